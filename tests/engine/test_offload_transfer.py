"""The offload transfer timing model (engine/offload/transfer.py, docs/offload.md "Transfer
model"): latency, then processor sharing of each direction's bandwidth."""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.offload.transfer import TransferError, TransferLink, TransferLinks

GB = 1e9
BLOCK = 2 * 1024 * 1024  # bytes: a 16-token block of llama-3.1-8b in bf16


def run_to_end(link: TransferLink) -> list[tuple[float, object]]:
    """Every completion, stepping from one next_completion_time to the next."""
    done: list[tuple[float, object]] = []
    while (t := link.next_completion_time()) is not None:
        step = link.advance_with_times(t)
        assert step, "advancing to the next completion time completes a job"
        assert all(time == t for time, _ in step)
        done += step
    return done


@pytest.mark.parametrize("latency", [0.0, 5e-6, 80e-6])
@pytest.mark.parametrize("start", [0.0, 1.25, 1234.5678])
def test_one_job_alone_takes_latency_plus_bytes_over_bandwidth(latency: float, start: float):
    link = TransferLink(50 * GB, 25 * GB, latency)
    link.advance(start)
    link.submit("load", "read", 8 * BLOCK, start)
    link.submit("store", "write", 3 * BLOCK, start)
    assert run_to_end(link) == sorted(
        [(start + latency + 8 * BLOCK / (50 * GB), "load"),
         (start + latency + 3 * BLOCK / (25 * GB), "store")]
    )  # fmt: skip


def test_two_identical_concurrent_loads_each_take_twice_as_long():
    alone = TransferLink(50 * GB, 50 * GB, 0.0)
    alone.submit(0, "read", 10 * BLOCK, 0.0)
    ((t_alone, _),) = run_to_end(alone)
    link = TransferLink(50 * GB, 50 * GB, 0.0)
    link.submit(0, "read", 10 * BLOCK, 0.0)
    link.submit(1, "read", 10 * BLOCK, 0.0)
    # both finish together, reported in submission order
    assert run_to_end(link) == [(2 * t_alone, 0), (2 * t_alone, 1)]


def test_two_identical_concurrent_loads_with_latency():
    latency, nbytes, bandwidth = 80e-6, 6 * BLOCK, 7 * GB
    link = TransferLink(bandwidth, 5 * GB, latency)
    link.submit("a", "read", nbytes, 0.0)
    link.submit("b", "read", nbytes, 0.0)
    expected = latency + 2 * nbytes / bandwidth
    assert link.next_completion_time() == expected
    assert link.advance(expected) == ["a", "b"]
    assert link.next_completion_time() is None


def test_a_job_arriving_mid_transfer_slows_the_first_as_processor_sharing_says():
    # 100 bytes/s. A: 1000 bytes at t=0, alone until t=4 (600 left). B: 500 bytes at t=4.
    # Both at 50 bytes/s: B done at 4 + 500/50 = 14, A has 600 - 500 = 100 left, alone: 15.
    link = TransferLink(100.0, 100.0, 0.0)
    link.submit("A", "read", 1000, 0.0)
    assert link.next_completion_time() == 10.0
    assert link.advance(4.0) == []
    link.submit("B", "read", 500, 4.0)
    assert link.next_completion_time() == 14.0
    assert link.advance_with_times(14.5) == [(14.0, "B")]
    assert link.next_completion_time() == 15.0
    assert link.advance_with_times(100.0) == [(15.0, "A")]


def test_latency_is_a_delay_without_bandwidth():
    # B submitted at t=1 with latency 2 joins at 3: A (300 bytes at 100/s) is alone until 3.
    link = TransferLink(100.0, 100.0, 2.0)
    link.submit("A", "read", 300, 0.0)  # joins at 2, alone until 3: 100 bytes, 200 left
    link.submit("B", "read", 50, 1.0)  # joins at 3, both at 50/s: B done at 4, A has 150 left
    assert run_to_end(link) == [(4.0, "B"), (5.5, "A")]  # A alone from 4: 150 / 100 more


def test_reads_and_writes_do_not_share_bandwidth():
    link = TransferLink(10 * GB, 10 * GB, 0.0)
    link.submit("load", "read", 4 * BLOCK, 0.0)
    link.submit("store", "write", 4 * BLOCK, 0.0)
    t = 4 * BLOCK / (10 * GB)
    assert run_to_end(link) == [(t, "load"), (t, "store")]


def test_polling_does_not_change_the_results():
    """State changes only at joins and completions: polling at odd times gives the same
    floats as jumping from completion to completion."""
    jobs = [(i, "read" if i % 3 else "write", (i * 7919) % 50 * BLOCK, i / 1024) for i in range(40)]
    plain, polled = TransferLink(30 * GB, 20 * GB, 5e-6), TransferLink(30 * GB, 20 * GB, 5e-6)
    seen_plain, seen_polled = [], []
    for job, direction, nbytes, t in jobs:
        seen_plain += plain.advance_with_times(t)
        plain.submit(job, direction, nbytes, t)
        for k in range(7):
            seen_polled += polled.advance_with_times(t - 1e-4 + k * 1.3e-5 if t else 0.0)
        seen_polled += polled.advance_with_times(t)
        polled.submit(job, direction, nbytes, t)
    assert seen_plain + run_to_end(plain) == seen_polled + run_to_end(polled)


def test_fifo_runs_one_job_at_a_time_in_submission_order():
    """vLLM's CPU worker: each transfer's stream waits for the previous one's end event."""
    latency, nbytes, bandwidth = 5e-6, 6 * BLOCK, 50 * GB
    link = TransferLink(bandwidth, bandwidth, latency, discipline="fifo")
    link.submit("a", "read", nbytes, 0.0)
    link.submit("b", "read", nbytes, 0.0)
    link.submit("w", "write", nbytes, 0.0)  # its own direction: not behind a or b
    first = latency + nbytes / bandwidth
    assert run_to_end(link) == [(first, "a"), (first, "w"), (first + nbytes / bandwidth, "b")]
    link.submit("late", "read", nbytes, 1.0)  # an idle link: latency + bytes / bandwidth again
    assert run_to_end(link) == [(1.0 + latency + nbytes / bandwidth, "late")]


def test_links_keyed_by_tier_report_in_completion_order():
    links = TransferLinks({"cpu": TransferLink(50 * GB, 50 * GB, 0.0),
                           "disk": TransferLink(7 * GB, 5 * GB, 80e-6)})  # fmt: skip
    links.submit("disk", "d", "read", BLOCK, 0.0)
    links.submit("cpu", "c", "read", BLOCK, 0.0)
    links.submit("cpu", "c2", "write", BLOCK, 0.0)
    first = BLOCK / (50 * GB)
    assert links.next_completion_time() == first
    assert links.advance(1.0) == ["c", "c2", "d"]  # equal times: submission order
    assert links.next_completion_time() is None


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: TransferLink(0.0, 1.0, 0.0), "read_bytes_per_s must be a finite number > 0"),
        (lambda: TransferLink(1.0, float("inf"), 0.0), "write_bytes_per_s"),
        (lambda: TransferLink(1.0, 1.0, -1e-6), "latency_s must be a finite number >= 0"),
    ],
)
def test_bad_links_are_refused(build, message):
    with pytest.raises(TransferError, match=message):
        build()


def test_bad_jobs_are_refused():
    link = TransferLink(1.0, 1.0, 0.0)
    link.submit("a", "read", 10, 5.0)
    with pytest.raises(TransferError, match="already in flight"):
        link.submit("a", "write", 1, 5.0)
    with pytest.raises(TransferError, match="before the link's clock"):
        link.submit("b", "read", 1, 4.0)
    with pytest.raises(TransferError, match="direction must be one of"):
        link.submit("b", "sideways", 1, 5.0)  # type: ignore[arg-type]
    with pytest.raises(TransferError, match="nbytes must be a finite number >= 0"):
        link.submit("b", "read", -1, 5.0)
    assert link.advance(15.0) == ["a"]
    link.submit("a", "read", 0, 15.0)  # an id completed may be used again; 0 bytes: at once
    assert link.advance(15.0) == ["a"]


# --- properties, against an exact rational processor-sharing reference -------------------------


def exact_completions(
    jobs: list[tuple[int, str, int, Fraction]], bandwidth: dict[str, Fraction], latency: Fraction
) -> dict[int, Fraction]:
    """Processor sharing computed in rationals, remaining bytes per job (not virtual time)."""
    finished: dict[int, Fraction] = {}
    for direction in ("read", "write"):
        mine = [(t + latency, job, Fraction(n)) for job, d, n, t in jobs if d == direction]
        pending = sorted(mine)
        active: dict[int, Fraction] = {}
        clock = Fraction(0)
        while pending or active:
            rate = bandwidth[direction] / len(active) if active else None
            finish = clock + min(active.values()) / rate if rate else None
            join = pending[0][0] if pending else None
            if finish is not None and (join is None or finish <= join):
                served = (finish - clock) * rate
                for job in list(active):
                    active[job] -= served
                    if active[job] == 0:
                        finished[job] = finish
                        del active[job]
                clock = finish
            else:
                assert join is not None
                if rate:
                    for job in active:
                        active[job] -= (join - clock) * rate
                clock = join
                _, job, n = pending.pop(0)
                if n == 0:
                    finished[job] = join
                else:
                    active[job] = n
    return finished


job_lists = st.lists(
    st.tuples(
        st.sampled_from(["read", "write"]),
        st.integers(0, 64),  # blocks
        st.integers(0, 2000),  # submission time, microseconds
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(
    discipline=st.sampled_from(["shared", "fifo"]),
    jobs=job_lists,
    read_gbps=st.sampled_from([1, 7, 25, 50, 450]),
    write_gbps=st.sampled_from([0.55, 5, 25, 50]),
    latency_us=st.sampled_from([0, 3, 5, 80]),
)
def test_transfer_properties(discipline, jobs, read_gbps, write_gbps, latency_us):
    bandwidth = {"read": read_gbps * GB, "write": write_gbps * GB}
    latency = latency_us * 1e-6
    block = 1 << 16
    link = TransferLink(bandwidth["read"], bandwidth["write"], latency, discipline=discipline)
    submitted = sorted(
        (Fraction(t, 10**6), i, d, n * block) for i, (d, n, t) in enumerate(jobs)
    )  # in time order, then by index
    done: list[tuple[float, object]] = []
    for t, job, direction, nbytes in submitted:
        done += link.advance_with_times(float(t))
        link.submit(job, direction, nbytes, float(t))
    done += run_to_end(link)
    when = dict((job, time) for time, job in done)

    # every job completes once, reported in completion order
    assert sorted(when) == sorted(job for _t, job, _d, _n in submitted)
    assert [t for t, _ in done] == sorted(t for t, _ in done)
    if discipline == "shared":  # as the exact (rational) model says, within rounding
        exact = exact_completions(
            [(job, d, n, t) for t, job, d, n in submitted],
            {k: Fraction(v) for k, v in bandwidth.items()},
            Fraction(latency),
        )
        for job, time in when.items():
            assert time == pytest.approx(float(exact[job]), rel=1e-12, abs=1e-15)
    else:  # each direction completes its jobs in submission order
        for direction in ("read", "write"):
            mine = [job for _t, job, d, _n in submitted if d == direction]
            assert sorted(mine, key=lambda j: when[j]) == mine
    # no job finishes before latency + bytes / bandwidth after its submission
    for t, job, direction, nbytes in submitted:
        assert when[job] >= (float(t) + latency + nbytes / bandwidth[direction]) * (1 - 1e-12)
    # work conservation: while jobs are active the direction moves exactly B bytes/s in
    # total, so its bytes equal B times the length of the union of the active intervals
    for direction in ("read", "write"):
        intervals = sorted(
            (float(t) + latency, when[job])
            for t, job, d, n in submitted
            if d == direction and n > 0
        )
        busy, end = 0.0, -1.0
        for start, stop in intervals:
            busy += max(0.0, stop - max(start, end))
            end = max(end, stop)
        moved = sum(n for _t, _j, d, n in submitted if d == direction)
        assert moved == pytest.approx(bandwidth[direction] * busy, rel=1e-9)
    # equal completion times come out in submission order
    order = {job: rank for rank, (_t, job, _d, _n) in enumerate(submitted)}
    for (t1, j1), (t2, j2) in itertools.pairwise(done):
        if t1 == t2:
            assert order[j1] < order[j2]


@settings(max_examples=60, deadline=None)
@given(jobs=job_lists)
def test_same_inputs_same_floats(jobs):
    def run() -> list[tuple[float, object]]:
        link = TransferLink(25 * GB, 12.5 * GB, 5e-6)
        out: list[tuple[float, object]] = []
        for i, (direction, n, t) in sorted(enumerate(jobs), key=lambda x: (x[1][2], x[0])):
            out += link.advance_with_times(t * 1e-6)
            link.submit(i, direction, n * 4096, t * 1e-6)
        return out + run_to_end(link)

    first, second = run(), run()
    assert [(t.hex(), j) for t, j in first] == [(t.hex(), j) for t, j in second]
