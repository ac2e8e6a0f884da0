"""Executors: how long a scheduled step takes, and which tokens it samples.

The executor is the only thing that differs between cost mode and engine mode. The cost-mode
executor predicts the step time from the roofline cost model; every count it needs is kept by
the Scheduler and BlockManager, so it costs O(1) per decode step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from engine import Scheduler, SchedulerOutput, StepKind
from kvsim.costmodel import CostModel, causal_pairs

DECODE = StepKind.DECODE  # a module constant: enum reads through the class are slow


class Executor(Protocol):
    """Runs (or predicts) one scheduled step."""

    def execute(self, out: SchedulerOutput, scheduler: Scheduler) -> tuple[float, list[int]]:
        """Return the step's duration (seconds) and one sampled token id per scheduled seq."""
        ...


class CostModelExecutor:
    """Cost mode: step time from ``cost_model``; sampled tokens are placeholders (0), since
    requests run with ignore_eos and stop at their trace's output length."""

    # Sampled tokens are placeholders, so the simulator may use the FastDecodeScheduler.
    placeholder_tokens = True

    def __init__(self, cost_model: CostModel) -> None:
        self.cost_model = cost_model
        self._zeros: list[int] = []

    def decode_step_time(self, num_seqs: int, context_tokens: int, num_blocks: int) -> float:
        """Predicted seconds of a decode step of ``num_seqs`` sequences reading
        ``context_tokens`` tokens of K/V through ``num_blocks`` block-table entries."""
        return self.cost_model.step_time_of(num_seqs, num_seqs, 0, context_tokens, num_blocks)

    def decode_step_timer(self) -> Callable[[int, int, int], float]:
        """``decode_step_time`` as one plain function (the same results), for the simulator's
        per-step loop."""
        return self.cost_model.decode_step_time_fn()

    def blocks_walked(self, out: SchedulerOutput, scheduler: Scheduler) -> int:
        """Block-table entries the step's attention reads (read before ``update``)."""
        if out.kind is DECODE or scheduler.is_v1:
            return scheduler.block_manager.num_used_blocks  # every used block is a runner's
        return sum(len(seq.block_table) for seq in out.seqs)

    def step_time(self, out: SchedulerOutput, scheduler: Scheduler) -> float:
        """Predicted seconds for ``out`` (read before ``scheduler.update``)."""
        n = len(out.seqs)
        blocks = self.blocks_walked(out, scheduler)
        if out.kind is DECODE and n == scheduler.num_running:
            # Every running sequence decodes: its context is its cache plus this token.
            return self.decode_step_time(n, scheduler.num_cached_tokens + n, blocks)
        if scheduler.is_v1:
            pairs, decode_context = v1_attention_counts(out, scheduler)
            return self.cost_model.step_time_of(
                n, out.num_batched_tokens, pairs, decode_context, blocks
            )
        pairs = 0
        for seq, new in zip(out.seqs, out.num_new_tokens):
            pairs += causal_pairs(new, seq.cached_token_count)
        return self.cost_model.step_time_of(n, out.num_batched_tokens, pairs, 0, blocks)

    def execute(self, out: SchedulerOutput, scheduler: Scheduler) -> tuple[float, list[int]]:
        n = len(out.seqs)
        if len(self._zeros) < n:
            self._zeros = [0] * n
        return self.step_time(out, scheduler), self._zeros[:n]


class LinearStepExecutor:
    """``--step-time linear:BASE_S:PER_TOKEN_S``: a step takes BASE_S + PER_TOKEN_S x its
    scheduled tokens (seconds), whatever the model and GPU. It is the logical clock of
    vLLM's reference scheduler driver, so a run can be compared with it decision for
    decision. Sampled tokens are placeholders, as in cost mode."""

    placeholder_tokens = True

    def __init__(self, base_s: float, per_token_s: float) -> None:
        self.base_s = base_s
        self.per_token_s = per_token_s
        self._zeros: list[int] = []

    def describe(self) -> dict[str, float | str]:
        return {"kind": "linear", "base_s": self.base_s, "per_token_s": self.per_token_s}

    def decode_step_timer(self) -> Callable[[int, int, int], float]:
        base, per_token = self.base_s, self.per_token_s

        def decode_step_time(num_seqs: int, context_tokens: int, num_blocks: int) -> float:
            return base + per_token * num_seqs

        return decode_step_time

    def execute(self, out: SchedulerOutput, scheduler: Scheduler) -> tuple[float, list[int]]:
        n = len(out.seqs)
        if len(self._zeros) < n:
            self._zeros = [0] * n
        return self.base_s + self.per_token_s * out.num_batched_tokens, self._zeros[:n]


def v1_attention_counts(out: SchedulerOutput, scheduler: Scheduler) -> tuple[int, int]:
    """A v1 step's attention work: (query-key pairs of its prefill chunks, context tokens of
    its decodes). A decode computes a sequence's last token alone (vLLM's notion, and the step
    kind's); a chunk of n tokens after c computed ones has n*c + n(n+1)/2 pairs (prefix hits
    are among the c: they cost reads, no compute).

    FastV1Scheduler's steps list only the sequences whose state is exact (``exact_seqs``);
    the others are decoders, whose total context the scheduler's counters give, so a step
    costs O(chunks), and the plain and fast schedulers price a step identically."""
    exact = getattr(out, "exact_seqs", None)
    if exact is None:
        exact = list(zip(out.seqs, out.num_new_tokens))
        lazy_context = 0
    else:
        # Every running sequence is scheduled in a fast step: the counters cover them all.
        lazy_context = scheduler.num_cached_tokens + out.num_batched_tokens
        for seq, n in exact:
            lazy_context -= seq.cached_token_count + n
    pairs = 0
    decode_context = lazy_context
    for seq, n in exact:
        cached = seq.cached_token_count
        if n == 1 and cached + 1 == seq.num_tokens:
            decode_context += cached + 1
        else:
            pairs += causal_pairs(n, cached)
    return pairs, decode_context
