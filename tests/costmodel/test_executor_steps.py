"""The cost-mode executor prices classic steps and vLLM v1 steps (decodes and prefill chunks
over their cached context, prefix hits included) by the BatchShape formula."""

from __future__ import annotations

import math
from typing import Any

import pytest

from engine import SamplingParams, Scheduler, SchedulerConfig, SchedulerOutput, Sequence, StepKind
from engine.core.block_manager import BlockManager
from kvsim.costmodel import BatchShape, CostModel, resolve_gpu, resolve_model
from kvsim.sim.allocators import ContiguousCostExecutor
from kvsim.sim.executor import CostModelExecutor, step_shape

COST = CostModel(resolve_model("llama-3-8b"), resolve_gpu("h100-sxm"))
BLOCK = 16


def seq(seq_id: int, prompt: int, cached: int, generated: int = 0) -> Sequence:
    """A sequence with ``cached`` tokens computed (prefix hits or earlier chunks) and a block
    table covering them and this step's tokens."""
    s = Sequence(seq_id, range(prompt), SamplingParams(max_tokens=64, ignore_eos=True))
    s.generated_token_ids.extend([0] * generated)
    s.cached_token_count = cached
    s.block_table = list(range(seq_id * 100, seq_id * 100 + math.ceil((cached + 512) / BLOCK)))
    return s


class UsedBlocks:
    num_used_blocks = 777


class V1Scheduler:
    """What the executor reads of a v1 scheduler (engine/v1/scheduler.py): a v1 step walks
    every used block, counted once (the pool's counter)."""

    is_v1 = True
    num_running = 10**6  # more than any step here: never the all-decode O(1) path
    block_manager = UsedBlocks()


def output(kind: StepKind, pairs: list[tuple[Sequence, int]]) -> SchedulerOutput:
    return SchedulerOutput(
        step=0, kind=kind, seqs=[s for s, _ in pairs], num_new_tokens=[n for _, n in pairs],
        block_size=BLOCK, preempted=[], rejected=[],
    )  # fmt: skip


def test_a_mixed_v1_step_is_priced_by_its_decodes_and_chunks() -> None:
    decode_a = seq(1, prompt=100, cached=130, generated=31)  # 131 tokens, computes its last
    decode_b = seq(2, prompt=40, cached=45, generated=6)
    chunk = seq(3, prompt=3000, cached=1024)  # 1,024 cached (hits or chunks), 512 more now
    fresh = seq(4, prompt=200, cached=0)  # a whole short prompt
    out = output(StepKind.PREFILL, [(decode_a, 1), (decode_b, 1), (chunk, 512), (fresh, 200)])
    blocks = UsedBlocks.num_used_blocks
    expected = BatchShape.of(
        prefill_chunks=[(512, 1024), (200, 0)],
        decode_contexts=(131, 46),
        num_blocks_walked=blocks,
    )
    assert step_shape(out, blocks) == expected
    assert expected.prefill_cached_pairs == 512 * 1024
    assert expected.prefill_causal_pairs == 512 * 513 // 2 + 200 * 201 // 2
    executor = CostModelExecutor(COST)
    scheduler: Any = V1Scheduler()
    assert executor.step_time(out, scheduler) == COST.step_time(expected)
    dt, tokens = executor.execute(out, scheduler)
    assert dt == COST.step_time(expected) and tokens == [0, 0, 0, 0]


def test_a_v1_decode_step_without_every_runner_is_read_from_its_sequences() -> None:
    # Under v1 a step of decodes need not hold every running sequence (the budget may cut
    # the running pass): the context comes from the scheduled sequences.
    out = output(StepKind.DECODE, [(seq(1, 50, 60, 11), 1), (seq(2, 70, 90, 21), 1)])
    expected = BatchShape.decode(2, 61 + 91, UsedBlocks.num_used_blocks)
    scheduler: Any = V1Scheduler()
    assert CostModelExecutor(COST).step_time(out, scheduler) == COST.step_time(expected)


def test_prefix_hits_cost_attention_reads_only() -> None:
    executor, scheduler = CostModelExecutor(COST), V1Scheduler()
    cold = output(StepKind.PREFILL, [(seq(1, 2048, 0), 2048)])
    warm = output(StepKind.PREFILL, [(seq(2, 2048, 1536), 512)])  # 1,536 tokens were hits
    alone = output(StepKind.PREFILL, [(seq(3, 512, 0), 512)])
    t_cold, t_warm, t_alone = (executor.step_time(o, scheduler) for o in (cold, warm, alone))  # type: ignore[arg-type]
    assert t_alone < t_warm < t_cold


def test_classic_steps_keep_the_o1_decode_path() -> None:
    manager = BlockManager(256, BLOCK, 0.0)
    scheduler = Scheduler(SchedulerConfig(), manager)
    for i in range(3):
        scheduler.add_request(
            Sequence(i, range(40 + i), SamplingParams(max_tokens=8, ignore_eos=True))
        )
    executor = CostModelExecutor(COST)
    prefill = scheduler.schedule()
    blocks = sum(len(s.block_table) for s in prefill.seqs)
    expected = BatchShape.of(prefill_chunks=[(40, 0), (41, 0), (42, 0)], num_blocks_walked=blocks)
    assert executor.step_time(prefill, scheduler) == COST.step_time(expected)
    scheduler.update(prefill, [0, 0, 0])
    decode = scheduler.schedule()
    assert decode.kind is StepKind.DECODE
    context = sum(s.cached_token_count + 1 for s in decode.seqs)
    shape = BatchShape.decode(3, context, manager.num_used_blocks)
    assert executor.step_time(decode, scheduler) == COST.step_time(shape)
    # the general path and the closure agree on it bit for bit
    timer = executor.decode_step_timer()
    assert timer(3, context, manager.num_used_blocks) == COST.step_time(shape)


def test_contiguous_executor_charges_one_entry_per_sequence_on_mixed_steps() -> None:
    out = output(StepKind.PREFILL, [(seq(1, 100, 130, 31), 1), (seq(2, 900, 256), 300)])
    scheduler: Any = V1Scheduler()
    expected = BatchShape.of(
        prefill_chunks=[(300, 256)], decode_contexts=(131,), num_blocks_walked=2
    )
    assert ContiguousCostExecutor(COST).step_time(out, scheduler) == COST.step_time(expected)


@pytest.mark.parametrize("num_seqs", [1, 7, 300, 2000])
def test_executor_decode_time_is_the_closure(num_seqs: int) -> None:
    executor = CostModelExecutor(COST)
    timer = executor.decode_step_timer()
    context, blocks = num_seqs * 777, num_seqs * 49
    assert executor.decode_step_time(num_seqs, context, blocks) == timer(num_seqs, context, blocks)
