"""kvsim's paged-attention engine.

The core (Sequence, BlockManager, Scheduler, events) imports no torch, so the simulator's cost
mode never pays torch's import time. ``LLMEngine`` and ``RequestOutput`` (the torch engine) are
imported on first use.
"""

from typing import Any

from engine.contiguous.allocator import ContiguousAllocator, ReservationError
from engine.contiguous.buddy import BuddyAllocator
from engine.core.block_manager import BlockManager, Slot, blocks_needed
from engine.core.errors import (
    DoubleFreeError,
    EngineError,
    InvariantError,
    OutOfBlocksError,
    SchedulerError,
)
from engine.core.events import EventKind, EventRecorder, EventSink, StepKind
from engine.core.scheduler import Scheduler
from engine.core.scheduler_output import SchedulerConfig, SchedulerOutput
from engine.core.sequence import SamplingParams, Sequence, SequenceStatus
from engine.factory import make_scheduler, scheduler_class
from engine.fast.fast_v1 import FastV1Scheduler
from engine.v1.scheduler import V1Scheduler

__all__ = [
    "BlockManager",
    "BuddyAllocator",
    "ContiguousAllocator",
    "DoubleFreeError",
    "EngineError",
    "EventKind",
    "EventRecorder",
    "EventSink",
    "FastV1Scheduler",
    "InvariantError",
    "OutOfBlocksError",
    "ReservationError",
    "SamplingParams",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerError",
    "SchedulerOutput",
    "Sequence",
    "SequenceStatus",
    "Slot",
    "StepKind",
    "V1Scheduler",
    "blocks_needed",
    "make_scheduler",
    "scheduler_class",
]

# Not in __all__: a star import must not pull in torch.
_TORCH_EXPORTS = {"LLMEngine", "RequestOutput"}


def __getattr__(name: str) -> Any:
    if name in _TORCH_EXPORTS:
        from engine.torch_engine import llm_engine

        return getattr(llm_engine, name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
