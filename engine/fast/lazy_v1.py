"""LazyV1Scheduler: the v1 scheduler's running decoders tracked lazily (FastV1Scheduler's base).

In cost mode every running sequence that decodes gains one placeholder token per fast
step, so its state is kept as (stored value, mark): exact computed tokens = stored value +
(fast steps since its mark). The decoders are kept in one list per residue class of
(computed tokens - mark) modulo the block size, in running order (admission numbers), and
their finishes on a heap keyed by fast step. Running sequences still prefilling are kept
exact in ``_nonlazy``. Anything that changes the batch (a finish, preemption, abort) makes
the sequence exact first, through the V1Scheduler code. With no event sink and only unique
prompts running, decode steps do not visit the decoders whose token fills a block (their
caching is deferred: engine/v1/prefix_cache.py); ``_sync`` counts those blocks instead.

The block work of a step's running pass over that state is here too: ``_decode_pass`` when
every running sequence decodes, ``_running_pass`` and ``_preempting_pass`` (FCFS, blocks
short) when some still prefill, each visiting only the decoders that take or fill a block
and the prefilling sequences, in running order (engine/fast/fast_v1.py decides which runs).
"""

from __future__ import annotations

import heapq
from bisect import insort
from collections.abc import Callable

from engine.core.block_manager import BlockManager
from engine.core.errors import SchedulerError
from engine.core.events import EventKind, EventSink
from engine.core.scheduler_output import SchedulerConfig
from engine.core.sequence import Sequence, SequenceStatus
from engine.fast.blocked_head import BlockedHead
from engine.v1.scheduler import V1Scheduler

RUNNING = SequenceStatus.RUNNING  # module constants: see engine/core/scheduler.py
FINISHED_LENGTH = SequenceStatus.FINISHED_LENGTH
FINISH = EventKind.FINISH


class LazyV1Scheduler(V1Scheduler):
    """V1Scheduler with lazily tracked decoders (see the module docstring); every sampled
    decode token is taken to be ``token``."""

    def __init__(
        self,
        config: SchedulerConfig,
        block_manager: BlockManager,
        event_sink: EventSink | None = None,
        *,
        token: int = 0,
    ) -> None:
        super().__init__(config, block_manager, event_sink)
        self.token = token
        self._decodes = 0  # fast steps updated so far
        self._next_order = 0
        self._order: dict[int, int] = {}  # running seq_id -> admission number
        self._epoch: dict[int, tuple[int, int]] = {}  # lazy seq_id -> (mark, bucket)
        self._buckets: list[list[Sequence]] = [[] for _ in range(block_manager.block_size)]
        self._finish_heap: list[tuple[int, int, Sequence]] = []  # (decode no, order, seq)
        self._nonlazy: list[Sequence] = []  # running, still prefilling, in running order
        self._head = BlockedHead(self)
        self._order_key: Callable[[Sequence], int] = lambda s: self._order[s.seq_id]
        # Running sequences whose prompt may be shared (not a unique prompt's): while there
        # are none and no event sink, the decode steps skip the blocks their tokens fill
        # (their caching is deferred anyway: engine/v1/prefix_cache.py) and _sync counts them.
        self._num_shared_running = 0
        self._fills_counted_at_sync = False
        self._in_step = False  # run_plain_decodes is inside its on_step callback
        self._plain_pending = False  # a plain decode step is left pending (FastV1Scheduler)

    # --- lazy state ---------------------------------------------------------------------------

    def _join(self, seq: Sequence) -> None:
        """``seq`` runs and decodes: track it lazily from the current fast-step count."""
        d = self._decodes
        c = seq.cached_token_count
        bucket = (c - d) % self.block_manager.block_size
        self._epoch[seq.seq_id] = (d, bucket)
        order = self._order[seq.seq_id]
        heapq.heappush(self._finish_heap, (d + seq._finish_cached_count - c, order, seq))
        insort(self._buckets[bucket], seq, key=self._order_key)

    def _sync(self, seq: Sequence) -> None:
        mark, bucket = self._epoch[seq.seq_id]
        delta = self._decodes - mark
        if delta:
            seq.cached_token_count += delta
            seq.generated_token_ids.extend([self.token] * delta)
            seq.last_token_id = self.token
            self._epoch[seq.seq_id] = (self._decodes, bucket)
        if self._fills_counted_at_sync and _unique(seq):
            # A decoder's cached blocks: those its computed tokens fill, and the one its
            # token fills in a step scheduled and not yet updated (cached when scheduled).
            in_step = self._pending is not None or self._in_step or self._plain_pending
            num_full = (seq.cached_token_count + in_step) // self.block_manager.block_size
            if num_full > seq._num_cached_blocks:
                seq._num_cached_blocks = num_full

    def _count_fills(self) -> None:
        """Bring every decoder's cached-block count up to date (before an event sink sees
        them: it is attached after a run without one)."""
        if self._fills_counted_at_sync:
            self.sync()
            self._fills_counted_at_sync = False

    def sync(self) -> None:
        """Bring every running sequence's state up to date."""
        for seq in self._running:
            if seq.seq_id in self._epoch:
                self._sync(seq)

    def _leave(self, seq: Sequence) -> None:
        """``seq`` stops running or waiting: make it exact and stop tracking it."""
        self._head.drop()
        if seq.seq_id in self._epoch:
            self._sync(seq)
            self._buckets[self._epoch.pop(seq.seq_id)[1]].remove(seq)  # a C scan by identity
        elif seq in self._nonlazy:
            self._nonlazy.remove(seq)
        if self._order.pop(seq.seq_id, None) is not None and not _unique(seq):
            self._num_shared_running -= 1

    def _detach_all(self) -> None:
        """Make every running sequence exact and untracked (before a plain step)."""
        self.sync()
        self._epoch.clear()
        for bucket in self._buckets:
            bucket.clear()
        self._finish_heap.clear()
        self._nonlazy = list(self._running)
        self._head.drop()

    def _attach_all(self) -> None:
        """Track every running sequence again (after a plain step), in running order."""
        d, bs = self._decodes, self.block_manager.block_size
        nonlazy: list[Sequence] = []
        heap = self._finish_heap
        for seq in self._running:
            c = seq.cached_token_count
            generated = len(seq.generated_token_ids)
            # One that has not sampled its first token yet (a 1-token prompt, or a prompt
            # cached but its last token) stays exact: that step records its FIRST_TOKEN.
            if generated and c + 1 == seq.num_prompt_tokens + generated:
                bucket = (c - d) % bs
                self._epoch[seq.seq_id] = (d, bucket)
                self._buckets[bucket].append(seq)
                heap.append((d + seq._finish_cached_count - c, self._order[seq.seq_id], seq))
            else:
                nonlazy.append(seq)
        heapq.heapify(heap)
        self._nonlazy = nonlazy

    # --- block work of a pass where every running sequence decodes ---------------------

    def _decode_pass(self, needing: list[Sequence], filling: list[Sequence]) -> None:
        """The running pass of a step where every running sequence decodes: ``needing``
        take a block, ``filling`` cache the block their token fills (at block size 1 the same
        list: each takes a block and fills it)."""
        bm = self.block_manager
        if bm.event_sink is not None and len(needing) + len(filling) == 1:
            # one block: the batch's fixed costs would outweigh its savings
            if needing:
                bm.append_decode_block(needing[0])
            else:
                self._cache_decode(filling[0])
            return
        for seq in filling:
            if seq.prefix is None:
                self._sync(seq)  # its keys are made from its tokens
        bm.decode_blocks(needing, filling, self._order)

    def _cache_filling(self, filling: list[Sequence]) -> None:
        """Cache the blocks the tokens of ``filling`` fill, with no event sink."""
        for seq in filling:
            if seq.prefix is None:
                self._sync(seq)  # its keys are made from its tokens
        self.block_manager.cache_decode_blocks(filling)

    def _cache_decode(self, seq: Sequence) -> None:
        """Cache the block a lazily tracked decoder's token fills this step."""
        if seq.prefix is None:
            self._sync(seq)  # its keys are made from its tokens
        self.block_manager.cache_decode_block(seq)

    # --- the running pass of a fast step (FastV1Scheduler) ---------------------------------

    def _running_pass(self, chunks: list[int]) -> None:
        """The plain running pass, visiting only the sequences that do something: decoders
        taking or filling a block, and prefilling sequences, in running order."""
        bm = self.block_manager
        bs, d = bm.block_size, self._decodes
        caching = bm.enable_prefix_caching
        needing = self._buckets[-d % bs]
        filling = self._buckets[(-d - 1) % bs] if caching and bs > 1 else []
        if not self._nonlazy:
            # at block size 1 the token fills the block it took
            self._decode_pass(needing, needing if caching and bs == 1 else filling)
            return
        active, chunk_of, needs = self._visits(needing, filling, chunks)
        max_len = self.config.max_model_len
        for seq in active:
            n = chunk_of.get(id(seq))
            if n is not None:
                ok = bm.allocate_slots(
                    seq, n, [], full_sequence_tokens=0, watermark_blocks=0, max_model_len=max_len
                )
                assert ok, "a planned allocation failed"
            elif id(seq) in needs:
                bm.append_decode_block(seq)
                if caching and bs == 1:
                    self._cache_decode(seq)
            else:
                self._cache_decode(seq)

    def _visits(
        self, needing: list[Sequence], filling: list[Sequence], chunks: list[int]
    ) -> tuple[list[Sequence], dict[int, int], set[int]]:
        """A running pass's visits in running order (the decoders taking or filling a
        block, and the prefilling sequences), each prefilling one's tokens and the decoders
        taking a block (both by id)."""
        nonlazy = self._nonlazy
        active = [*needing, *filling, *nonlazy]
        active.sort(key=self._order_key)
        return active, {id(s): n for s, n in zip(nonlazy, chunks)}, {id(s) for s in needing}

    def _preempting_pass(self, chunks: list[int], preempted: list[Sequence]) -> list[int]:
        """``_running_pass`` of a step whose blocks are short (FCFS): before a visited
        sequence's blocks, the last running sequences are preempted until they fit, as the
        plain pass does; the pass ends when a sequence has to preempt itself. Victims come
        from the tail, so no visited sequence is one, and the budget of those visited is
        what the plan counted (1,885 of the full Azure conversation trace's 1,891 plain
        steps under v1 were such steps). Returns the chunks of the prefilling sequences
        still running (victims leave ``_nonlazy``)."""
        bm = self.block_manager
        bs = bm.block_size
        caching = bm.enable_prefix_caching
        needing = self._buckets[-self._decodes % bs]
        filling = self._buckets[(-self._decodes - 1) % bs] if caching and bs > 1 else []
        active, chunk_of, needs = self._visits(needing, filling, chunks)
        max_len = self.config.max_model_len
        for seq in active:
            if seq.status is not RUNNING:
                break  # preempted before its turn: so is every later one
            n = chunk_of.get(id(seq))
            if n is not None:
                while not bm.allocate_slots(
                    seq, n, [], full_sequence_tokens=0, watermark_blocks=0, max_model_len=max_len
                ):
                    if self._preempt_last(seq, preempted):
                        break
            elif id(seq) in needs:
                while not bm.get_num_free_blocks():  # a decode's one block
                    if self._preempt_last(seq, preempted):
                        break
                else:
                    bm.append_decode_block(seq)
                    if caching and bs == 1:
                        self._cache_decode(seq)
            else:
                self._cache_decode(seq)
            if seq.status is not RUNNING:
                break  # it preempted itself: the pass ends
        return [chunk_of[id(s)] for s in self._nonlazy]

    def _preempt_last(self, seq: Sequence, preempted: list[Sequence]) -> bool:
        """Preempt the last running sequence for ``seq``; whether that was ``seq``."""
        victim = self._running.pop()
        self._preempt(victim)
        preempted.append(victim)
        return victim is seq

    # --- overrides ----------------------------------------------------------------------------

    def add_request(self, seq: Sequence) -> None:
        if seq._stop_ids:
            raise SchedulerError(
                f"sequence {seq.seq_id} can be stopped by a token; FastV1Scheduler runs only "
                "placeholder tokens (use ignore_eos and no stop ids)"
            )
        self._head.drop()
        super().add_request(seq)

    def _on_admit(self, seq: Sequence) -> None:
        self._order[seq.seq_id] = self._next_order
        self._next_order += 1
        self._nonlazy.append(seq)
        if not _unique(seq):
            self._num_shared_running += 1

    def _finish(self, seq: Sequence, status: SequenceStatus, kind: EventKind) -> None:
        self._leave(seq)
        super()._finish(seq, status, kind)

    def _preempt(self, seq: Sequence) -> None:
        self._leave(seq)
        super()._preempt(seq)

    def abort(self, seq_id: int) -> bool:
        seq = self._unfinished.get(seq_id)
        if seq is not None and seq_id in self._epoch:
            self._sync(seq)
        return super().abort(seq_id)

    def _finish_due(self, done: list[Sequence]) -> list[Sequence]:
        """Finish ``done`` and the decoders at their length limit, in running order; returns
        them after any rejected while scheduling."""
        finished, self._finished_early = self._finished_early, []
        d = self._decodes
        heap, epoch, order = self._finish_heap, self._epoch, self._order
        while heap and heap[0][0] <= d:
            _, number, seq = heapq.heappop(heap)
            if seq.seq_id not in epoch or order.get(seq.seq_id) != number:
                continue  # it left (or was re-admitted) since
            self._sync(seq)
            seq.finish_reason = "length"
            done.append(seq)
        if done:
            if len(done) > 1:
                done.sort(key=self._order_key)
            for seq in done:
                self._finish(seq, FINISHED_LENGTH, FINISH)
            self._drop_finished(done)
            finished.extend(done)
        return finished


def _unique(seq: Sequence) -> bool:
    """Whether ``seq``'s prompt is shared with nobody (engine/v1/prefix_keys.py)."""
    return seq.prefix is not None and not seq.prefix.shared
