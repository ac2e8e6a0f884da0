"""The scheduler side of KV offloading: vLLM 0.33's OffloadingConnectorScheduler
(vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py) for one
full-attention KV group, without partial tails or synchronous loads (vLLM's defaults).

What the V1Scheduler asks it, and what it answers (docs/offload.md cites each rule):

- ``get_num_new_matched_tokens(seq, local_hit_tokens)`` when a waiting request is looked up:
  the tokens the tier can add beyond the GPU prefix hit — the consecutive chunks it holds
  from the chunk the GPU hit ends in, up to the request's length; 0 when that is less than
  one chunk; None ("ask again next step") while one of those chunks is still being stored
  or loaded for another request, or while this request has transfers in flight.
- ``update_state_after_alloc(seq, external_tokens)`` once its blocks are allocated: a load
  job for the GPU blocks past the local hit, pinning its chunks in the tier.
- ``build_meta(...)`` at the end of each schedule(): store jobs for every full prompt chunk
  a scheduled request has computed by the end of this step (or a finished one had) and has
  not offered yet — the tier skips chunks it already holds; a full tier that cannot evict
  enough stores nothing and the request offers them again next step — and the jobs to flush:
  store jobs of requests preempted this step, and of finished requests whose (already freed)
  blocks were handed out again this step (the step waits for those stores first).
- ``update_connector_output(completed)`` with the jobs reported done at a step's end: stores
  become readable, loads unpin their chunks; returns the requests whose load finished.
- ``request_finished(seq)`` when a request finishes; its last stores are made next step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.core.scheduler_output import ConnectorMeta, TransferJob
from engine.core.sequence import Sequence
from engine.offload.cpu_manager import LookupResult, make_cpu_tier
from engine.offload.policies import OffloadKey
from engine.offload.secondary_tier import SecondaryTier, SecondaryTierConfig
from engine.offload.tiering import TieringManager
from engine.v1.prefix_cache import ensure_block_hashes

HIT_PENDING, MISS = LookupResult.HIT_PENDING, LookupResult.MISS


@dataclass(frozen=True, slots=True)
class OffloadConfig:
    """A CPU tier of ``num_chunks`` chunks, each ``blocks_per_chunk`` GPU blocks, evicting by
    ``policy`` ("lru" or "arc"). ``offload_prompt_only`` (vLLM's default) stores prompt
    chunks only. ``secondary_tiers``: tiers behind the CPU tier (engine/offload/tiering.py),
    none by default."""

    num_chunks: int
    blocks_per_chunk: int = 1
    policy: str = "lru"
    offload_prompt_only: bool = True
    secondary_tiers: tuple[SecondaryTierConfig, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.num_chunks, int) or self.num_chunks < 0:
            raise ValueError(f"num_chunks must be an integer >= 0, got {self.num_chunks!r}")
        if not isinstance(self.blocks_per_chunk, int) or self.blocks_per_chunk < 1:
            raise ValueError(f"blocks_per_chunk must be >= 1, got {self.blocks_per_chunk!r}")


@dataclass(slots=True)
class _RequestState:
    seq: Sequence
    ctx: Any  # the tier's access record of it (RequestContext, or the compiled tier's id)
    offload_keys: list[OffloadKey] = field(default_factory=list)
    block_ids: list[int] = field(default_factory=list)  # as the connector last saw the table
    next_stored_chunk: int = 0
    num_local_tokens: int = 0
    transfer_jobs: set[int] = field(default_factory=set)
    finished: bool = False
    signaled: bool = False  # its finish reached the tier (build_meta after it finished)


class OffloadConnector:
    """The scheduler side of one replica's offloading (module docstring)."""

    def __init__(
        self,
        config: OffloadConfig,
        block_size: int,
        *,
        prefix_caching: bool = True,
        compiled_tier: bool | None = None,
    ) -> None:
        """``compiled_tier``: the CPU tier's implementation (cpu_manager.make_cpu_tier's
        ``compiled``: None = the compiled one when built)."""
        self.config = config
        self.block_size = block_size
        self.tokens_per_chunk = block_size * config.blocks_per_chunk
        # vLLM's tiering manager reaches into the CPU tier's policy (pins, evictability), so
        # with secondary tiers the CPU tier is the Python one (docs/compiled.md)
        compiled = False if config.secondary_tiers else compiled_tier
        self.manager = make_cpu_tier(config.num_chunks, config.policy, compiled=compiled)
        # With secondary tiers the CPU tier sits inside vLLM's tiering manager, which the
        # lookups, stores and finishes go through (the hook; None: the CPU tier alone).
        self.tiering: TieringManager | None = None
        if config.secondary_tiers:
            tiers = [SecondaryTier(c) for c in config.secondary_tiers]
            self.tiering = TieringManager(self.manager, tiers)
        self._states: dict[int, _RequestState] = {}
        self._jobs: dict[int, TransferJob] = {}  # in flight
        self._next_job_id = 0
        # Chunks some load will write to the GPU: another request wanting them waits, so
        # the same chunk is not loaded twice (only with GPU prefix caching, as vLLM).
        self._chunks_being_loaded: set[OffloadKey] | None = set() if prefix_caching else None
        self._block_pending_jobs: dict[int, set[int]] = {}  # freed block -> its pending stores
        self._batch_loads: list[TransferJob] = []
        self._batch_allocated: set[int] = set()
        self._batch_evicted: list[OffloadKey] = []
        self._finished_since_meta: list[int] = []
        # Per-run totals (tokens, chunks) for metrics.
        self.num_loaded_chunks = 0
        self.num_stored_chunks = 0

    # --- requests ---------------------------------------------------------------------------

    def on_new_request(self, seq: Sequence) -> None:
        st = self._states[seq.seq_id] = _RequestState(seq, self.manager.new_context(seq.seq_id))
        if self.tiering is not None:
            self.tiering.on_new_request(st.ctx, seq.seq_id)

    def has_pending_work(self) -> bool:
        """Jobs in flight, or finished requests whose last stores are still to be made: the
        engine must keep stepping (vLLM: has_pending_push_work, and finished_req_ids still
        to reach the connector); with secondary tiers, their jobs in flight too."""
        if self.tiering is not None and self.tiering.has_pending_work():
            return True
        return bool(self._jobs or self._finished_since_meta)

    def _update_offload_keys(self, st: _RequestState) -> None:
        """One key per full chunk of the request's tokens: its last block's chained key;
        a key's position is the token count up to its chunk's end."""
        bpc, tpc = self.config.blocks_per_chunk, self.tokens_per_chunk
        seq = st.seq
        num_chunks = seq.num_tokens // tpc
        keys = st.offload_keys
        if len(keys) >= num_chunks:
            return
        hashes = ensure_block_hashes(seq, num_chunks * bpc, self.block_size)
        first = len(keys)
        new_keys = hashes[(first + 1) * bpc - 1 : num_chunks * bpc : bpc]
        keys.extend(new_keys)
        self.manager.add_positions(st.ctx, new_keys, (first + 1) * tpc, tpc)

    # --- lookup ---------------------------------------------------------------------------------

    def get_num_new_matched_tokens(self, seq: Sequence, num_local_tokens: int) -> int | None:
        """Tokens the tier adds beyond the ``num_local_tokens`` GPU hit (block-aligned); None
        when the request must wait for transfers first (module docstring)."""
        st = self._states[seq.seq_id]
        st.block_ids.clear()
        st.next_stored_chunk = 0  # starting over: every chunk may be offered again
        if st.transfer_jobs:
            return None
        self._update_offload_keys(st)
        st.num_local_tokens = num_local_tokens
        tpc = self.tokens_per_chunk
        keys = st.offload_keys
        max_hit = min(seq.num_tokens, len(keys) * tpc)
        if max_hit - num_local_tokens < tpc:
            return 0
        start = num_local_tokens // tpc
        end = min(-(-max_hit // tpc), len(keys))
        num_hit_chunks = 0
        pending = False
        if self.tiering is not None:
            num_hit_chunks, pending, retry = self.tiering.prefix_lookup(keys[start:end], st.ctx)
            if retry:
                return None  # a secondary tier's probe is on its way
        else:
            for key in keys[start:end]:
                result = self.manager.lookup(key)
                if result is MISS:
                    break
                num_hit_chunks += 1
                pending |= result is HIT_PENDING
        if num_hit_chunks == 0:
            return 0
        if not pending:
            max_hit = min(max_hit, tpc * (start + num_hit_chunks))
        num_hit_tokens = max_hit - num_local_tokens
        if num_hit_tokens < tpc:
            return 0
        if pending:
            return None  # a chunk it would load is still being stored
        being_loaded = self._chunks_being_loaded
        if being_loaded:
            needed = keys[start : -(-(num_local_tokens + num_hit_tokens) // tpc)]
            if not being_loaded.isdisjoint(needed):
                return None
        return num_hit_tokens

    def update_state_after_alloc(self, seq: Sequence, num_external_tokens: int) -> None:
        """``seq``'s blocks are allocated (its local hit plus ``num_external_tokens`` to load):
        issue the load of the blocks past the local hit."""
        table = seq.block_table
        self._batch_allocated.update(table)
        if num_external_tokens == 0:
            return
        st = self._states[seq.seq_id]
        bs, bpc, tpc = self.block_size, self.config.blocks_per_chunk, self.tokens_per_chunk
        num_cached = st.num_local_tokens + num_external_tokens
        num_gpu_blocks = -(-num_cached // bs)
        # The blocks past the local hit are fresh (no key): the load writes those.
        first_block = -(-st.num_local_tokens // bs)
        num_chunks = -(-num_cached // tpc)
        keys = tuple(st.offload_keys[first_block // bpc : num_chunks])
        # vLLM's CHUNK_LEVEL policy: chunks hit (locally or loaded) are not offered again.
        st.next_stored_chunk = num_chunks
        if self.tiering is not None:
            self.tiering.prepare_load(keys, st.ctx)
        else:
            self.manager.prepare_load(keys, st.ctx)
        job = TransferJob(
            self._new_job_id(), seq.seq_id, False, keys, tuple(table[first_block:num_gpu_blocks])
        )
        self._batch_loads.append(job)
        st.transfer_jobs.add(job.job_id)
        self._jobs[job.job_id] = job
        self.num_loaded_chunks += len(keys)
        if self._chunks_being_loaded is not None:
            self._chunks_being_loaded.update(keys)

    def _new_job_id(self) -> int:
        job_id = self._next_job_id
        self._next_job_id += 1
        return job_id

    # --- end of schedule() ------------------------------------------------------------------

    def build_meta(
        self,
        scheduled: list[Sequence],
        num_new_tokens: list[int],
        admitted: list[Sequence],
        preempted: list[Sequence],
    ) -> ConnectorMeta:
        """This step's loads, stores and flushes (module docstring). ``scheduled`` and
        ``num_new_tokens``: the step's batch; ``admitted``: who of it joined this step (their
        whole tables are new to the worker); ``preempted``: who was preempted."""
        allocated = self._batch_allocated
        admitted_ids = {seq.seq_id for seq in admitted}
        tiering = self.tiering
        if tiering is not None:  # CPU chunks this step's promotions evicted come first
            self._batch_evicted[:0] = tiering.take_evicted()
        for seq in scheduled:
            st = self._states[seq.seq_id]
            if st.next_stored_chunk < self._max_chunks(seq):
                self._update_offload_keys(st)
            if seq.seq_id in admitted_ids:
                st.block_ids[:] = seq.block_table
                allocated.update(seq.block_table)
            else:
                new_blocks = seq.block_table[len(st.block_ids) :]
                st.block_ids.extend(new_blocks)
                allocated.update(new_blocks)
        jobs_to_flush: set[int] = set()
        batch_load_ids = {job.job_id for job in self._batch_loads}
        for seq in preempted:
            victim = self._states.get(seq.seq_id)
            if victim is not None:
                jobs_to_flush.update(victim.transfer_jobs - batch_load_ids)
        pending = self._block_pending_jobs
        if pending and not allocated.isdisjoint(pending):
            for b in allocated:
                jobs_to_flush.update(pending.get(b, ()))
        store_jobs = []
        finished = [self._states[i] for i in self._finished_since_meta if i in self._states]
        # A request that has offered every chunk it may store has nothing to store (most
        # decoding requests: vLLM stores prompt chunks only), so it is not asked.
        work = [
            (st, n)
            for s, n in zip(scheduled, num_new_tokens)
            if (st := self._states[s.seq_id]).next_stored_chunk < self._max_chunks(s)
        ]
        work.extend((st, 0) for st in finished)
        for st, n in work:
            job = self._store_job(st, n)
            if job is None:
                continue
            store_jobs.append(job)
            if st.finished:
                for b in job.gpu_block_ids:
                    pending.setdefault(b, set()).add(job.job_id)
                    if b in allocated:
                        jobs_to_flush.add(job.job_id)
        for st in finished:
            st.signaled = True
            if tiering is not None:
                tiering.on_request_finished(st.ctx)
            else:
                self.manager.on_request_finished(st.ctx)
            if not st.transfer_jobs:
                del self._states[st.seq.seq_id]
        if tiering is not None:
            tiering.on_schedule_end()  # vLLM: the step's last manager call
        meta = ConnectorMeta(self._batch_loads, store_jobs, jobs_to_flush, self._batch_evicted)
        self._batch_evicted = []
        self._batch_loads = []
        self._batch_allocated = set()
        self._finished_since_meta = []
        return meta

    def _max_chunks(self, seq: Sequence) -> int:
        """Chunks ``seq`` could ever store: its prompt's full chunks (vLLM's
        offload_prompt_only), else all its tokens' (it grows)."""
        tokens = seq.num_prompt_tokens if self.config.offload_prompt_only else seq.num_tokens
        return tokens // self.tokens_per_chunk

    def _store_job(self, st: _RequestState, num_scheduled: int) -> TransferJob | None:
        seq = st.seq
        if st.finished:
            # The last sampled token's KV is never written: stop one short of it.
            computed_after = max(seq.num_prompt_tokens, seq.num_tokens - 1)
        else:
            computed_after = seq.cached_token_count + num_scheduled
        offloadable = min(computed_after, seq.num_tokens)
        if self.config.offload_prompt_only:
            offloadable = min(offloadable, seq.num_prompt_tokens)
        bpc = self.config.blocks_per_chunk
        num_chunks = min(
            offloadable // self.tokens_per_chunk,
            len(st.block_ids) // bpc,
            len(st.offload_keys),
        )
        start = st.next_stored_chunk
        if num_chunks <= start:
            return None
        offered = st.offload_keys[start:num_chunks]
        if self.tiering is not None:
            out = self.tiering.prepare_store(offered, st.ctx)
        else:
            out = self.manager.prepare_store(offered, st.ctx)
        if out is None:
            return None  # the tier is full of pinned chunks: offered again next step
        st.next_stored_chunk = num_chunks
        self._batch_evicted.extend(out.evicted_keys)
        if not out.keys_to_store:
            return None
        to_store = set(out.keys_to_store)
        blocks: list[int] = []
        for i, key in enumerate(offered, start):
            if key in to_store:
                blocks.extend(st.block_ids[i * bpc : (i + 1) * bpc])
        job = TransferJob(
            self._new_job_id(), seq.seq_id, True, tuple(out.keys_to_store), tuple(blocks)
        )
        st.transfer_jobs.add(job.job_id)
        self._jobs[job.job_id] = job
        self.num_stored_chunks += len(job.keys)
        return job

    # --- update() ---------------------------------------------------------------------------

    def request_finished(self, seq: Sequence) -> None:
        """``seq`` finished (its blocks are freed right after): its in-flight stores now
        fence their source blocks, and its last chunks are offered at the next build_meta."""
        st = self._states.get(seq.seq_id)
        if st is None:
            return
        self._update_offload_keys(st)
        st.finished = True
        for job_id in st.transfer_jobs:
            job = self._jobs[job_id]
            if job.is_store:  # its source blocks are about to be freed: fence them
                for b in job.gpu_block_ids:
                    self._block_pending_jobs.setdefault(b, set()).add(job_id)
        self._finished_since_meta.append(seq.seq_id)

    def update_connector_output(self, completed_jobs: list[int]) -> list[TransferJob]:
        """Jobs reported done at a step's end (stores become readable, loads unpin); returns
        them, in the order given."""
        done: list[TransferJob] = []
        pending = self._block_pending_jobs
        if self.tiering is not None:
            # A store's completion submits its cascades, numbered in this order: job-id order
            # (the reference driver hands vLLM a step's completions so).
            completed_jobs = sorted(completed_jobs)
        for job_id in completed_jobs:
            job = self._jobs.pop(job_id)
            done.append(job)
            st = self._states[job.seq_id]
            if job.is_store:
                if self.tiering is not None:
                    self.tiering.complete_store(job.keys, st.ctx)
                else:
                    self.manager.complete_store(job.keys)
            else:
                self.manager.complete_load(job.keys)
                if self._chunks_being_loaded:
                    self._chunks_being_loaded.difference_update(job.keys)
            if pending and st.finished and job.is_store:
                for b in job.gpu_block_ids:
                    jobs = pending.get(b)
                    if jobs is not None:
                        jobs.discard(job_id)
                        if not jobs:
                            del pending[b]
            st.transfer_jobs.remove(job_id)
            if st.signaled and not st.transfer_jobs:
                del self._states[job.seq_id]
        return done

    def has_job(self, job_id: int) -> bool:
        """``job_id`` is in flight."""
        return job_id in self._jobs
