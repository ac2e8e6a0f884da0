"""Exceptions raised by the engine core.

Every error says what went wrong and, where one is involved, which block and sequence.
"""


class EngineError(Exception):
    """Base class for every error the engine raises."""


class OutOfBlocksError(EngineError):
    """More blocks were requested than the free list holds."""


class DoubleFreeError(EngineError):
    """A block that is already free was freed again."""


class InvariantError(EngineError):
    """The BlockManager's bookkeeping broke one of the invariants of docs/design.md."""


class SchedulerError(EngineError):
    """The scheduler was driven in a way its contract forbids."""
