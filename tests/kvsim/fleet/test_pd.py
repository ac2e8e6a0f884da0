"""Prefill/decode disaggregation (``--pd P:D``, docs/fleet.md): the token timeline against a
one-replica run when transfers take no time, the pull time formula over prompt length and
concurrency, llm-d's decider threshold, and a fleet whose pools are too small that still
finishes everything without leaking a block."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import EventKind
from kvsim.config import RunConfig
from kvsim.fleet.pd_run import build_pd_fleet
from kvsim.runner import load_workload, resolve_pd_pools, run

STEP = "linear:0.005:1e-5"
ONE_TOKEN_STEP_S = 0.005 + 1e-5  # a step computing one token
BYTES_PER_TOKEN = 2 * 32 * 4096 * 2  # llama-2-7b (the default model), fp16, TP 1: 512 KiB


def write_trace(path: Path, rows: list[dict], hash_block_size: int | None = None) -> Path:
    with path.open("w") as f:
        if hash_block_size is not None:
            f.write(json.dumps({"kvsim_trace": 1, "name": path.stem,
                                "hash_block_size": hash_block_size}) + "\n")  # fmt: skip
        for i, row in enumerate(rows):
            f.write(json.dumps({"request_id": str(i), **row}) + "\n")
    return path


def run_requests(trace: Path, **options) -> dict:
    config = RunConfig(trace=str(trace), **{"step_time": STEP, **options})
    result = run(config, keep_events=False)
    return {"requests": result.requests_table, "summary": result.summary, "result": result}


def test_zero_transfer_time_matches_one_replica_within_one_step(tmp_path: Path) -> None:
    """Transfers of no time (latency 0, 1e6 GB/s) and an ample decode pool: every request's
    first token and finish come at the one-replica run's times plus at most one step, the
    decode side's computing of the prompt's last token (vLLM's rule for a load that covers the
    whole prompt). Requests one at a time, so both runs batch the same tokens; each prompt fits
    one step (kvsim's first-token time is the end of a request's admission step)."""
    rng = np.random.default_rng(0)
    rows = [
        {"arrival_time_s": 2.0 * i, "prompt_tokens": int(rng.integers(17, 4000)),
         "output_tokens": int(rng.integers(1, 60))}
        for i in range(12)
    ]  # fmt: skip
    trace = write_trace(tmp_path / "t.jsonl", rows)
    plain = run_requests(trace, num_blocks=4000, max_num_batched_tokens=4096)["requests"]
    pd = run_requests(
        trace, num_blocks=4000, max_num_batched_tokens=4096, pd="1:1", pd_link_latency_us=0.0,
        pd_link_gbps=1e6,
    )["requests"]  # fmt: skip
    assert (pd["disaggregated"] == 1).all()
    assert (pd["pd_transfer_tokens"] == pd["prompt_tokens"]).all()  # the whole prompt moved
    for name in ("first_token_time_s", "finish_time_s"):
        late = pd[name] - plain[name]
        assert (late >= 0).all() and (late <= ONE_TOKEN_STEP_S + 1e-5).all(), (name, late)
    np.testing.assert_array_equal(pd["generated_tokens"], plain["generated_tokens"])
    np.testing.assert_allclose(pd["tpot_s"][pd["output_tokens"] > 1],
                               plain["tpot_s"][plain["output_tokens"] > 1], rtol=0.25)  # fmt: skip


@pytest.mark.parametrize("latency_us, gbps", [(50.0, 25.0), (10.0, 50.0)])
def test_pull_time_grows_with_prompt_length_as_the_formula(
    tmp_path: Path, latency_us: float, gbps: float
) -> None:
    """One pull at a time: latency + prompt tokens x KV bytes per token / bandwidth."""
    prompts = [100, 1000, 4000]
    rows = [{"arrival_time_s": 5.0 * i, "prompt_tokens": p, "output_tokens": 3}
            for i, p in enumerate(prompts)]  # fmt: skip
    out = run_requests(write_trace(tmp_path / "t.jsonl", rows), num_blocks=4000, pd="1:1",
                       pd_link_latency_us=latency_us, pd_link_gbps=gbps)  # fmt: skip
    requests, pd = out["requests"], out["summary"]["fleet"]["pd"]
    assert pd["kv_bytes_per_token"] == BYTES_PER_TOKEN
    expected = [latency_us * 1e-6 + p * BYTES_PER_TOKEN / (gbps * 1e9) for p in prompts]
    np.testing.assert_allclose(requests["pd_transfer_time_s"], expected, rtol=1e-9)
    np.testing.assert_array_equal(requests["pd_transfer_bytes"],
                                  [p * BYTES_PER_TOKEN for p in prompts])  # fmt: skip
    assert pd["transfers"] == 3 and pd["transfer_bytes"] == sum(prompts) * BYTES_PER_TOKEN


def test_concurrent_pulls_share_the_link(tmp_path: Path) -> None:
    """Pulls to one decode replica at the same time share its bandwidth equally (processor
    sharing): two of s1 < s2 bytes take L + 2 s1 / B and L + 2 s1 / B + (s2 - s1) / B; three
    equal ones L + 3 s / B each. Prompts of one prefill step each, on their own prefill
    replicas (round-robin), so they hand over together."""
    latency, bandwidth = 50e-6, 25e9
    rows = [{"arrival_time_s": 0.0, "prompt_tokens": 1000, "output_tokens": 2},
            {"arrival_time_s": 0.0, "prompt_tokens": 1000, "output_tokens": 2},
            {"arrival_time_s": 0.0, "prompt_tokens": 1000, "output_tokens": 2}]  # fmt: skip
    requests = run_requests(write_trace(tmp_path / "a.jsonl", rows), num_blocks=4000,
                            pd="3:1", step_time="linear:0.005:0")["requests"]  # fmt: skip
    s = 1000 * BYTES_PER_TOKEN
    np.testing.assert_allclose(requests["pd_transfer_time_s"], latency + 3 * s / bandwidth)
    np.testing.assert_allclose(requests["pd_transfer_start_s"], 0.005)  # together
    rows = [{"arrival_time_s": 0.0, "prompt_tokens": 500, "output_tokens": 2},
            {"arrival_time_s": 0.0, "prompt_tokens": 2000, "output_tokens": 2}]  # fmt: skip
    requests = run_requests(write_trace(tmp_path / "b.jsonl", rows), num_blocks=4000,
                            pd="2:1", step_time="linear:0.005:0")["requests"]  # fmt: skip
    s1, s2 = 500 * BYTES_PER_TOKEN, 2000 * BYTES_PER_TOKEN
    np.testing.assert_allclose(
        requests["pd_transfer_time_s"],
        [latency + 2 * s1 / bandwidth, latency + 2 * s1 / bandwidth + (s2 - s1) / bandwidth],
    )


def test_decider_threshold(tmp_path: Path) -> None:
    """llm-d's decider: disaggregate only when the decode replica's uncached prompt is at
    least the threshold. A prompt below it runs whole on the decode replica; a session's next
    turn whose earlier prompt the decode replica holds (it pulled and cached it) has only its
    new tokens uncached, so it stays on the decode replica at threshold 16 and is
    disaggregated at threshold 8, moving only the uncached tokens."""
    rows = [
        {"arrival_time_s": 0.0, "prompt_tokens": 15, "output_tokens": 2},
        {"arrival_time_s": 1.0, "prompt_tokens": 16, "output_tokens": 2},
        {"arrival_time_s": 2.0, "prompt_tokens": 400, "output_tokens": 2, "session_id": "s"},
        {"arrival_time_s": 4.0, "prompt_tokens": 410, "output_tokens": 2, "session_id": "s"},
    ]
    trace = write_trace(tmp_path / "t.jsonl", rows)
    out = run_requests(trace, num_blocks=4000, pd="1:1", router_event_delay_s=0.0)
    requests = out["requests"]
    assert list(requests["disaggregated"]) == [0, 1, 1, 0]
    assert list(requests["replica"]) == [1, 0, 0, 1]  # decode replica is 1
    assert out["summary"]["fleet"]["pd"]["disaggregated_share"] == 0.5
    low = run_requests(trace, num_blocks=4000, pd="1:1", router_event_delay_s=0.0,
                       pd_threshold=8)["requests"]  # fmt: skip
    assert list(low["disaggregated"]) == [1, 1, 1, 1]
    assert low["pd_transfer_tokens"][3] == 410 - 400 // 16 * 16  # only what it lacks
    routing = out["result"].extra_tables["routing"]
    assert routing["decode_prefix_blocks"][3] == 400 // 16


def test_config_json_without_pd_is_unchanged() -> None:
    """A run without --pd writes the config.json it wrote before the P/D options existed."""
    data = RunConfig(trace="x.jsonl").to_dict()
    assert not any(name.startswith("pd") for name in data)
    assert RunConfig(trace="x.jsonl", pd="2:2").to_dict()["pd"] == "2:2"


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(
        st.tuples(st.floats(0, 2), st.integers(1, 700), st.integers(1, 30), st.integers(0, 3)),
        min_size=1,
        max_size=25,
    ),
    shape=st.sampled_from(["1:1", "2:1", "1:2"]),
    prefill_blocks=st.integers(8, 60),
    threshold=st.sampled_from([0, 16, 64]),
    router=st.sampled_from(["round-robin", "prefix", "kv-router"]),
)
def test_small_pools_queue_and_everything_finishes(
    tmp_path_factory: pytest.TempPathFactory,
    rows: list[tuple[float, int, int, int]],
    shape: str,
    prefill_blocks: int,
    threshold: int,
    router: str,
) -> None:
    """Random small traces through pools of 8-60 blocks: the run ends (no deadlock: a full
    decode pool queues its pulls), every request finishes or is rejected (a prompt no pool
    can hold), and every block of every replica is free at the end (held prefill blocks
    were released by their pulls or by the decode side's end)."""
    trace_rows = [
        {"arrival_time_s": round(t, 3), "prompt_tokens": p, "output_tokens": o,
         "session_id": f"s{s}"}
        for t, p, o, s in sorted(rows)
    ]  # fmt: skip
    path = write_trace(tmp_path_factory.mktemp("pd") / "t.jsonl", trace_rows)
    config = RunConfig(trace=str(path), step_time=STEP, pd=shape, pd_threshold=threshold,
                       router=router, num_blocks=prefill_blocks, max_num_seqs=4)  # fmt: skip
    _, trace = load_workload(config)
    replicas, fleet = build_pd_fleet(config, trace, resolve_pd_pools(config, None, []), None)
    result = fleet.run()
    assert sum(r.sim.num_done for r in replicas) == len(trace_rows) + sum(
        1 for route in result.routes if route.disaggregated and route.decode_seq >= 0
    )
    for replica in replicas:
        sched = replica.sim.scheduler
        assert not sched.has_unfinished()
        assert replica.sim.block_manager.get_num_free_blocks() == prefill_blocks
    for route in result.routes:
        if route.disaggregated and route.decode_seq >= 0:
            assert route.transfer is not None or route.request.prompt_tokens > 16 * prefill_blocks


def test_run_folder_of_a_pd_fleet(tmp_path: Path) -> None:
    """kvsim run --pd writes the transfer picture into plots/ and report.html, the pd
    columns into requests.parquet and the fleet.pd section; a bad --pd is one line, exit 2."""
    from typer.testing import CliRunner

    from kvsim.cli import app
    from kvsim.commands.summary import summary_rows

    rows = [{"arrival_time_s": 0.1 * i, "prompt_tokens": 200 + 50 * i, "output_tokens": 4}
            for i in range(6)]  # fmt: skip
    trace = write_trace(tmp_path / "t.jsonl", rows)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", str(trace), "--pd", "1:2", "--num-blocks", "400",
                                      "--step-time", STEP, "--out", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (out / "plots" / "fleet_pd_transfer.png").stat().st_size > 0
    assert 'alt="fleet-pd-transfer"' in (out / "report.html").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["fleet"]["pd"]["transfers"] == 6
    assert "P/D disaggregated" in result.output  # the terminal summary has the P/D lines
    rows = dict(summary_rows(summary))
    assert rows["fleet"] == (
        "1 prefill x 400 blocks x 16 tokens (6,400 slots) + 2 decode x 400 blocks x 16 tokens "
        "(6,400 slots)"
    )
    assert rows["P/D disaggregated"].startswith("6 requests (100.0%")
    moved = sum(200 + 50 * i for i in range(6))
    assert rows["P/D KV pulls"].startswith(f"6 of {moved:,} tokens, ")
    assert f"{BYTES_PER_TOKEN * moved / 2**20:,.1f} MiB" in rows["P/D KV pulls"]
    p50, p99 = (
        summary["fleet"]["pd"]["transfer_time_s"]["p50"],
        summary["fleet"]["pd"]["transfer_time_s"]["p99"],
    )
    assert rows["P/D pull time p50 / p99"] == f"{p50 * 1e3:.1f} ms / {p99 * 1e3:.1f} ms"
    assert json.loads((out / "config.json").read_text())["options"]["pd"] == "1:2"
    (out / "plots" / "fleet_pd_transfer.png").unlink()
    redraw = CliRunner().invoke(app, ["plot", str(out), "--force"])
    assert redraw.exit_code == 0, redraw.output
    assert (out / "plots" / "fleet_pd_transfer.png").exists()  # kvsim plot redraws it
    (out / "plots" / "fleet_pd_transfer.png").unlink()
    by_name = CliRunner().invoke(app, ["plot", str(out), "--what", "fleet-pd-transfer", "--force"])
    assert by_name.exit_code == 0, by_name.output
    assert (out / "plots" / "fleet_pd_transfer.png").exists()
    bad = CliRunner().invoke(app, ["run", str(trace), "--pd", "3"])
    assert bad.exit_code == 2 and "P:D" in bad.output


def test_progress_counts_requests_not_legs(tmp_path: Path) -> None:
    """The progress callback ends at the number of requests (a disaggregated request's two
    legs count once)."""
    rows = [{"arrival_time_s": 0.01 * i, "prompt_tokens": 100 + i, "output_tokens": 3}
            for i in range(300)]  # fmt: skip
    calls: list[tuple[float, int]] = []
    config = RunConfig(trace=str(write_trace(tmp_path / "t.jsonl", rows)), step_time=STEP,
                       pd="1:1", num_blocks=4000)  # fmt: skip
    run(config, lambda t, n: calls.append((t, n)), keep_events=False)
    assert len(calls) >= 3 and calls[-1][1] == 300
    assert [n for _, n in calls] == sorted(n for _, n in calls)


def test_a_full_decode_pool_queues_the_pull(tmp_path: Path) -> None:
    """Two 500-token prompts prefilled side by side; the decode pool (40 blocks of 16) holds
    one of them: the second is not rejected, its pull starts only once the first request has
    finished and freed its blocks, and its prefill replica keeps its blocks until that pull
    has completed."""
    rows = [{"arrival_time_s": 0.0, "prompt_tokens": 500, "output_tokens": 10},
            {"arrival_time_s": 0.0, "prompt_tokens": 500, "output_tokens": 10}]  # fmt: skip
    config = RunConfig(trace=str(write_trace(tmp_path / "t.jsonl", rows)), step_time=STEP,
                       pd="2:1", num_blocks=40)  # fmt: skip
    _, trace = load_workload(config)
    replicas, fleet = build_pd_fleet(config, trace, resolve_pd_pools(config, None, []), None)
    freed: dict[int, float] = {}  # prefill replica -> when its request's blocks were freed
    for p, replica in enumerate(replicas[:2]):
        bm = replica.sim.block_manager
        free = bm.free_sequence_v1

        def record(seq, preempted=False, p=p, free=free, sim=replica.sim):
            freed[p] = sim.env.now
            return free(seq, preempted)

        bm.free_sequence_v1 = record
    result = fleet.run()
    first, second = sorted(result.routes, key=lambda r: r.transfer.submitted_s)
    decode = replicas[2].sim
    assert decode.num_done == 2 and not decode._reject_reasons
    cols = decode.recorder.columns()[0]
    finish = (cols["kind"] == EventKind.FINISH) & (cols["seq_id"] == first.decode_seq)
    first_finish = float(cols["time_s"][finish][0])
    assert second.transfer.submitted_s >= first_finish > first.transfer.completed_s
    assert freed[second.prefill_replica] == pytest.approx(second.transfer.completed_s, abs=1e-9)
    assert freed[first.prefill_replica] == pytest.approx(first.transfer.completed_s, abs=1e-9)
