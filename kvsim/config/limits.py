"""The batch limits a run uses once vLLM's defaults are resolved (scheduling_limits)."""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.config.run_config import RunConfig
from kvsim.costmodel.gpuspec import GPUSpec
from kvsim.costmodel.memory_plan import serving_batch_defaults
from kvsim.option_spec import (
    ConfigError,
)


@dataclass(frozen=True, slots=True)
class SchedulingLimits:
    """The batch limits a run uses once its defaults are resolved (sequences, tokens, share
    of blocks)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    watermark: float


CLASSIC_LIMITS = SchedulingLimits(max_num_seqs=256, max_num_batched_tokens=8192, watermark=0.01)


def scheduling_limits(
    config: RunConfig, gpu: GPUSpec, max_model_len: int | None = None
) -> SchedulingLimits:
    """``config``'s limits, with vLLM 0.33's serving defaults for ``gpu`` under v1 (watermark
    0) and the 2023 defaults (256 sequences, 8,192 tokens, watermark 0.01) under classic.

    With the run's resolved ``max_model_len`` (tokens) the v1 defaults are fitted as vLLM 0.33
    fits them (``EngineArgs._set_default_max_num_seqs_and_batched_tokens_args``): a defaulted
    token budget is raised to ``max_model_len`` without chunked prefill (else no long prompt
    could run) and capped at ``max_num_seqs * max_model_len``; a defaulted ``max_num_seqs`` is
    capped at the token budget. Then vLLM's own checks (``SchedulerConfig.verify_max_model_len``)
    raise ConfigError: a budget below ``max_num_seqs``, a long-prefill threshold above
    ``max_model_len``."""
    if config.resolved_scheduler() != "v1":
        return SchedulingLimits(
            max_num_seqs=config.max_num_seqs or CLASSIC_LIMITS.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens
            or CLASSIC_LIMITS.max_num_batched_tokens,
            watermark=CLASSIC_LIMITS.watermark if config.watermark is None else config.watermark,
        )
    tokens, seqs = serving_batch_defaults(gpu)
    seqs = config.max_num_seqs or seqs
    tokens = config.max_num_batched_tokens or tokens
    if max_model_len is not None and config.max_num_batched_tokens is None:
        if not config.enable_chunked_prefill:
            tokens = max(tokens, max_model_len)
        tokens = min(tokens, seqs * max_model_len)
    if config.max_num_seqs is None:
        seqs = min(seqs, tokens)
    if tokens < seqs:
        given = "" if config.max_num_batched_tokens else " (the default for this GPU)"
        raise ConfigError(
            f"--max-num-batched-tokens {tokens:,}{given} is below --max-num-seqs {seqs:,}: "
            "a step could never schedule every running sequence (vLLM 0.33 refuses it too); "
            "raise --max-num-batched-tokens or lower --max-num-seqs"
        )
    if max_model_len is not None and config.long_prefill_token_threshold > max_model_len:
        raise ConfigError(
            f"--long-prefill-token-threshold {config.long_prefill_token_threshold:,} is above "
            f"max_model_len {max_model_len:,} (vLLM 0.33 refuses it too): lower it"
        )
    return SchedulingLimits(
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        watermark=0.0 if config.watermark is None else config.watermark,
    )
