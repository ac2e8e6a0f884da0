"""Helpers shared by the engine-core tests."""

from __future__ import annotations

from collections.abc import Callable

from engine import Scheduler, SchedulerOutput, Sequence

EOS = 2


def run_to_completion(
    scheduler: Scheduler,
    sample: Callable[[SchedulerOutput], list[int]] | None = None,
    max_steps: int = 100_000,
) -> list[SchedulerOutput]:
    """Drive schedule/update until nothing is unfinished; return every step's output."""
    outputs = []
    for _ in range(max_steps):
        if not scheduler.has_unfinished():
            return outputs
        out = scheduler.schedule()
        tokens = sample(out) if sample else [7] * out.num_seqs
        scheduler.update(out, tokens)
        scheduler.block_manager.check_invariants()
        outputs.append(out)
    raise AssertionError(f"still unfinished after {max_steps} steps")


def seq_ids(seqs: list[Sequence] | tuple[Sequence, ...]) -> list[int]:
    return [s.seq_id for s in seqs]
