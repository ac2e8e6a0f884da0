"""Write the KV-offload golden traces, and record their golden step files with vLLM 0.33.0.

    python tests/engine/golden/offload/make_goldens.py traces
        writes traces/*.jsonl (deterministic: a hand-made trace and a slice of the shipped
        Mooncake sample)
    python tests/engine/golden/offload/make_goldens.py record [--python PY] [NAME ...]
        runs the reference driver (benchmarks/vllm_reference/drive_vllm.py) under PY
        (default ~/vllm-ref/bin/python) with vLLM's OffloadingConnector (CPU tier) on each
        config and writes NAME.steps.jsonl.gz

Recording needs the reference's venv (benchmarks/vllm_reference/README.md); tests only read
the committed files. Each golden keeps the driver's config line, every step line (minus the
fields v1's goldens drop too) and the summary line without its per-request table.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRACES = HERE / "traces"
REPO = HERE.parents[3]
MOONCAKE = REPO / "workloads" / "traces" / "mooncake_fast25_conversation_first_1000.jsonl"
MIB2 = 2 * 1024 * 1024  # llama-3.1-8b KV bytes of a 16-token block (the driver's default)

HANDMADE = [
    "--block-size",
    "16",
    "--num-blocks",
    "41",
    "--max-num-seqs",
    "4",
    "--max-num-batched-tokens",
    "256",
    "--cpu-bytes",
    str(64 * MIB2),  # 64 chunks of one 16-token block
    "--read-gbps",
    "2",
    "--write-gbps",
    "0.25",
    "--link-latency-us",
    "10",
    "--cpu-snapshot-every",
    "20",
]
MOONCAKE_OPTIONS = [
    "--block-size",
    "64",
    "--num-blocks",
    "200",
    "--max-num-seqs",
    "64",
    "--max-num-batched-tokens",
    "8192",
    "--kv-offloading-size-gib",
    "32",  # 4,096 chunks of 8 MiB (64 tokens)
    "--read-gbps",
    "25",
    "--write-gbps",
    "25",
    "--link-latency-us",
    "10",
    "--cpu-snapshot-every",
    "2000",
]
MOONCAKE_SLICE = "mooncake_300_le8k_out32"
# vLLM's tiering spec with a disk tier behind a small CPU tier (offload_tier.TimedFsTier: the
# fs tier's rules, transfers on the model): a slow disk in the hand-made case, NVMe numbers
# behind a CPU tier of 512 chunks (re-use beyond the CPU tier's capacity) on the slice.
HANDMADE_DISK = [
    "--block-size",
    "16",
    "--num-blocks",
    "41",
    "--max-num-seqs",
    "4",
    "--max-num-batched-tokens",
    "256",
    "--cpu-bytes",
    str(16 * MIB2),  # 16 chunks of one 16-token block
    "--read-gbps",
    "25",
    "--write-gbps",
    "25",
    "--link-latency-us",
    "10",
    "--disk-tier",
    "--disk-read-gbps",
    "1",
    "--disk-write-gbps",
    "0.5",
    "--disk-latency-us",
    "100",
    "--cpu-snapshot-every",
    "5",
]
MOONCAKE_DISK = [
    "--block-size",
    "64",
    "--num-blocks",
    "200",
    "--max-num-seqs",
    "64",
    "--max-num-batched-tokens",
    "8192",
    "--cpu-bytes",
    str(512 * 4 * MIB2),  # 512 chunks of 8 MiB (64 tokens)
    "--read-gbps",
    "25",
    "--write-gbps",
    "25",
    "--link-latency-us",
    "10",
    "--disk-tier",
    "--disk-read-gbps",
    "7",
    "--disk-write-gbps",
    "5",
    "--disk-latency-us",
    "80",
    "--cpu-snapshot-every",
    "500",
]

# name -> (trace, driver options)
CONFIGS: dict[str, tuple[str, list[str]]] = {
    "handmade": ("handmade", HANDMADE),
    "mooncake_lru": (MOONCAKE_SLICE, [*MOONCAKE_OPTIONS, "--offload-policy", "lru"]),
    "mooncake_arc": (MOONCAKE_SLICE, [*MOONCAKE_OPTIONS, "--offload-policy", "arc"]),
    "handmade_disk": ("handmade_disk", HANDMADE_DISK),
    "mooncake_disk": (MOONCAKE_SLICE, MOONCAKE_DISK),
    "mooncake_chunk4": (
        MOONCAKE_SLICE,
        [
            "--block-size",
            "16",
            "--num-blocks",
            "800",
            "--max-num-seqs",
            "64",
            "--max-num-batched-tokens",
            "8192",
            "--kv-offloading-size-gib",
            "32",
            "--offload-block-size",
            "64",
            "--read-gbps",
            "25",
            "--write-gbps",
            "25",
            "--link-latency-us",
            "10",
            "--cpu-snapshot-every",
            "2000",
        ],
    ),
}


def handmade_trace() -> list[dict[str, object]]:
    """Phases (16-token hash blocks = GPU blocks = offload chunks; 40 GPU blocks, 64 CPU
    chunks, slow stores): A stores a shared prefix S; B's fillers push S out of the GPU
    cache, and a request re-using a filler's prefix waits for its pending store; C re-uses S
    from the CPU tier (a load, a second request delayed while S's chunks
    are being loaded, a full-prompt hit); D's fillers evict from the CPU tier; E's two long
    decodes run out of GPU blocks and preempt a request whose stores are in flight."""
    next_id = [1000]

    def fresh(n: int) -> list[int]:
        ids = list(range(next_id[0], next_id[0] + n))
        next_id[0] += n
        return ids

    s = list(range(8))  # the shared prefix S: 8 blocks
    a0, a1 = s + fresh(2), fresh(10)
    b0, b1, b2 = fresh(16), fresh(16), fresh(20)
    rows: list[tuple[float, list[int], int]] = [
        (0.0, a0, 3),  # A: stores S
        (0.0, a1, 3),
        (0.3, b0, 2),  # B: fillers
        (0.3, b1, 2),
        (0.305, b2, 2),  # evicts most of r2's blocks from the GPU cache ...
        (0.31, b0[:8] + fresh(2), 2),  # ... then r2's prefix, its store still pending
        (0.6, s + fresh(2), 3),  # C: loads S ...
        (0.6, s + fresh(2), 3),  # ... and waits while S's chunks are being loaded
        (0.8, list(s), 2),  # full-prompt hit (chunk-aligned prompt)
        (1.0, fresh(16), 2),  # D: fillers, CPU evictions
        (1.0, fresh(16), 2),
        (1.05, fresh(16), 2),
        (2.0, fresh(18), 60),  # E: preemption with stores in flight
        (2.0, fresh(18), 60),
    ]
    return [
        {
            "request_id": f"r{i}",
            "arrival_time_s": t,
            "prompt_tokens": 16 * len(ids),
            "output_tokens": out,
            "hash_ids": ids,
            "hash_block_size": 16,
        }
        for i, (t, ids, out) in enumerate(rows)
    ]


def handmade_disk_trace() -> list[dict[str, object]]:
    """Phases (16-token blocks = chunks; 40 GPU blocks, 16 CPU chunks, a slow disk): A stores
    a prefix S (cascaded to the disk); B's fillers push S out of the GPU cache and the CPU
    tier; C re-uses S: the disk's first answer is "not yet" (a probe), then S is promoted
    into the CPU tier and loaded from there, a second request with S waits for the
    promotion; D re-uses a filler's prefix whose disk write is still in flight (the probe
    answers a miss, which the request keeps); E re-uses S again while the CPU tier still
    holds it (no disk lookup)."""
    next_id = [5000]

    def fresh(n: int) -> list[int]:
        ids = list(range(next_id[0], next_id[0] + n))
        next_id[0] += n
        return ids

    s = list(range(100, 108))  # S: 8 blocks
    fill = [fresh(12) for _ in range(4)]
    rows: list[tuple[float, list[int], int]] = [
        (0.0, s + fresh(2), 3),  # A: stores S, cascaded to the disk
        (0.3, fill[0], 2),  # B: fillers push S out of the GPU and CPU tiers
        (0.3, fill[1], 2),
        (0.35, fill[2], 2),
        (0.6, s + fresh(2), 3),  # C: S from the disk: probe, promotion, load
        (0.6, s + fresh(3), 3),  # ... a second request waits for the promotion
        (0.62, fill[3], 2),  # another filler
        (0.63, fill[3][:6] + fresh(4), 2),  # D: its prefix's disk write may be in flight
        (1.2, s + fresh(1), 2),  # E: S again
    ]
    return [
        {
            "request_id": f"d{i}",
            "arrival_time_s": t,
            "prompt_tokens": 16 * len(ids),
            "output_tokens": out,
            "hash_ids": ids,
            "hash_block_size": 16,
        }
        for i, (t, ids, out) in enumerate(rows)
    ]


def mooncake_slice(
    n: int, max_prompt_tokens: int, max_output_tokens: int, time_scale: float
) -> list[dict[str, object]]:
    """The first n requests of the shipped Mooncake sample whose prompt has at most
    max_prompt_tokens tokens, outputs capped at max_output_tokens and arrival times multiplied
    by time_scale (ids and hash ids kept): conversation turns re-use earlier turns' prefixes,
    so a GPU pool of a few requests' size leaves the re-use to the CPU tier; the compressed
    arrivals keep the engine loaded and the short outputs keep the file small."""
    rows: list[dict[str, object]] = []
    with MOONCAKE.open() as f:
        header = json.loads(f.readline())
        for line in f:
            if len(rows) >= n:
                break
            row = json.loads(line)
            if row["prompt_tokens"] <= max_prompt_tokens:
                arrival = round(float(row["arrival_time_s"]) * time_scale, 6)
                output = min(int(row["output_tokens"]), max_output_tokens)
                rows.append(
                    {
                        **row,
                        "arrival_time_s": arrival,
                        "output_tokens": output,
                        "hash_block_size": header["hash_block_size"],
                    }
                )
    return rows


def build_traces() -> dict[str, list[dict[str, object]]]:
    return {
        "handmade": handmade_trace(),
        "handmade_disk": handmade_disk_trace(),
        MOONCAKE_SLICE: mooncake_slice(300, 8192, 32, 0.1),
    }


def write_traces() -> None:
    TRACES.mkdir(exist_ok=True)
    for name, rows in build_traces().items():
        with (TRACES / f"{name}.jsonl").open("w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        print(f"{name}: {len(rows)} requests")


DROP_STEP_FIELDS = ("vllm_prefix_cache", "first_token", "total_scheduled_tokens")


def record(python: str, driver: str, names: list[str]) -> None:
    for name in names or list(CONFIGS):
        trace, options = CONFIGS[name]
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "out.jsonl"
            cmd = [python, driver, str(TRACES / f"{trace}.jsonl"), "--out", str(out), *options]
            # the driver orders vLLM's one hash-ordered set itself; a fixed seed keeps any
            # other str-set order reproducible too
            env = {**os.environ, "PYTHONHASHSEED": "0"}
            subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL, env=env)
            lines = [json.loads(line) for line in out.read_text().splitlines()]
        config, summary = lines[0], lines[-1]
        if summary.get("stalled") or summary.get("num_unfinished"):
            raise SystemExit(f"{name}: the reference stalled or left requests unfinished")
        config["trace"] = f"traces/{trace}.jsonl"  # not the recording machine's path
        config.pop("args", None)
        config["driver_options"] = options
        summary.pop("per_request", None)
        steps = [{k: v for k, v in s.items() if k not in DROP_STEP_FIELDS} for s in lines[1:-1]]
        for s in steps:  # kept short: step_start_s is "time"; forward_start_s only if later
            assert s.pop("step_start_s") == s["time"]
            if s["forward_start_s"] == s["time"]:
                del s["forward_start_s"]
        path = HERE / f"{name}.steps.jsonl.gz"
        with gzip.GzipFile(path, "wb", mtime=0) as f:
            for row in [config, *steps, summary]:
                f.write((json.dumps(row, separators=(",", ":")) + "\n").encode())
        off = summary["offload"]
        print(
            f"{name}: {sum(1 for s in steps if s['num_scheduled_tokens'])} non-empty steps "
            f"of {len(steps)}, {off['load_jobs']} loads, {off['store_jobs']} stores, "
            f"{sum(1 for s in steps if s['jobs_to_flush'])} flushes, {off['cpu_evicted']} "
            f"evictions, external hit tokens {off['external_hit_tokens']}, prefix hit rate "
            f"{summary['prefix_hit_rate']:.4f}, {path.stat().st_size:,} bytes"
        )
        if "final_disk_chunks" in off:
            disk = [j for s in steps for j in s.get("disk_jobs", ())]
            print(
                f"  disk: {sum(j['event'] == 'cascade' for j in disk)} cascades, "
                f"{sum(j['event'] == 'promotion' for j in disk)} promotions "
                f"({sum(len(j['chunks']) for j in disk if j['event'] == 'promotion')} chunks), "
                f"{len(off['final_disk_chunks'])} chunks on disk at the end"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("traces")
    rec = sub.add_parser("record")
    rec.add_argument(
        "--python",
        default=str(Path.home() / "vllm-ref" / "bin" / "python"),
        help="the reference venv's python (default: ~/vllm-ref/bin/python)",
    )
    rec.add_argument(
        "--driver",
        default=str(REPO / "benchmarks" / "vllm_reference" / "drive_vllm.py"),
        help="the reference driver (default: the repository's copy)",
    )
    rec.add_argument("names", nargs="*", help=f"configs (default: all of {list(CONFIGS)})")
    args = parser.parse_args()
    if args.command == "traces":
        write_traces()
    else:
        record(args.python, args.driver, args.names)


if __name__ == "__main__":
    main()
