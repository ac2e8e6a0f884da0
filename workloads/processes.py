"""simpy processes that feed requests to a simulated server.

The server is reached only through two callbacks, so this module knows nothing of the engine:

- ``submit(request) -> simpy.Event``: hand one request to the server; the returned event must
  succeed when that request is done for any reason (finished, aborted, rejected).
- ``abort(request_id) -> None``: the client gives up on a request. It may be called for a request
  that has already finished (e.g. finish and deadline fall on the same instant); it must then do
  nothing. After a real abort the server must still make the submit event succeed.

Requests and their finish events are the only state; KV memory is never mirrored here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator, Iterable, Iterator, Sized
from typing import Any, Literal

import numpy as np
import simpy

from workloads.errors import WorkloadError
from workloads.limits import MAX_TIME_S, is_integer, is_number
from workloads.request import Request

Submit = Callable[[Request], simpy.Event]
Abort = Callable[[str], None]
Process = Generator[simpy.Event, Any, None]


def cancel_after(
    env: simpy.Environment, request: Request, finished: simpy.Event, abort: Abort
) -> Process:
    """Call ``abort(request.request_id)`` at arrival_time_s + cancel_after_s unless ``finished``
    has been triggered by then. Does nothing for a request without cancel_after_s."""
    if request.cancel_after_s is None:
        return
    deadline = request.arrival_time_s + request.cancel_after_s
    yield env.timeout(max(0.0, deadline - env.now))
    if not finished.triggered:
        abort(request.request_id)


class _Outstanding:
    """Counts submitted-but-unfinished requests without keeping their events."""

    def __init__(self, env: simpy.Environment) -> None:
        self._count = 0
        self._closed = False
        self.all_done = env.event()

    def add(self, finished: simpy.Event) -> None:
        if finished.processed:
            return
        self._count += 1
        finished.callbacks.append(self._on_finish)

    def close(self) -> None:
        """No more requests will be added; all_done succeeds once the count reaches 0."""
        self._closed = True
        if self._count == 0:
            self.all_done.succeed()

    def _on_finish(self, _event: simpy.Event) -> None:
        self._count -= 1
        if self._closed and self._count == 0:
            self.all_done.succeed()


def _send(
    env: simpy.Environment, request: Request, submit: Submit, abort: Abort | None
) -> simpy.Event:
    finished = submit(request)
    if abort is not None and request.cancel_after_s is not None:
        env.process(cancel_after(env, request, finished, abort))
    return finished


def open_loop(
    env: simpy.Environment,
    requests: Iterable[Request],
    submit: Submit,
    *,
    abort: Abort | None = None,
) -> Process:
    """Submit each request at its arrival_time_s (absolute sim seconds; requests in arrival order).

    A request whose time has passed when it is reached is submitted at once. With ``abort``,
    requests with cancel_after_s are aborted that long after arrival if unfinished; without it,
    cancel_after_s is ignored. The process ends when every request was submitted and finished,
    so ``env.run(until=env.process(open_loop(...)))`` replays the whole trace.
    """
    outstanding = _Outstanding(env)
    for request in requests:
        delay = request.arrival_time_s - env.now
        if delay > 0:
            yield env.timeout(delay)
        outstanding.add(_send(env, request, submit, abort))
    outstanding.close()
    yield outstanding.all_done


def _user(
    env: simpy.Environment,
    queue: Iterator[Request],
    submit: Submit,
    think: Callable[[], float],
    abort: Abort | None,
) -> Process:
    first = True
    for request in queue:  # the iterator is shared: each user takes the next unclaimed request
        pause = 0.0 if first else think()
        first = False
        if pause > 0:
            yield env.timeout(pause)
        yield _send(env, dataclasses.replace(request, arrival_time_s=float(env.now)), submit, abort)


def closed_loop(
    env: simpy.Environment,
    requests: Iterable[Request],
    submit: Submit,
    concurrency: int,
    think_time_s: float = 0.0,
    rng: np.random.Generator | None = None,
    *,
    think_time_dist: Literal["exponential", "fixed"] = "exponential",
    abort: Abort | None = None,
) -> Process:
    """``concurrency`` users replay ``requests`` in order, each with one request in flight.

    A free user claims the next request, waits its think time (none before a user's first
    request), then submits a copy whose arrival_time_s is the submission time (the trace's
    arrival times are ignored) and waits for it to finish. Think times are exponential with mean
    ``think_time_s`` drawn from ``rng`` (required when think_time_s > 0), or exactly
    ``think_time_s`` with ``think_time_dist="fixed"``. The process ends when all users are done.
    """
    # Validate now (not at the first simpy step) so bad arguments fail where they are passed.
    if not is_integer(concurrency) or concurrency < 1:
        raise WorkloadError(f"concurrency must be an integer >= 1, got {concurrency!r}")
    if not (is_number(think_time_s) and 0 <= think_time_s <= MAX_TIME_S):
        raise WorkloadError(
            f"think time must be a number of seconds from 0 to {MAX_TIME_S:.0f} (2^32), "
            f"got {think_time_s!r}"
        )
    if think_time_dist not in ("exponential", "fixed"):
        raise WorkloadError(
            f"think time distribution must be exponential or fixed, got {think_time_dist!r}"
        )
    if isinstance(requests, Sized):
        # Users past the number of requests would never claim one; not starting them gives
        # the same run (same claims, same think-time draws) and keeps --concurrency 10**12
        # from building 10**12 simpy processes.
        concurrency = min(concurrency, max(len(requests), 1))
    if think_time_dist == "exponential" and think_time_s > 0 and rng is None:
        raise WorkloadError("exponential think times need an rng")
    return _users(
        env, requests, submit, concurrency, _think_time(think_time_s, think_time_dist, rng), abort
    )


def _think_time(mean_s: float, dist: str, rng: np.random.Generator | None) -> Callable[[], float]:
    if dist == "exponential" and mean_s > 0:
        assert rng is not None
        generator = rng
        return lambda: float(generator.exponential(mean_s))
    return lambda: mean_s


def _users(
    env: simpy.Environment,
    requests: Iterable[Request],
    submit: Submit,
    concurrency: int,
    think: Callable[[], float],
    abort: Abort | None,
) -> Process:
    queue = iter(requests)
    users = [env.process(_user(env, queue, submit, think, abort)) for _ in range(concurrency)]
    yield env.all_of(users)
