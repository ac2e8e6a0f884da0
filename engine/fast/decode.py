"""FastDecodeScheduler: the Scheduler for placeholder-token runs (the simulator's cost mode).

In cost mode no token value matters: every running sequence gains one token per decode step
and stops at its length limit. The plain Scheduler still touches every running sequence twice
per step, which bounds the simulator at about a microsecond per sequence per step. This
subclass makes a decode step cost O(sequences that allocate a block or finish) instead, and
produces exactly the plain Scheduler's events, outputs and counters (tests/engine compare them
step by step):

- a running sequence's ``cached_token_count`` and ``generated_token_ids`` are brought up to
  date lazily: exact value = stored value + (decode steps since its mark);
- the sequences whose next token starts a new block in a given step are those in one residue
  class of (cached tokens - mark) modulo block_size, kept in per-class lists in admission order;
- finishes come off a heap keyed by the decode step whose update finishes them.

Preemption and rejection go through the plain Scheduler's own code, after bringing the victim
up to date. Call ``sync()`` before reading running sequences' state or calling
``check_invariants()``.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from engine.core.block_manager import BlockManager
from engine.core.errors import SchedulerError
from engine.core.events import EventKind, EventSink, StepKind
from engine.core.scheduler import Scheduler
from engine.core.scheduler_output import SchedulerConfig, SchedulerOutput
from engine.core.sequence import Sequence, SequenceStatus

RUNNING = SequenceStatus.RUNNING  # module constants: see engine/core/scheduler.py
FINISHED_LENGTH = SequenceStatus.FINISHED_LENGTH
FINISH = EventKind.FINISH
PREFILL, DECODE = StepKind.PREFILL, StepKind.DECODE

# (num_seqs, context_tokens, num_used_blocks) of a scheduled plain step -> whether it has run
PlainStepCallback = Callable[[int, int, int], bool]


def _never_called(finished: list[Sequence]) -> None:
    raise AssertionError("a step left pending finishes nothing")


class FastDecodeOutput(SchedulerOutput):
    """A decode step of the fast path: counts only, no per-token views."""

    __slots__ = ()

    def _check_live(self) -> None:
        raise SchedulerError(
            "a FastDecodeScheduler decode step has no slot_mapping / block_tables / "
            "context_lengths; use the plain Scheduler to run a model"
        )


class FastDecodeScheduler(Scheduler):
    """Scheduler whose decode steps cost O(allocations + finishes); every sampled decode
    token is taken to be ``token`` (sequences must not be stoppable by a token)."""

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
        self._decodes = 0  # decode steps updated so far
        # seq_id -> (admission no, mark, bucket): the decode count its state is exact at,
        # and the residue class it sits in
        self._epoch: dict[int, tuple[int, int, int]] = {}
        self._next_admission = 0
        self._finish_heap: list[tuple[int, int, Sequence]] = []  # (decode no, admission no, seq)
        # running sequences by residue class, in admission order; a sequence leaves its
        # bucket when it stops running
        self._buckets: list[list[Sequence]] = [[] for _ in range(block_manager.block_size)]
        # The allocator's tables hold exactly the blocks the cached tokens fill, so a
        # sequence needs a block exactly when its next token starts a new one.
        self._exact_tables: bool = getattr(block_manager, "tables_fit_tokens", False)
        self._fast_out: SchedulerOutput | None = None
        self._plain_pending = False  # begin_plain_decode ran, end_plain_decode not yet
        # The waiting head last found unable to fit. Plain steps only take blocks and keep
        # every seat, so it stays unable until a sequence leaves or a general step runs.
        self._blocked_head: Sequence | None = None

    # --- lazy state ---------------------------------------------------------------------------

    def _join(self, seq: Sequence) -> None:
        """``seq`` has just been prefilled and is running: track it lazily from now on."""
        admission, d = self._next_admission, self._decodes
        self._next_admission += 1
        c = seq.cached_token_count
        bucket = (c - d) % self.block_manager.block_size
        self._epoch[seq.seq_id] = (admission, d, bucket)
        heapq.heappush(self._finish_heap, (d + seq._finish_cached_count - c, admission, seq))
        self._buckets[bucket].append(seq)

    def _sync(self, seq: Sequence) -> None:
        admission, mark, bucket = self._epoch[seq.seq_id]
        delta = self._decodes - mark
        if delta:
            seq.cached_token_count += delta
            seq.generated_token_ids.extend([self.token] * delta)
            seq.last_token_id = self.token
            self._epoch[seq.seq_id] = (admission, self._decodes, bucket)

    def sync(self) -> None:
        """Bring every running sequence's state up to date."""
        for seq in self._running:
            if seq.seq_id in self._epoch:
                self._sync(seq)

    # --- overrides ----------------------------------------------------------------------------

    def add_request(self, seq: Sequence) -> None:
        if seq._stop_ids:
            raise SchedulerError(
                f"sequence {seq.seq_id} can be stopped by a token; FastDecodeScheduler runs "
                "only placeholder tokens (use ignore_eos and no stop ids)"
            )
        super().add_request(seq)

    def _leave(self, seq: Sequence) -> None:
        """``seq`` stops running or waiting: make its state exact, then stop tracking it
        (blocks or a seat may be free now)."""
        self._blocked_head = None
        if seq.seq_id in self._epoch:
            self._sync(seq)
            self._buckets[self._epoch.pop(seq.seq_id)[2]].remove(seq)  # a C scan by identity

    def _finish(self, seq: Sequence, status: SequenceStatus, kind: EventKind) -> None:
        self._leave(seq)
        super()._finish(seq, status, kind)

    def _preempt(self, seq: Sequence) -> None:
        self._leave(seq)
        super()._preempt(seq)

    def _make_room(
        self, seq: Sequence, preempted: list[Sequence], rejected: list[Sequence]
    ) -> bool:
        # A sequence that cannot grow alone is rejected with a reason that counts its
        # tokens: make them exact first, as the plain Scheduler's always are (the reason
        # counted the tokens of its last mark, a few decode steps short).
        if seq.seq_id in self._epoch:
            self._sync(seq)
        return super()._make_room(seq, preempted, rejected)

    def abort(self, seq_id: int) -> bool:
        seq = self._unfinished.get(seq_id)
        if seq is not None and seq_id in self._epoch:
            self._sync(seq)
        return super().abort(seq_id)

    def schedule(self) -> SchedulerOutput:
        if self._plain_pending:
            raise SchedulerError("a plain decode step is pending; call end_plain_decode()")
        self._blocked_head = None
        return super().schedule()

    def _needing_blocks(self) -> list[Sequence]:
        """Running sequences whose next decode token starts a new block (admission order)."""
        bs = self.block_manager.block_size
        d = self._decodes
        epoch = self._epoch
        # The residue class whose token index is at a block boundary this step. With exact
        # tables each of them needs a block; a table that reaches beyond the boundary
        # (allocators that reserve ahead) needs nothing.
        bucket = self._buckets[-d % bs]
        if self._exact_tables:
            return bucket.copy()
        return [
            seq
            for seq in bucket
            if seq.cached_token_count + d - epoch[seq.seq_id][1] >= len(seq.block_table) * bs
        ]

    def _schedule_decode(self) -> SchedulerOutput:
        running = self._running
        if not running:
            return super()._schedule_decode()
        bm = self.block_manager
        bs = bm.block_size
        needing = self._needing_blocks()
        # As the plain Scheduler's decode loop, visiting only the sequences that need a
        # block (the others raise no event): preempt from the most recently admitted when
        # no block is free. Victims that were to be visited later are gone by then.
        preempted: list[Sequence] = []
        rejected: list[Sequence] = []
        if not needing:
            pass
        elif len(needing) <= bm.get_num_free_blocks():
            bm.append_blocks(needing)  # no preemption this step: all at once
        else:
            for seq in needing:
                if seq.status is not RUNNING:
                    continue
                if bm.get_num_free_blocks() == 0 and not self._make_room(seq, preempted, rejected):
                    break
                bm.append_block(seq)
        out = FastDecodeOutput(
            step=self.step,
            kind=DECODE,
            seqs=running.copy(),
            num_new_tokens=[1] * len(running),
            block_size=bs,
            preempted=preempted,
            rejected=rejected,
        )
        self._fast_out = out
        return out

    def update(self, output: SchedulerOutput, sampled_token_ids: list[int]) -> list[Sequence]:
        if output is not self._fast_out:
            finished = super().update(output, sampled_token_ids)
            # Only prefill steps (and empty ones) take the plain path.
            if output.kind is PREFILL:
                for seq in output.seqs:
                    if seq.status is RUNNING:
                        self._join(seq)
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
        return self._advance_decode()

    def _advance_decode(self) -> list[Sequence]:
        """Every running sequence gains its token; finish those at their length limit."""
        self._decodes += 1
        self.num_cached_tokens += len(self._running)  # sequences aborted mid-step already left
        return self._finish_due()

    def _finish_due(self) -> list[Sequence]:
        """Finish (and free) the sequences at their length limit after ``_decodes`` decode
        steps; returns them, after any rejected while scheduling this step."""
        finished, self._finished_early = self._finished_early, []
        num_done_before = len(finished)
        d = self._decodes
        heap, epoch = self._finish_heap, self._epoch
        while heap and heap[0][0] <= d:
            _, admission, seq = heapq.heappop(heap)
            state = epoch.get(seq.seq_id)
            if state is None or state[0] != admission:
                continue
            self._sync(seq)
            seq.finish_reason = "length"
            finished.append(seq)
        if len(finished) > num_done_before:
            for seq in finished[num_done_before:]:
                self._finish(seq, FINISHED_LENGTH, FINISH)
            self._drop_finished(finished[num_done_before:])
        return finished

    # --- plain decode steps without output objects (the simulator's multi-step loop) -------

    def run_plain_decodes(
        self, on_step: PlainStepCallback, on_finished: Callable[[list[Sequence]], None]
    ) -> bool:
        """Multi-step decoding: run decode steps back to back while each is plain.

        Plain: sequences are running, no waiting sequence can be admitted (none waits, or the
        head is known not to fit) and the free blocks cover every append (no preemption). Such
        a step changes no batch, so it needs no output object: its block appends, STEP event,
        counters and finishes are exactly those ``schedule()`` / ``update()`` would make, at a
        fraction of their cost.

        Each step is scheduled, then ``on_step(num_seqs, context_tokens, num_used_blocks)``
        is called (the caller runs it: in the simulator, predicts its time and moves the
        clock). If it returns True the step is updated at once and the sequences it finished
        (blocks freed) go to ``on_finished``; if False the step stays pending until
        ``end_plain_decode()``. Returns True when it leaves a step pending, False when the
        next step is not plain (call ``schedule()``)."""
        if self._pending is not None or self._plain_pending:
            raise SchedulerError("a step is pending; update it before starting another")
        waiting, bm, sink = self._waiting, self.block_manager, self.event_sink
        buckets, heap = self._buckets, self._finish_heap
        bs, num_blocks = bm.block_size, bm.num_blocks
        exact = self._exact_tables
        d, step = self._decodes, self.step
        # Within the loop only finishes change the batch, the free blocks (beyond this loop's
        # appends) and whether the waiting head may fit: re-read those after finishes only.
        n = len(self._running)
        num_free = bm.get_num_free_blocks()
        check_head = True
        while n:
            if check_head:
                if waiting and waiting[0] is not self._blocked_head:
                    if not self._head_blocked():
                        return False
                    self._blocked_head = waiting[0]
                check_head = False
            # nothing preempts during a plain step, so the bucket itself can be handed over
            needing = buckets[-d % bs] if exact else self._needing_blocks()
            if len(needing) > num_free:
                return False
            step += 1
            self.step = step
            block_ids = bm.append_blocks(needing, record=False) if needing else []
            num_free -= len(needing)
            if sink is not None:
                seq_ids = [seq.seq_id for seq in needing]
                sink.record_decode_step(step, n, num_free, seq_ids, block_ids)
            if not on_step(n, self.num_cached_tokens + n, num_blocks - num_free):
                self._plain_pending = True
                return True
            # _advance_decode, inlined: most steps finish nobody
            d += 1
            self._decodes = d
            self.num_cached_tokens += n
            if heap and heap[0][0] <= d:
                on_finished(self._finish_due())
                n = len(self._running)
                num_free = bm.get_num_free_blocks()
                check_head = True
        return False

    def begin_plain_decode(self) -> int:
        """Schedule the next step if it is plain (see ``run_plain_decodes``) and return its
        batch size; else do nothing and return 0 (call ``schedule()``). Follow with
        ``end_plain_decode()``."""
        batch_size = 0

        def leave_pending(num_seqs: int, context_tokens: int, num_used_blocks: int) -> bool:
            nonlocal batch_size
            batch_size = num_seqs
            return False

        self.run_plain_decodes(leave_pending, _never_called)
        return batch_size

    def end_plain_decode(self) -> list[Sequence]:
        """Update the pending plain step (left by ``begin_plain_decode`` or
        ``run_plain_decodes``); sequences aborted meanwhile are skipped, as ``update()`` does.
        Returns the sequences it finished (their blocks freed)."""
        if not self._plain_pending:
            raise SchedulerError("no plain decode step is pending")
        self._plain_pending = False
        return self._advance_decode()
