"""The compiled transfer link (engine/compiled: CompiledTransferLink, csrc/transfer_link.hpp)
against the readable one (engine/offload/transfer.py's TransferLink): random jobs (both
directions, sizes from 0 bytes to past the service counter's rebase point, submissions at
non-decreasing times, polls in between) on links with and without latency, processor-shared
and FIFO. After each operation both must give the same next completion time and the same
completions with their times, bit for bit, and the same counts in flight and active."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.compiled import load
from engine.offload.transfer import TransferError, TransferLink, make_transfer_link

pytestmark = pytest.mark.skipif(load() is None, reason="the compiled core is not built")


def _same_state(py: TransferLink, cc: Any, what: str) -> None:
    assert py.next_completion_time() == cc.next_completion_time(), what
    assert py.in_flight() == cc.in_flight(), what
    for d in ("read", "write"):
        assert (py.in_flight(d), py.active(d)) == (cc.in_flight(d), cc.active(d)), what
    assert py.now == cc.now, what


# One check, two strengths: a sample in the default run, the full 300 examples under
# -m slow (.ci/run runs both).
_STRATEGIES = dict(
    data=st.data(),
    discipline=st.sampled_from(["shared", "fifo"]),
    read=st.sampled_from([1e9, 5e10, 3.3e11, 1e12]),
    write=st.sampled_from([1e9, 2.5e10, 7e11]),
    latency=st.sampled_from([0.0, 1e-5, 8e-5, 0.003]),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**_STRATEGIES)  # type: ignore[arg-type]
def test_compiled_link_matches_the_python_link(
    data: Any, discipline: str, read: float, write: float, latency: float
) -> None:
    _check(data, discipline, read, write, latency)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**_STRATEGIES)  # type: ignore[arg-type]
def test_compiled_link_matches_the_python_link_slow(
    data: Any, discipline: str, read: float, write: float, latency: float
) -> None:
    _check(data, discipline, read, write, latency)


def _check(data: Any, discipline: str, read: float, write: float, latency: float) -> None:
    py = TransferLink(read, write, latency, discipline=discipline)  # type: ignore[arg-type]
    cc = make_transfer_link(read, write, latency, discipline=discipline, compiled=True)  # type: ignore[arg-type]
    now = 0.0
    job = 0
    sizes = st.one_of(
        st.sampled_from([0, 4096, 2 * 1024 * 1024, 3 * 1024**3]),
        st.integers(0, 1 << 42),
        st.floats(0.0, 5e12, allow_nan=False),
    )
    for step in range(data.draw(st.integers(1, 80), label="operations")):
        op = data.draw(st.sampled_from(["submit", "submit", "advance", "to next"]))
        if op == "submit":
            now += data.draw(st.sampled_from([0.0, 0.0, 1e-6, 1e-4, 0.01, 1.0]))
            direction = data.draw(st.sampled_from(["read", "write"]))
            nbytes = data.draw(sizes)
            py.submit(job, direction, nbytes, now)
            cc.submit(job, direction, nbytes, now)
            job += 1
        elif op == "advance":
            now += data.draw(st.sampled_from([0.0, 1e-5, 0.001, 0.05, 2.0, 100.0]))
            assert py.advance_with_times(now) == cc.advance_with_times(now), step
        else:
            due = py.next_completion_time()
            if due is not None:
                now = max(now, due)  # exactly at a completion: ties with joins
                assert py.advance_with_times(now) == cc.advance_with_times(now), step
        _same_state(py, cc, f"operation {step} ({op})")
    end = now + 1e9
    assert py.advance_with_times(end) == cc.advance_with_times(end)


def test_compiled_link_refuses_what_the_python_one_refuses() -> None:
    link = make_transfer_link(1e9, 1e9, 0.0, compiled=True)
    link.submit(1, "read", 100, 1.0)
    with pytest.raises(TransferError, match="already in flight"):
        link.submit(1, "write", 100, 1.0)
    with pytest.raises(TransferError, match="before the link's clock"):
        link.advance(0.5)
    with pytest.raises(TransferError, match="nbytes"):
        link.submit(2, "read", -1, 1.0)
    with pytest.raises(TransferError, match="direction"):
        link.submit(2, "up", 1, 1.0)  # type: ignore[arg-type]
    with pytest.raises(TransferError, match="discipline"):
        make_transfer_link(1e9, 1e9, 0.0, discipline="lifo", compiled=True)  # type: ignore[arg-type]
    # two equal jobs together take twice as long each as one alone (processor sharing)
    link.submit(2, "read", 100, 1.0)
    assert link.advance_with_times(2.0) == [(1.0 + 200 / 1e9, 1), (1.0 + 200 / 1e9, 2)]
