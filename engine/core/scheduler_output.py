"""SchedulerConfig and SchedulerOutput: what the Scheduler is told and what it decides."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from engine.core.errors import SchedulerError
from engine.core.events import StepKind
from engine.core.sequence import Sequence

SCHEDULERS = ("classic", "v1")
POLICIES = ("fcfs", "priority")


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerConfig:
    """Batch limits and which scheduler runs.

    ``scheduler="classic"`` (the default) is vLLM's 2023 scheduler: a step is a prefill batch
    or a decode batch, ``max_num_batched_tokens`` bounds a prefill step and a prompt longer
    than it is rejected; it ignores every option below ``max_model_len``.
    ``scheduler="v1"`` is vLLM 0.33's v1 scheduler (engine/v1/scheduler.py): one token
    budget of ``max_num_batched_tokens`` per step shared by decodes and prefill chunks
    (``enable_chunked_prefill``; ``long_prefill_token_threshold`` > 0 caps one sequence's
    chunk), ``policy`` "fcfs" or "priority" (lower ``Sequence.priority`` first), prefix
    caching as the BlockManager's ``enable_prefix_caching`` says.
    ``max_model_len`` (tokens, prompt + generated) rejects longer prompts (under v1, prompts
    of at least that many tokens) and finishes sequences that reach it.
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None
    scheduler: str = "classic"
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    policy: str = "fcfs"

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.max_model_len is not None and (
            not isinstance(self.max_model_len, int) or self.max_model_len < 1
        ):
            raise ValueError(
                f"max_model_len must be a positive integer, got {self.max_model_len!r}"
            )
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler must be one of {SCHEDULERS}, got {self.scheduler!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        threshold = self.long_prefill_token_threshold
        if not isinstance(threshold, int) or threshold < 0:
            raise ValueError(
                f"long_prefill_token_threshold must be an integer >= 0, got {threshold!r}"
            )


@dataclass(frozen=True, slots=True)
class TransferJob:
    """One load (tier -> GPU) or store (GPU -> tier) of ``keys`` (chunks) into / from
    ``gpu_block_ids`` for sequence ``seq_id``."""

    job_id: int
    seq_id: int
    is_store: bool
    keys: tuple[int, ...]
    gpu_block_ids: tuple[int, ...]


@dataclass(slots=True)
class ConnectorMeta:
    """What the worker side must do for one step (vLLM's OffloadingConnectorMetadata)."""

    load_jobs: list[TransferJob]
    store_jobs: list[TransferJob]
    jobs_to_flush: set[int]
    evicted_keys: list[int] = dataclasses.field(default_factory=list)  # from the CPU tier


def step_kind(seqs: list[Sequence], num_new_tokens: list[int]) -> StepKind:
    """A v1 step's kind: DECODE when every sequence computes only its last token (its
    output is sampled next), PREFILL when none does, MIXED otherwise."""
    num_decodes = 0
    for seq, n in zip(seqs, num_new_tokens):
        if n == 1 and seq.cached_token_count + 1 == seq.num_prompt_tokens + len(
            seq.generated_token_ids
        ):
            num_decodes += 1
    if num_decodes == len(seqs):
        return StepKind.DECODE
    return StepKind.PREFILL if num_decodes == 0 else StepKind.MIXED


class SchedulerOutput:
    """One step's decision.

    ``slot_mapping``, ``block_tables`` and ``context_lengths`` describe the cache as it is
    between ``schedule()`` and ``update()``; reading them after ``update()`` raises, since the
    sequences have moved on. Block tables are the sequences' own lists, not copies.
    """

    __slots__ = (
        "_decode_slots",
        "_updated",
        "admitted",
        "block_size",
        "connector_meta",
        "kind",
        "num_batched_tokens",
        "num_new_tokens",
        "preempted",
        "rejected",
        "seqs",
        "step",
    )

    def __init__(
        self,
        *,
        step: int,
        kind: StepKind,
        seqs: list[Sequence],
        num_new_tokens: list[int],
        block_size: int,
        preempted: list[Sequence],
        rejected: list[Sequence],
        decode_slots: list[int] | None = None,
        admitted: list[Sequence] | None = None,
    ) -> None:
        self.step = step
        self.kind = kind
        self.seqs = seqs
        self.num_new_tokens = num_new_tokens
        self.num_batched_tokens = sum(num_new_tokens)
        self.block_size = block_size
        self.preempted = preempted
        self.rejected = rejected
        self._decode_slots = decode_slots
        self._updated = False
        # v1: the sequences admitted from the waiting queue this step (new or resumed), in
        # batch order; the classic scheduler leaves it empty (its prefill steps admit seqs).
        self.admitted: list[Sequence] = admitted if admitted is not None else []
        # With KV offloading (engine/offload): this step's loads, stores and flushes.
        self.connector_meta: ConnectorMeta | None = None

    @property
    def is_empty(self) -> bool:
        """Nothing runs this step (update() must still be called)."""
        return not self.seqs

    @property
    def num_seqs(self) -> int:
        return len(self.seqs)

    @property
    def num_scheduled_tokens(self) -> dict[int, int]:
        """seq_id -> tokens computed this step (a prefill chunk, or 1 for a decode)."""
        return {s.seq_id: n for s, n in zip(self.seqs, self.num_new_tokens)}

    def _check_live(self) -> None:
        if self._updated:
            raise SchedulerError(
                f"step {self.step}: read slot_mapping / block_tables / context_lengths "
                "before update(); the sequences have moved on since"
            )

    @property
    def slot_mapping(self) -> list[int]:
        """Flat slot index of every token written this step, concatenated in batch order."""
        self._check_live()
        if self._decode_slots is not None:
            return self._decode_slots
        bs = self.block_size
        slots: list[int] = []
        for seq, n in zip(self.seqs, self.num_new_tokens):
            table = seq.block_table
            start = seq.cached_token_count
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, start + n))
        return slots

    @property
    def block_tables(self) -> list[list[int]]:
        self._check_live()
        return [seq.block_table for seq in self.seqs]

    @property
    def context_lengths(self) -> list[int]:
        """Per sequence: cached tokens plus this step's tokens (what attention reads)."""
        self._check_live()
        return [s.cached_token_count + n for s, n in zip(self.seqs, self.num_new_tokens)]

    def __repr__(self) -> str:
        return (
            f"SchedulerOutput(step={self.step}, kind={self.kind}, num_seqs={self.num_seqs}, "
            f"num_batched_tokens={self.num_batched_tokens}, preempted="
            f"{[s.seq_id for s in self.preempted]}, rejected={[s.seq_id for s in self.rejected]})"
        )
