"""`kvsim run --kv-offloading-size`: a run with a CPU tier end to end (docs/offload.md):
loads show in requests.parquet and summary.json, the run ends when the connector's last work
is done, and a tier of size 0 writes the plain run's folder byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
from typer.testing import CliRunner, Result

from kvsim.analysis.metrics import WALL_CLOCK_FIELDS
from kvsim.cli import app

MODEL = ["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--step-time", "linear:0.005:1e-5"]


def kvsim(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


def write_trace(path: Path, prompts: list[list[int]], gap_s: float = 1.0) -> Path:
    """One request per prompt (hash ids of 16-token blocks), ``gap_s`` apart."""
    lines = [json.dumps({"kvsim_trace": 1, "name": path.stem, "hash_block_size": 16})]
    for i, ids in enumerate(prompts):
        row = {
            "request_id": f"r{i}",
            "arrival_time_s": i * gap_s,
            "prompt_tokens": 16 * len(ids),
            "output_tokens": 4,
            "hash_ids": ids,
        }
        lines.append(json.dumps(row))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_prefix_the_gpu_lost_is_loaded_from_the_cpu_tier(tmp_path: Path) -> None:
    # 7 blocks: r1 (unrelated) evicts most of r0's cached blocks; r2 repeats r0's prompt.
    trace = write_trace(tmp_path / "t.jsonl", [[1, 2, 3, 4, 5], [9, 8, 7, 6, 5], [1, 2, 3, 4, 5]])
    out = tmp_path / "run"
    result = kvsim(
        "run", trace, *MODEL, "--num-blocks", "7", "--kv-offloading-size", "1",
        "--out", out, "--no-plots",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    requests = pq.read_table(out / "requests.parquet").to_pandas()
    r2 = requests.set_index("request_id").loc["r2"]
    assert r2["offload_hit_tokens"] > 0
    assert r2["prefix_hit_tokens"] + r2["offload_hit_tokens"] == 80
    assert r2["offload_transfer_s"] > 0 and r2["offload_load_wait_s"] >= r2["offload_transfer_s"]
    assert r2["offload_bytes_loaded"] == r2["offload_hit_tokens"] * 131072  # 128 KiB a token
    # recomputing instead: one lone prefill of the loaded tokens on the run's step time
    assert r2["offload_recompute_s"] == 0.005 + 1e-5 * r2["offload_hit_tokens"]
    summary = json.loads((out / "summary.json").read_text())
    offload = summary["offload"]
    assert offload["prompt_tokens_by_source"]["external_kv_transfer"] == r2["offload_hit_tokens"]
    assert offload["loads"]["jobs"] == 1
    assert offload["hit_rate_all_tiers"] > summary["prefix_cache_hit_rate"]
    transfers = pq.read_table(out / "transfers.parquet").to_pandas()
    assert list(transfers["kind"].astype(str)).count("load") == 1
    load = transfers[transfers["kind"].astype(str) == "load"].iloc[0]
    assert load["transfer_s"] == r2["offload_transfer_s"]
    assert load["recompute_s"] == r2["offload_recompute_s"]
    assert load["bytes"] == load["gpu_blocks"] * 16 * 131072
    steps = pq.read_table(out / "steps.parquet").to_pandas()
    assert steps["offload_tier_chunks"].max() == offload["tier_chunks_peak"] > 0


def test_the_run_ends_after_the_last_request_stores_nothing_new(tmp_path: Path) -> None:
    # r1 repeats r0: its finish builds no store; the connector's last work ends in an empty
    # step (the simulation used to wait there forever for an arrival)
    trace = write_trace(tmp_path / "t.jsonl", [[1, 2, 3, 4], [1, 2, 3, 4]])
    out = tmp_path / "run"
    result = kvsim(
        "run", trace, *MODEL, "--num-blocks", "64", "--kv-offloading-size", "1",
        "--out", out, "--no-plots",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads((out / "summary.json").read_text())["num_finished"] == 2


def test_a_tier_of_size_0_writes_the_plain_run_folder(tmp_path: Path) -> None:
    plain, zero = tmp_path / "plain", tmp_path / "zero"
    assert kvsim("run", "--out", plain, "--no-plots").exit_code == 0
    result = kvsim("run", "--out", zero, "--no-plots", "--kv-offloading-size", "0")
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in plain.iterdir())
    assert names == sorted(p.name for p in zero.iterdir())
    for name in names:
        a, b = (plain / name).read_bytes(), (zero / name).read_bytes()
        if name == "summary.json":
            strip = lambda s: {k: v for k, v in json.loads(s).items() if k not in WALL_CLOCK_FIELDS}  # noqa: E731
            assert strip(a) == strip(b)
        elif name.endswith(".parquet") or name == "config.json":
            assert a == b, name
