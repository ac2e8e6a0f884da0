"""The shared-prefix workload of inference-perf (late 2025 defaults) as a kvsim trace.

``num_groups`` groups of ``prompts_per_group`` prompts; each prompt is its group's system prompt
followed by a question of its own. Request *i* of a stage sends prompt *i* mod (groups x
prompts), so every prompt repeats once per that many requests and a prefix cache hits on the
repeats. Each stage sends exactly ``rate_per_s x duration_s`` requests ("constant" load:
exponential gaps rescaled so their sum is the stage's duration); stages run back to back.
Every request generates exactly ``output_tokens`` tokens (the client's ``ignore_eos``) and
is cancelled ``timeout_s`` after it was sent if it has not finished.

A trace carries no tokens, so prompt identity is carried by ``hash_ids`` at
``hash_block_size`` tokens per id (docs/formats.md): a hash block that lies wholly inside the
system prompt gets the group's id, every later one an id of the prompt alone. With the
engine's block size equal to (or a multiple of) ``hash_block_size``, a KV block is shared
exactly when vLLM would share it: when all its tokens are equal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from workloads.errors import SpecError
from workloads.limits import MAX_TIME_S
from workloads.request import Request, Trace

# A recipe's trace is built in memory: ten million requests (a few GB) is the bound.
MAX_REQUESTS = 10_000_000


@dataclass(frozen=True, slots=True)
class Stage:
    """One constant-rate stage: ``rate_per_s`` requests per second for ``duration_s`` seconds."""

    rate_per_s: float
    duration_s: float

    @property
    def num_requests(self) -> int:
        """Requests the stage sends: rate x duration, rounded to the nearest integer."""
        return round(self.rate_per_s * self.duration_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class SharedPrefixRecipe:
    """What inference-perf's shared-prefix generator sends (token counts are tokens the server
    sees, after tokenization; times in seconds)."""

    name: str
    system_prompt_tokens: int
    question_tokens: int
    output_tokens: int
    stages: tuple[Stage, ...]
    num_groups: int = 10
    prompts_per_group: int = 10
    timeout_s: float | None = 300.0
    seed: int = 0
    hash_block_size: int = 16

    def __post_init__(self) -> None:
        for field_name in (
            "system_prompt_tokens",
            "question_tokens",
            "output_tokens",
            "num_groups",
            "prompts_per_group",
            "hash_block_size",
        ):
            value = getattr(self, field_name)
            if type(value) is not int or value < 1:
                raise SpecError(f"{field_name} must be a positive integer, got {value!r}")
        if not self.stages:
            raise SpecError("a shared-prefix recipe needs at least one stage")
        total = 0
        for index, stage in enumerate(self.stages):
            rate, duration = stage.rate_per_s, stage.duration_s
            if not (
                0 < rate < math.inf
                and 0 < duration <= MAX_TIME_S
                and 1 <= rate * duration <= MAX_REQUESTS
            ):
                raise SpecError(
                    f"stages[{index}]: rate_per_s and duration_s must be positive and finite and "
                    f"send 1 to {MAX_REQUESTS:,} requests, got {rate!r} x {duration!r}"
                )
            total += stage.num_requests
        if total > MAX_REQUESTS:
            raise SpecError(f"the stages send {total:,} requests; at most {MAX_REQUESTS:,}")
        if self.timeout_s is not None and not 0 < self.timeout_s <= MAX_TIME_S:
            raise SpecError(f"timeout_s must be positive and finite, got {self.timeout_s!r}")

    @property
    def prompt_tokens(self) -> int:
        """Tokens of every prompt: system prompt plus question."""
        return self.system_prompt_tokens + self.question_tokens

    @property
    def num_prompts(self) -> int:
        """Distinct prompts: groups x prompts per group."""
        return self.num_groups * self.prompts_per_group


def stage_of(request_id: str) -> int:
    """The stage index of a request of :func:`shared_prefix_trace` (ids are ``s<stage>-<i>``)."""
    return int(request_id[1 : request_id.index("-")])


def prompt_hash_ids(recipe: SharedPrefixRecipe, prompt: int) -> tuple[int, ...]:
    """The hash ids of prompt number ``prompt`` (0 ... num_prompts - 1): the group's ids while a
    hash block lies wholly in the system prompt, ids of this prompt alone after that."""
    size, total = recipe.hash_block_size, recipe.prompt_tokens
    group = prompt // recipe.prompts_per_group
    num_blocks = -(-total // size)
    # Disjoint integer ranges: group ids below 2^40, a prompt's own ids above.
    return tuple(
        (group << 20) + k
        if (k + 1) * size <= recipe.system_prompt_tokens
        else ((prompt + 1) << 40) + k
        for k in range(num_blocks)
    )


def stage_arrivals(stage: Stage, start_s: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (s) of one stage: exponential gaps of mean 1/rate, rescaled so the n gaps
    sum to the duration exactly; the first request is sent at ``start_s``."""
    n = stage.num_requests
    gaps = rng.exponential(1.0 / stage.rate_per_s, n)
    before = np.concatenate(([0.0], np.cumsum(gaps)[:-1]))  # time before request i
    result: np.ndarray = start_s + before * (stage.duration_s / float(gaps.sum()))
    return result


def shared_prefix_trace(recipe: SharedPrefixRecipe) -> Trace:
    """The trace ``recipe`` describes: request ids ``s<stage>-<i>``, seeded by ``recipe.seed``
    (the same recipe gives the same trace, bit for bit)."""
    rng = np.random.default_rng(recipe.seed)
    hash_ids = [prompt_hash_ids(recipe, p) for p in range(recipe.num_prompts)]
    requests: list[Request] = []
    start = 0.0
    for index, stage in enumerate(recipe.stages):
        times = stage_arrivals(stage, start, rng)
        for i, t in enumerate(times.tolist()):
            requests.append(
                Request(
                    request_id=f"s{index}-{i}",
                    arrival_time_s=t,
                    prompt_tokens=recipe.prompt_tokens,
                    output_tokens=recipe.output_tokens,
                    hash_ids=hash_ids[i % recipe.num_prompts],
                    cancel_after_s=recipe.timeout_s,
                )
            )
        start += stage.duration_s
    return Trace(name=recipe.name, hash_block_size=recipe.hash_block_size, requests=requests)
