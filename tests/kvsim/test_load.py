"""Numbers that say when they mean nothing: overload (``saturated``), rejection reasons, ITL,
and the noise of measured step times (kvsim/analysis/load.py, docs/metrics.md)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvsim.analysis.load import (
    itl_samples,
    overload,
    rejections,
    step_time_noise,
    warnings,
    weighted_distribution,
)
from kvsim.config import RunConfig
from kvsim.runner import RunResult, run
from tests.kvsim.conftest import ToySim
from workloads import DEFAULT_TRACE_NAME


def requests_table(arrivals: list[float], admits: list[float | None]) -> pd.DataFrame:
    """Finished requests (service 1 s after admission) or, admit None, still waiting."""
    admit = np.array([np.nan if a is None else a for a in admits], dtype=float)
    done = ~np.isnan(admit)
    return pd.DataFrame(
        {
            "arrival_time_s": arrivals,
            "admit_time_s": admit,
            "finish_time_s": np.where(done, admit + 1.0, np.nan),
            "status": np.where(done, "finished", "unfinished"),
            "queueing_delay_s": admit - np.array(arrivals),
            "e2e_latency_s": np.where(done, admit + 1.0 - np.array(arrivals), np.nan),
            "ttft_s": np.where(done, admit + 0.1 - np.array(arrivals), np.nan),
        }
    )


def test_a_queue_that_grows_to_the_last_arrival_is_saturated() -> None:
    n = 100
    arrivals = [i * 0.1 for i in range(n)]
    # served one per second: by the last arrival (9.9 s) ~10 were admitted, 90 wait
    admits = [10.0 + i * 1.0 if i >= 10 else float(i) for i in range(n)]
    table = requests_table(arrivals, admits)
    out = overload(table, 120.0, closed_loop=False)
    assert out["saturated"] is True
    assert out["offered_rate_per_s"] == pytest.approx(10.1, rel=0.01)  # 100 in 9.9 s
    assert out["waiting_at_last_arrival"] > 2 * out["waiting_at_quarter_of_arrivals"] + 1
    assert out["service_time_p50_s"] == pytest.approx(1.0)
    assert overload(table, 120.0, closed_loop=True)["saturated"] is False


def test_a_burst_worked_off_before_the_last_arrival_is_not_saturation() -> None:
    arrivals = [0.0] * 50 + [100.0 + i for i in range(50)]
    admits = [i * 0.5 for i in range(50)] + [100.0 + i for i in range(50)]
    out = overload(requests_table(arrivals, admits), 200.0, closed_loop=False)
    assert out["saturated"] is False and out["waiting_at_last_arrival"] == 0


def test_too_few_requests_are_not_judged() -> None:
    out = overload(requests_table([0.0, 1.0, 2.0], [None, None, None]), 5.0, closed_loop=False)
    assert out["saturated"] is False and out["offered_rate_per_s"] is None


@pytest.fixture(scope="module")
def overloaded() -> RunResult:
    return run(RunConfig(trace=DEFAULT_TRACE_NAME, rate=8.0), keep_events=False)


def test_the_default_trace_is_not_saturated_and_twice_its_rate_is(
    planned_run: RunResult, overloaded: RunResult
) -> None:
    assert planned_run.summary["saturated"] is False
    s = overloaded.summary
    assert s["saturated"] is True
    assert s["offered_rate_per_s"] == pytest.approx(8.0, rel=0.01)
    assert s["served_rate_per_s"] < s["offered_rate_per_s"] / 1.5
    assert s["queueing_share_of_ttft"] > 0.9  # TTFT is the queue
    line = warnings(s)[0]
    assert line.startswith("saturated:") and "offered 8.0" in line and "served" in line


def test_a_closed_loop_is_never_saturated() -> None:
    result = run(
        RunConfig(trace=DEFAULT_TRACE_NAME, concurrency=400, until=60.0), keep_events=False
    )
    assert result.summary["saturated"] is False
    assert result.summary["offered_rate_per_s"] is None


def test_rejected_requests_carry_the_engines_reason(toy_sim: ToySim) -> None:
    # 4 blocks of 4 slots: a 20-token prompt never fits, nor does a 30-token one
    result = toy_sim([(0, 4, 2), (0, 20, 2), (1, 30, 2), (2, 5, 40)], num_blocks=4, block_size=4)
    reasons = result.requests.set_index("request_id")["finish_reason"]
    assert reasons["r0"] == "length"
    assert reasons["r1"].startswith("exceeds KV capacity: 20 tokens need 5 blocks")
    assert reasons["r2"].startswith("exceeds KV capacity: 30 tokens need 8 blocks")
    assert reasons["r3"].startswith("exceeds KV capacity")  # grows past the pool alone
    assert result.summary["num_rejected"] == 3
    counted = {r["reason"]: r["count"] for r in result.summary["rejections"]}
    assert sum(counted.values()) == 3
    common = result.summary["rejections"][0]
    assert common["count"] == 2
    assert "20 to 30 tokens need 5 to 8 blocks, the pool has 4" in common["reason"]
    assert common["example"] == reasons["r1"]


def test_rejections_merge_only_the_numbers_that_differ() -> None:
    table = pd.DataFrame(
        {
            "status": ["rejected"] * 3 + ["finished"],
            "finish_reason": [
                "prompt of 5120 tokens exceeds max_model_len 4096",
                "prompt of 4200 tokens exceeds max_model_len 4096",
                "9000 tokens exceed max_num_batched_tokens 8192 (no chunked prefill)",
                "length",
            ],
        }
    )
    assert rejections(table) == [
        {
            "reason": "prompt of 4200 to 5120 tokens exceeds max_model_len 4096",
            "count": 2,
            "example": "prompt of 5120 tokens exceeds max_model_len 4096",
        },
        {
            "reason": "9000 tokens exceed max_num_batched_tokens 8192 (no chunked prefill)",
            "count": 1,
            "example": "9000 tokens exceed max_num_batched_tokens 8192 (no chunked prefill)",
        },
    ]


def test_finish_reasons_of_every_status(pressured_run: RunResult) -> None:
    r = pressured_run.requests
    by_status = r.groupby("status", observed=True)["finish_reason"]
    assert set(by_status.get_group("finished")) <= {"length", "length (max_model_len reached)"}
    assert by_status.get_group("rejected").str.contains("exceeds").all()
    capped = r[r["finish_reason"] == "length (max_model_len reached)"]
    assert (capped["generated_tokens"] < capped["output_tokens"]).all()


def test_itl_is_the_gap_between_decode_steps_once_per_sequence(toy_sim: ToySim) -> None:
    # r0 alone decodes three steps (0.25 s each), then r1's prefill (1 + 4/16 s) stalls it,
    # then both decode together.
    result = toy_sim([(0, 4, 8), (1.9, 4, 3)], num_blocks=16, block_size=4)
    steps = result.steps
    values, weights = itl_samples(steps)
    decode = steps[steps["kind"] == "decode"]
    ends = (decode["time_s"] + decode["duration_s"]).to_numpy()
    assert np.allclose(values, np.diff(ends))
    assert weights.tolist() == decode["num_seqs"].tolist()[1:]
    assert 1.25 + 0.25 in np.round(values, 9)  # the stall: r1's prefill and one decode step
    itl = result.summary["itl_s"]
    assert itl["p50"] == 0.25
    assert itl["mean"] == pytest.approx(float(np.average(values, weights=weights)))


def test_weighted_percentiles_count_each_sample_its_weight() -> None:
    d = weighted_distribution(np.array([1.0, 2.0, 3.0]), np.array([1.0, 8.0, 1.0]))
    assert (d["p50"], d["p90"], d["p99"]) == (2.0, 2.0, 3.0)
    assert d["mean"] == pytest.approx(2.0)
    assert weighted_distribution(np.empty(0), np.empty(0))["p50"] is None


def test_step_time_noise_is_the_spread_of_same_sized_decode_steps() -> None:
    steps = pd.DataFrame(
        {
            "kind": ["decode"] * 10 + ["prefill"],
            "num_seqs": [4] * 5 + [8] * 5 + [4],
            "duration_s": [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 3.0, 1.0, 3.0, 2.0, 50.0],
        }
    )
    cv8 = float(np.std([1.0, 3.0, 1.0, 3.0, 2.0], ddof=1) / 2.0)
    assert step_time_noise(steps) == pytest.approx(cv8 / 2)  # (0 + cv8) / 2
    assert step_time_noise(steps.iloc[:3]) is None  # fewer than 5 steps of a size


def test_cost_mode_says_its_times_are_modelled(planned_run: RunResult) -> None:
    s = planned_run.summary
    assert s["timing"] == "cost model" and s["step_time_noise_cv"] is None
    assert not any(w.startswith("engine mode") for w in warnings(s))
    finished = planned_run.requests[planned_run.requests["status"] == "finished"]
    assert s["total_prompt_tokens"] == int(finished["prompt_tokens"].sum())
    assert s["total_output_tokens"] == int(finished["generated_tokens"].sum())
