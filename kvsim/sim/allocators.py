"""The KV allocator of a run: vLLM's paged BlockManager or a contiguous baseline.

Every allocator gets the same KV memory: ``num_blocks x block_size`` slots of the paged
configuration, whether given or planned from GPU memory. A contiguous allocator (engine/
contiguous.py) works at slot granularity over exactly those slots.

Contiguous regions are read by a contiguous attention kernel (Orca / FasterTransformer style),
so the cost model charges one block-table entry per sequence, not one per reserved slot.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from engine import BlockManager, Scheduler, SchedulerOutput
from engine.contiguous.allocator import POLICIES, ContiguousAllocator
from kvsim.config import ALLOCATORS
from kvsim.sim.executor import CostModelExecutor

__all__ = ["ALLOCATORS", "ContiguousCostExecutor", "build_allocator"]


def build_allocator(
    allocator: str,
    num_blocks: int,
    block_size: int,
    watermark: float,
    max_model_len: int | None,
    *,
    enable_prefix_caching: bool = False,
) -> BlockManager:
    """The BlockManager, or a ContiguousAllocator over ``num_blocks x block_size`` slots
    (typed as the BlockManager whose interface it implements for the Scheduler)."""
    if allocator == "paged":
        return BlockManager(
            num_blocks, block_size, watermark, enable_prefix_caching=enable_prefix_caching
        )
    if allocator not in POLICIES:
        raise ValueError(f"allocator must be one of {', '.join(ALLOCATORS)}, got {allocator!r}")
    contiguous = ContiguousAllocator(num_blocks * block_size, allocator, max_model_len)
    return cast(BlockManager, contiguous)


class ContiguousCostExecutor(CostModelExecutor):
    """Cost mode for contiguous allocators: one block-table entry per sequence (its region)."""

    def decode_step_time(self, num_seqs: int, context_tokens: int, num_blocks: int) -> float:
        return self._step_time_of(num_seqs, num_seqs, num_seqs, context_tokens, 0, 0, 0, num_seqs)

    def decode_step_timer(self) -> Callable[[int, int, int], float]:
        return self.decode_step_time

    def blocks_walked(self, out: SchedulerOutput, scheduler: Scheduler) -> int:
        return len(out.seqs)
