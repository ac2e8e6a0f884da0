"""KV offload tiers behind the GPU prefix cache (docs/offload.md): the transfer timing model
(``transfer``); the manager, policies and connector rules join it here."""

from engine.offload.transfer import (
    Direction,
    Discipline,
    TransferError,
    TransferLink,
    TransferLinks,
)

__all__ = [
    "Direction",
    "Discipline",
    "TransferError",
    "TransferLink",
    "TransferLinks",
]
