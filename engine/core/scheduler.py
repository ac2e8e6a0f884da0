"""The Scheduler: who runs each step, under the token budget and the free blocks.

Policy (vLLM's classic one, first come first served, recompute preemption):

1. If waiting sequences can be admitted, run a prefill batch of them in arrival order while
   ``max_num_seqs``, ``max_num_batched_tokens`` and ``BlockManager.can_allocate`` all allow;
   the first that does not fit stops admission (no overtaking).
2. Otherwise run one decode step for every running sequence. If the free blocks cannot give
   each one its next slot, preempt the most recently admitted running sequence (free its
   blocks, reset its cache, put it at the front of the waiting queue) until the rest fit.

A sequence that can never fit (longer than ``max_model_len`` or the token budget, more blocks
than the pool) is finished as REJECTED at once, so it never blocks the queue. It imports no
torch: the simulator runs this same object millions of times per run.
"""

from __future__ import annotations

from collections import deque
from typing import Any, ClassVar

from engine.core.block_manager import BlockManager, blocks_needed
from engine.core.errors import SchedulerError
from engine.core.events import EventKind, EventSink, StepKind
from engine.core.scheduler_output import SchedulerConfig, SchedulerOutput
from engine.core.sequence import Sequence, SequenceStatus

# Enum members read through their class cost about 0.16 us each on CPython 3.11 (the
# metaclass lookup), a visible share of a step; the hot paths read these module constants.
WAITING = SequenceStatus.WAITING
RUNNING = SequenceStatus.RUNNING
FINISHED_STOPPED = SequenceStatus.FINISHED_STOPPED
FINISHED_LENGTH = SequenceStatus.FINISHED_LENGTH
FINISHED_ABORTED = SequenceStatus.FINISHED_ABORTED
FINISHED_REJECTED = SequenceStatus.FINISHED_REJECTED
ARRIVE, ADMIT, RESUME = EventKind.ARRIVE, EventKind.ADMIT, EventKind.RESUME
PREEMPT, FINISH, ABORT, REJECT = (
    EventKind.PREEMPT,
    EventKind.FINISH,
    EventKind.ABORT,
    EventKind.REJECT,
)
PREFILL, DECODE = StepKind.PREFILL, StepKind.DECODE


class Scheduler:
    """Drives one BlockManager. Call ``schedule()`` then ``update()``, every step.

    This class is the classic scheduler. Build schedulers with ``engine.factory.make_scheduler``;
    ``Scheduler(config, ...)`` with ``config.scheduler == "v1"`` still builds the v1 one
    (engine/v1/scheduler.py) for callers written before the factory.
    """

    is_v1: ClassVar[bool] = False

    def __new__(cls, config: SchedulerConfig, *args: Any, **kwargs: Any) -> Scheduler:
        if config.scheduler == "v1" and not cls.is_v1:
            # Imported here: the factory imports every scheduler class, this one included.
            from engine.factory import v1_counterpart

            target = v1_counterpart(cls)
            if not issubclass(target, cls):
                # Python runs __init__ only for instances of cls: build the object whole.
                built: Scheduler = target(config, *args, **kwargs)
                return built
            cls = target
        return super().__new__(cls)

    def __init__(
        self,
        config: SchedulerConfig,
        block_manager: BlockManager,
        event_sink: EventSink | None = None,
    ) -> None:
        self.config = config
        self.block_manager = block_manager
        self.event_sink = event_sink if event_sink is not None else block_manager.event_sink
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []  # in admission order: the last is preempted first
        self._unfinished: dict[int, Sequence] = {}
        self._finished_early: list[Sequence] = []  # rejected in schedule(), returned by update()
        self._pending: SchedulerOutput | None = None
        self._head_fits: Sequence | None = None  # the waiting head last found able to fit
        self.step = 0
        self.num_cached_tokens = 0  # sum of cached_token_count over sequences holding blocks

    # --- queues ---------------------------------------------------------------------------

    @property
    def waiting(self) -> tuple[Sequence, ...]:
        return tuple(self._waiting)

    @property
    def running(self) -> tuple[Sequence, ...]:
        return tuple(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running)

    def add_request(self, seq: Sequence) -> None:
        """Queue ``seq`` (status WAITING, no blocks) behind every waiting sequence."""
        if seq.seq_id in self._unfinished:
            raise SchedulerError(f"sequence {seq.seq_id} is already queued or running")
        if seq.status is not WAITING or seq.block_table:
            raise SchedulerError(f"sequence {seq.seq_id} is {seq.status.name}, not a new request")
        max_len = self.config.max_model_len
        if max_len is not None:
            # Finishing at max_model_len (num_tokens == max_model_len) caps the same count;
            # a prompt of exactly max_model_len still gets its one prefill token.
            seq._finish_cached_count = min(
                seq._finish_cached_count, max(max_len - 1, seq.num_prompt_tokens)
            )
        self._waiting.append(seq)
        self._unfinished[seq.seq_id] = seq
        if self.event_sink is not None:
            self.event_sink.record(
                ARRIVE,
                seq.seq_id,
                self.block_manager.get_num_free_blocks(),
                (),
                seq.num_tokens,
            )

    # --- schedule ---------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """Decide this step: a prefill batch if any waiting sequence fits, else a decode step."""
        if self._pending is not None:
            raise SchedulerError(f"step {self._pending.step} was scheduled but never updated")
        self.step += 1
        sink = self.event_sink
        if sink is not None:
            sink.begin_step(self.step)
        out = self._schedule_prefill() if self._waiting and not self._head_blocked() else None
        if out is None:
            out = self._schedule_decode()
        self._pending = out
        if sink is not None and out.seqs:
            sink.record_step(
                out.kind,
                len(out.seqs),
                out.num_batched_tokens,
                self.block_manager.get_num_free_blocks(),
            )
        return out

    def _head_blocked(self) -> bool:
        """A cheap early refusal for the common case of a long queue: the waiting head was
        already found able to fit, and still has no seat or no blocks."""
        head = self._waiting[0]
        if head is not self._head_fits:
            return False
        if len(self._running) >= self.config.max_num_seqs:
            return True
        return not self.block_manager.can_allocate(head.num_tokens, head)

    def _schedule_prefill(self) -> SchedulerOutput | None:
        cfg, bm, sink = self.config, self.block_manager, self.event_sink
        waiting = self._waiting
        seqs: list[Sequence] = []
        num_new_tokens: list[int] = []
        rejected: list[Sequence] = []
        num_tokens = 0
        seat_limit = cfg.max_num_seqs - len(self._running)
        while waiting:
            seq = waiting[0]
            n = seq.num_tokens  # waiting sequences hold no cache: all tokens are new
            # A waiting sequence's length does not change, so one check per stay at the head
            # is enough (a blocked head is looked at again every step).
            reason = None if seq is self._head_fits else self._never_fits(seq, n)
            if reason is None:
                self._head_fits = seq
            else:
                waiting.popleft()
                self._reject(seq, reason)
                rejected.append(seq)
                continue
            if len(seqs) >= seat_limit or num_tokens + n > cfg.max_num_batched_tokens:
                break
            if not bm.can_allocate(n, seq):
                break
            waiting.popleft()
            self._head_fits = None  # if it comes back (preempted), it has grown: check again
            bm.allocate_for_prefill(seq, n)
            seq.status = RUNNING
            seqs.append(seq)
            num_new_tokens.append(n)
            num_tokens += n
            if sink is not None:
                kind = RESUME if seq.num_preemptions else ADMIT
                sink.record(kind, seq.seq_id, bm.get_num_free_blocks(), (), n)
        if not seqs and not rejected:
            return None
        if not seqs:
            # Only rejections: fall through to a decode step that carries them.
            out = self._schedule_decode()
            out.rejected[:0] = rejected
            return out
        self._running.extend(seqs)
        return SchedulerOutput(
            step=self.step,
            kind=PREFILL,
            seqs=seqs,
            num_new_tokens=num_new_tokens,
            block_size=bm.block_size,
            preempted=[],
            rejected=rejected,
        )

    def _never_fits(self, seq: Sequence, num_tokens: int) -> str | None:
        cfg, bm = self.config, self.block_manager
        if cfg.max_model_len is not None and seq.num_prompt_tokens > cfg.max_model_len:
            return (
                f"prompt of {seq.num_prompt_tokens} tokens exceeds max_model_len "
                f"{cfg.max_model_len}"
            )
        if num_tokens > cfg.max_num_batched_tokens:
            return (
                f"{num_tokens} tokens exceed max_num_batched_tokens "
                f"{cfg.max_num_batched_tokens} (no chunked prefill)"
            )
        if not bm.can_ever_allocate(num_tokens, seq):
            return (
                f"exceeds KV capacity: {num_tokens} tokens need "
                f"{blocks_needed(num_tokens, bm.block_size)} blocks, the pool has "
                f"{bm.num_blocks} (watermark {bm.watermark_blocks})"
            )
        return None

    def _schedule_decode(self) -> SchedulerOutput:
        bm = self.block_manager
        bs = bm.block_size
        running = self._running
        preempted: list[Sequence] = []
        rejected: list[Sequence] = []
        slots: list[int] = []
        append = slots.append
        # Popping victims off the end while iterating is deliberate: the loop then simply
        # stops earlier, and victims are always sequences it has not reached yet (or s).
        for s in running:
            c = s.cached_token_count
            offset = c % bs
            # The common case: the token lands in a block the table already has (mid-block,
            # or at a boundary the table reaches beyond, as with allocators that reserve ahead).
            if offset or c < len(s.block_table) * bs:
                append(s.block_table[c // bs] * bs + offset)
                continue
            if bm.get_num_free_blocks() == 0 and not self._make_room(s, preempted, rejected):
                break
            append(bm.append_slot_index(s))
        return SchedulerOutput(
            step=self.step,
            kind=DECODE,
            seqs=running.copy(),
            num_new_tokens=[1] * len(running),
            block_size=bs,
            preempted=preempted,
            rejected=rejected,
            decode_slots=slots,
        )

    def _make_room(
        self, seq: Sequence, preempted: list[Sequence], rejected: list[Sequence]
    ) -> bool:
        """Preempt from the most recently admitted until a block is free for ``seq``.

        Returns False when ``seq`` itself had to go: preempted, or rejected when it runs alone
        and still cannot grow (its tokens exceed the whole pool).
        """
        bm, running = self.block_manager, self._running
        while bm.get_num_free_blocks() == 0:
            victim = running[-1]
            if victim is seq and len(running) == 1:
                running.pop()
                self._reject(
                    seq,
                    f"exceeds KV capacity: {seq.num_tokens} tokens do not fit in "
                    f"{bm.num_blocks} blocks of {bm.block_size}",
                )
                rejected.append(seq)
                return False
            running.pop()
            self._preempt(victim)
            preempted.append(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.num_cached_tokens -= seq.cached_token_count
        self.block_manager.free_sequence(seq)
        seq.cached_token_count = 0
        seq.status = WAITING
        seq.num_preemptions += 1
        self._waiting.appendleft(seq)
        if self.event_sink is not None:
            self.event_sink.record(PREEMPT, seq.seq_id, self.block_manager.get_num_free_blocks())

    # --- finish -------------------------------------------------------------------------------

    def _finish(self, seq: Sequence, status: SequenceStatus, kind: EventKind) -> None:
        """Mark ``seq`` finished and free its blocks; the caller removes it from the queues."""
        seq.status = status
        self._unfinished.pop(seq.seq_id, None)
        self.num_cached_tokens -= seq.cached_token_count
        sink = self.event_sink
        if sink is not None:
            sink.record(
                kind, seq.seq_id, self.block_manager.get_num_free_blocks(), (), seq.num_tokens
            )
        self.block_manager.free_sequence(seq)

    def _reject(self, seq: Sequence, reason: str) -> None:
        seq.finish_reason = reason
        self._finish(seq, FINISHED_REJECTED, REJECT)
        self._finished_early.append(seq)

    def abort(self, seq_id: int) -> bool:
        """Abort a waiting or running sequence and free its blocks now.

        Returns False if ``seq_id`` is unknown or already finished. A sequence aborted between
        ``schedule()`` and ``update()`` is skipped by that ``update()``.
        """
        seq = self._unfinished.get(seq_id)
        if seq is None:
            return False
        if seq.status is RUNNING:
            self._running.remove(seq)
        else:
            self._waiting.remove(seq)
        seq.finish_reason = "aborted"
        self._finish(seq, FINISHED_ABORTED, ABORT)
        return True

    # --- update -------------------------------------------------------------------------------

    def update(self, output: SchedulerOutput, sampled_token_ids: list[int]) -> list[Sequence]:
        """Apply one step's sampled tokens (one per scheduled sequence, in batch order).

        Advances ``cached_token_count`` by the step's tokens, appends each sampled token,
        finishes sequences on a stop token (EOS unless ignore_eos) or on max_tokens /
        max_model_len, and frees their blocks. Returns the sequences finished this step,
        those rejected while scheduling it included.
        """
        finished = self._take_pending(output, sampled_token_ids)
        num_done_before = len(finished)
        if output.kind is DECODE:
            self._update_decode(output.seqs, sampled_token_ids, finished)
        else:
            self._update_prefill(output.seqs, sampled_token_ids, output.num_new_tokens, finished)
        if len(finished) > num_done_before:
            self._finish_sampled(finished[num_done_before:])
        return finished

    def _take_pending(
        self, output: SchedulerOutput, sampled_token_ids: list[int]
    ) -> list[Sequence]:
        """Check that ``output`` is the pending step and has one sampled token per sequence,
        and close it; returns the list update() fills, holding the rejections first."""
        if output is not self._pending:
            raise SchedulerError(f"update() got step {output.step}, not the pending step")
        if len(sampled_token_ids) != len(output.seqs):
            raise SchedulerError(
                f"step {output.step}: {len(sampled_token_ids)} sampled tokens for "
                f"{len(output.seqs)} sequences"
            )
        self._pending = None
        output._updated = True
        finished, self._finished_early = self._finished_early, []
        return finished

    def _finish_sampled(self, done: list[Sequence]) -> None:
        """Finish ``done`` (running sequences that sampled a stop token or reached their
        length limit, ``finish_reason`` set) and free their blocks."""
        for seq in done:
            status = FINISHED_STOPPED if seq.finish_reason == "stop" else FINISHED_LENGTH
            self._finish(seq, status, FINISH)
        self._drop_finished(done)

    def _drop_finished(self, done: list[Sequence]) -> None:
        """Remove ``done`` (sequences that were running) from the running list, in order."""
        if len(done) <= 8:
            remove = self._running.remove  # a C scan by identity: far cheaper than a rebuild
            for seq in done:
                remove(seq)
        else:
            self._running = [s for s in self._running if s.status is RUNNING]

    def _update_decode(
        self, seqs: list[Sequence], sampled_token_ids: list[int], finished: list[Sequence]
    ) -> None:
        # The simulator's hottest loop: one pass, no per-token objects, no len() calls.
        self.num_cached_tokens += len(seqs)
        for seq, token in zip(seqs, sampled_token_ids):
            if seq.status is not RUNNING:
                self.num_cached_tokens -= 1  # aborted after it was scheduled
                continue
            cached = seq.cached_token_count + 1
            seq.cached_token_count = cached
            seq.generated_token_ids.append(token)
            seq.last_token_id = token
            if token in seq._stop_ids:
                seq.finish_reason = "stop"
                finished.append(seq)
            elif cached >= seq._finish_cached_count:
                seq.finish_reason = "length"
                finished.append(seq)

    def _update_prefill(
        self,
        seqs: list[Sequence],
        sampled_token_ids: list[int],
        num_new_tokens: list[int],
        finished: list[Sequence],
    ) -> None:
        for seq, token, n in zip(seqs, sampled_token_ids, num_new_tokens):
            if seq.status is not RUNNING:
                continue  # aborted after it was scheduled
            seq.cached_token_count += n
            self.num_cached_tokens += n
            seq.generated_token_ids.append(token)
            seq.last_token_id = token
            if token in seq._stop_ids:
                seq.finish_reason = "stop"
                finished.append(seq)
            elif seq.cached_token_count >= seq._finish_cached_count:
                seq.finish_reason = "length"
                finished.append(seq)
