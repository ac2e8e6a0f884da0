"""Shared fixtures for the simulator tests: a toy executor with hand-checkable step times, and
runs of the shipped default trace that several test modules read (computed once per session)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engine import Scheduler, SchedulerOutput, StepKind
from kvsim.config import RunConfig
from kvsim.runner import RunResult, run, simulate
from workloads import DEFAULT_TRACE_NAME, Request, Trace

# A pool small enough that the default trace preempts (about 200 times) and that 18 prompts
# do not fit, yet large enough that every admitted request can grow to its last token alone
# (test_rejected_requests_are_exactly_those_that_can_never_fit checks that premise).
PRESSURED_NUM_BLOCKS = 240


class ToyExecutor:
    """Prefill steps take 1 s + 1/16 s per batched token, decode steps 1/4 s; every sampled
    token is 0. Powers of two keep every simulated time exact in binary floating point, so
    hand-computed timelines compare with ``==``."""

    def execute(self, out: SchedulerOutput, scheduler: Scheduler) -> tuple[float, list[int]]:
        if out.kind is StepKind.PREFILL:
            return 1.0 + out.num_batched_tokens / 16, [0] * len(out.seqs)
        return 0.25, [0] * len(out.seqs)


ToySim = Callable[..., RunResult]


@pytest.fixture
def toy_sim() -> ToySim:
    """``toy_sim(requests, num_blocks=..., block_size=..., **options)``: simulate ``requests``
    (tuples ``(arrival_s, prompt, output)`` or ``(arrival_s, prompt, output, cancel_after_s)``,
    ids "r0", "r1", ...) with the ToyExecutor, watermark 0 and no max_model_len, under the
    classic scheduler unless ``scheduler="v1"`` is given (the hand-computed timelines are
    classic prefill / decode steps)."""

    def _simulate(
        requests: list[tuple[Any, ...]], *, num_blocks: int, block_size: int, **options: Any
    ) -> RunResult:
        records = [
            Request(
                request_id=f"r{i}",
                arrival_time_s=float(r[0]),
                prompt_tokens=r[1],
                output_tokens=r[2],
                cancel_after_s=r[3] if len(r) > 3 else None,
            )
            for i, r in enumerate(requests)
        ]
        trace = Trace(name="toy", hash_block_size=None, requests=records)
        options.setdefault("scheduler", "classic")
        config = RunConfig(
            trace="toy", block_size=block_size, num_blocks=num_blocks, watermark=0.0, **options
        )
        return simulate(config, trace, num_blocks, None, ToyExecutor(), {})

    return _simulate


@pytest.fixture(scope="session")
def planned_run() -> RunResult:
    """The shipped default trace on llama-2-7b / a100-80gb, pool planned from GPU memory
    (classic scheduler: these runs pin the 2023 behaviour; v1 runs have their own tests)."""
    return run(RunConfig(trace=DEFAULT_TRACE_NAME, scheduler="classic"))


@pytest.fixture(scope="session")
def pressured_config() -> RunConfig:
    return RunConfig(
        trace=DEFAULT_TRACE_NAME,
        num_blocks=PRESSURED_NUM_BLOCKS,
        watermark=0.0,
        scheduler="classic",
    )


@pytest.fixture(scope="session")
def pressured_run(pressured_config: RunConfig) -> RunResult:
    """The shipped default trace on llama-2-7b / a100-80gb with a 240-block pool."""
    return run(pressured_config)


V1_GOLDEN_TRACE = Path(__file__).parents[1] / "engine/golden/v1/traces/conversations_hash_ids.jsonl"


@pytest.fixture(scope="session")
def conversation_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """51 conversation turns sharing prefixes through ``hash_ids`` (the v1 golden trace
    tests/engine/golden/v1/traces/conversations_hash_ids.jsonl, as a kvsim trace: blocks the
    golden leaves without a hash id get unique ones)."""
    records = [json.loads(line) for line in V1_GOLDEN_TRACE.read_text().splitlines()]
    hash_block_size = records[0]["hash_block_size"]
    header = {"kvsim_trace": 1, "name": "conversations", "hash_block_size": hash_block_size}
    body = [{k: v for k, v in r.items() if k != "hash_block_size"} for r in records]
    for i, r in enumerate(body):
        need = -(-r["prompt_tokens"] // hash_block_size)
        r["hash_ids"] = (r["hash_ids"] + [10_000 * (i + 1) + k for k in range(need)])[:need]
    path = tmp_path_factory.mktemp("traces") / "conversations.jsonl"
    path.write_text("\n".join(json.dumps(o) for o in [header, *body]) + "\n")
    return path
