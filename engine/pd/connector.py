"""The scheduler side of prefill/decode disaggregation: vLLM 0.33's NIXL connector in pull
mode (vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py), for one replica,
driven by OffloadingV1Scheduler's connector hooks (engine/v1/offloading_scheduler.py).
docs/fleet.md, "Prefill/decode disaggregation", cites each rule.

A replica plays either side per request, as NIXL's ``kv_transfer_params`` say:

- **decode side** (``do_remote_prefill``; ``expect_remote_prefill``): when the request is
  looked up, ``get_num_new_matched_tokens`` answers its prompt tokens less the local prefix
  hit, to be loaded asynchronously; once its blocks are allocated (the scheduler's rule for
  async loads: only if they fit in the free blocks less what in-flight prefills still need),
  ``update_state_after_alloc`` issues one pull job for the prompt tokens past the local hit,
  the request waits in WAITING_FOR_KV (vLLM's WAITING_FOR_REMOTE_KVS) until the pull is
  reported done, then computes its last prompt token (the scheduler's rule for a load that
  covers the whole prompt) and decodes. Only one pull per request: after a preemption it
  recomputes locally (vLLM clears ``do_remote_prefill`` once allocated).
- **prefill side** (``do_remote_decode``; ``expect_remote_decode``): the request runs with
  max_tokens 1; when it finishes normally (length or stop) with blocks,
  ``request_finished`` keeps its blocks (vLLM's delay_free_blocks) and records a send job;
  the job is reported done when the decode side's pull of it completes (vLLM's
  finished_sending), and the scheduler frees the blocks then. An aborted or rejected prefill
  frees at once and sends nothing.
"""

from __future__ import annotations

from engine.core.scheduler_output import ConnectorMeta, TransferJob
from engine.core.sequence import Sequence

FINISHED_NORMALLY = ("length", "stop")  # vLLM: FINISHED_LENGTH_CAPPED, FINISHED_STOPPED


class PDConnector:
    """One replica's P/D connector (module docstring)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._remote_prefill: set[int] = set()  # decode side: seq ids still to pull
        self._remote_decode: set[int] = set()  # prefill side: seq ids to keep for a pull
        self._num_local: dict[int, int] = {}  # decode side: each lookup's local hit (tokens)
        self._jobs: dict[int, TransferJob] = {}  # pulls and sends in flight, by job id
        self._sends: dict[int, TransferJob] = {}  # prefill side: held requests' send jobs
        self.job_tokens: dict[int, int] = {}  # tokens each pull moves
        self._batch_loads: list[TransferJob] = []
        self._next_job_id = 0

    # --- which side a request is on (the fleet's router says) -----------------------------

    def expect_remote_prefill(self, seq_id: int) -> None:
        """``seq_id`` (not yet added) decodes here after a prefill elsewhere: pull its prompt."""
        self._remote_prefill.add(seq_id)

    def expect_remote_decode(self, seq_id: int) -> None:
        """``seq_id`` (not yet added) prefills here for a decode elsewhere: keep its blocks."""
        self._remote_decode.add(seq_id)

    def awaiting_pull(self, seq_id: int) -> bool:
        """Decode side: ``seq_id`` has not issued its pull yet (it never will if it ends now)."""
        return seq_id in self._remote_prefill

    def send_job(self, seq_id: int) -> TransferJob | None:
        """Prefill side: the send job of finished ``seq_id`` whose blocks are held, if any."""
        return self._sends.get(seq_id)

    # --- the scheduler's hooks ----------------------------------------------------------------

    def on_new_request(self, seq: Sequence) -> None:
        return None

    def has_pending_work(self) -> bool:
        """Pulls not yet reported done, or blocks held for a pull: keep stepping."""
        return bool(self._jobs)

    def get_num_new_matched_tokens(self, seq: Sequence, num_local_tokens: int) -> int:
        """Decode side: the prompt tokens past the ``num_local_tokens`` local hit (never 0:
        a local hit stops one token short of the prompt); else 0."""
        if seq.seq_id not in self._remote_prefill:
            return 0
        self._num_local[seq.seq_id] = num_local_tokens
        return max(seq.num_prompt_tokens - num_local_tokens, 0)

    def update_state_after_alloc(self, seq: Sequence, num_external_tokens: int) -> None:
        """Decode side: the blocks past the local hit are allocated; issue their pull."""
        if seq.seq_id not in self._remote_prefill or num_external_tokens == 0:
            return
        self._remote_prefill.discard(seq.seq_id)
        first_block = self._num_local.pop(seq.seq_id, 0) // self.block_size
        job = TransferJob(
            self._new_job_id(), seq.seq_id, False, (), tuple(seq.block_table[first_block:])
        )
        self._jobs[job.job_id] = job
        self.job_tokens[job.job_id] = num_external_tokens
        self._batch_loads.append(job)

    def build_meta(
        self,
        scheduled: list[Sequence],
        num_new_tokens: list[int],
        admitted: list[Sequence],
        preempted: list[Sequence],
    ) -> ConnectorMeta:
        """This step's pulls (nothing is stored or flushed)."""
        meta = ConnectorMeta(self._batch_loads, [], set(), [])
        self._batch_loads = []
        return meta

    def request_finished(self, seq: Sequence) -> bool:
        """True (keep its blocks) for a prefill-side request finished normally with blocks."""
        self._remote_prefill.discard(seq.seq_id)
        self._num_local.pop(seq.seq_id, None)
        if seq.seq_id not in self._remote_decode:
            return False
        self._remote_decode.discard(seq.seq_id)
        if seq.finish_reason not in FINISHED_NORMALLY or not seq.block_table:
            return False
        job = TransferJob(self._new_job_id(), seq.seq_id, True, (), tuple(seq.block_table))
        self._jobs[job.job_id] = job
        self._sends[seq.seq_id] = job
        return True

    def update_connector_output(self, completed_jobs: list[int]) -> list[TransferJob]:
        """Jobs reported done at a step's end: pulls (decode side) and sends (prefill side)."""
        done = []
        for job_id in completed_jobs:
            job = self._jobs.pop(job_id)
            if job.is_store:
                del self._sends[job.seq_id]
            done.append(job)
        return done

    def _new_job_id(self) -> int:
        job_id = self._next_job_id
        self._next_job_id += 1
        return job_id
