"""FastV1Scheduler: the v1 scheduler for placeholder-token runs (the simulator's cost mode).

``FastDecodeScheduler(config, bm)`` with ``config.scheduler == "v1"`` builds one. It makes
exactly the plain V1Scheduler's decisions, events, outputs and counters (tests/engine compare
them), with the machinery of engine/fast/decode.py applied to v1's mixed steps:

- Running sequences that decode are tracked lazily: exact computed tokens = stored value +
  (fast steps since their mark). Those whose next token starts a block (they take one from
  the free queue) and those whose token fills a block (it is cached, under a key made in
  O(1) from the previous one) are two residue classes of (computed tokens - mark) modulo
  the block size, kept in per-class lists in running order; finishes come off a heap.
- A step is fast when the running pass cannot run out of budget before its last sequence:
  then only the decoders of those two classes and the sequences still prefilling are
  visited, in running order, as the plain running pass would visit them; under FCFS, when
  the blocks they need are short, the last running sequences are preempted before a visit,
  as the plain pass does (``_preempting_pass``). The waiting pass is the plain one, skipped
  while the waiting head is known blocked (engine/fast/blocked_head.py).
- Any other step (a budget that cuts decodes, a priority preemption) brings everything up
  to date and runs the plain V1Scheduler step.

``run_plain_decodes`` / ``begin_plain_decode`` / ``end_plain_decode`` run decode-only steps
back to back without output objects, as FastDecodeScheduler's do. A fast step's output
(``FastV1Output``) says which scheduled sequences are exact; the rest are decoders, whose
total context the scheduler's ``num_cached_tokens`` gives (as FastDecodeScheduler's does).
Call ``sync()`` before
reading running sequences' state or calling ``check_invariants()``.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.core.block_manager import BlockManager
from engine.core.errors import SchedulerError
from engine.core.events import EventKind, EventSink, StepKind
from engine.core.scheduler_output import SchedulerConfig, SchedulerOutput
from engine.core.sequence import Sequence, SequenceStatus
from engine.fast.decode import FastDecodeOutput, PlainStepCallback
from engine.fast.lazy_v1 import LazyV1Scheduler

RUNNING = SequenceStatus.RUNNING  # module constants: see engine/core/scheduler.py
FINISHED_LENGTH = SequenceStatus.FINISHED_LENGTH
FINISH = EventKind.FINISH
PREFILL, DECODE, MIXED = StepKind.PREFILL, StepKind.DECODE, StepKind.MIXED


class FastV1Output(FastDecodeOutput):
    """A fast v1 step: no per-token views (see FastDecodeOutput). ``exact_seqs`` lists the
    scheduled sequences whose state is exact between ``schedule()`` and ``update()`` (those
    prefilling, and those admitted), with their tokens; every other scheduled sequence is a
    decoder computing 1 token, whose ``cached_token_count`` may lag. Their total context
    (computed tokens + 1 each) is ``scheduler.num_cached_tokens + out.num_batched_tokens``
    minus the ``cached_token_count + n`` of the exact ones."""

    __slots__ = ("exact_seqs",)
    exact_seqs: list[tuple[Sequence, int]]


class FastV1Scheduler(LazyV1Scheduler):
    """V1Scheduler whose decodes cost O(blocks taken or filled); every sampled decode token
    is taken to be ``token`` (sequences must not be stoppable by a token)."""

    def __init__(
        self,
        config: SchedulerConfig,
        block_manager: BlockManager,
        event_sink: EventSink | None = None,
        *,
        token: int = 0,
    ) -> None:
        super().__init__(config, block_manager, event_sink, token=token)
        self._fast_out: SchedulerOutput | None = None
        self._fast_batch: list[tuple[Sequence, int, int]] = []  # nonlazy (seq, n, position)
        self._plain_pending = False

    # --- schedule -----------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        if self._plain_pending:
            raise SchedulerError("a plain decode step is pending; call end_plain_decode()")
        if self._pending is not None:
            raise SchedulerError(f"step {self._pending.step} was scheduled but never updated")
        if self.block_manager.event_sink is not None:
            self._count_fills()
        out = self._schedule_fast()
        if out is None:
            self._detach_all()
            out = super().schedule()
        return out

    def _plan_running(self, threshold: int) -> tuple[list[int], bool] | None:
        """Each prefilling sequence's tokens this step, and whether the blocks the running
        pass needs exceed the free ones (FCFS: it then preempts from the tail, as the plain
        pass does), if it cannot cut a decode for budget and, under priority, cannot
        preempt; else None (take the plain path)."""
        running, nonlazy = self._running, self._nonlazy
        cfg, bm = self.config, self.block_manager
        max_len = cfg.max_model_len
        budget = cfg.max_num_batched_tokens
        tokens = len(running) - len(nonlazy)
        chunks: list[int] = []
        for seq in nonlazy:
            cached = seq.cached_token_count
            n = seq.num_prompt_tokens + len(seq.generated_token_ids) - cached
            if 0 < threshold < n:
                n = threshold
            if max_len is not None and n > max_len - cached - 1:
                n = max_len - cached - 1
            if n <= 0:
                return None
            chunks.append(n)
            tokens += n
        if tokens > budget:
            # Only the last running sequence may be cut (the budget then ends the pass).
            if not nonlazy or running[-1] is not nonlazy[-1] or tokens - chunks[-1] >= budget:
                return None
            chunks[-1] -= tokens - budget
        bs = bm.block_size
        blocks = len(self._buckets[-self._decodes % bs])
        for seq, n in zip(nonlazy, chunks):
            slots = seq.cached_token_count + n
            if max_len is not None and slots > max_len:
                slots = max_len
            blocks += max(-(-slots // bs) - len(seq.block_table), 0)
        short = blocks > bm.get_num_free_blocks()
        if short and self._by_priority:
            return None  # its victims may be scheduled already: the plain pass
        return chunks, short

    def _schedule_fast(self) -> SchedulerOutput | None:
        if not self._running:
            return None
        cfg = self.config
        eligible = len(self._running) + self.num_waiting
        threshold = cfg.long_prefill_token_threshold if eligible > 1 else 0
        plan = self._plan_running(threshold)
        if plan is None:
            return None
        chunks, short = plan
        self.step += 1
        sink = self.event_sink
        if sink is not None:
            sink.begin_step(self.step)
        running, nonlazy = self._running, self._nonlazy
        preempted: list[Sequence] = []
        if short:
            chunks = self._preempting_pass(chunks, preempted)
        else:
            self._running_pass(chunks)
        num_running = len(running)
        # The batch: every running sequence (decoders 1 token each), then the admitted.
        seqs = running.copy()
        num_new_tokens = [1] * num_running
        batch: list[tuple[Sequence, int, int]] = []
        if nonlazy:
            position = {id(s): i for i, s in enumerate(running)} if len(nonlazy) > 4 else None
            for seq, n in zip(nonlazy, chunks):
                at = running.index(seq) if position is None else position[id(seq)]
                num_new_tokens[at] = n
                batch.append((seq, n, at))
        budget = cfg.max_num_batched_tokens - sum(num_new_tokens)
        admitted: list[Sequence] = []
        rejected = self._finished_early.copy()
        if not preempted and self._head.waiting_pass_may_admit(budget):
            added_tokens: list[int] = []
            self._schedule_waiting(threshold, budget, seqs, added_tokens, admitted, rejected)
            for j, (seq, n) in enumerate(zip(admitted, added_tokens)):
                batch.append((seq, n, num_running + j))
            num_new_tokens.extend(added_tokens)
            budget -= sum(added_tokens)
            self._head.note(budget)
        num_decodes = num_running - len(chunks)
        for seq, n, _ in batch:
            if n == 1 and seq.cached_token_count + 1 == seq.num_prompt_tokens + len(
                seq.generated_token_ids
            ):
                num_decodes += 1
        kind = DECODE if num_decodes == len(seqs) else PREFILL if num_decodes == 0 else MIXED
        out = FastV1Output(
            step=self.step,
            kind=kind,
            seqs=seqs,
            num_new_tokens=num_new_tokens,
            block_size=self.block_manager.block_size,
            preempted=preempted,
            rejected=rejected,
            admitted=admitted,
        )
        out.exact_seqs = [(seq, n) for seq, n, _ in batch]
        self._pending = self._fast_out = out
        self._fast_batch = batch
        if sink is not None and seqs:  # (a step that preempted everyone records no STEP)
            sink.record_step(
                kind, len(seqs), out.num_batched_tokens, self.block_manager.get_num_free_blocks()
            )
        return out

    # --- update -------------------------------------------------------------------------------

    def update(self, output: SchedulerOutput, sampled_token_ids: list[int]) -> list[Sequence]:
        if output is not self._fast_out:
            finished = super().update(output, sampled_token_ids)
            self._attach_all()
            return finished
        if output is not self._pending:
            raise SchedulerError(f"update() got step {output.step}, not the pending step")
        if len(sampled_token_ids) != len(output.seqs):
            raise SchedulerError(
                f"step {output.step}: {len(sampled_token_ids)} sampled tokens for "
                f"{len(output.seqs)} sequences"
            )
        self._pending = self._fast_out = None
        output._updated = True
        self._decodes += 1
        self.num_cached_tokens += len(self._epoch)  # decoders aborted mid-step already left
        done: list[Sequence] = []
        for seq, n, at in self._fast_batch:
            if seq.status is not RUNNING:
                continue
            cached = seq.cached_token_count + n
            seq.cached_token_count = cached
            self.num_cached_tokens += n
            if cached < seq.num_prompt_tokens + len(seq.generated_token_ids):
                continue
            token = sampled_token_ids[at]
            seq.generated_token_ids.append(token)
            seq.last_token_id = token
            if len(seq.generated_token_ids) == 1 and self.event_sink is not None:
                self._record_first_token(seq)
            self._nonlazy.remove(seq)
            if cached >= seq._finish_cached_count:
                seq.finish_reason = "length"
                done.append(seq)
            else:
                self._join(seq)
        self._fast_batch = []
        return self._finish_due(done)

    # --- plain decode steps without output objects (the simulator's multi-step loop) -------

    def run_plain_decodes(
        self, on_step: PlainStepCallback, on_finished: Callable[[list[Sequence]], None]
    ) -> bool:
        """FastDecodeScheduler.run_plain_decodes under v1: decode steps back to back while
        every running sequence decodes, the budget covers them, no block is short and no
        waiting sequence can be admitted. Same callbacks and return value."""
        if self._pending is not None or self._plain_pending:
            raise SchedulerError("a step is pending; update it before starting another")
        bm, sink, blocked = self.block_manager, self.event_sink, self._head
        if bm.event_sink is not None:
            self._count_fills()
        bs, num_blocks = bm.block_size, bm.num_blocks
        buckets, heap = self._buckets, self._finish_heap
        max_tokens = self.config.max_num_batched_tokens
        # The decoders that fill a block this step (bs > 1; at bs 1 the token fills the
        # block it takes: _running_pass handles that case).
        fills = bm.enable_prefix_caching and bs > 1
        single = bs == 1 and bm.enable_prefix_caching
        decode_pass = self._decode_pass
        take, cache_filling = bm.take_decode_blocks, self._cache_filling
        # Within the loop only finishes change the batch, the seats and the budget, and the
        # free blocks only shrink, by one per block taken: the waiting head is looked at
        # again after finishes, or when a block it could hit was cached. Steps where no
        # decoder takes or fills a block (most steps at small batches) do no block work.
        check_head = True
        n = len(self._running)
        d, step = self._decodes, self.step
        num_free = bm.get_num_free_blocks()
        if fills and sink is None and bm.event_sink is None:
            self._fills_counted_at_sync = True
        while n and not self._nonlazy and not self._finished_early:
            if check_head or bm._watch_hit:
                budget = max_tokens - n
                if budget < 0:
                    return False
                if blocked.waiting_pass_may_admit(budget) and not blocked.blocked(budget):
                    return False
                check_head = False
            needing = buckets[-d % bs]
            k = len(needing)
            if k > num_free:
                return False
            step += 1
            self.step = step
            if sink is not None:
                sink.begin_step(step)
            if single:
                self._running_pass(_NO_CHUNKS)
            elif fills:
                if sink is None:  # _decode_pass without events, inlined
                    if k:
                        take(needing)
                    if self._num_shared_running:
                        filling = buckets[(-d - 1) % bs]
                        if filling:
                            cache_filling(filling)
                    # else: unique prompts only, their fills are counted at _sync
                    # (lazy_v1.py): Azure bench first 8,000 requests, median thread CPU
                    # 2.08 -> 1.96 s (6 rounds interleaved)
                else:
                    filling = buckets[(-d - 1) % bs]
                    if k or filling:
                        decode_pass(needing, filling)
            elif k:
                decode_pass(needing, _NO_SEQS)
            num_free -= k
            if sink is not None:
                sink.record_step(DECODE, n, n, num_free)
            self._in_step = True
            ran = on_step(n, self.num_cached_tokens + n, num_blocks - num_free)
            self._in_step = False
            if not ran:
                self._plain_pending = True
                return True
            d += 1
            self._decodes = d
            self.num_cached_tokens += n
            if heap and heap[0][0] <= d:
                on_finished(self._finish_due([]))
                n = len(self._running)
                num_free = bm.get_num_free_blocks()
                check_head = True
        return False

    def begin_plain_decode(self) -> int:
        """FastDecodeScheduler.begin_plain_decode under v1."""
        batch_size = 0

        def leave_pending(num_seqs: int, context_tokens: int, num_used_blocks: int) -> bool:
            nonlocal batch_size
            batch_size = num_seqs
            return False

        self.run_plain_decodes(leave_pending, _never_called)
        return batch_size

    def end_plain_decode(self) -> list[Sequence]:
        """Update the pending plain step; returns the sequences it finished."""
        if not self._plain_pending:
            raise SchedulerError("no plain decode step is pending")
        self._plain_pending = False
        self._decodes += 1
        self.num_cached_tokens += len(self._running)
        return self._finish_due([])


_NO_CHUNKS: list[int] = []
_NO_SEQS: list[Sequence] = []


def _never_called(finished: list[Sequence]) -> None:
    raise AssertionError("a step left pending finishes nothing")
