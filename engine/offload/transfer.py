"""How long KV offload transfers take: one link per tier, two directions, processor sharing.

The model (docs/offload.md, "Transfer model"; the reference driver implements the same):

- A tier's link has two independent directions: ``read`` (tier -> GPU: loads) and ``write``
  (GPU -> tier: stores). Each has a bandwidth B (bytes/s); the link has a latency L (s).
- A job of ``nbytes`` submitted at time t first waits L seconds, using no bandwidth, then joins
  its direction's active set. While n jobs are active each moves B/n bytes/s (processor
  sharing); a job completes when all its bytes have moved. Alone it takes exactly
  L + nbytes/B; two identical jobs submitted together take L + 2 * nbytes/B each.

The classes are clocks for a discrete-event simulator: ``submit`` a job at the current time,
ask ``next_completion_time()`` when the next job will finish, and ``advance(now)`` to collect
the jobs finished by ``now`` in completion order (equal times: submission order).

Arithmetic: each direction keeps the service every active job has received so far (bytes,
"virtual time") and gives a job the finish tag service-at-join + nbytes; the smallest tag
finishes first. State changes only at joins and completions, never at the times ``advance`` is
called with, so the results are the same floats however often a simulator polls (same inputs,
same results, bit for bit).
"""

from __future__ import annotations

import collections
import heapq
import math
from collections.abc import Hashable, Iterable
from typing import Literal

from engine.compiled import chosen
from engine.core.errors import EngineError

Direction = Literal["read", "write"]
DIRECTIONS: tuple[Direction, ...] = ("read", "write")
# How a direction serves its jobs: "shared" (processor sharing, the spec's model) or "fifo"
# (one at a time in submission order, as vLLM's CPU worker's CUDA streams run them)
Discipline = Literal["shared", "fifo"]
DISCIPLINES: tuple[Discipline, ...] = ("shared", "fifo")
JobId = Hashable
# When a busy direction's service counter passes this (bytes), the tags are rebased to it: a
# counter of 1e18 bytes would round a 4 KiB job's remaining bytes to nothing.
_REBASE_BYTES = float(1 << 40)


class TransferError(EngineError):
    """A link was built or driven against its contract (a bad number, a job id reused, a
    time earlier than the link's clock)."""


def _check_number(name: str, value: float, *, positive: bool) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value < 0 or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        raise TransferError(f"{name} must be a finite number {bound}, got {value!r}")


class _SharedDirection:
    """One direction of a link: a latency queue, then processor sharing of ``bandwidth``."""

    __slots__ = ("_active", "_clock", "_pending", "_service", "bandwidth", "latency")

    def __init__(self, bandwidth: float, latency: float) -> None:
        self.bandwidth = float(bandwidth)  # bytes/s
        self.latency = float(latency)  # s
        # (join time s, submission seq, job, nbytes): submitted, still waiting out the latency
        self._pending: list[tuple[float, int, JobId, float]] = []
        # (finish tag in bytes of service, submission seq, job): moving bytes
        self._active: list[tuple[float, int, JobId]] = []
        self._service = 0.0  # bytes each active job has received, as of _clock
        self._clock = 0.0  # s: the time of the last join or completion processed

    def submit(self, seq: int, job: JobId, nbytes: float, now: float) -> None:
        heapq.heappush(self._pending, (now + self.latency, seq, job, float(nbytes)))

    def in_flight(self) -> int:
        return len(self._pending) + len(self._active)

    def active(self) -> int:
        return len(self._active)

    # -- the two events, shared by the real advance and the look-ahead (same floats) --------

    def _finish(self, clock: float, service: float, n: int, tag: float) -> float:
        """When the active job with ``tag`` finishes if nothing joins first (s)."""
        return clock + max(tag - service, 0.0) * n / self.bandwidth

    def _service_at(self, clock: float, service: float, n: int, t: float) -> float:
        """The service counter at ``t`` with ``n`` jobs active since ``clock`` (bytes); an idle
        direction starts again from 0."""
        return service + (t - clock) * self.bandwidth / n if n else 0.0

    def next_completion(self) -> float | None:
        """When the next job will finish (s), joins before it included; None if idle."""
        clock, service, n = self._clock, self._service, len(self._active)
        head = self._active[0][0] if self._active else None
        for join, _seq, _job, nbytes in sorted(self._pending):
            if head is not None:
                finish = self._finish(clock, service, n, head)
                if finish <= join:
                    return finish
            service = self._service_at(clock, service, n, join)
            clock, n = join, n + 1
            if service > _REBASE_BYTES:  # as advance does, so the floats are the same
                head = None if head is None else head - service
                service = 0.0
            tag = service + nbytes
            head = tag if head is None else min(head, tag)
        return None if head is None else self._finish(clock, service, n, head)

    def advance(self, now: float) -> list[tuple[float, int, JobId]]:
        """Process every join and completion up to ``now``; the completions as (time s,
        submission seq, job), in completion order."""
        done: list[tuple[float, int, JobId]] = []
        while True:
            join = self._pending[0][0] if self._pending else math.inf
            if self._active:
                tag = self._active[0][0]
                finish = self._finish(self._clock, self._service, len(self._active), tag)
                # a completion at a join's instant goes first: the joiner takes none of its bytes
                if finish <= now and finish <= join:
                    _tag, seq, job = heapq.heappop(self._active)
                    self._clock = finish
                    self._service = max(self._service, tag) if self._active else 0.0
                    done.append((finish, seq, job))
                    continue
            if join > now:
                return done
            join, seq, job, nbytes = heapq.heappop(self._pending)
            self._service = self._service_at(self._clock, self._service, len(self._active), join)
            self._clock = join
            if self._service > _REBASE_BYTES:
                self._rebase()
            heapq.heappush(self._active, (self._service + nbytes, seq, job))

    def _rebase(self) -> None:
        base = self._service
        self._active = [(tag - base, seq, job) for tag, seq, job in self._active]
        heapq.heapify(self._active)
        self._service = 0.0


class _FifoDirection:
    """One direction run as vLLM's CPU worker runs it: one job at a time, in submission order
    (each job's CUDA stream waits for the previous job's end event,
    vllm/v1/kv_offload/cpu/gpu_worker.py SingleDirectionOffloadingHandler). A job starts at
    the later of its submission + latency and the previous job's end."""

    __slots__ = ("_free_at", "_queue", "bandwidth", "latency")

    def __init__(self, bandwidth: float, latency: float) -> None:
        self.bandwidth = float(bandwidth)  # bytes/s
        self.latency = float(latency)  # s
        self._queue: collections.deque[tuple[float, int, JobId, float]] = collections.deque()
        self._free_at = 0.0  # s: when the last job completed

    def submit(self, seq: int, job: JobId, nbytes: float, now: float) -> None:
        self._queue.append((now + self.latency, seq, job, float(nbytes)))

    def in_flight(self) -> int:
        return len(self._queue)

    def active(self) -> int:
        return min(len(self._queue), 1)

    def next_completion(self) -> float | None:
        if not self._queue:
            return None
        join, _seq, _job, nbytes = self._queue[0]
        return max(join, self._free_at) + nbytes / self.bandwidth

    def advance(self, now: float) -> list[tuple[float, int, JobId]]:
        done: list[tuple[float, int, JobId]] = []
        while (finish := self.next_completion()) is not None and finish <= now:
            _join, seq, job, _nbytes = self._queue.popleft()
            self._free_at = finish
            done.append((finish, seq, job))
        return done


class TransferLink:
    """One tier's link: ``read`` (tier -> GPU) and ``write`` (GPU -> tier) directions that
    share no bandwidth, each processor-shared among its active jobs.

    read_bytes_per_s, write_bytes_per_s: each direction's bandwidth (bytes/s, > 0).
    latency_s: the delay before a job starts moving bytes (s, >= 0), both directions.
    discipline: "shared" (processor sharing: the model above) or "fifo" (one job at a time in
    submission order, each starting at the later of its submission + latency and the previous
    job's end: how vLLM's CPU worker orders its CUDA streams). Both move B bytes/s while busy.
    """

    def __init__(
        self,
        read_bytes_per_s: float,
        write_bytes_per_s: float,
        latency_s: float,
        *,
        discipline: Discipline = "shared",
    ):
        _check_number("read_bytes_per_s", read_bytes_per_s, positive=True)
        _check_number("write_bytes_per_s", write_bytes_per_s, positive=True)
        _check_number("latency_s", latency_s, positive=False)
        if discipline not in DISCIPLINES:
            raise TransferError(f"discipline must be one of {DISCIPLINES}, got {discipline!r}")
        kind = _SharedDirection if discipline == "shared" else _FifoDirection
        self.discipline = discipline
        self._directions: dict[str, _SharedDirection | _FifoDirection] = {
            "read": kind(read_bytes_per_s, latency_s),
            "write": kind(write_bytes_per_s, latency_s),
        }
        self._now = 0.0  # s: the latest time submitted or advanced to
        self._seq = 0
        self._jobs: set[JobId] = set()  # in flight
        self._next: float | None = None  # cached next_completion_time
        self._next_known = True

    @property
    def now(self) -> float:
        """The latest time the link was given (s): submit and advance take no earlier one."""
        return self._now

    def bandwidth(self, direction: Direction) -> float:
        """``direction``'s bandwidth (bytes/s)."""
        return self._direction(direction).bandwidth

    @property
    def latency_s(self) -> float:
        return self._directions["read"].latency

    def in_flight(self, direction: Direction | None = None) -> int:
        """Jobs submitted and not yet completed (in ``direction``, or both)."""
        if direction is None:
            return len(self._jobs)
        return self._direction(direction).in_flight()

    def active(self, direction: Direction) -> int:
        """Jobs moving bytes in ``direction`` (past their latency), as of the last event."""
        return self._direction(direction).active()

    def submit(self, job_id: JobId, direction: Direction, nbytes: float, now: float) -> None:
        """Submit ``nbytes`` (bytes, >= 0) to move in ``direction`` from ``now`` (s)."""
        self._check_time(now)
        _check_number("nbytes", nbytes, positive=False)
        if job_id in self._jobs:
            raise TransferError(f"job {job_id!r} is already in flight")
        side = self._direction(direction)
        self._now = float(now)
        side.submit(self._seq, job_id, nbytes, self._now)
        self._seq += 1
        self._jobs.add(job_id)
        self._next_known = False

    def next_completion_time(self) -> float | None:
        """When the next job completes (s), or None when nothing is in flight."""
        if not self._next_known:
            times = [t for d in self._directions.values() if (t := d.next_completion()) is not None]
            self._next, self._next_known = (min(times) if times else None), True
        return self._next

    def advance(self, now: float) -> list[JobId]:
        """The jobs completed by ``now`` (s) and not reported before, in completion order
        (equal times: submission order)."""
        return [job for _time, job in self.advance_with_times(now)]

    def advance_with_times(self, now: float) -> list[tuple[float, JobId]]:
        """As ``advance``, each job with its completion time (s)."""
        self._check_time(now)
        self._now = float(now)
        done = [c for d in self._directions.values() for c in d.advance(self._now)]
        if not done:
            return []
        done.sort(key=lambda c: (c[0], c[1]))
        self._jobs.difference_update(job for _t, _s, job in done)
        self._next_known = False
        return [(time, job) for time, _seq, job in done]

    def _direction(self, direction: Direction) -> _SharedDirection | _FifoDirection:
        side = self._directions.get(direction)
        if side is None:
            raise TransferError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
        return side

    def _check_time(self, now: float) -> None:
        _check_number("now", now, positive=False)
        if now < self._now:
            raise TransferError(f"time {now!r} is before the link's clock {self._now!r}")


def make_transfer_link(
    read_bytes_per_s: float,
    write_bytes_per_s: float,
    latency_s: float,
    *,
    discipline: Discipline = "shared",
    compiled: bool | None = None,
) -> TransferLink:
    """A TransferLink (arguments as its), or its compiled mirror (engine/compiled:
    ``CompiledTransferLink``, the same completion times bit for bit, integer job ids only).
    ``compiled``: None = the compiled one when the extension is built and
    ``KVSIM_PURE_PYTHON`` is not 1; True = the compiled one (RuntimeError when
    unavailable); False = the Python one (engine.compiled.chosen)."""
    core = chosen(compiled)
    if core is None:
        return TransferLink(read_bytes_per_s, write_bytes_per_s, latency_s, discipline=discipline)
    link: TransferLink = core.CompiledTransferLink(
        read_bytes_per_s, write_bytes_per_s, latency_s, discipline=discipline
    )
    return link


class TransferLinks:
    """Several tiers' links keyed by tier name (e.g. "cpu", "disk"), one clock: completions
    across tiers come back in completion order, equal times in submission order."""

    def __init__(self, links: dict[str, TransferLink] | Iterable[tuple[str, TransferLink]]):
        self._links = dict(links)
        self._seq = 0
        self._order: dict[JobId, int] = {}  # in-flight job -> its submission seq, all tiers

    @property
    def tiers(self) -> tuple[str, ...]:
        return tuple(self._links)

    def __getitem__(self, tier: str) -> TransferLink:
        link = self._links.get(tier)
        if link is None:
            raise TransferError(f"no link for tier {tier!r} (tiers: {', '.join(self._links)})")
        return link

    def submit(
        self, tier: str, job_id: JobId, direction: Direction, nbytes: float, now: float
    ) -> None:
        """Submit a job on ``tier``'s link (see TransferLink.submit); ids are unique across
        tiers while in flight."""
        if job_id in self._order:
            raise TransferError(f"job {job_id!r} is already in flight")
        self[tier].submit(job_id, direction, nbytes, now)
        self._order[job_id] = self._seq
        self._seq += 1

    def next_completion_time(self) -> float | None:
        """The earliest next completion over all tiers (s), or None when all are idle."""
        times = [link.next_completion_time() for link in self._links.values()]
        known = [t for t in times if t is not None]
        return min(known) if known else None

    def advance(self, now: float) -> list[JobId]:
        """Jobs completed by ``now`` on any tier, in completion order."""
        return [job for _time, job in self.advance_with_times(now)]

    def advance_with_times(self, now: float) -> list[tuple[float, JobId]]:
        """As ``advance``, each job with its completion time (s)."""
        done = [c for link in self._links.values() for c in link.advance_with_times(now)]
        done.sort(key=lambda c: (c[0], self._order[c[1]]))
        for _time, job in done:
            del self._order[job]
        return done
