"""Multi-step decode: advance the running batch several decode steps in one call.

vLLM's multi-step scheduling runs several decode steps per scheduler call with lookahead
slots. kvsim uses the same idea to make the simulator fast: when nothing can change the batch
between steps (no admission, no preemption, no arrival), the per-token work of ``schedule()``
and ``update()`` is replaced by per-sequence work once per run, while the event stream stays
exactly what step-by-step scheduling would have produced: the same steps, APPEND_BLOCK events
(same block ids, same order), FINISH and FREE events, and counters.

It only applies when every sampled token is a placeholder and no running sequence can be stopped
by a token (the simulator's cost mode, with ignore_eos); it is not used with a real model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from engine.events import EventKind, StepKind
from engine.sequence import Sequence, SequenceStatus

if TYPE_CHECKING:
    from engine.scheduler import Scheduler


class DecodeRunHooks(Protocol):
    """The caller's side of a decode run: the clock and the step-time model."""

    def fits(self, num_seqs: int, context_tokens: int, num_blocks: int) -> bool:
        """Whether a step of this batch could run now (a side-effect-free begin_step)."""
        ...

    def begin_step(self, num_seqs: int, context_tokens: int, num_blocks: int) -> bool:
        """Called before each step with its batch (sequences, context tokens including this
        step's token, blocks in use after this step's appends). Return False to end the run
        before this step; otherwise the step's schedule events are stamped with its start."""
        ...

    def end_step(self) -> None:
        """Called between the step's schedule and its update: the step's compute is over."""
        ...


def _admission_blocked(scheduler: Scheduler) -> bool:
    """Whether no waiting sequence can be admitted now, nor while nobody finishes."""
    waiting = scheduler._waiting
    if not waiting:
        return True
    head = waiting[0]
    if scheduler._never_fits(head, head.num_tokens) is not None:
        return False  # schedule() would reject it now: leave that to schedule()
    seats_full = len(scheduler._running) >= scheduler.config.max_num_seqs
    # Free blocks only shrink during a run, so a head that does not fit now never will.
    return seats_full or not scheduler.block_manager.can_allocate(head.num_tokens)


def advance_decode_run(
    scheduler: Scheduler,
    hooks: DecodeRunHooks,
    *,
    max_steps: int,
    token: int,
    stop_at_finish: bool,
) -> tuple[int, list[Sequence]]:
    """Run up to ``max_steps`` decode steps of the whole running batch, sampling ``token``.

    Stops before a step that would need a preemption or that ``hooks`` refuses, and after a
    step in which a sequence finished if ``stop_at_finish`` or anyone is waiting (a finish
    frees seats and blocks, so admission may follow). Returns the number of steps run and the
    sequences finished, in the order ``update()`` would have returned them.
    """
    running = scheduler._running
    if scheduler._pending is not None or not running or scheduler.num_stoppable:
        return 0, []
    bm = scheduler.block_manager
    # Cheap refusals first: the next step cannot fit in time even with no new block, or a
    # waiting sequence would be admitted.
    num_running = len(running)
    context = scheduler.num_cached_tokens + num_running
    if not hooks.fits(num_running, context, bm.num_used_blocks):
        return 0, []
    if not _admission_blocked(scheduler):
        return 0, []
    stop_at_finish = stop_at_finish or bool(scheduler._waiting)
    bs = bm.block_size
    sink = scheduler.event_sink
    free = bm._free
    refs, owners = bm._ref_counts, bm._owners

    # 1. Per sequence: cached tokens now, the run step whose update finishes it, and the
    #    residue class of the steps where its next token starts a new block.
    cached0 = [s.cached_token_count for s in running]
    finish_step: dict[int, list[int]] = {}
    needs_by_residue: list[list[int]] = [[] for _ in range(bs)]
    for i, (s, c) in enumerate(zip(running, cached0)):
        finish_step.setdefault(s._finish_cached_count - c - 1, []).append(i)
        # The first token beyond the table starts a new block; a table may reach further
        # than the cache (an allocator that reserves ahead), so count from its end.
        first_need = len(s.block_table) * bs - c
        if first_need < max_steps:
            needs_by_residue[first_need % bs].append(i)
    alive = [True] * len(running)
    num_alive = len(running)
    sum_cached_alive = scheduler.num_cached_tokens
    finished: list[Sequence] = []

    # 2. Step by step, touching only the sequences that allocate or finish in that step.
    steps = 0
    while steps < max_steps and num_alive:
        j = steps
        needing = [
            i
            for i in needs_by_residue[j % bs]
            if alive[i] and len(running[i].block_table) * bs <= j + cached0[i]
        ]
        if len(needing) > len(free):
            break  # this step would preempt: leave it to schedule()
        context = sum_cached_alive + num_alive
        if not hooks.begin_step(num_alive, context, bm.num_blocks - len(free) + len(needing)):
            break
        scheduler.step += 1
        if sink is not None:
            sink.begin_step(scheduler.step)
        for i in needing:
            s = running[i]
            block_id = free.popleft()
            refs[block_id] = 1
            owners[block_id] = s.seq_id
            s.block_table.append(block_id)
            if sink is not None:
                sink.record(EventKind.APPEND_BLOCK, s.seq_id, len(free), (block_id,), 1)
        if sink is not None:
            sink.record_step(StepKind.DECODE, num_alive, num_alive, len(free))
        hooks.end_step()
        steps += 1
        sum_cached_alive += num_alive
        ending = finish_step.get(j)
        if ending:
            for i in ending:
                s = running[i]
                s.cached_token_count = cached0[i] + steps
                s.generated_token_ids.extend([token] * steps)
                s.last_token_id = token
                s.finish_reason = "length"
                alive[i] = False
                num_alive -= 1
                sum_cached_alive -= s.cached_token_count
                scheduler._finish(s, SequenceStatus.FINISHED_LENGTH, EventKind.FINISH)
                finished.append(s)
            if stop_at_finish:
                break

    # 3. Bring the survivors up to date in one pass.
    if steps:
        tail = [token] * steps
        for i, s in enumerate(running):
            if alive[i]:
                s.cached_token_count = cached0[i] + steps
                s.generated_token_ids.extend(tail)
                s.last_token_id = token
        scheduler.num_cached_tokens = sum_cached_alive
        if finished:
            scheduler._running = [s for s, a in zip(running, alive) if a]
    return steps, finished
