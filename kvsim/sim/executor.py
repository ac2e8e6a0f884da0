"""Executors: how long a scheduled step takes, and which tokens it samples.

The executor is the only thing that differs between cost mode and engine mode. The cost-mode
executor prices each step with the fitted cost model (kvsim/costmodel/model.py): a step in which
every running sequence decodes in O(1) from the Scheduler's and BlockManager's counters; a
classic prefill, or a v1 step of decodes and prefill chunks, in one pass over the sequences
whose context the step changes otherwise (a FastV1 step's ``exact_seqs``: O(chunks)).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from engine import Scheduler, SchedulerOutput, Sequence, StepKind
from kvsim.costmodel import BatchShape, CostModel

DECODE = StepKind.DECODE  # a module constant: enum reads through the class are slow


class Executor(Protocol):
    """Runs (or predicts) one scheduled step."""

    def execute(self, out: SchedulerOutput, scheduler: Scheduler) -> tuple[float, list[int]]:
        """Return the step's duration (seconds) and one sampled token id per scheduled seq."""
        ...


def step_shape(
    out: SchedulerOutput, blocks_walked: int, scheduler: Scheduler | None = None
) -> BatchShape:
    """What ``out`` computes (read before ``scheduler.update``), for the cost model.

    A sequence computing one token over a non-empty cache is priced as a decode (its context:
    the cache plus this token); any other (a classic prefill, or a v1 prefill chunk of n tokens
    after c already computed, prefix-cache hits included) as a prefill that computes n new
    tokens and attends to all n + c: n*c + n(n+1)/2 query-key pairs, c cached tokens read.
    Prefix hits cost nothing to compute; they are part of c. A FastV1Scheduler step
    (``exact_seqs``) needs its ``scheduler``, whose counters give its lazy decoders' context.
    """
    return BatchShape(*_counts(out, blocks_walked, scheduler))


def _counts(
    out: SchedulerOutput, blocks_walked: int, scheduler: Scheduler | None
) -> tuple[int, int, int, int, int, int, int, int]:
    """step_shape's eight counts, in BatchShape's field order (no dataclass built).

    A FastV1Output lists only the sequences whose state is exact (``exact_seqs``: those
    prefilling and those admitted); every other scheduled sequence is a decoder whose
    ``cached_token_count`` may lag, so they are counted together from the scheduler's
    ``num_cached_tokens`` (every running sequence is in a fast step): a step costs O(chunks),
    not O(running), and the plain and fast schedulers price it identically."""
    exact: list[tuple[Sequence, int]] | None = getattr(out, "exact_seqs", None)
    scheduled: Iterable[tuple[Sequence, int]]
    if exact is None:
        scheduled = zip(out.seqs, out.num_new_tokens)  # no list: this runs every prefill step
        decodes = context = 0
    else:
        if scheduler is None:
            raise TypeError("a FastV1 step's counts need its scheduler (lazy decoders)")
        scheduled = exact
        decodes = len(out.seqs) - len(exact)
        context = scheduler.num_cached_tokens + out.num_batched_tokens
        for seq, n in exact:
            context -= seq.cached_token_count + n
    causal = cached_pairs = cached = 0
    for seq, n in scheduled:
        c = seq.cached_token_count
        if n == 1 and c:
            decodes += 1
            context += c + 1
        else:
            causal += n * (n + 1) // 2
            cached_pairs += n * c
            cached += c
    return (
        len(out.seqs), out.num_batched_tokens, decodes, context, causal, cached_pairs, cached,
        blocks_walked,
    )  # fmt: skip


class CostModelExecutor:
    """Cost mode: step time from ``cost_model``; sampled tokens are placeholders (0), since
    requests run with ignore_eos and stop at their trace's output length."""

    # Sampled tokens are placeholders, so the simulator may use the FastDecodeScheduler.
    placeholder_tokens = True

    def __init__(self, cost_model: CostModel) -> None:
        self.cost_model = cost_model
        self._step_time_of = cost_model.step_time_of
        self._zeros: list[int] = []

    def decode_step_time(self, num_seqs: int, context_tokens: int, num_blocks: int) -> float:
        """Predicted seconds of a decode step of ``num_seqs`` sequences reading
        ``context_tokens`` tokens of K/V through ``num_blocks`` block-table entries."""
        return self._step_time_of(num_seqs, num_seqs, num_seqs, context_tokens, 0, 0, 0, num_blocks)

    def decode_step_timer(self) -> Callable[[int, int, int], float]:
        """``decode_step_time`` as one plain function (the same results), for the simulator's
        per-step loop."""
        return self.cost_model.decode_step_time_fn()

    def blocks_walked(self, out: SchedulerOutput, scheduler: Scheduler) -> int:
        """Block-table entries the step's attention reads (read before ``update``). A decode
        step or a v1 step reads every used block (a block a running sequence holds), in O(1):
        a prefix block k sequences share counts once, not k times (on the Mooncake trace's
        shared prefixes that prices v1 steps about 1% lower; docs/costmodel.md, Limitations)."""
        if out.kind is DECODE or scheduler.is_v1:
            return scheduler.block_manager.num_used_blocks
        return sum(len(seq.block_table) for seq in out.seqs)

    def step_shape(self, out: SchedulerOutput, scheduler: Scheduler) -> BatchShape:
        """The BatchShape this executor prices ``out`` by (read before ``update``)."""
        return step_shape(out, self.blocks_walked(out, scheduler), scheduler)

    def step_time(self, out: SchedulerOutput, scheduler: Scheduler) -> float:
        """Predicted seconds for ``out`` (read before ``scheduler.update``)."""
        n = len(out.seqs)
        blocks = self.blocks_walked(out, scheduler)
        if out.kind is DECODE and n == scheduler.num_running:
            # Every running sequence decodes: its context is its cache plus this token, so the
            # Scheduler's counters give the sums in O(1).
            return self.decode_step_time(n, scheduler.num_cached_tokens + n, blocks)
        return self._step_time_of(*_counts(out, blocks, scheduler))

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
