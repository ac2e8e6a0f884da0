"""The CPU tier with secondary tiers behind it: vLLM 0.33's TieringOffloadingManager
(vllm/v1/kv_offload/tiering/manager.py) for kvsim's connector.

The connector (engine/offload/connector.py) talks to this manager as it talks to the CPU tier
alone; the rules it adds (docs/offload.md, "Secondary tiers"):

- **Cascade**: when a GPU -> CPU store completes (``complete_store``), its chunks are written
  to every secondary tier; each write pins its CPU chunks (``prepare_read``: a reference, no
  access recorded) until it completes.
- **Lookup**: a chunk the CPU tier misses is asked of each secondary tier in order; the first
  HIT starts a promotion: a CPU slot is taken at once (``prepare_write`` = the CPU tier's
  ``prepare_store``, evicting as a store does; if it cannot, the chunk is a MISS) and the
  lookup answers HIT_PENDING, so the request waits; a tier's RETRY (its probe is on its way)
  makes the request wait too. The promotions of one step are submitted at its end, one job
  per (tier, request) (``_flush_pending_promotions``); when one completes the chunk becomes
  ready in the CPU tier (``complete_write``) and the next lookup loads it from there.
- **Polling**: secondary jobs are polled (their completions applied) at a step's first lookup,
  at every ``prepare_store`` and at the step's end (``_maybe_process_finished_jobs``,
  ``prepare_store``, ``on_schedule_end``), at the scheduler's clock ``now`` (s), which the
  simulator sets before each schedule() and update().
- **Pending work**: jobs in flight keep the engine stepping (``has_pending_work``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.offload.cpu_manager import CPUOffloadManager, LookupResult, PrepareStoreOutput
from engine.offload.policies import OffloadKey, RequestContext
from engine.offload.secondary_tier import SecondaryTier, TierJob, TierLookup

# What a lookup answers besides the CPU tier's three: a secondary tier's probe is on its way.
RETRY = "retry"


@dataclass(slots=True)
class _Request:
    seq_id: int
    pending_primary_stores: int = 0
    finished: bool = False


class TieringManager:
    """The CPU tier ``primary`` and ``tiers`` behind it (module docstring). Reads of the CPU
    tier's counters (``num_held``, ``num_evicted``, ``policy``...) go to ``primary``."""

    def __init__(self, primary: CPUOffloadManager, tiers: Sequence[SecondaryTier]) -> None:
        self.primary = primary
        self.tiers = list(tiers)
        self.now = 0.0  # s: the scheduler's clock, set by the simulator
        self._requests: dict[int, _Request] = {}  # id(ctx) -> state
        self._contexts: dict[int, RequestContext] = {}  # id(ctx) -> ctx (keeps ids unique)
        self._jobs: dict[int, tuple[int, TierJob, int]] = {}  # job -> (tier, job, ctx id)
        self._next_job_id = 0
        self._polled = False  # this step's once-per-step poll is done
        self._pending: dict[int, dict[int, list[OffloadKey]]] = {}  # tier -> ctx id -> keys
        self._evicted: list[OffloadKey] = []  # CPU chunks promotions evicted, not yet taken
        # Where each request's promoted chunks came from (vLLM's _request_load_sources), and
        # per tier the chunks promoted and the chunks requests then loaded (hits by tier).
        self._sources: dict[int, dict[OffloadKey, int]] = {}
        self.promoted_chunks = [0] * len(self.tiers)
        self.loaded_chunks = [0] * len(self.tiers)
        # (event, job id, seq id, keys) of every job submitted or reported, in order, when a
        # caller sets a list here (the golden replays); None: not kept.
        self.log: list[tuple[str, int, int, tuple[OffloadKey, ...]]] | None = None

    def __getattr__(self, name: str) -> object:
        return getattr(self.primary, name)

    # --- requests ---------------------------------------------------------------------------

    def on_new_request(self, ctx: RequestContext, seq_id: int) -> None:
        self._requests[id(ctx)] = _Request(seq_id)
        self._contexts[id(ctx)] = ctx

    def on_request_finished(self, ctx: RequestContext) -> None:
        self.primary.on_request_finished(ctx)
        state = self._requests.get(id(ctx))
        if state is not None:
            state.finished = True
            self._maybe_finalize(id(ctx))

    def _maybe_finalize(self, cid: int) -> None:
        """The tiers forget the request once no cascade of it can come any more."""
        state = self._requests[cid]
        if not state.finished or state.pending_primary_stores:
            return
        for tier in self.tiers:
            tier.on_request_finished(state.seq_id)
        self._sources.pop(cid, None)
        del self._requests[cid]
        del self._contexts[cid]

    # --- polling ----------------------------------------------------------------------------

    def _poll(self) -> None:
        for tier in self.tiers:
            for job in tier.get_finished_jobs(self.now):
                del self._jobs[job.job_id]
                if self.log is not None:
                    self.log.append(("done", job.job_id, -1, ()))
                if job.is_promotion:
                    self.primary.complete_store(job.keys)  # complete_write
                else:
                    self.primary.complete_load(job.keys)  # complete_read: unpin

    def _maybe_poll(self) -> None:
        if not self._polled:
            self._polled = True
            self._poll()

    # --- the CPU tier's interface -----------------------------------------------------------

    def lookup(self, key: OffloadKey, ctx: RequestContext) -> LookupResult | str:
        """HIT / HIT_PENDING / MISS as the CPU tier's, or RETRY (module docstring)."""
        self._maybe_poll()
        result = self.primary.lookup(key)
        if result is not LookupResult.MISS:
            return result
        cid = id(ctx)
        seq_id = self._requests[cid].seq_id
        retry = False
        for i, tier in enumerate(self.tiers):
            answer = tier.lookup(key, seq_id)
            if answer is TierLookup.HIT:
                out = self.primary.prepare_store([key], ctx)  # prepare_write
                if out is None:
                    return LookupResult.MISS  # the CPU tier is full of pinned chunks
                self._evicted.extend(out.evicted_keys)
                self._pending.setdefault(i, {}).setdefault(cid, []).extend(out.keys_to_store)
                sources = self._sources.setdefault(cid, {})
                for promoted in out.keys_to_store:
                    sources[promoted] = i
                return LookupResult.HIT_PENDING
            retry |= answer is TierLookup.RETRY
        return RETRY if retry else LookupResult.MISS

    def prefix_lookup(
        self, keys: Sequence[OffloadKey], ctx: RequestContext
    ) -> tuple[int, bool, bool]:
        """vLLM's _maximal_prefix_lookup with tiers (offloading/scheduler.py): consecutive
        hits (HIT, or HIT_PENDING: a store or a promotion in flight) up to the first MISS; a
        RETRY counts no hit but does not stop the scan, so every chunk's probe or promotion
        starts. Returns (hits, any pending, any retry)."""
        num_hits = 0
        pending = retry = False
        for key in keys:
            result = self.lookup(key, ctx)
            if result is LookupResult.MISS:
                break
            if result is RETRY:
                retry = True
                continue
            num_hits += 1
            pending |= result is LookupResult.HIT_PENDING
        return num_hits, pending, retry

    def prepare_load(self, keys: Sequence[OffloadKey], ctx: RequestContext) -> None:
        self.primary.prepare_load(keys, ctx)
        sources = self._sources.get(id(ctx))
        if sources:
            for key in keys:
                i = sources.get(key)
                if i is not None:
                    self.loaded_chunks[i] += 1

    def load_sources(self, keys: Sequence[OffloadKey], ctx: RequestContext) -> list[int]:
        """Per secondary tier, how many of ``keys`` (a load of ``ctx``'s request) it had
        promoted for this request (the rest came from the CPU tier)."""
        counts = [0] * len(self.tiers)
        sources = self._sources.get(id(ctx))
        if sources:
            for key in keys:
                i = sources.get(key)
                if i is not None:
                    counts[i] += 1
        return counts

    def complete_load(self, keys: Sequence[OffloadKey] | set[OffloadKey]) -> None:
        self.primary.complete_load(keys)

    def prepare_store(
        self, keys: Sequence[OffloadKey], ctx: RequestContext
    ) -> PrepareStoreOutput | None:
        """Poll first (completed cascades unpin, promotions become evictable), then the CPU
        tier's prepare_store."""
        self._polled = True
        self._poll()
        out = self.primary.prepare_store(keys, ctx)
        if out is not None and out.keys_to_store:
            self._requests[id(ctx)].pending_primary_stores += 1
        return out

    def complete_store(self, keys: Sequence[OffloadKey], ctx: RequestContext) -> None:
        """The GPU -> CPU store of ``keys`` completed: they become ready and cascade."""
        self.primary.complete_store(keys)
        cid = id(ctx)
        for i, tier in enumerate(self.tiers):
            self._pin(keys)  # prepare_read
            job = tier.submit_store(self._new_job_id(), tuple(keys), self.now)
            self._jobs[job.job_id] = (i, job, cid)
            if self.log is not None:
                self.log.append(("cascade", job.job_id, self._requests[cid].seq_id, job.keys))
        state = self._requests[cid]
        state.pending_primary_stores -= 1
        self._maybe_finalize(cid)

    def _pin(self, keys: Sequence[OffloadKey]) -> None:
        """vLLM's prepare_read: a reference on each ready chunk, no access recorded."""
        primary = self.primary
        for key in keys:
            chunk = primary.policy.get(key)
            if chunk is None or not chunk.is_ready:
                raise ValueError(f"chunk {key} is not ready to cascade")
            if chunk.ref_cnt == 0:
                primary.policy.mark_non_evictable(key)
                primary.num_evictable -= 1
            chunk.ref_cnt += 1

    def _new_job_id(self) -> int:
        job_id = self._next_job_id
        self._next_job_id += 1
        return job_id

    # --- end of a step ----------------------------------------------------------------------

    def take_evicted(self) -> list[OffloadKey]:
        """CPU chunks that promotions evicted since the last call."""
        evicted, self._evicted = self._evicted, []
        return evicted

    def on_schedule_end(self) -> None:
        """Poll (once a step), submit this step's promotions, post the tiers' probes."""
        self._maybe_poll()
        self._polled = False
        for i, by_request in self._pending.items():
            tier = self.tiers[i]
            for cid, keys in by_request.items():
                job = tier.submit_load(self._new_job_id(), tuple(keys), self.now)
                self._jobs[job.job_id] = (i, job, cid)
                if self.log is not None:
                    seq_id = self._requests[cid].seq_id
                    self.log.append(("promotion", job.job_id, seq_id, job.keys))
                self.promoted_chunks[i] += len(keys)
        self._pending.clear()
        for tier in self.tiers:
            tier.on_schedule_end(self.now)

    def has_pending_work(self) -> bool:
        return bool(self._jobs)

    def next_event_time(self) -> float | None:
        """When the engine must step again for these tiers (s): now while probes wait for
        their answers, else the next job completion; None when idle."""
        if any(tier.probes_waiting() for tier in self.tiers):
            return self.now
        times = [t for tier in self.tiers if (t := tier.next_completion_time()) is not None]
        return min(times) if times else None
