"""A P/D fleet's pools on their own GPU and TP (``--pd-prefill-gpu``, ``--pd-prefill-tp``,
``--pd-decode-gpu``, ``--pd-decode-tp``; docs/fleet.md): each pool's planned KV pool and
step times, the pull's bytes per token across TP sizes as vLLM's NIXL connector reads them,
and the one-line errors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.config import RunConfig, scheduling_limits
from kvsim.costmodel import plan_num_blocks, resolve_gpu, resolve_model
from kvsim.fleet.pd_pools import pull_bytes_per_token
from kvsim.option_spec import ConfigError
from kvsim.runner import resolve_pd_pools, run
from tests.kvsim.fleet.test_pd import write_trace

MODEL = "llama-3.1-8b"  # 32 layers, 8 KV heads of 128, bf16
HEAD_BYTES = 2 * 32 * 128 * 2  # K and V of one KV head, per token


def trace_of(tmp_path: Path, n: int = 12) -> Path:
    rows = [{"arrival_time_s": 0.3 * i, "prompt_tokens": 600 + 40 * i, "output_tokens": 40}
            for i in range(n)]  # fmt: skip
    return write_trace(tmp_path / "t.jsonl", rows)


def test_a_decode_pool_on_a_faster_gpu_lowers_tpot(tmp_path: Path) -> None:
    """The decode replicas on h100-sxm instead of a100-80gb decode faster (HBM 3.35 against
    2.0 TB/s); the prefill replica, on a100-80gb in both runs, runs the same steps."""
    trace = str(trace_of(tmp_path))
    base = RunConfig(trace=trace, model=MODEL, gpu="a100-80gb", pd="1:2")
    slow = run(base, keep_events=False).summary
    fast = run(dataclasses.replace(base, pd_decode_gpu="h100-sxm"),
               keep_events=False).summary  # fmt: skip
    assert fast["tpot_s"]["p50"] < 0.8 * slow["tpot_s"]["p50"]
    assert fast["replicas"][0]["busy_time_s"] == slow["replicas"][0]["busy_time_s"]
    assert fast["replicas"][1]["busy_time_s"] < slow["replicas"][1]["busy_time_s"]


def test_each_pool_plans_its_own_kv_pool(tmp_path: Path) -> None:
    """Each pool's KV blocks are vLLM's memory plan on its GPU and TP (its own batch limits);
    summary.json's fleet.pd names them and each replica's section has its pool's; config.json
    has the pools' plans only when a pool option is given."""
    trace = str(trace_of(tmp_path, 4))
    config = RunConfig(trace=trace, model=MODEL, gpu="a100-80gb", pd="2:1", pd_decode_gpu="h200",
                       pd_decode_tp=2)  # fmt: skip
    result = run(config, keep_events=False)
    model = resolve_model(MODEL)
    planned = {}
    for role, gpu, tp in (("prefill", "a100-80gb", 1), ("decode", "h200", 2)):
        spec = resolve_gpu(gpu)
        limits = scheduling_limits(config, spec, model.max_model_len)
        planned[role] = plan_num_blocks(
            model, spec, 16, tp=tp, max_num_batched_tokens=limits.max_num_batched_tokens,
            max_num_seqs=limits.max_num_seqs,
        ).num_blocks  # fmt: skip
    assert planned["decode"] > 2 * planned["prefill"]  # two GPUs of 141 GB against one of 80
    pd = result.summary["fleet"]["pd"]
    assert (pd["prefill"]["num_blocks"], pd["decode"]["num_blocks"]) == (
        planned["prefill"], planned["decode"])  # fmt: skip
    assert (pd["decode"]["gpu"], pd["decode"]["tp"]) == ("h200", 2)
    assert [r["num_blocks"] for r in result.summary["replicas"]] == [
        planned["prefill"], planned["prefill"], planned["decode"]]  # fmt: skip
    pools = result.resolved["pd_pools"]
    assert pools["decode"]["memory_plan"]["num_blocks"] == planned["decode"]
    from kvsim.commands.summary import summary_rows

    rows = dict(summary_rows(result.summary))
    assert rows["fleet"].startswith(f"2 prefill (1 x a100-80gb) x {planned['prefill']:,} blocks")
    assert f"1 decode (2 x h200) x {planned['decode']:,} blocks" in rows["fleet"]
    plain = run(RunConfig(trace=trace, model=MODEL, pd="2:1"), keep_events=False)
    assert "pd_pools" not in plain.resolved
    assert not any(k.startswith("pd_") for k in RunConfig(trace=trace, pd="2:1").to_dict())


@pytest.mark.parametrize(
    "prefill_tp, decode_tp, heads",
    [
        (1, 1, 8),  # one GPU's 8 heads
        (2, 2, 4),
        (1, 2, 8),  # two decode GPUs read 4 heads each from one prefill GPU: it sends 8
        (2, 1, 8),  # one decode GPU reads 4 heads from each of two prefill GPUs: it gets 8
        (2, 8, 4),  # four decode GPUs of 1 head each read from one prefill GPU of 4
        (4, 16, 4),  # 16 decode GPUs each hold a copy of 1 of 8 heads: 4 copies per prefill GPU
        (16, 4, 2),  # a decode GPU of 2 heads reads them from 2 of its 4 prefill GPUs (dedup)
    ],
)
def test_pull_bytes_per_token_across_tp_sizes(
    tmp_path: Path, prefill_tp: int, decode_tp: int, heads: int
) -> None:
    """The bytes a pull moves per token on its busiest NIC (vLLM's compute_tp_mapping): the
    decode GPU's KV x max(1, decode TP / prefill TP)."""
    config = RunConfig(trace="x", model=MODEL, gpu="h200", pd="1:1", pd_prefill_tp=prefill_tp,
                       pd_decode_tp=decode_tp)  # fmt: skip
    assert pull_bytes_per_token(*resolve_pd_pools(config, None, [])) == heads * HEAD_BYTES


def test_pulls_move_the_pools_bytes(tmp_path: Path) -> None:
    """A run's pulls move tokens x the heterogeneous-TP bytes per token (decode TP 2 from
    prefill TP 1: the prefill GPU sends all 8 heads), and summary.json says that figure."""
    trace = str(trace_of(tmp_path, 3))
    result = run(RunConfig(trace=trace, model=MODEL, gpu="h100-sxm", pd="1:1", pd_decode_tp=2),
                 keep_events=False)  # fmt: skip
    requests = result.requests_table
    assert result.summary["fleet"]["pd"]["kv_bytes_per_token"] == 8 * HEAD_BYTES
    assert (requests["pd_transfer_bytes"] == requests["pd_transfer_tokens"] * 8 * HEAD_BYTES).all()
    assert (requests["pd_transfer_tokens"] > 0).all()


@pytest.mark.parametrize(
    "options, names",
    [
        (["--model", "llama-2-70b", "--gpu", "h100-sxm", "--tp", "4", "--pd", "1:1",
          "--pd-decode-gpu", "a100-40gb", "--pd-decode-tp", "2"],
         "--pd-decode-gpu a100-40gb --pd-decode-tp 2 (decode pool): llama-2-70b does not fit"),
        (["--pd", "1:1", "--pd-prefill-gpu", "nope"], "--pd-prefill-gpu nope (prefill pool)"),
        (["--pd", "1:1", "--pd-prefill-tp", "2", "--pd-decode-tp", "3"],
         "--pd-prefill-tp 2 and --pd-decode-tp 3: one must divide the other"),
        (["--pd-decode-tp", "2"], "give --pd P:D"),
    ],
)  # fmt: skip
def test_a_bad_pool_is_one_line_exit_2(tmp_path: Path, options: list[str], names: str) -> None:
    result = CliRunner().invoke(app, ["run", str(trace_of(tmp_path, 2)), *options, "--out",
                                      str(tmp_path / "run")])  # fmt: skip
    assert result.exit_code == 2, result.output
    assert names in result.output and result.output.strip().count("\n") == 0, result.output


def test_config_json_round_trips_the_pools() -> None:
    config = RunConfig(trace="x", pd="1:1", pd_prefill_gpu="h200", pd_decode_tp=2)
    data = json.loads(json.dumps(config.to_dict()))
    assert RunConfig.from_dict(data) == config
    with pytest.raises(ConfigError, match="pd_decode_tp"):
        RunConfig(trace="x", pd="1:1", pd_decode_tp=0)
