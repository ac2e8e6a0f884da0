"""The worker side of P/D disaggregation, as time (vLLM 0.33's NIXL worker, pull mode:
nixl/pull_worker.py). docs/fleet.md, "Prefill/decode disaggregation".

- Decode side: a step's pulls (``ConnectorMeta.load_jobs``) are submitted to the replica's
  network link when the step starts (vLLM's start_load_kv, with the forward); a pull of n
  tokens moves n x ``bytes_per_token`` bytes: it takes the link's latency, then its bytes
  at the link's bandwidth shared equally by the pulls moving at the same time
  (engine/offload/transfer.py's processor sharing, the ``read`` direction). Each step reports
  the pulls completed by its start (get_finished after the launch).
- Prefill side: nothing moves here; a send is reported done at the first step after the
  decode side's pull of it completed (``notify``: vLLM's finished_sending, from the NIXL
  notification the reader sends when its read completes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from engine.core.scheduler_output import ConnectorMeta, TransferJob
from engine.offload.transfer import TransferLink


@dataclass(slots=True)
class PDTransfer:
    """One pull: its job, tokens and bytes, when it was submitted and completed (s)."""

    job: TransferJob
    tokens: int
    nbytes: float
    submitted_s: float
    completed_s: float | None = None


@dataclass
class PDWorker:
    """One replica's P/D transfers: pulls on ``link`` (decode side; None on a prefill
    replica), ``bytes_per_token`` the KV bytes of one token on this replica's GPU,
    ``tokens_of`` a pull job's tokens (PDConnector.job_tokens)."""

    link: TransferLink | None
    bytes_per_token: float
    tokens_of: Callable[[int], int] = lambda job_id: 0
    # called with each pull as it completes (the fleet tells the prefill side)
    on_complete: Callable[[PDTransfer], None] | None = None
    # called when a pull is submitted (the fleet watches the link's next completion)
    on_submit: Callable[[], None] | None = None
    timings: dict[int, PDTransfer] = field(default_factory=dict)  # every pull ever submitted
    _completed: list[int] = field(default_factory=list)  # done, not yet reported

    def collect(self, now: float) -> None:
        """Take the pulls completed by ``now`` (s) off the link."""
        if self.link is None:
            return
        for t, job_id in self.link.advance_with_times(now):
            timing = self.timings[job_id]  # type: ignore[index]
            timing.completed_s = t
            self._completed.append(job_id)  # type: ignore[arg-type]
            if self.on_complete is not None:
                self.on_complete(timing)

    def notify(self, job_id: int) -> None:
        """Prefill side: send job ``job_id`` is done (its pull completed)."""
        self._completed.append(job_id)

    def start_step(self, meta: ConnectorMeta, now: float) -> float:
        """Submit this step's pulls at ``now`` (s); the step starts at once (returns ``now``)."""
        self.collect(now)
        if meta.load_jobs:
            if self.link is None:
                raise ValueError("a replica without a link cannot pull KV")
            for job in meta.load_jobs:
                tokens = self.tokens_of(job.job_id)
                nbytes = tokens * self.bytes_per_token
                self.link.submit(job.job_id, "read", nbytes, now)
                self.timings[job.job_id] = PDTransfer(job, tokens, nbytes, now)
            if self.on_submit is not None:
                self.on_submit()
        return now

    def poll(self, now: float) -> list[int]:
        """The jobs completed (pulls) or notified (sends) by ``now`` not reported before."""
        self.collect(now)
        done, self._completed = self._completed, []
        return done

    def next_completion_time(self) -> float | None:
        """When the next pull completes (s); None when none is in flight."""
        return None if self.link is None else self.link.next_completion_time()

    def has_unreported(self) -> bool:
        """Jobs completed or notified that no poll has reported yet."""
        return bool(self._completed)

    def has_work(self) -> bool:
        return bool(self._completed or (self.link is not None and self.link.in_flight()))
