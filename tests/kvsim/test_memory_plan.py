"""vLLM-style KV-cache memory planning, per GPU, with tensor parallelism."""

from __future__ import annotations

import pytest

from kvsim.costmodel import (
    GPU_PRESETS,
    MODEL_PRESETS,
    CostModelError,
    default_activation_reserve,
    plan_num_blocks,
    shard_model,
)

A100_80 = GPU_PRESETS["a100-80gb"]
LLAMA7 = MODEL_PRESETS["llama-2-7b"]
LLAMA70 = MODEL_PRESETS["llama-2-70b"]


def test_plan_num_blocks_by_hand() -> None:
    # 80 GiB x 0.9 = 77,309,411,328 B; weights 6,738,415,616 x 2 = 13,476,831,232 B;
    # reserve 1 GiB; block = 16 tokens x 524,288 B = 8,388,608 B.
    # (77,309,411,328 - 13,476,831,232 - 1,073,741,824) / 8,388,608 = 7481.4 -> 7481.
    plan = plan_num_blocks(LLAMA7, A100_80, 16, activation_reserve_bytes=1 << 30)
    assert plan.budget_bytes == 77_309_411_328
    assert plan.weight_bytes == 13_476_831_232
    assert plan.block_bytes == 8_388_608
    assert plan.kv_cache_bytes == 77_309_411_328 - 13_476_831_232 - (1 << 30)
    assert plan.num_blocks == 7481
    assert plan.token_capacity == 7481 * 16
    assert plan.max_model_len_fits


def test_default_reserve_is_a_fraction_of_a_gib_to_a_few_gib() -> None:
    reserve = default_activation_reserve(LLAMA7)
    assert 0.5 * (1 << 30) < reserve < 2 * (1 << 30)
    bigger = default_activation_reserve(LLAMA7, max_num_batched_tokens=8192)
    assert bigger > reserve
    plan = plan_num_blocks(LLAMA7, A100_80, 16)
    assert plan.activation_reserve_bytes == reserve
    assert 7000 < plan.num_blocks < 7609  # 7609 = no reserve at all


def test_smaller_blocks_give_more_blocks_for_the_same_tokens() -> None:
    plan16 = plan_num_blocks(LLAMA7, A100_80, 16, activation_reserve_bytes=0)
    plan8 = plan_num_blocks(LLAMA7, A100_80, 8, activation_reserve_bytes=0)
    assert plan8.num_blocks in (2 * plan16.num_blocks, 2 * plan16.num_blocks + 1)


def test_tp_halves_per_gpu_weights_and_kv_bytes() -> None:
    one, two = shard_model(LLAMA7, 1), shard_model(LLAMA7, 2)
    assert two.weight_bytes_per_gpu * 2 == one.weight_bytes_per_gpu
    assert two.kv_bytes_per_token_per_gpu * 2 == one.kv_bytes_per_token_per_gpu
    plan1 = plan_num_blocks(LLAMA7, A100_80, 16, activation_reserve_bytes=0)
    plan2 = plan_num_blocks(LLAMA7, A100_80, 16, activation_reserve_bytes=0, tp=2)
    assert plan2.weight_bytes * 2 == plan1.weight_bytes
    # Each GPU has more room and each block is half as big there: more than twice the blocks.
    assert plan2.num_blocks > 2 * plan1.num_blocks


def test_kv_heads_are_replicated_when_tp_exceeds_them() -> None:
    # llama-2-70b has 8 KV heads: at tp=16 each GPU still holds one whole KV head.
    shard = shard_model(LLAMA70, 16)
    assert (shard.heads_per_gpu, shard.kv_heads_per_gpu) == (4, 1)
    assert shard.kv_bytes_per_token_per_gpu == 2 * 80 * 1 * 128 * 2
    assert shard.weight_bytes_per_gpu > LLAMA70.weight_bytes // 16


@pytest.mark.parametrize(("tp", "message"), [(0, "tp must be"), (3, "num_heads"), (True, "tp")])
def test_invalid_tp_is_rejected(tp: int, message: str) -> None:
    with pytest.raises(CostModelError, match=message):
        plan_num_blocks(LLAMA70, A100_80, 16, tp=tp)


def test_tp_must_divide_or_be_a_multiple_of_kv_heads() -> None:
    qwen = MODEL_PRESETS["qwen2.5-7b"]  # 28 heads, 4 KV heads
    shard_model(qwen, 4)
    with pytest.raises(CostModelError, match="num_kv_heads"):
        shard_model(qwen, 14)  # divides 28 heads, but 14 is not a multiple of 4


def test_70b_on_one_a100_40gb_fails_with_a_tp_suggestion() -> None:
    with pytest.raises(CostModelError) as info:
        plan_num_blocks(LLAMA70, GPU_PRESETS["a100-40gb"], 16)
    message = str(info.value)
    assert "llama-2-70b does not fit on a100-40gb with tp=1" in message
    assert "weights 128.48 GiB" in message
    assert "use --tp 4 or more" in message


def test_70b_tp2_on_a100_80gb_plans_a_few_thousand_blocks() -> None:
    plan = plan_num_blocks(LLAMA70, A100_80, 16, tp=2)
    assert plan.weight_bytes == LLAMA70.weight_bytes // 2
    assert plan.block_bytes == 16 * 2 * 80 * 4 * 128 * 2
    assert 2000 < plan.num_blocks < 3000


def test_long_context_model_may_not_fit_max_model_len() -> None:
    plan = plan_num_blocks(MODEL_PRESETS["llama-3.1-8b"], GPU_PRESETS["l4"], 16)
    assert plan.num_blocks > 0
    assert not plan.max_model_len_fits


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"block_size": 0}, "block_size"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": 0}, "gpu_memory_utilization"),
        ({"activation_reserve_bytes": -1}, "activation_reserve_bytes"),
    ],
)
def test_bad_planning_inputs_are_named(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"block_size": 16, **kwargs}
    with pytest.raises(CostModelError, match=message):
        plan_num_blocks(LLAMA7, A100_80, **args)  # type: ignore[arg-type]
