"""Saturation as a three-level verdict with its figures (kvsim/analysis/saturation.py,
docs/metrics.md "Saturation"): constructed queues whose answer is known, and the Azure conv
trace on one A100 (the README's saturated example)."""

from __future__ import annotations

import heapq
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from kvsim.analysis.load import overload, saturation_text, warnings
from kvsim.analysis.saturation import NEAR, SATURATED, STABLE, queue_trend
from kvsim.commands.summary import summary_rows as terminal_rows
from kvsim.config import RunConfig
from kvsim.outputs.report import summary_rows as report_rows
from kvsim.runner import run


def fifo_table(
    arrival: np.ndarray, service_s: float, prefill_s: float = 0.1, servers: int = 1
) -> pd.DataFrame:
    """requests.parquet's columns for ``servers`` FIFO servers taking ``service_s`` per
    request (an M/D/1 queue when ``arrival`` is Poisson and ``servers`` 1; many servers are
    an engine's batch); the first token ``prefill_s`` after admission."""
    admit = np.empty_like(arrival)
    free_at = [-math.inf] * servers  # a heap of the moments each server frees up
    for i, a in enumerate(arrival):  # Lindley's recursion, per server
        admit[i] = max(a, heapq.heappop(free_at))
        heapq.heappush(free_at, admit[i] + service_s)
    finish = admit + service_s
    return pd.DataFrame(
        {
            "arrival_time_s": arrival,
            "admit_time_s": admit,
            "finish_time_s": finish,
            "status": "finished",
            "queueing_delay_s": admit - arrival,
            "ttft_s": admit + prefill_s - arrival,
            "e2e_latency_s": finish - arrival,
        }
    )


def verdict_of(table: pd.DataFrame) -> dict:
    end = float(table["finish_time_s"].max())
    return overload(table, end, closed_loop=False)["saturation"]


@pytest.mark.parametrize("backlog", [0, 50, 1000])
def test_a_queue_growing_linearly_is_saturated_whatever_its_start(backlog: int) -> None:
    # `backlog` requests at 0, then 10 req/s for 200 s, served at 8 req/s: the queue grows
    # by 2 req/s from wherever it starts (the old rule, twice the quarter-mark queue, missed
    # the 1000 start: 1,400 waiting at the end against 1,100 at the quarter mark)
    arrival = np.concatenate([np.zeros(backlog), np.arange(2000) / 10.0])
    v = verdict_of(fifo_table(arrival, service_s=1 / 8))
    assert v["verdict"] == SATURATED
    assert v["queue_slope_per_s"] == pytest.approx(2.0, rel=0.05)
    low, high = v["queue_slope_ci95_per_s"]
    assert 1.9 < low <= v["queue_slope_per_s"] <= high < 2.1
    assert v["served_rate_per_s"] == pytest.approx(8.0, rel=0.02)
    assert v["queueing_share_of_ttft"] > 0.99


@pytest.mark.parametrize("seed", range(5))
def test_a_stable_md1_queue_at_rho_0_7_is_stable(seed: int) -> None:
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1 / 0.7, 3000))  # Poisson, 0.7 req/s; 1 s service
    v = verdict_of(fifo_table(arrival, service_s=1.0))
    assert v["verdict"] == STABLE, v["reason"]
    low, high = v["queue_slope_ci95_per_s"]
    assert low <= 0.0 <= high  # no trend
    assert v["served_share"] == pytest.approx(1.0, abs=0.01)


def test_an_overloaded_md1_queue_is_saturated() -> None:
    rng = np.random.default_rng(0)
    arrival = np.cumsum(rng.exponential(1 / 1.2, 1000))  # rho = 1.2
    v = verdict_of(fifo_table(arrival, service_s=1.0))
    assert v["verdict"] == SATURATED
    assert v["served_rate_per_s"] == pytest.approx(1.0, rel=0.05)
    assert v["queue_growth_share"] == pytest.approx(0.2 / 1.2, rel=0.25)


@pytest.mark.parametrize(
    ("service_rate", "verdict"),
    [(10.0, STABLE), (9.95, STABLE), (9.85, NEAR), (9.7, SATURATED)],
)
def test_the_verdict_passes_through_near_saturation(service_rate: float, verdict: str) -> None:
    # 10 req/s for 200 s served at a rate a little below it: the queue grows by 0%, 0.5%, 1.5%
    # and 3% of the arrivals; 1.5% is below the 2% that saturates, above the 1% that warns
    v = verdict_of(fifo_table(np.arange(2000) / 10.0, service_s=1 / service_rate))
    assert v["verdict"] == verdict, v["reason"]


def test_a_growing_queue_is_saturated_before_its_wait_reaches_two_service_times() -> None:
    # a batch of 100 taking 10 s per request serves 10 req/s; 10.5 req/s arrive for 200 s:
    # the queue grows by 0.5 req/s (4.8% of arrivals) while the last wait about one service
    # time, so the trend alone decides
    arrival = np.arange(2100) / 10.5
    v = verdict_of(fifo_table(arrival, service_s=10.0, servers=100))
    assert v["backlog_service_times"] < 2
    assert v["queue_growth_share_low"] > 0.02
    assert v["verdict"] == SATURATED, v["reason"]


def test_a_large_backlog_that_no_longer_grows_is_saturated() -> None:
    # 500 requests at once, then arrivals exactly at the service rate: the queue stays at
    # ~500 (no trend), so every later request waits 500 service times
    arrival = np.concatenate([np.zeros(500), 1.0 + np.arange(1000) * 1.0])
    v = verdict_of(fifo_table(arrival, service_s=1.0))
    assert abs(v["queue_growth_share"]) < 0.02
    assert v["backlog_service_times"] > 100 and v["backlog_share_of_window"] > 0.4
    assert v["verdict"] == SATURATED


def test_the_slope_is_least_squares_and_its_interval_is_widened_for_autocorrelation() -> None:
    rng = np.random.default_rng(3)
    times = np.linspace(0.0, 100.0, 200)
    counts = np.round(5 + 0.3 * times + np.cumsum(rng.normal(0, 1, 200))).astype(np.int64)
    trend = queue_trend(times, counts)
    fit = stats.linregress(times, counts)
    assert trend.slope_per_s == pytest.approx(fit.slope, rel=1e-12)
    r = trend.lag1_autocorrelation
    assert 0.5 < r <= 0.9  # a random walk's residuals are strongly autocorrelated
    assert trend.stderr_per_s == pytest.approx(fit.stderr * math.sqrt((1 + r) / (1 - r)))
    assert trend.low_per_s < fit.slope - 1.96 * fit.stderr  # wider than the naive interval


def test_the_warning_and_summary_text_say_the_verdict_and_its_figures() -> None:
    table = fifo_table(np.arange(2000) / 10.0, service_s=1 / 8)
    summary = overload(table, float(table["finish_time_s"].max()), closed_loop=False)
    assert summary["saturated"] is True
    line = warnings(summary)[0]
    assert line.startswith("saturated: arrivals outpace service (offered 10.01 req/s")
    assert "95% interval" in line and "queueing is 100% of TTFT" in line
    assert saturation_text(summary).startswith("saturated (queue +2.00 req/s, 20.0% of offered")
    near = fifo_table(np.arange(2000) / 10.0, service_s=1 / 9.85)
    summary = overload(near, float(near["finish_time_s"].max()), closed_loop=False)
    assert summary["saturated"] is False
    assert warnings(summary)[0].startswith("near saturation: offered 10.01 req/s")


def test_closed_loops_and_handfuls_are_not_judged() -> None:
    table = fifo_table(np.arange(2000) / 10.0, service_s=1 / 8)
    v = overload(table, 1e4, closed_loop=True)["saturation"]
    assert v == {"verdict": STABLE, "judged": False, "reason": v["reason"]}
    assert v["reason"].startswith("closed loop")
    few = overload(table.iloc[:5], 1e4, closed_loop=False)["saturation"]
    assert not few["judged"] and "fewer than 20" in few["reason"]
    assert warnings({"saturation": few}) == []


def test_the_azure_conv_trace_on_one_a100_is_saturated() -> None:
    # the README's example: the whole trace (19,366 requests) on llama-2-7b / A100-80GB
    s = run(RunConfig(trace="azure_llm_2023_conv"), keep_events=False).summary
    v = s["saturation"]
    assert s["saturated"] is True and v["verdict"] == SATURATED, v["reason"]
    assert v["queue_growth_share_low"] > 0.02
    assert v["backlog_service_times"] > 10
    assert v["queueing_share_of_ttft"] > 0.99
    # the terminal's and report.html's summary rows say it, with the headline figures
    terminal = dict(terminal_rows(s))["saturation"]
    assert terminal == dict(report_rows(s))["saturation"]
    assert (
        terminal.startswith("saturated (queue +0.")
        and "of offered; queueing 100% of TTFT" in terminal
    )
    assert warnings(s)[0].startswith("saturated: arrivals outpace service (offered 5.53 req/s")
