"""summary.json's prefix-cache counts equal vLLM's own PrefixCacheStats on the v1 goldens.

Each golden (tests/engine/golden/v1, recorded with vLLM 0.33.0's scheduler by the reference
driver) ends with the driver's summary: ``vllm_prefix_cache_queries`` / ``_hits`` (what
``vllm:prefix_cache_queries`` / ``_hits`` report: first admissions) and
``vllm_preempted_queries`` / ``_hits``. kvsim makes the same decisions step for step
(tests/engine/test_v1_conformance.py); here its event stream, read by
``kvsim.analysis.prefix_metrics``, must count them exactly as vLLM does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from engine import EventRecorder
from kvsim.analysis.prefix_metrics import admissions, prefix_cache_summary
from kvsim.config import RunConfig
from kvsim.runner import run

sys.path.insert(0, str(Path(__file__).parents[1] / "engine"))
from v1_replay import GOLDEN, load_golden, load_trace, replay

NAMES = sorted(p.name.removesuffix(".steps.jsonl.gz") for p in GOLDEN.glob("*.steps.jsonl.gz"))


def counts(name: str) -> tuple[dict[str, object], dict[str, object]]:
    config, _, summary = load_golden(GOLDEN / f"{name}.steps.jsonl.gz")
    recorder = EventRecorder()
    replay(name, event_sink=recorder)
    trace = load_trace(GOLDEN / config["trace"])
    prompt = np.zeros(max(int(r["request_id"]) for r in trace) + 1, dtype=np.int64)
    for r in trace:
        prompt[int(r["request_id"])] = r["prompt_tokens"]
    caching = config["cache_config"]["enable_prefix_caching"]
    ours = prefix_cache_summary(admissions(recorder.columns()[0], prompt), None, caching=caching)
    return ours, summary


@pytest.mark.parametrize("name", NAMES)
def test_prefix_cache_counts_equal_vllms(name: str) -> None:
    ours, vllm = counts(name)
    assert ours["prefix_cache_queries"] == vllm["vllm_prefix_cache_queries"]
    assert ours["prefix_cache_hits"] == vllm["vllm_prefix_cache_hits"]
    assert ours["prefix_cache_hit_rate"] == vllm["vllm_prefix_cache_hit_rate"]
    assert ours["prefix_cache_preempted_queries"] == vllm["vllm_preempted_queries"]
    assert ours["prefix_cache_preempted_hits"] == vllm["vllm_preempted_hits"]


def test_the_goldens_resume_with_hits() -> None:
    """The comparison means something: some golden preempts and resumes with hits."""
    summaries = [load_golden(GOLDEN / f"{n}.steps.jsonl.gz")[2] for n in NAMES]
    assert any(s["vllm_preempted_hits"] > 0 for s in summaries)
    assert any(s["vllm_prefix_cache_hits"] > 0 for s in summaries)


def test_the_simulator_with_the_references_clock_counts_what_vllm_counted(
    tmp_path: Path,
) -> None:
    """`kvsim run`'s whole path (trace file, cost-mode prefix keys from hash_ids, simulator,
    streamed metrics) on the Mooncake golden with the reference's linear clock and pool."""
    config, _, vllm = load_golden(GOLDEN / "mooncake.steps.jsonl.gz")
    rows = load_trace(GOLDEN / config["trace"])
    header = {"kvsim_trace": 1, "name": "mooncake_first_120", "hash_block_size": 512}
    body = [{k: v for k, v in r.items() if k != "hash_block_size"} for r in rows]
    trace = tmp_path / "mooncake_first_120.jsonl"
    trace.write_text("\n".join(json.dumps(o) for o in [header, *body]) + "\n")
    sc, cc = config["scheduler_config"], config["cache_config"]
    run_config = RunConfig(
        trace=str(trace), model="llama-3.1-8b", gpu="h100-sxm",
        num_blocks=cc["num_gpu_blocks"] - 1, block_size=cc["block_size"],
        max_num_seqs=sc["max_num_seqs"], max_num_batched_tokens=sc["max_num_batched_tokens"],
        max_model_len=config["max_model_len"], allow_long_max_model_len=True,
        step_time="linear:0.005:1e-5",
    )  # fmt: skip
    s = run(run_config).summary
    assert s["prefix_cache_queries"] == vllm["vllm_prefix_cache_queries"]
    assert s["prefix_cache_hits"] == vllm["vllm_prefix_cache_hits"]
    assert s["prefix_cache_hit_rate"] == vllm["vllm_prefix_cache_hit_rate"]
    assert s["prefix_cache_preempted_queries"] == vllm["vllm_preempted_queries"]
    assert s["prefix_cache_preempted_hits"] == vllm["vllm_preempted_hits"]
    assert s["num_preemptions"] == vllm["total_preemptions"]
