"""A request's state as the engine sees it: tokens, KV-cache progress and block table.

Semantics (docs/design.md): after prefill of a P-token prompt, ``cached_token_count == P``, one
token G has been sampled, ``last_token_id == G``, and G's K/V is written by the next decode
step at token index P.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence as TokenIds
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.v1.prefix_keys import PrefixSource


class SequenceStatus(enum.Enum):
    """Where a sequence is in its life."""

    WAITING = "waiting"
    RUNNING = "running"
    # Admitted with blocks, waiting for a KV connector's load (vLLM's WAITING_FOR_REMOTE_KVS).
    WAITING_FOR_KV = "waiting_for_kv"
    FINISHED_STOPPED = "finished_stopped"  # EOS or a stop token
    FINISHED_LENGTH = "finished_length"  # max_tokens or max_model_len reached
    FINISHED_ABORTED = "finished_aborted"  # cancelled by the caller
    FINISHED_REJECTED = "finished_rejected"  # can never fit; see Sequence.finish_reason

    @property
    def is_finished(self) -> bool:
        return self not in _UNFINISHED


_UNFINISHED = frozenset(
    (SequenceStatus.WAITING, SequenceStatus.RUNNING, SequenceStatus.WAITING_FOR_KV)
)


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingParams:
    """How many tokens to generate, when to stop, and how to sample.

    ``max_tokens`` counts generated tokens. ``temperature == 0`` means greedy; ``seed`` seeds
    this request's own generator so sampling is reproducible whatever else is in the batch.
    """

    max_tokens: int = 16
    ignore_eos: bool = False
    eos_token_id: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))

    @property
    def stop_ids(self) -> frozenset[int]:
        """Token ids that finish the sequence as FINISHED_STOPPED."""
        ids = set(self.stop_token_ids)
        if self.eos_token_id is not None and not self.ignore_eos:
            ids.add(self.eos_token_id)
        return frozenset(ids)


class Sequence:
    """One request inside the engine.

    ``prompt_token_ids`` may be any sized, indexable sequence of ints; the simulator passes a
    ``range`` so a million simulated prompts cost no memory.

    Prefix caching (the v1 scheduler) keys full blocks by their token ids, unless ``prefix``
    (engine.v1.prefix_keys: ``prefix_from_hash_ids(...)`` or ``UNIQUE_PREFIX``) says which
    prompts share what; then the token ids are never read and every generated token counts
    as the same placeholder. ``priority`` orders the waiting queue under
    ``policy="priority"`` (lower first).
    """

    __slots__ = (
        "_cached_tables",
        "_finish_cached_count",
        "_num_cached_blocks",
        "_num_keyed_blocks",
        "_stop_ids",
        "arrival_time",
        "block_hashes",
        "block_table",
        "cached_token_count",
        "finish_reason",
        "generated_token_ids",
        "last_token_id",
        "num_preemptions",
        "num_prompt_tokens",
        "offload_hit_tokens",
        "prefix",
        "prefix_hit_tokens",
        "priority",
        "prompt_token_ids",
        "sampling_params",
        "seq_id",
        "status",
    )

    def __init__(
        self,
        seq_id: int,
        prompt_token_ids: TokenIds[int],
        sampling_params: SamplingParams | None = None,
        arrival_time: float = 0.0,
        priority: int = 0,
        *,
        prefix: PrefixSource | None = None,
    ) -> None:
        if len(prompt_token_ids) == 0:
            raise ValueError(f"sequence {seq_id}: prompt_token_ids must not be empty")
        params = sampling_params if sampling_params is not None else SamplingParams()
        self.seq_id = seq_id
        self.arrival_time = arrival_time
        self.prompt_token_ids = prompt_token_ids
        self.num_prompt_tokens = len(prompt_token_ids)
        self.sampling_params = params
        self.generated_token_ids: list[int] = []
        self.cached_token_count = 0
        self.last_token_id = int(prompt_token_ids[-1])
        self.block_table: list[int] = []
        self.status = SequenceStatus.WAITING
        self.finish_reason: str | None = None
        self.num_preemptions = 0
        self.priority = priority
        self.prefix = prefix
        # Tokens served from the prefix cache at the latest admission (v1 scheduler).
        self.prefix_hit_tokens = 0
        # Tokens loaded from a KV offload tier at the latest admission (beyond the prefix hit).
        self.offload_hit_tokens = 0
        # Chained keys of the full blocks hashed so far (engine.v1.prefix_keys), kept across
        # preemptions; and how many leading blocks of block_table are in the prefix cache.
        self.block_hashes: list[int] = []
        self._num_cached_blocks = 0
        # How many of those carry their key and cached flags in the BlockManager yet: fewer
        # while a unique prompt's caching is deferred (no event sink: engine/v1/prefix_cache.py).
        self._num_keyed_blocks = 0
        # The cached part of each table it was preempted with (private prefix caching:
        # engine/v1/prefix_cache.py).
        self._cached_tables: list[list[int]] = []
        # Hot-path copies: update() checks these once per sequence per step. After every
        # step cached_token_count == num_tokens - 1, so "max_tokens generated" is reached
        # exactly when cached_token_count hits this count (the Scheduler lowers it for
        # max_model_len).
        self._finish_cached_count = self.num_prompt_tokens + params.max_tokens - 1
        self._stop_ids = params.stop_ids

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        return self.num_prompt_tokens + len(self.generated_token_ids)

    @property
    def num_generated_tokens(self) -> int:
        return len(self.generated_token_ids)

    @property
    def token_ids(self) -> list[int]:
        """Prompt plus generated token ids (a new list)."""
        return [*self.prompt_token_ids, *self.generated_token_ids]

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def __repr__(self) -> str:
        return (
            f"Sequence(seq_id={self.seq_id}, status={self.status.name}, "
            f"num_tokens={self.num_tokens}, cached_token_count={self.cached_token_count}, "
            f"block_table={self.block_table})"
        )
