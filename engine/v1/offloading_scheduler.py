"""The v1 scheduler with a KV offload tier: vLLM 0.33's scheduler driving its
OffloadingConnector (vllm/v1/core/sched/scheduler.py with a connector; the connector's own
rules are engine/offload/connector.py's). docs/offload.md cites each rule.

What the connector changes in V1Scheduler's step (engine/v1/scheduler.py):

- The waiting pass looks each request up in the tier too, beyond its GPU prefix hit. A
  request with chunks to load gets its blocks at once (it is admitted only if the blocks the
  in-flight prefills still need stay free), waits for the load in the holding queue (vLLM's
  WAITING_FOR_REMOTE_KVS, kv_holding_waiting) and is scheduled, like any waiting request, once
  the load is reported done; holding requests go before the waiting queue. A request the
  connector cannot answer yet (its chunks are still being stored or loaded) or still loading
  is skipped for this step, not a reason to stop the pass; the skipped go back to the front of
  their queues in their order.
- Every step ends with the connector's loads, stores and flushes
  (``SchedulerOutput.connector_meta``), and ``update(..., completed_jobs)`` takes the
  transfers reported done by then.
- A connector's ``request_finished`` may keep a finished request's blocks (vLLM's
  delay_free_blocks: a P/D prefill's blocks wait for the decode side to pull them,
  engine/pd/connector.py); they are freed when a store (send) job of that request is
  reported done. The offloading connector never delays.

The connector is the offloading one (``offload=``) or any object with the same hooks
(``connector=``: ``KVConnector``).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol

from engine.core.block_manager import BlockManager, blocks_needed
from engine.core.errors import SchedulerError
from engine.core.events import EventKind, EventSink
from engine.core.scheduler_output import (
    ConnectorMeta,
    SchedulerConfig,
    SchedulerOutput,
    TransferJob,
)
from engine.core.sequence import Sequence, SequenceStatus
from engine.offload.connector import OffloadConfig, OffloadConnector
from engine.v1.scheduler import V1Scheduler

WAITING, RUNNING = SequenceStatus.WAITING, SequenceStatus.RUNNING
WAITING_FOR_KV, FINISHED_REJECTED = SequenceStatus.WAITING_FOR_KV, SequenceStatus.FINISHED_REJECTED
ADMIT, RESUME = EventKind.ADMIT, EventKind.RESUME
OFFLOAD_LOAD, OFFLOAD_STORE = EventKind.OFFLOAD_LOAD, EventKind.OFFLOAD_STORE
OFFLOAD_LOAD_DONE, OFFLOAD_STORE_DONE = EventKind.OFFLOAD_LOAD_DONE, EventKind.OFFLOAD_STORE_DONE


class KVConnector(Protocol):
    """The scheduler side of a KV connector, as OffloadingV1Scheduler calls it (vLLM's
    KVConnectorBase_V1 scheduler hooks). ``get_num_new_matched_tokens``: tokens to load
    beyond the local hit (0: none; None: ask again next step); ``request_finished``: truthy
    to keep the request's blocks until one of its store jobs is reported done."""

    def on_new_request(self, seq: Sequence) -> None: ...
    def has_pending_work(self) -> bool: ...
    def get_num_new_matched_tokens(self, seq: Sequence, num_local_tokens: int) -> int | None: ...
    def update_state_after_alloc(self, seq: Sequence, num_external_tokens: int) -> None: ...
    def build_meta(
        self,
        scheduled: list[Sequence],
        num_new_tokens: list[int],
        admitted: list[Sequence],
        preempted: list[Sequence],
    ) -> ConnectorMeta: ...
    def request_finished(self, seq: Sequence) -> Any: ...
    def update_connector_output(self, completed_jobs: list[int]) -> list[TransferJob]: ...


class OffloadingV1Scheduler(V1Scheduler):
    """V1Scheduler with a KV connector: a CPU tier behind its prefix cache (``offload``), or
    another connector (``connector``; module docstring)."""

    def __init__(
        self,
        config: SchedulerConfig,
        block_manager: BlockManager,
        event_sink: EventSink | None = None,
        *,
        offload: OffloadConfig | None = None,
        connector: KVConnector | None = None,
    ) -> None:
        super().__init__(config, block_manager, event_sink)
        if (offload is None) == (connector is None):
            raise SchedulerError("give the scheduler an offload config or a connector, not both")
        self.connector: Any = connector
        if offload is not None:
            self.connector = OffloadConnector(
                offload,
                block_manager.block_size,
                prefix_caching=block_manager.enable_prefix_caching,
            )
        # Finished requests whose blocks the connector keeps (vLLM's delay_free_blocks).
        self._delayed_free: dict[int, Sequence] = {}
        # Requests holding blocks while they wait: loading, or loaded and not yet running.
        self._kv_holding: deque[Sequence] = deque()
        self._loaded: set[int] = set()  # seq ids whose load is reported done
        # Admitted and still prefilling (vLLM's _inflight_prefills): their blocks still
        # needed are kept free when a load is admitted.
        self._inflight_prefills: dict[int, Sequence] = {}

    # --- queues ---------------------------------------------------------------------------

    def has_unfinished(self) -> bool:
        """Anything waits, loads or runs, or the connector has work left (transfers in
        flight, a finished request's last stores)."""
        pending = bool(self._kv_holding) or self.connector.has_pending_work()
        return pending or super().has_unfinished()

    @property
    def num_waiting(self) -> int:
        """Waiting sequences, those waiting for a KV load included (vLLM counts both)."""
        return len(self._waiting) + len(self._kv_holding)

    def abort(self, seq_id: int) -> bool:
        """As Scheduler.abort; a request waiting for its load leaves the holding queue."""
        seq = self._unfinished.get(seq_id)
        if seq is not None and seq in self._kv_holding:
            self._kv_holding.remove(seq)
            self._waiting.append(seq)  # where Scheduler.abort looks for a waiting one
        return super().abort(seq_id)

    def add_request(self, seq: Sequence) -> None:
        super().add_request(seq)
        if seq.status is not FINISHED_REJECTED:
            self.connector.on_new_request(seq)

    # --- schedule ---------------------------------------------------------------------------

    def _schedule_waiting(
        self,
        threshold: int,
        budget: int,
        seqs: list[Sequence],
        num_new_tokens: list[int],
        admitted: list[Sequence],
        rejected: list[Sequence],
    ) -> None:
        """The waiting pass with a KV connector (vLLM's loop with a connector): requests
        holding blocks (loading, or loaded) go first; one the connector cannot answer yet,
        or still loading, is skipped for this step instead of stopping the pass; one with
        chunks to load gets its blocks now (only if the blocks in-flight prefills still need
        stay free) and waits for its load in the holding queue."""
        cfg, bm, sink = self.config, self.block_manager, self.event_sink
        connector = self.connector
        running = self._running
        bs = bm.block_size
        skipped_holding: list[Sequence] = []
        skipped_waiting: list[Sequence] = []
        while budget > 0 and len(running) < cfg.max_num_seqs:
            queue = self._kv_holding if self._kv_holding else self._waiting
            if not queue:
                break
            seq = queue[0]
            if seq.status is WAITING_FOR_KV:
                if seq.seq_id not in self._loaded:
                    skipped_holding.append(queue.popleft())
                    continue
                self._loaded.discard(seq.seq_id)
                self._finish_load(seq)
            hits: list[int] = []
            num_local = num_external = 0
            looked_up = seq.cached_token_count == 0
            if looked_up:
                reason = self._never_runs(seq)
                if reason is not None:
                    queue.popleft()
                    self._reject(seq, reason)
                    rejected.append(seq)
                    continue
                hits = bm.find_cached_prefix(seq)
                num_local = len(hits) * bs
                matched = connector.get_num_new_matched_tokens(seq, num_local)
                if matched is None:  # its chunks are not ready yet: ask again next step
                    skipped_waiting.append(queue.popleft())
                    continue
                num_external = matched
            num_computed = seq.cached_token_count + num_local + num_external
            loading = num_external > 0
            n = reserved = 0
            if loading:
                reserved = sum(
                    self._blocks_still_needed(s) for s in self._inflight_prefills.values()
                )
            else:
                n = seq.num_tokens - num_computed
                if 0 < threshold < n:
                    n = threshold
                if not cfg.enable_chunked_prefill and n > budget:
                    break
                n = min(n, budget)
            if not bm.allocate_slots(
                seq,
                n,
                hits,
                full_sequence_tokens=self._full_tokens(seq),
                watermark_blocks=self._watermark_blocks if running else 0,
                max_model_len=cfg.max_model_len,
                external_tokens=num_external,
                reserved_blocks=reserved,
                cache=not loading,
            ):
                break
            connector.update_state_after_alloc(seq, num_external)
            queue.popleft()
            if looked_up:
                seq.prefix_hit_tokens = num_local
                seq.offload_hit_tokens = num_external
                self.num_cached_tokens += num_local + num_external
                seq.cached_token_count = num_computed
            if loading:
                seq.status = WAITING_FOR_KV
                self._inflight_prefills[seq.seq_id] = seq
                skipped_holding.append(seq)
                if sink is not None:
                    table = seq.block_table[num_local // bs :]
                    sink.record(
                        OFFLOAD_LOAD, seq.seq_id, bm.get_num_free_blocks(), table, num_external
                    )
                continue
            running.append(seq)
            seq.status = RUNNING
            if num_computed + n < seq.num_tokens:
                self._inflight_prefills[seq.seq_id] = seq
            seqs.append(seq)
            num_new_tokens.append(n)
            admitted.append(seq)
            budget -= n
            if sink is not None:
                kind = RESUME if seq.num_preemptions else ADMIT
                sink.record(kind, seq.seq_id, bm.get_num_free_blocks(), (), n)
        # The skipped go back to the front of their queues, in their order.
        self._kv_holding.extendleft(reversed(skipped_holding))
        self._waiting.extendleft(reversed(skipped_waiting))

    def _blocks_still_needed(self, seq: Sequence) -> int:
        """Blocks ``seq`` (prefilling or loading) still needs for its whole sequence."""
        need = blocks_needed(self._full_tokens(seq), self.block_manager.block_size)
        return max(need - len(seq.block_table), 0)

    def _full_tokens(self, seq: Sequence) -> int:
        max_len = self.config.max_model_len
        return seq.num_tokens if max_len is None else min(seq.num_tokens, max_len)

    def _finish_load(self, seq: Sequence) -> None:
        """``seq``'s load completed (vLLM's _update_waiting_for_remote_kv): cache its blocks;
        a load covering the whole request leaves its last token to compute."""
        bm = self.block_manager
        if bm.enable_prefix_caching:
            bm.cache_blocks(seq, seq.cached_token_count)
        if seq.cached_token_count == seq.num_tokens:
            seq.cached_token_count -= 1
            self.num_cached_tokens -= 1
        seq.status = WAITING

    def _after_schedule(self, out: SchedulerOutput) -> None:
        for seq, n in zip(out.seqs, out.num_new_tokens):
            if seq.cached_token_count + n >= seq.num_tokens:
                self._inflight_prefills.pop(seq.seq_id, None)
        meta = self.connector.build_meta(out.seqs, out.num_new_tokens, out.admitted, out.preempted)
        out.connector_meta = meta
        sink = self.event_sink
        if sink is not None:
            free = self.block_manager.get_num_free_blocks()
            bs = self.block_manager.block_size
            for job in meta.store_jobs:
                blocks = job.gpu_block_ids
                sink.record(OFFLOAD_STORE, job.seq_id, free, blocks, len(blocks) * bs)

    def _preempt(self, seq: Sequence) -> None:
        self._inflight_prefills.pop(seq.seq_id, None)
        super()._preempt(seq)

    # --- finish and update --------------------------------------------------------------------

    def _finish(self, seq: Sequence, status: SequenceStatus, kind: EventKind) -> None:
        if status is not FINISHED_REJECTED:
            self._inflight_prefills.pop(seq.seq_id, None)
            # before its blocks are freed, as vLLM; truthy: they stay until it is sent
            if self.connector.request_finished(seq):
                self._delayed_free[seq.seq_id] = seq
        super()._finish(seq, status, kind)

    def _free_blocks(self, seq: Sequence) -> None:
        if seq.seq_id not in self._delayed_free:
            super()._free_blocks(seq)

    def update(
        self,
        output: SchedulerOutput,
        sampled_token_ids: list[int],
        completed_jobs: list[int] | None = None,
    ) -> list[Sequence]:
        """V1Scheduler.update, then the transfers (job ids) reported done by this step."""
        finished = super().update(output, sampled_token_ids)
        if completed_jobs:
            self._complete_jobs(completed_jobs)
        return finished

    def _complete_jobs(self, completed_jobs: list[int]) -> None:
        sink = self.event_sink
        for job in self.connector.update_connector_output(completed_jobs):
            if not job.is_store:
                self._loaded.add(job.seq_id)
            else:
                held = self._delayed_free.pop(job.seq_id, None)
                if held is not None:  # sent: vLLM frees it on finished_sending
                    self.block_manager.free_sequence_v1(held)
            if sink is not None:
                kind = OFFLOAD_STORE_DONE if job.is_store else OFFLOAD_LOAD_DONE
                tokens = len(job.gpu_block_ids) * self.block_manager.block_size
                free = self.block_manager.get_num_free_blocks()
                sink.record(kind, job.seq_id, free, job.gpu_block_ids, tokens)
