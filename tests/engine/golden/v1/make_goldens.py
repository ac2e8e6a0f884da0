"""Write the v1 conformance traces, and record their golden step files with vLLM 0.33.0.

    python tests/engine/golden/v1/make_goldens.py traces
        writes traces/*.jsonl (deterministic: fixed seeds, no input files but the shipped
        Mooncake sample)
    python tests/engine/golden/v1/make_goldens.py record [--python ~/vllm-ref/bin/python] [NAME ...]
        runs the reference driver (benchmarks/vllm_reference/drive_vllm.py) on each config
        and writes NAME.steps.jsonl.gz

Recording needs the reference's venv (see README.md beside this file); tests only read the
committed files. Each golden keeps the driver's config line, every step line (minus fields
the test does not compare) and the summary line without its per-request table.
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
TRACES = HERE / "traces"
REPO = HERE.parents[3]
MOONCAKE = REPO / "workloads" / "traces" / "mooncake_fast25_conversation_first_1000.jsonl"

# name -> (trace, driver options). Every config keeps the driver's clock defaults
# (step = 0.005 s + 1e-5 s per scheduled token) unless it says otherwise.
CONFIGS: dict[str, tuple[str, list[str]]] = {
    "pressure": (
        "unique",
        [
            "--block-size",
            "16",
            "--num-blocks",
            "90",
            "--max-num-seqs",
            "16",
            "--max-num-batched-tokens",
            "512",
        ],
    ),
    "pressure_all_at_once": (
        "unique",
        [
            "--block-size",
            "16",
            "--num-blocks",
            "100",
            "--max-num-seqs",
            "32",
            "--max-num-batched-tokens",
            "1024",
            "--all-at-once",
        ],
    ),
    "prefix_tokens": (
        "conversations_tokens",
        [
            "--block-size",
            "16",
            "--num-blocks",
            "50",
            "--max-num-seqs",
            "8",
            "--max-num-batched-tokens",
            "256",
        ],
    ),
    "prefix_hash_ids": (
        "conversations_hash_ids",
        [
            "--block-size",
            "16",
            "--num-blocks",
            "45",
            "--max-num-seqs",
            "12",
            "--max-num-batched-tokens",
            "384",
        ],
    ),
    "block_size_1": (
        "conversations_hash_ids_short",
        [
            "--block-size",
            "1",
            "--num-blocks",
            "400",
            "--max-num-seqs",
            "12",
            "--max-num-batched-tokens",
            "256",
        ],
    ),
    "block_size_64": (
        "conversations_hash_ids_48",
        [
            "--block-size",
            "64",
            "--num-blocks",
            "14",
            "--max-num-seqs",
            "12",
            "--max-num-batched-tokens",
            "512",
        ],
    ),
    "long_prefill": (
        "conversations_tokens",
        [
            "--block-size",
            "16",
            "--num-blocks",
            "50",
            "--max-num-seqs",
            "8",
            "--max-num-batched-tokens",
            "256",
            "--long-prefill-token-threshold",
            "48",
        ],
    ),
    "priority": (
        "priority_tokens",
        [
            "--block-size",
            "16",
            "--num-blocks",
            "45",
            "--max-num-seqs",
            "10",
            "--max-num-batched-tokens",
            "320",
            "--policy",
            "priority",
        ],
    ),
    "priority_threshold": (
        "priority_tokens",
        [
            "--block-size",
            "8",
            "--num-blocks",
            "100",
            "--max-num-seqs",
            "6",
            "--max-num-batched-tokens",
            "128",
            "--policy",
            "priority",
            "--long-prefill-token-threshold",
            "40",
        ],
    ),
    "no_chunked_prefill": (
        "conversations_tokens",
        [
            "--block-size",
            "16",
            "--num-blocks",
            "50",
            "--max-num-seqs",
            "8",
            "--max-num-batched-tokens",
            "448",
            "--no-chunked-prefill",
        ],
    ),
    "no_caching": (
        "conversations_tokens",
        [
            "--block-size",
            "16",
            "--num-blocks",
            "50",
            "--max-num-seqs",
            "8",
            "--max-num-batched-tokens",
            "256",
            "--no-prefix-caching",
        ],
    ),
    "watermark": (
        "unique",
        [
            "--block-size",
            "16",
            "--num-blocks",
            "100",
            "--max-num-seqs",
            "16",
            "--max-num-batched-tokens",
            "512",
            "--watermark",
            "0.1",
        ],
    ),
    "mooncake": (
        "mooncake_first_120",
        [
            "--block-size",
            "16",
            "--num-blocks",
            "7700",
            "--max-num-seqs",
            "64",
            "--max-num-batched-tokens",
            "8192",
        ],
    ),
}


def lognormal(rng: np.random.Generator, mean: float, cv: float, n: int) -> np.ndarray:
    sigma2 = np.log1p(cv * cv)
    return rng.lognormal(np.log(mean) - sigma2 / 2, np.sqrt(sigma2), n)


def unique_trace() -> list[dict[str, object]]:
    """Requests sharing nothing, Poisson arrivals: memory pressure and preemption."""
    rng = np.random.default_rng(1)
    n = 70
    arrivals = np.cumsum(rng.exponential(0.08, n))
    prompts = np.clip(lognormal(rng, 260, 1.0, n), 1, 900).astype(int)
    outputs = np.clip(lognormal(rng, 70, 1.0, n), 1, 500).astype(int)
    return [
        {
            "request_id": str(i),
            "arrival_time_s": round(float(t), 4),
            "prompt_tokens": int(p),
            "output_tokens": int(o),
        }
        for i, (t, p, o) in enumerate(zip(arrivals, prompts, outputs))
    ]


SAMPLED = 7  # what the driver samples: a conversation's next turn repeats it


def conversations(
    rng: np.random.Generator, num_convs: int, turns: int, user_mean: float, out_mean: float
) -> list[tuple[float, list[tuple[str, int]], int, int]]:
    """Multi-turn conversations over a few shared system prompts, as segments:
    (arrival, [(segment key, length), ...], output tokens, priority). A turn's prompt is the
    previous turn's prompt, its answer (the driver's sampled tokens) and a new user part."""
    systems = [(f"sys{k}", int(x)) for k, x in enumerate(rng.integers(20, 160, 4))]
    out: list[tuple[float, list[tuple[str, int]], int, int]] = []
    t0 = 0.0
    for c in range(num_convs):
        t0 += float(rng.exponential(0.25))
        t = t0
        segments = [systems[int(rng.integers(len(systems)))]]
        priority = int(rng.integers(0, 4))
        for k in range(turns):
            segments = [*segments, (f"c{c}u{k}", int(max(1, rng.normal(user_mean, user_mean / 3))))]
            output = int(np.clip(rng.normal(out_mean, out_mean / 2), 1, 4 * out_mean))
            out.append((round(t, 4), segments, output, priority))
            segments = [*segments, ("answer", output)]
            t += float(rng.exponential(1.5)) + 0.3
    out.sort(key=lambda r: r[0])
    return out


def token_trace(seed: int, priorities: bool) -> list[dict[str, object]]:
    rng = np.random.default_rng(seed)
    vocab: dict[str, list[int]] = {}
    rows = []
    for i, (t, segments, output, priority) in enumerate(conversations(rng, 16, 3, 60, 40)):
        tokens: list[int] = []
        for key, length in segments:
            if key == "answer":
                tokens += [SAMPLED] * length
                continue
            if key not in vocab:
                vocab[key] = rng.integers(10, 5000, length).tolist()
            tokens += vocab[key]
        row: dict[str, object] = {
            "request_id": str(i),
            "arrival_time_s": t,
            "prompt_tokens": len(tokens),
            "output_tokens": output,
            "prompt_token_ids": tokens,
        }
        if priorities:
            row["priority"] = priority
        rows.append(row)
    return rows


def hash_id_trace(seed: int, hbs: int, num_convs: int, user_mean: float) -> list[dict[str, object]]:
    """Conversations as hash ids (one per hbs tokens, prefix-chained as Mooncake's): a turn
    extends the previous turn's ids; the last id of a prompt covers a partial block. Some
    requests repeat a prompt exactly, some have fewer ids than tokens (padding)."""
    rng = np.random.default_rng(seed)
    next_id = 0
    rows: list[dict[str, object]] = []
    t0 = 0.0
    shared = [[next_id + k for k in range(int(rng.integers(1, 4)))] for _ in range(3)]
    next_id += 100
    for _ in range(num_convs):
        t0 += float(rng.exponential(0.3))
        t = t0
        ids = list(shared[int(rng.integers(len(shared)))])
        length = len(ids) * hbs
        for _ in range(3):
            add = int(max(1, rng.normal(user_mean, user_mean / 3)))
            length += add
            while len(ids) * hbs < length:
                ids.append(next_id)
                next_id += 1
            output = int(np.clip(rng.normal(40, 20), 1, 160))
            row: dict[str, object] = {
                "request_id": str(len(rows)),
                "arrival_time_s": round(t, 4),
                "prompt_tokens": length,
                "output_tokens": output,
                "hash_ids": list(ids),
                "hash_block_size": hbs,
            }
            rows.append(row)
            if rng.random() < 0.15:  # the same prompt again, a little later
                rows.append(
                    {**row, "request_id": str(len(rows)), "arrival_time_s": round(t + 0.05, 4)}
                )
            if rng.random() < 0.1:  # ids cover fewer tokens than the prompt
                rows.append(
                    {
                        **row,
                        "request_id": str(len(rows)),
                        "hash_ids": ids[:-1],
                        "arrival_time_s": round(t + 0.02, 4),
                    }
                )
            t += float(rng.exponential(1.2)) + 0.3
    rows.sort(key=lambda r: (r["arrival_time_s"], int(str(r["request_id"]))))
    return rows


def mooncake_slice(n: int) -> list[dict[str, object]]:
    rows = []
    with MOONCAKE.open() as f:
        header = json.loads(f.readline())
        for line in f:
            if len(rows) >= n:
                break
            r = json.loads(line)
            rows.append({**r, "hash_block_size": header["hash_block_size"]})
    return rows


def build_traces() -> dict[str, list[dict[str, object]]]:
    return {
        "unique": unique_trace(),
        "conversations_tokens": token_trace(2, priorities=False),
        "priority_tokens": token_trace(3, priorities=True),
        "conversations_hash_ids": hash_id_trace(4, 32, 14, 60),
        "conversations_hash_ids_short": hash_id_trace(5, 32, 10, 30),
        "conversations_hash_ids_48": hash_id_trace(6, 48, 14, 70),
        "mooncake_first_120": mooncake_slice(120),
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
            subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL)
            lines = [json.loads(line) for line in out.read_text().splitlines()]
        config, summary = lines[0], lines[-1]
        if summary.get("stalled") or summary.get("num_unfinished"):
            raise SystemExit(f"{name}: the reference stalled or left requests unfinished")
        config["trace"] = f"traces/{trace}.jsonl"  # not the recording machine's path
        config.pop("args", None)
        config["driver_options"] = options
        summary.pop("per_request", None)
        steps = [{k: v for k, v in s.items() if k not in DROP_STEP_FIELDS} for s in lines[1:-1]]
        with gzip.GzipFile(HERE / f"{name}.steps.jsonl.gz", "wb", mtime=0) as f:
            for row in [config, *steps, summary]:
                f.write((json.dumps(row, separators=(",", ":")) + "\n").encode())
        nonempty = sum(1 for s in steps if s["num_scheduled_tokens"])
        print(
            f"{name}: {nonempty} steps, {summary['total_preemptions']} preemptions, "
            f"prefix hit rate {summary['prefix_hit_rate']}"
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
    sys.exit(main())
