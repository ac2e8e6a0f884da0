"""The metrics of docs/metrics.md, recomputed from their definitions and compared with
kvsim.analysis.metrics' tables and summary (on the default trace in a 240-block pool)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvsim.analysis.metrics import WALL_CLOCK_FIELDS
from kvsim.runner import RunResult

# The names outside tools read (issue 3, section 4); more may be added, none removed.
SUMMARY_FIELDS = {
    "num_requests", "num_finished", "num_rejected", "num_aborted", "num_preemptions",
    "block_size", "num_blocks", "sim_duration_s", "throughput_requests_per_s",
    "throughput_output_tokens_per_s", "ttft_s", "tpot_s", "e2e_latency_s", "kv_usage_mean",
    "kv_usage_peak", "internal_fragmentation_mean", "mean_running_seqs", "wall_time_s",
}  # fmt: skip
REQUEST_COLUMNS = {
    "request_id", "arrival_time_s", "prompt_tokens", "output_tokens", "generated_tokens",
    "status", "first_token_time_s", "finish_time_s", "num_preemptions",
}  # fmt: skip
STEP_COLUMNS = {
    "step", "time_s", "duration_s", "kind", "num_seqs", "num_batched_tokens", "free_blocks",
    "allocated_slots", "filled_slots",
}  # fmt: skip
EVENT_COLUMNS = {"time_s", "step", "kind", "seq_id", "block_id", "free_blocks"}


def test_outputs_carry_the_stable_names(pressured_run: RunResult) -> None:
    assert set(pressured_run.summary) >= SUMMARY_FIELDS
    assert set(WALL_CLOCK_FIELDS) <= set(pressured_run.summary)
    assert set(pressured_run.requests.columns) >= REQUEST_COLUMNS
    assert set(pressured_run.steps.columns) >= STEP_COLUMNS
    assert set(pressured_run.events.columns) >= EVENT_COLUMNS
    for name in ("ttft_s", "tpot_s", "e2e_latency_s", "queueing_delay_s"):
        assert set(pressured_run.summary[name]) == {"mean", "p50", "p90", "p99"}


# --- per request, from the event stream -----------------------------------------------------------


def first_time_of(
    events: pd.DataFrame, kinds: tuple[str, ...], column: str = "time_s"
) -> pd.Series:
    """Per seq_id, ``column`` of its first event of one of ``kinds``."""
    rows = events[events["kind"].astype(str).isin(kinds)]
    return rows.groupby("seq_id")[column].first()


def test_request_times_come_from_the_events(pressured_run: RunResult) -> None:
    events, steps = pressured_run.events, pressured_run.steps
    requests = pressured_run.requests.set_index("seq_id")
    arrival = first_time_of(events, ("ARRIVE",))
    admit = first_time_of(events, ("ADMIT",))
    end = first_time_of(events, ("FINISH", "ABORT", "REJECT"))
    pd.testing.assert_series_equal(requests["arrival_time_s"], arrival, check_names=False)
    assert requests["admit_time_s"].dropna().equals(admit.rename("admit_time_s"))
    assert requests["finish_time_s"].equals(end.reindex(requests.index).rename("finish_time_s"))
    # first token: the end of the step that first admitted the request
    admit_step = first_time_of(events, ("ADMIT",), "step")
    step_end = (steps["time_s"] + steps["duration_s"]).set_axis(steps["step"])
    first_token = step_end.reindex(admit_step.to_numpy()).to_numpy()
    assert (requests.loc[admit_step.index, "first_token_time_s"].to_numpy() == first_token).all()


def test_request_latencies_follow_their_formulas(pressured_run: RunResult) -> None:
    r = pressured_run.requests
    finished = r["status"] == "finished"
    arrival = r["arrival_time_s"]
    assert r["queueing_delay_s"].equals(r["admit_time_s"] - arrival)
    assert r["ttft_s"].equals(r["first_token_time_s"] - arrival)
    e2e = r["finish_time_s"] - arrival
    assert r.loc[finished, "e2e_latency_s"].equals(e2e[finished].rename("e2e_latency_s"))
    assert r.loc[~finished, "e2e_latency_s"].isna().all()
    many = finished & (r["generated_tokens"] > 1)
    tpot = (r["finish_time_s"] - r["first_token_time_s"]) / (r["generated_tokens"] - 1)
    assert np.allclose(r.loc[many, "tpot_s"], tpot[many], rtol=1e-12, atol=0)
    assert r.loc[~many, "tpot_s"].isna().all()
    assert (r["queueing_delay_s"].dropna() >= 0).all()
    assert (r["ttft_s"].dropna() > r["queueing_delay_s"].dropna()).all()


def test_preemptions_are_counted_per_request(pressured_run: RunResult) -> None:
    events, r = pressured_run.events, pressured_run.requests
    kind = events["kind"].astype(str)
    preempt = events.loc[kind == "PREEMPT", "seq_id"].value_counts()
    resume = events.loc[kind == "RESUME", "seq_id"].value_counts()
    counted = r.set_index("seq_id")["num_preemptions"]
    assert counted[counted > 0].sort_index().equals(preempt.sort_index().rename("num_preemptions"))
    # every preempted request of this run came back and finished
    assert resume.sort_index().equals(preempt.sort_index())
    assert pressured_run.summary["num_preemptions"] == len(events[kind == "PREEMPT"])


def test_generated_tokens_come_from_the_end_event(pressured_run: RunResult) -> None:
    events, r = pressured_run.events, pressured_run.requests.set_index("seq_id")
    end_tokens = first_time_of(events, ("FINISH", "ABORT", "REJECT"), "num_tokens")
    generated = (end_tokens - r.loc[end_tokens.index, "prompt_tokens"]).astype(float)
    assert r.loc[end_tokens.index, "generated_tokens"].equals(generated)


# --- events.parquet -------------------------------------------------------------------------------


def test_event_rows_and_token_counts_per_kind(pressured_run: RunResult) -> None:
    events, requests = pressured_run.events, pressured_run.requests.set_index("seq_id")
    kind = events["kind"].astype(str)
    by_kind = {k: events[kind == k] for k in kind.unique()}
    # one row per (event, block): only block events carry blocks, and always at least one
    for k, rows in by_kind.items():
        has_blocks = k in ("ALLOCATE", "APPEND_BLOCK", "FREE")
        assert ((rows["block_id"] >= 0) == has_blocks).all(), k
    assert (by_kind["STEP"]["seq_id"] == -1).all()
    assert (events.loc[kind != "STEP", "seq_id"] >= 0).all()
    # num_tokens: ARRIVE the prompt; ALLOCATE and ADMIT/RESUME the tokens prefilled;
    # APPEND_BLOCK 1; FREE and PREEMPT 0; STEP the batched tokens
    arrive = by_kind["ARRIVE"].set_index("seq_id")["num_tokens"]
    assert (arrive == requests.loc[arrive.index, "prompt_tokens"]).all()
    allocate = by_kind["ALLOCATE"].drop_duplicates(["seq_id", "time_s"])
    starts = events[kind.isin(["ADMIT", "RESUME"])]
    assert allocate["num_tokens"].tolist() == starts["num_tokens"].tolist()
    assert allocate["seq_id"].tolist() == starts["seq_id"].tolist()
    first_admit = by_kind["ADMIT"].set_index("seq_id")["num_tokens"]
    assert (first_admit == requests.loc[first_admit.index, "prompt_tokens"]).all()
    assert (by_kind["APPEND_BLOCK"]["num_tokens"] == 1).all()
    assert (by_kind["FREE"]["num_tokens"] == 0).all()
    assert (by_kind["PREEMPT"]["num_tokens"] == 0).all()
    # an ALLOCATE gives exactly ceil(tokens / block_size) blocks
    bs = pressured_run.summary["block_size"]
    per_allocate = by_kind["ALLOCATE"].groupby(["seq_id", "time_s"])
    sizes = per_allocate.agg(blocks=("block_id", "size"), tokens=("num_tokens", "first"))
    assert (sizes["blocks"] == -(-sizes["tokens"] // bs)).all()


# --- steps and summary ----------------------------------------------------------------------------


def test_summary_time_averages_are_weighted_by_step_duration(pressured_run: RunResult) -> None:
    s, steps = pressured_run.summary, pressured_run.steps
    total_slots = s["num_blocks"] * s["block_size"]
    w = steps["duration_s"]
    assert s["busy_time_s"] == pytest.approx(w.sum())
    assert s["num_steps"] == len(steps)
    usage = steps["allocated_slots"] / total_slots
    assert s["kv_usage_mean"] == pytest.approx((usage * w).sum() / w.sum())
    assert s["kv_usage_peak"] == usage.max()
    internal = (steps["allocated_slots"] - steps["filled_slots"]) / total_slots
    assert s["internal_fragmentation_mean"] == pytest.approx((internal * w).sum() / w.sum())
    assert s["mean_running_seqs"] == pytest.approx((steps["num_running"] * w).sum() / w.sum())
    assert s["mean_batch_size"] == pytest.approx((steps["num_seqs"] * w).sum() / w.sum())
    assert s["max_batch_size"] == steps["num_seqs"].max()
    assert 0 <= s["internal_fragmentation_mean"] < s["kv_usage_mean"] <= s["kv_usage_peak"] <= 1


def test_summary_counts_throughputs_and_percentiles(pressured_run: RunResult) -> None:
    s, r = pressured_run.summary, pressured_run.requests
    status = r["status"].astype(str)
    finished = r[status == "finished"]
    for name in ("finished", "rejected", "aborted", "unfinished"):
        assert s[f"num_{name}"] == (status == name).sum()
    assert s["num_requests"] == len(r)
    duration = s["sim_duration_s"]
    assert s["throughput_requests_per_s"] == pytest.approx(len(finished) / duration)
    out_tokens = finished["generated_tokens"].sum()
    assert s["throughput_output_tokens_per_s"] == pytest.approx(out_tokens / duration)
    total = out_tokens + finished["prompt_tokens"].sum()
    assert s["throughput_total_tokens_per_s"] == pytest.approx(total / duration)
    # latency distributions: over every request with a value (e2e: finished ones only),
    # numpy's linearly interpolated percentiles
    for name, values in (
        ("ttft_s", r["ttft_s"]),
        ("tpot_s", r["tpot_s"]),
        ("queueing_delay_s", r["queueing_delay_s"]),
        ("e2e_latency_s", finished["e2e_latency_s"]),
    ):
        v = values.dropna().to_numpy()
        expected = {"mean": v.mean(), **{f"p{p}": np.percentile(v, p) for p in (50, 90, 99)}}
        assert s[name] == pytest.approx(expected), name


def test_wall_clock_fields_measure_the_simulator(pressured_run: RunResult) -> None:
    s = pressured_run.summary
    assert s["wall_time_s"] > 0
    assert s["sim_requests_per_wall_s"] == pytest.approx(s["num_requests"] / s["wall_time_s"])
    assert s["sim_steps_per_wall_s"] == pytest.approx(s["num_steps"] / s["wall_time_s"])
