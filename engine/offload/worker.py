"""The worker side of KV offloading, as time: when each step's transfers are submitted, how
long a flush holds a step back, and which completions a step reports (vLLM 0.33's
OffloadingConnectorWorker, offloading/worker.py, driven by gpu_model_runner.execute_model and
kv_connector_model_runner_mixin._get_kv_connector_output). docs/offload.md, "Transfer model".

Per step, at its start time t:

1. ``handle_preemptions``: the stores the previous step deferred, and this step's stores it
   must flush, are submitted at t; the step waits until every job to flush has completed
   (``worker.wait``): its forward pass starts at t' >= t.
2. ``start_load_kv``: this step's loads are submitted at t' (launched with the forward, which
   runs asynchronously on the GPU).
3. ``get_finished`` right after the launch: the jobs completed by t' are reported in this
   step's output (so a load that completes during step k is seen by step k + 1's update).
4. ``wait_for_save``: this step's other stores are deferred to the next step's start ("so
   offloading starts after the transfers of token sampling").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.scheduler_output import ConnectorMeta, TransferJob
from engine.offload.transfer import TransferLink


@dataclass(slots=True)
class JobTiming:
    """When a job was submitted and completed (s), and its size (bytes)."""

    job: TransferJob
    nbytes: int
    submitted_s: float
    completed_s: float | None = None


@dataclass
class OffloadWorker:
    """Submits each step's jobs to ``link`` (one CPU tier); ``bytes_per_block`` = the KV bytes
    of one GPU block (all layers, this replica)."""

    link: TransferLink
    bytes_per_block: int
    _deferred: list[TransferJob] = field(default_factory=list)
    _completed: list[int] = field(default_factory=list)  # done, not yet reported
    timings: dict[int, JobTiming] = field(default_factory=dict)  # every job ever submitted

    def _submit(self, job: TransferJob, now: float) -> None:
        nbytes = len(job.gpu_block_ids) * self.bytes_per_block
        self.link.submit(job.job_id, "write" if job.is_store else "read", nbytes, now)
        self.timings[job.job_id] = JobTiming(job, nbytes, now)

    def _collect(self, now: float) -> None:
        for t, job_id in self.link.advance_with_times(now):
            self.timings[job_id].completed_s = t  # type: ignore[index]
            self._completed.append(job_id)  # type: ignore[arg-type]

    def start_step(self, meta: ConnectorMeta, now: float) -> float:
        """Steps 1-2 of the module docstring for a step starting at ``now`` (s); returns when
        its forward pass starts (s): ``now``, or later when it waits for a flush."""
        # Completions before ``now`` first: the link's clock may not pass them unseen.
        self._collect(now)
        flush = meta.jobs_to_flush
        stores_now = [job for job in meta.store_jobs if job.job_id in flush]
        for job in self._deferred + stores_now:
            self._submit(job, now)
        self._deferred = [job for job in meta.store_jobs if job.job_id not in flush]
        start = now
        waiting = {
            job_id
            for job_id in flush
            if job_id in self.timings and self.timings[job_id].completed_s is None
        }
        while waiting:
            t = self.link.next_completion_time()
            if t is None:
                raise RuntimeError(f"flushed jobs {sorted(waiting)} were never submitted")
            start = max(start, t)
            self._collect(t)
            waiting.difference_update(self._completed)
        self._collect(start)
        for job in meta.load_jobs:
            self._submit(job, start)
        return start

    def poll(self, now: float) -> list[int]:
        """Step 3: the jobs completed by ``now`` (s) not reported before, in completion order."""
        self._collect(now)
        done, self._completed = self._completed, []
        return done

    def next_completion_time(self) -> float | None:
        """When the next submitted job completes (s); None when none is in flight."""
        return self.link.next_completion_time()

    def has_unreported(self) -> bool:
        """Jobs completed (collected from the link) that no poll has reported yet."""
        return bool(self._completed)

    def has_work(self) -> bool:
        """Stores deferred to the next step, or jobs in flight or not yet reported."""
        return bool(self._deferred or self._completed or self.link.in_flight())
