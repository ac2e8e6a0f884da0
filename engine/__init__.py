"""kvsim's paged-attention engine.

The core (Sequence, BlockManager, Scheduler, events) imports no torch, so the simulator's cost
mode never pays torch's import time. ``LLMEngine`` and ``RequestOutput`` (the torch engine) are
imported on first use.
"""

from typing import Any

from engine.block_manager import BlockManager, Slot, blocks_needed
from engine.buddy import BuddyAllocator
from engine.contiguous import ContiguousAllocator, ReservationError
from engine.errors import (
    DoubleFreeError,
    EngineError,
    InvariantError,
    OutOfBlocksError,
    SchedulerError,
)
from engine.events import EventKind, EventRecorder, EventSink, StepKind
from engine.scheduler import Scheduler
from engine.scheduler_output import SchedulerConfig, SchedulerOutput
from engine.sequence import SamplingParams, Sequence, SequenceStatus
from engine.v1_scheduler import V1Scheduler  # registers itself as Scheduler's v1 counterpart

# isort: split
from engine.fast_v1 import FastV1Scheduler  # registers itself as FastDecodeScheduler's

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
]

# Not in __all__: a star import must not pull in torch.
_TORCH_EXPORTS = {"LLMEngine", "RequestOutput"}


def __getattr__(name: str) -> Any:
    if name in _TORCH_EXPORTS:
        from engine import llm_engine

        return getattr(llm_engine, name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
