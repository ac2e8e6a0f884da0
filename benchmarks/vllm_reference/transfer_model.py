"""Transfer timing model of kvsim's offload spec (issue 29), for the reference driver.

One link between the GPU and the CPU tier, two independent directions: `read` (tier -> GPU,
loads) and `write` (GPU -> tier, stores). A job of `nbytes` submitted at time t waits the
link latency L (using no bandwidth), then joins its direction's active set; while n jobs are
active each moves at B/n bytes/s (processor sharing). Alone it takes exactly L + nbytes/B.
Times in seconds, sizes in bytes, bandwidths in bytes/s. Pure Python, no vLLM.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

INF = math.inf


@dataclass
class Job:
    job_id: int
    direction: str  # "read" | "write"
    nbytes: float
    submit_s: float
    remaining: float  # bytes still to move
    done_s: float | None = None


class Link:
    def __init__(self, read_bytes_per_s: float, write_bytes_per_s: float, latency_s: float):
        self.bandwidth = {"read": read_bytes_per_s, "write": write_bytes_per_s}
        self.latency_s = latency_s
        self.now = 0.0
        self.jobs: dict[int, Job] = {}  # submitted, not complete
        self.done: list[Job] = []  # complete, not yet collected

    def submit(self, job_id: int, direction: str, nbytes: int, t: float) -> None:
        self.advance(t)
        self.jobs[job_id] = Job(job_id, direction, float(nbytes), t, float(nbytes))

    def _active(self, direction: str) -> list[Job]:
        return [j for j in self.jobs.values()
                if j.direction == direction and j.submit_s + self.latency_s <= self.now]

    def _next_event(self) -> float:
        """Next activation (latency over) or completion, assuming no new submissions."""
        t = INF
        for j in self.jobs.values():
            if j.submit_s + self.latency_s > self.now:
                t = min(t, j.submit_s + self.latency_s)
        for d, bw in self.bandwidth.items():
            active = self._active(d)
            if active:
                t = min(t, self.now + min(j.remaining for j in active) * len(active) / bw)
        return t

    def advance(self, t: float) -> None:
        """Move the clock to t (never backwards), completing jobs on the way."""
        while True:
            nxt = self._next_event()
            to = min(nxt, t)
            if to > self.now:
                for d, bw in self.bandwidth.items():
                    active = self._active(d)
                    for j in active:
                        j.remaining -= bw / len(active) * (to - self.now)
                self.now = to
            for j in list(self.jobs.values()):
                # tolerance: float rounding of the shared-rate arithmetic
                active = j.submit_s + self.latency_s <= self.now
                if active and j.remaining <= 1e-9 * j.nbytes + 1e-6:
                    j.done_s = self.now
                    self.done.append(j)
                    del self.jobs[j.job_id]
            if nxt >= t or not self.jobs:
                return

    def wait(self, job_ids: set[int]) -> float:
        """Advance until every job in job_ids is complete; return that time."""
        while job_ids & self.jobs.keys():
            self.advance(self._next_event())
        return self.now

    def next_completion(self) -> float:
        """Time the next submitted job completes if nothing else is submitted (inf if none)."""
        sim = copy.deepcopy(self)
        n = len(sim.done)
        while sim.jobs and len(sim.done) == n:
            sim.advance(sim._next_event())
        return sim.now if len(sim.done) > n else INF

    def collect(self, t: float) -> list[Job]:
        """Advance to t and return the jobs completed since the last collect."""
        self.advance(t)
        out, self.done = self.done, []
        return out
