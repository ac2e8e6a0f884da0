"""RunConfig's serving options: the trace, the model and its hardware, the KV pool and vLLM's
scheduler limits."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvsim.config.types import (
    Mode,
    Policy,
    SchedulerName,
)
from kvsim.costmodel.gpuspec import GPU_PRESETS
from kvsim.option_spec import (
    MAX_BLOCK_SIZE,
    MAX_NUM_BLOCKS,
    MAX_TOKENS,
    at_least,
    check_step_time,
    fraction,
    not_empty,
    option,
)


@dataclass(frozen=True, kw_only=True)
class ServingOptions:
    """RunConfig's serving options (kvsim/config/run_config.py puts the groups together in this
    order; each field is defined once, here)."""

    trace: str = option(
        dataclasses.MISSING,
        help="Trace file (.json/.jsonl/.csv) or shipped trace name",
        run=False,
        sweep="no",
        check=not_empty,
    )
    mode: Mode = option(
        "cost",
        help="cost: step times from the cost model; engine: the torch engine runs every step",
        sweep="no",
    )
    model: str = option(
        "llama-2-7b",
        help="Model preset or a Hugging Face config.json path",
        unit="NAME|PATH",
        check=not_empty,
    )
    gpu: str = option(
        "a100-80gb",
        help=f"GPU preset ({', '.join(GPU_PRESETS)}) or a GPU spec JSON file",
        unit="NAME|PATH",
        check=not_empty,
    )
    tp: int = option(1, help="Tensor-parallel GPUs", unit="GPUS", check=at_least(1, maximum=4096))
    coefficients: str | None = option(
        None,
        help="Cost-model coefficient overrides (JSON file)",
        unit="FILE",
        path=True,
        default_text="none",
        check=not_empty,
    )
    step_time: str | None = option(
        None,
        help="Replace the cost model: linear:BASE_S:PER_TOKEN_S prices a step at BASE_S + "
        "PER_TOKEN_S x scheduled tokens (the clock of vLLM's reference scheduler driver)",
        unit="SPEC",
        default_text="the cost model",
        check=lambda name, value: check_step_time(value),
    )
    block_size: int = option(
        16,
        help="Tokens per KV block",
        unit="TOKENS",
        sweep="axis",
        sweep_help="Block sizes to sweep, e.g. 1,2,4,8,16,32,64,128,256",
        check=at_least(1, maximum=MAX_BLOCK_SIZE, why=" tokens (no context is that long)"),
    )
    num_blocks: int | None = option(
        None,
        help="KV blocks in the pool",
        unit="BLOCKS",
        default_text="planned from GPU memory",
        sweep_help="KV blocks (of the base block size, 16, when block sizes are swept: the "
        "slots are held)",
        check=at_least(1, maximum=MAX_NUM_BLOCKS),
    )
    gpu_memory_utilization: float = option(
        0.9,
        help="Share of GPU memory for weights, activations and KV",
        unit="FRACTION",
        check=fraction(low_open=True, high_open=False),
    )
    max_num_seqs: int | None = option(
        None,
        help="Most sequences in one batch",
        unit="SEQS",
        default_text="v1: vLLM 0.33's serving default for the GPU (1024 on H100/H200-class, "
        "256 on A100 and smaller), at most the token budget; classic: 256",
        check=at_least(1, maximum=MAX_TOKENS),
    )
    max_num_batched_tokens: int | None = option(
        None,
        help="Token budget of one step (classic: of one prefill step)",
        unit="TOKENS",
        default_text="v1: vLLM 0.33's serving default for the GPU (8192 on H100/H200-class, "
        "2048 on A100 and smaller), at least max_model_len without chunked prefill; "
        "classic: 8192",
        check=at_least(1, maximum=MAX_TOKENS),
    )
    max_model_len: int | None = option(
        None,
        help="Longest sequence, prompt + output",
        unit="TOKENS",
        default_text="the model's",
        check=at_least(1, maximum=MAX_TOKENS),
    )
    allow_long_max_model_len: bool = option(
        False,
        help="Accept --max-model-len beyond the model's context as a what-if (vLLM 0.33 "
        "refuses it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)",
        omit_default=True,
    )
    watermark: float | None = option(
        None,
        help="Share of blocks kept free when admitting",
        unit="FRACTION",
        default_text="v1: 0 (vLLM 0.33); classic: 0.01",
        check=fraction(low_open=False, high_open=True),
    )
    scheduler: SchedulerName | None = option(
        None,
        help="v1: vLLM 0.33's scheduler (one token budget shared by decodes and prefill "
        "chunks, prefix caching, priorities); classic: vLLM's 2023 scheduler (a step is a "
        "prefill or a decode batch; the vLLM paper's figures)",
        default_text="v1; classic with a contiguous --allocator (the paper's comparison)",
    )
    enable_chunked_prefill: bool = option(
        True, help="v1: cut prefills into chunks that fit the step's token budget"
    )
    long_prefill_token_threshold: int = option(
        0,
        help="v1: cap one sequence's prefill chunk at this many tokens (0: no cap)",
        unit="TOKENS",
        check=at_least(0, maximum=MAX_TOKENS),
    )
    enable_prefix_caching: bool = option(
        True,
        help="v1: reuse cached full KV blocks across requests (a trace's hash_ids, else its "
        "session ids, say which prompts share a prefix: docs/formats.md)",
    )
    scheduling_policy: Policy = option(
        "fcfs",
        unit="POLICY",
        help="v1: fcfs (arrival order) or priority (the trace's priority, lower first)",
    )
