"""Copy Vidur's profiles into the repository, keeping only what the fitter reads.

``python profiles/ship_vidur.py SRC profiles/vidur``, SRC a copy of Vidur's profiling data
(compute/, attention/, network/ and its LICENSE): for every CSV, writes the key columns and the
``.median`` columns the fitter reads, rows in the source's order, times rounded to 1e-6 ms, plus
LICENSE (MIT, Microsoft) and a README saying where the files come from. The result loads like
the source: the same rows and values to the timer's resolution, so the fitted coefficients are
the same.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

from kvsim.costmodel.layer_shapes import LINEAR_OPS

KEEP_COMPUTE = (
    "n_head",
    "n_kv_head",
    "n_embd",
    "n_expanded_embd",
    "vocab_size",
    "use_gated_mlp",
    "num_tokens",
    "num_tensor_parallel_workers",
)
# Constant columns are dropped and recorded in README: attention_backend FLASH_ATTENTION,
# profile_method KINETO, max_model_len 4096; network rank 0, collective all_reduce.
KEEP_ATTENTION = (
    "n_embd",
    "n_q_head",
    "n_kv_head",
    "block_size",
    "num_tensor_parallel_workers",
    "batch_size",
    "prefill_chunk_size",
    "kv_cache_size",
    "is_prefill",
)
KEEP_NETWORK = ("num_workers", "size", "devices_per_node", "max_devices_per_node")

README = """# Measured GPU operator profiles (from Vidur)

Operator timings measured on NVIDIA A100-80GB and H100 GPUs by the Vidur project
(https://github.com/microsoft/vidur, MLSys 2024), MIT License (LICENSE in this folder,
Copyright (c) Microsoft Corporation). Source: the repository at commit
7d47513363ec447a741ac5e47241580b47724fbf (compute/, network/) and e2d00e9 (attention/).

Changed from the source: only the key columns and the `time_stats.<op>.median` columns that kvsim
reads are kept (min/max/mean/std and unused operators dropped); rows are unchanged; times are
rounded to 0.000001 ms (the source prints float noise such as 0.10400000000000001;
its timer resolves 0.001 ms). Times are in milliseconds. Dropped constant columns: attention
`attention_backend` = AttentionBackend.FLASH_ATTENTION, `profile_method` = ProfileMethod.KINETO,
`max_model_len` = 4096; network `rank` = 0, `collective` = all_reduce.
Regenerate with `python profiles/ship_vidur.py SRC profiles/vidur`. kvsim fits the shipped GPU
coefficients from these files (`kvsim calibrate`, `kvsim validate`; docs/costmodel.md).
"""


def _short(cell: str) -> str:
    # Vidur wrote float noise (0.10400000000000001 for 0.104); its timer resolves 1 µs = 0.001 ms.
    try:
        number = float(cell)
    except ValueError:
        return cell
    if cell.lstrip("-").isdigit():
        return cell
    return repr(round(number, 6))  # 1 ns in ms; the shortest text of that float


def trim_csv(src: Path, dst: Path, keys: tuple[str, ...], medians: tuple[str, ...]) -> None:
    with src.open(newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader)
        wanted = set(keys) | {f"time_stats.{op}.median" for op in medians}
        keep = [i for i, name in enumerate(header) if name in wanted]
        rows = [[_short(row[i]) for i in keep] for row in reader]
    dst.parent.mkdir(parents=True, exist_ok=True)
    with dst.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow([header[i] for i in keep])
        writer.writerows(rows)


def ship(src: Path, dst: Path) -> None:
    for sub, keys, medians in (
        ("compute", KEEP_COMPUTE, (*LINEAR_OPS, "emb")),
        ("attention", KEEP_ATTENTION, ("attn_prefill", "attn_decode")),
        ("network", KEEP_NETWORK, ("all_reduce",)),
    ):
        for path in sorted((src / sub).glob("*.csv")):
            trim_csv(path, dst / sub / path.name, keys, medians)
    (dst / "LICENSE").write_text((src / "LICENSE").read_text(encoding="utf-8"), encoding="utf-8")
    (dst / "README.md").write_text(README, encoding="utf-8")


if __name__ == "__main__":
    ship(Path(sys.argv[1]), Path(sys.argv[2]))
