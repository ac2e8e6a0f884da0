"""Synthetic traces are seeded (same seed, same bytes) and have roughly the asked statistics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from workloads import (
    ArrivalProcess,
    SpecError,
    WorkloadError,
    generate_trace,
    mean_arrival_rate,
    parse_length_spec,
    save_trace,
    trace_stats,
)
from workloads.lengths import LengthKind, sample_lengths


def make(seed: int = 1, **kw: object):  # type: ignore[no-untyped-def]
    options: dict[str, object] = {
        "arrivals": ArrivalProcess(rate_per_s=20.0),
        "prompt": "lognormal:1000:1.0",
        "output": "uniform:1:100",
        "num_requests": 2000,
        "seed": seed,
        **kw,
    }
    return generate_trace(**options)  # type: ignore[arg-type]


def test_same_seed_gives_identical_bytes(tmp_path: Path) -> None:
    source = "trace:azure_llm_2023_conv_first_2min"
    for name in ("a", "b"):
        save_trace(make(seed=7, prompt=source), tmp_path / f"{name}.jsonl")
    save_trace(make(seed=8, prompt=source), tmp_path / "c.jsonl")
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert (tmp_path / "a.jsonl").read_bytes() != (tmp_path / "c.jsonl").read_bytes()


def test_a_shared_generator_is_accepted() -> None:
    rng = np.random.default_rng(5)
    assert make(seed=rng) != make(seed=rng)  # the stream moved on
    assert make(seed=np.random.default_rng(5)) == make(seed=5)


@pytest.mark.parametrize(("kind", "cv"), [("poisson", 1.0), ("gamma", 0.5), ("gamma", 3.0)])
def test_rate_and_burstiness_are_roughly_right(kind: str, cv: float) -> None:
    process = ArrivalProcess(rate_per_s=20.0, kind=kind, cv=cv)  # type: ignore[arg-type]
    stats = trace_stats(make(arrivals=process, num_requests=20_000, prompt="fixed:8", output="3"))
    assert stats["mean_rate_per_s"] == pytest.approx(20.0, rel=0.1)
    assert stats["interarrival_cv"] == pytest.approx(cv, rel=0.1)


def test_duration_mode_keeps_arrivals_inside_the_window() -> None:
    trace = make(num_requests=None, duration_s=100.0, arrivals=ArrivalProcess(rate_per_s=50.0))
    times = [r.arrival_time_s for r in trace.requests]
    assert times[0] > 0 and times[-1] < 100.0
    assert len(trace) == pytest.approx(5000, rel=0.1)
    assert [r.request_id for r in trace.requests[:3]] == ["0", "1", "2"]


def test_length_distributions() -> None:
    rng = np.random.default_rng(0)
    lognormal = sample_lengths(parse_length_spec("lognormal:1000:1.0"), 50_000, rng)
    assert lognormal.mean() == pytest.approx(1000, rel=0.05)
    assert lognormal.std() / lognormal.mean() == pytest.approx(1.0, rel=0.1)
    capped = sample_lengths(parse_length_spec("lognormal:1000:2:4096"), 10_000, rng)
    assert capped.min() >= 1 and capped.max() == 4096
    uniform = sample_lengths(parse_length_spec("uniform:3:5"), 10_000, rng)
    assert set(uniform.tolist()) == {3, 4, 5}
    assert set(sample_lengths(parse_length_spec("512"), 10, rng).tolist()) == {512}


def test_trace_spec_resamples_pairs_from_the_shipped_trace() -> None:
    pairs = {
        (r.prompt_tokens, r.output_tokens)
        for r in make(
            prompt="trace:azure_llm_2023_code", output="trace:azure_llm_2023_code"
        ).requests
    }
    from workloads import load_trace, shipped_trace_path

    source = load_trace(shipped_trace_path("azure_llm_2023_code"))
    assert pairs <= {(r.prompt_tokens, r.output_tokens) for r in source.requests}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("uniform:5", "expected fixed:N"),
        ("uniform:9:3", "LO must be <= HI"),
        ("fixed:0", "lengths must be >= 1"),
        ("fixed:x", "'x' is not an integer"),
        ("lognormal:-1:1", "'-1' is out of range"),
        ("normal:5:1", "expected fixed:N"),
        ("trace:", "expected fixed:N"),
    ],
)
def test_bad_specs(spec: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_length_spec(spec)


def test_spec_kinds() -> None:
    assert parse_length_spec("trace:x.jsonl").kind is LengthKind.TRACE
    assert parse_length_spec("lognormal:10:0").params == (10.0, 0.0, float("inf"))


def test_bad_arrival_parameters() -> None:
    with pytest.raises(SpecError, match="use gamma"):
        ArrivalProcess(rate_per_s=1.0, cv=2.0)
    with pytest.raises(SpecError, match="rate must be"):
        ArrivalProcess(rate_per_s=0.0)
    with pytest.raises(WorkloadError, match="no request arrives"):
        make(num_requests=None, duration_s=1e-9, arrivals=ArrivalProcess(rate_per_s=1.0))


def test_mean_rate_definition() -> None:
    trace = make()
    span = trace.requests[-1].arrival_time_s - trace.requests[0].arrival_time_s
    assert mean_arrival_rate(trace) == (len(trace) - 1) / span
