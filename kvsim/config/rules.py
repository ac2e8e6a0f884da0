"""Options that contradict each other: ``RULES``, each returning what is wrong with a run's
options, or None. RunConfig refuses a config any rule finds fault with (ConfigError), after
checking each field's type and bounds."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from kvsim.config.run_options import RunOptions
from kvsim.option_spec import parse_pd


def pd_pool_tps(c: RunOptions) -> tuple[int, int]:
    """A P/D fleet's tensor-parallel sizes: (prefill, decode), each its option or --tp."""
    prefill = c.tp if c.pd_prefill_tp is None else c.pd_prefill_tp
    return prefill, c.tp if c.pd_decode_tp is None else c.pd_decode_tp


def _pd_tp_problem(c: RunOptions) -> str | None:
    """vLLM's NIXL connector pulls between TP sizes of which one divides the other
    (TransferTopology.tp_ratio in vllm/distributed/kv_transfer/kv_connector/utils.py asserts
    it at the handshake)."""
    if c.pd is None:
        return None
    prefill, decode = pd_pool_tps(c)
    if max(prefill, decode) % min(prefill, decode) == 0:
        return None
    return (
        f"--pd-prefill-tp {prefill} and --pd-decode-tp {decode}: one must divide the other "
        "(vLLM's NIXL connector maps TP ranks between pools only then)"
    )


def _tier_without_cpu_problem(c: RunOptions) -> str | None:
    if c.kv_offload_tier is None or c.offloads():
        return None
    return (
        "--kv-offload-tier needs --kv-offloading-size above 0 (secondary tiers sit behind "
        "the CPU tier, as in vLLM's tiering spec)"
    )


def _offload_block_size_problem(c: RunOptions) -> str | None:
    size = c.kv_offload_block_size
    if size is None or size % c.block_size == 0:
        return None
    return (
        f"--kv-offload-block-size {size} must be a multiple of --block-size {c.block_size} "
        "(an offloaded chunk is whole GPU blocks, as vLLM requires)"
    )


def _engine_only_in_cost_mode(c: RunOptions) -> str | None:
    if c.mode != "cost":
        return None
    fields = {f.name: f for f in dataclasses.fields(c)}
    given = [n for n in ("device", "dtype", "threads") if getattr(c, n) != fields[n].default]
    if not given:
        return None
    flags = ", ".join(fields[n].metadata["option"].cli_flag(n) for n in given)
    return f"{flags} applies to --mode engine only (cost mode runs no model)"


RULES: tuple[Callable[[RunOptions], str | None], ...] = (
    lambda c: (
        "give --rate or --time-scale, not both"
        if c.rate is not None and c.time_scale is not None
        else None
    ),
    lambda c: (
        "--rate rescales an open-loop trace; with --concurrency the users set the rate "
        "(give one of them)"
        if c.rate is not None and c.concurrency is not None
        else None
    ),
    lambda c: (
        "--time-scale rescales an open-loop trace; with --concurrency the users set the "
        "rate (give one of them)"
        if c.time_scale is not None and c.concurrency is not None
        else None
    ),
    lambda c: (
        "--think-time is the pause of a closed-loop user: it needs --concurrency"
        if c.think_time_s > 0 and c.concurrency is None
        else None
    ),
    lambda c: (
        f"allocator {c.allocator!r} runs in cost mode only (the torch engine is paged)"
        if c.allocator != "paged" and c.mode != "cost"
        else None
    ),
    lambda c: (
        f"allocator {c.allocator!r} runs with the classic scheduler (the contiguous baselines "
        "reproduce the vLLM paper's comparison of 2023 schedulers), not --scheduler v1"
        if c.allocator != "paged" and c.scheduler == "v1"
        else None
    ),
    lambda c: (
        # vLLM's SchedulerConfig refuses this too: no prompt longer than one step's budget
        # could ever be scheduled
        f"--max-num-batched-tokens {c.max_num_batched_tokens} is below --max-model-len "
        f"{c.max_model_len} with chunked prefill off, so longer prompts could never run (as "
        "vLLM says): raise it, lower --max-model-len or enable chunked prefill"
        if not c.enable_chunked_prefill
        and c.resolved_scheduler() == "v1"
        and c.max_num_batched_tokens is not None
        and c.max_model_len is not None
        and c.max_num_batched_tokens < c.max_model_len
        else None
    ),
    lambda c: (
        # vLLM's SchedulerConfig.verify_max_model_len; the defaulted cases are checked once
        # the GPU's defaults are known (scheduling_limits)
        f"--max-num-batched-tokens {c.max_num_batched_tokens:,} is below --max-num-seqs "
        f"{c.max_num_seqs:,}: a step could never schedule every running sequence (vLLM 0.33 "
        "refuses it too); raise --max-num-batched-tokens or lower --max-num-seqs"
        if c.max_num_batched_tokens is not None
        and c.max_num_seqs is not None
        and c.max_num_batched_tokens < c.max_num_seqs
        else None
    ),
    lambda c: (
        f"--long-prefill-token-threshold {c.long_prefill_token_threshold:,} is above "
        f"--max-model-len {c.max_model_len:,} (vLLM 0.33 refuses it too): lower it"
        if c.max_model_len is not None and c.long_prefill_token_threshold > c.max_model_len
        else None
    ),
    lambda c: (
        "--step-time prices cost-mode steps; engine mode measures them"
        if c.step_time is not None and c.mode != "cost"
        else None
    ),
    lambda c: (
        "a fleet (--replicas above 1) runs in cost mode with the v1 scheduler and paged KV "
        "blocks, open loop (no --concurrency)"
        if c.replicas > 1
        and (c.mode != "cost" or c.resolved_scheduler() != "v1" or c.concurrency is not None)
        else None
    ),
    lambda c: (
        "--fleet-events all writes the replicas' events of a --replicas fleet (a P/D fleet "
        "writes its routing decisions only)"
        if c.fleet_events == "all" and c.pd is not None
        else None
    ),
    lambda c: (
        "--router-speculative-ttl is llm-d's speculative indexing: it needs --router prefix "
        "in a fleet (--replicas above 1 or --pd)"
        if c.router_speculative_ttl_s > 0
        and (c.router != "prefix" or (c.replicas <= 1 and c.pd is None))
        else None
    ),
    lambda c: (
        "--pd P:D sets the fleet: --replicas is P + D (or leave it out)"
        if c.pd is not None and c.replicas not in (1, sum(parse_pd(c.pd)))
        else None
    ),
    lambda c: (
        "a P/D fleet (--pd) runs in cost mode with the v1 scheduler and paged KV blocks, open "
        "loop (no --concurrency), without KV offload"
        if c.pd is not None
        and (
            c.mode != "cost"
            or c.resolved_scheduler() != "v1"
            or c.concurrency is not None
            or c.offloads()
        )
        else None
    ),
    lambda c: (
        "--pd-prefill-gpu, --pd-prefill-tp, --pd-decode-gpu and --pd-decode-tp set a P/D "
        "fleet's pools: give --pd P:D"
        if c.pd is None and c.sets_pd_pools()
        else None
    ),
    _pd_tp_problem,
    lambda c: (
        "KV offload (--kv-offloading-size above 0) runs with the v1 scheduler and paged KV "
        "blocks (vLLM's OffloadingConnector is a v1 KV connector)"
        if c.offloads() and c.resolved_scheduler() != "v1"
        else None
    ),
    _offload_block_size_problem,
    _tier_without_cpu_problem,
    _engine_only_in_cost_mode,
)
