"""simpy processes: open loop submits on time, closed loop bounds concurrency, cancellation
aborts only unfinished requests."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from workloads import Request, WorkloadError, cancel_after, closed_loop, open_loop


class FakeServer:
    """Serves each request in ``service_s`` seconds; records submissions and aborts."""

    def __init__(self, env: simpy.Environment, service_s: float) -> None:
        self.env = env
        self.service_s = service_s
        self.submitted: list[tuple[float, Request]] = []
        self.aborted: list[tuple[float, str]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._done: dict[str, simpy.Event] = {}

    def submit(self, request: Request) -> simpy.Event:
        self.submitted.append((self.env.now, request))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        done = self.env.event()
        self._done[request.request_id] = done
        self.env.process(self._serve(request.request_id))
        return done

    def _serve(self, request_id: str):  # type: ignore[no-untyped-def]
        yield self.env.timeout(self.service_s)
        self._finish(request_id)

    def _finish(self, request_id: str) -> None:
        done = self._done[request_id]
        if not done.triggered:
            self.in_flight -= 1
            done.succeed()

    def abort(self, request_id: str) -> None:
        if not self._done[request_id].triggered:  # no-op for finished requests
            self.aborted.append((self.env.now, request_id))
            self._finish(request_id)


def reqs(*times: float, cancel: float | None = None) -> list[Request]:
    return [
        Request(
            request_id=str(i),
            arrival_time_s=t,
            prompt_tokens=8,
            output_tokens=2,
            cancel_after_s=cancel,
        )
        for i, t in enumerate(times)
    ]


def test_open_loop_submits_at_arrival_times_and_ends_when_all_finish() -> None:
    env = simpy.Environment()
    server = FakeServer(env, service_s=1.0)
    process = env.process(open_loop(env, reqs(0.0, 0.5, 0.5, 3.25), server.submit))
    env.run(until=process)
    assert [(t, r.request_id) for t, r in server.submitted] == [
        (0.0, "0"), (0.5, "1"), (0.5, "2"), (3.25, "3")
    ]  # fmt: skip
    assert env.now == 4.25


def test_closed_loop_never_exceeds_concurrency() -> None:
    env = simpy.Environment()
    server = FakeServer(env, service_s=1.0)
    process = env.process(closed_loop(env, reqs(*[100.0] * 10), server.submit, concurrency=3))
    env.run(until=process)
    assert server.max_in_flight == 3
    assert [t for t, _ in server.submitted] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]
    assert [r.request_id for _, r in server.submitted] == [str(i) for i in range(10)]
    assert [r.arrival_time_s for _, r in server.submitted][-1] == 3.0  # submission time
    assert env.now == 4.0  # no think time after the last request


def test_closed_loop_think_times() -> None:
    env = simpy.Environment()
    server = FakeServer(env, service_s=1.0)
    env.process(closed_loop(env, reqs(0, 0, 0), server.submit, 1, 0.5, think_time_dist="fixed"))
    env.run()
    assert [t for t, _ in server.submitted] == [0.0, 1.5, 3.0]

    env = simpy.Environment()
    server = FakeServer(env, service_s=0.0)
    rng = np.random.default_rng(0)
    env.process(closed_loop(env, reqs(*[0.0] * 2001), server.submit, 1, 2.0, rng))
    env.run()
    assert server.submitted[-1][0] / 2000 == pytest.approx(2.0, rel=0.1)


def test_closed_loop_rejects_bad_arguments() -> None:
    env = simpy.Environment()
    server = FakeServer(env, 1.0)
    with pytest.raises(WorkloadError, match="concurrency"):
        closed_loop(env, reqs(0), server.submit, 0)
    with pytest.raises(WorkloadError, match="need an rng"):
        closed_loop(env, reqs(0), server.submit, 1, 1.0)
    with pytest.raises(WorkloadError, match="think time"):
        closed_loop(env, reqs(0), server.submit, 1, -1.0)


def test_cancellation_aborts_only_unfinished_requests() -> None:
    env = simpy.Environment()
    server = FakeServer(env, service_s=2.0)
    requests = [
        *reqs(0.0, 1.0, cancel=1.5),
        Request(request_id="on-time", arrival_time_s=0.0, prompt_tokens=1, output_tokens=1,
                cancel_after_s=2.0),
        Request(request_id="patient", arrival_time_s=0.0, prompt_tokens=1, output_tokens=1,
                cancel_after_s=5.0),
    ]  # fmt: skip
    requests.sort(key=lambda r: r.arrival_time_s)
    env.process(open_loop(env, requests, server.submit, abort=server.abort))
    env.run()
    # "0" and "1" are cut off 1.5 s after arrival; the others finish first (or at the deadline).
    assert server.aborted == [(1.5, "0"), (2.5, "1")]


def test_cancellation_in_closed_loop_is_relative_to_submission() -> None:
    env = simpy.Environment()
    server = FakeServer(env, service_s=3.0)
    env.process(
        closed_loop(env, reqs(50.0, 50.0, cancel=1.0), server.submit, 1, abort=server.abort)
    )
    env.run()
    assert server.aborted == [(1.0, "0"), (2.0, "1")]


def test_cancel_after_without_deadline_does_nothing() -> None:
    env = simpy.Environment()
    calls: list[str] = []
    env.process(cancel_after(env, reqs(0.0)[0], env.event(), calls.append))
    env.run()
    assert calls == []


def test_without_abort_callback_cancel_after_is_ignored() -> None:
    env = simpy.Environment()
    server = FakeServer(env, service_s=2.0)
    env.process(open_loop(env, reqs(0.0, cancel=0.1), server.submit))
    env.run()
    assert server.aborted == [] and env.now == 2.0
