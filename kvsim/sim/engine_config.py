"""What a run's engine is built from: the scheduler's limits and the prompts' prefix identity
(kvsim.runner and kvsim.fleet build their engines from the same two)."""

from __future__ import annotations

from collections.abc import Callable

from engine import SchedulerConfig
from engine.v1.prefix_keys import PrefixSource, prefix_from_hash_ids
from kvsim.config import RunConfig, SchedulingLimits
from kvsim.sim.engine_mode import SESSION_STREAM_TOKENS, session_stream_key
from workloads import Request, Trace


def scheduler_config(
    config: RunConfig, limits: SchedulingLimits, max_model_len: int | None
) -> SchedulerConfig:
    """The engine's SchedulerConfig for ``config`` (vLLM's option names map one to one)."""
    return SchedulerConfig(
        max_num_seqs=limits.max_num_seqs,
        max_num_batched_tokens=limits.max_num_batched_tokens,
        max_model_len=max_model_len,
        scheduler=config.resolved_scheduler(),
        enable_chunked_prefill=config.enable_chunked_prefill,
        long_prefill_token_threshold=config.long_prefill_token_threshold,
        policy=config.scheduling_policy,
    )


def prefix_source_of(trace: Trace, block_size: int) -> Callable[[Request], PrefixSource]:
    """What says which placeholder-token prompts share a prefix: the trace's hash_ids, or
    else its session ids (docs/formats.md, "Prefix identity")."""
    hash_block_size = trace.hash_block_size

    def prefix_of(request: Request) -> PrefixSource:
        if not request.hash_ids and request.session_id is not None:
            return prefix_from_hash_ids(
                [session_stream_key(request.session_id)], SESSION_STREAM_TOKENS,
                request.prompt_tokens, block_size,
            )  # fmt: skip
        return prefix_from_hash_ids(
            request.hash_ids, hash_block_size, request.prompt_tokens, block_size
        )

    return prefix_of


def key_source_of(
    trace: Trace, *, caching: bool
) -> Callable[[Request], tuple[list[int], int] | None]:
    """``prefix_source_of``'s keys for the compiled core: a request's (hash_ids,
    hash_block_size), or None for a prompt nobody shares (or no prefix caching)."""
    trace_hash_block_size = trace.hash_block_size

    def key_source(request: Request) -> tuple[list[int], int] | None:
        if not caching:
            return None
        if not request.hash_ids and request.session_id is not None:
            ids, hash_block_size = [session_stream_key(request.session_id)], SESSION_STREAM_TOKENS
        elif not request.hash_ids:
            return None
        else:
            if trace_hash_block_size is None:  # the same error as prefix_source_of's
                prefix_from_hash_ids(request.hash_ids, None, request.prompt_tokens, 1)
            assert trace_hash_block_size is not None
            ids, hash_block_size = list(request.hash_ids), trace_hash_block_size
        # A hash id covering the whole prompt gives the same keys at any larger size (only the
        # first id is used, and every block's last token falls in it): the core takes int32.
        return ids, min(hash_block_size, request.prompt_tokens)

    return key_source
