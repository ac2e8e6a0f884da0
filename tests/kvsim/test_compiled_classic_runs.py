"""Whole cost-mode runs of the classic scheduler on the compiled core
(kvsim/sim/compiled_classic.py) against the pure-Python path (KVSIM_PURE_PYTHON=1): the same
tables, summary (wall times aside) and run-folder files, byte for byte
(test_compiled_runs.run_both)."""

from __future__ import annotations

from pathlib import Path

import pytest

import engine.compiled
from kvsim.config import RunConfig
from kvsim.sim.compiled_classic import CompiledClassicSimulation

if engine.compiled.load() is None:
    pytest.skip(str(engine.compiled.unavailable_reason()), allow_module_level=True)
from tests.kvsim.test_compiled_runs import grid_config, run_both  # only with the extension

CLASSIC = {"scheduler": "classic"}


@pytest.mark.parametrize(
    "options",
    [
        {},  # the first two minutes of the Azure conversation trace (rejections)
        {"num_blocks": 500, "block_size": 8},  # preemption storms
        {"block_size": 1, "num_blocks": 40_000, "until": 60.0},  # a block per token
        {"max_num_seqs": 8, "max_num_batched_tokens": 4096, "until": 40.0},
        {"max_model_len": 2048, "num_blocks": 900},  # finishes at max_model_len
        {"num_blocks": 600, "concurrency": 24, "think_time_s": 0.2},  # closed loop
        {"step_time": "linear:0.005:0.00001", "num_blocks": 800},  # the reference's clock
    ],
)
def test_compiled_classic_runs_match_python(
    options: dict[str, object], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = RunConfig(trace="azure_llm_2023_conv_first_2min", **CLASSIC, **options)
    run_both(config, tmp_path, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("trace", "options"),
    [
        ("azure_llm_2023_conv", {}),
        ("azure_llm_2023_code", {}),
        ("mooncake_fast25_conversation", {}),
        # 5,233 preemptions; sequences that outgrow the pool alone are rejected (their reason
        # once counted FastDecodeScheduler's lagging tokens)
        ("azure_llm_2023_conv", {"num_blocks": 500, "block_size": 8}),
    ],
)
def test_compiled_classic_runs_of_whole_traces_match_python(
    trace: str, options: dict[str, object], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_both(RunConfig(trace=trace, **CLASSIC, **options), tmp_path, monkeypatch)


def test_cancellations_and_arrivals_at_step_ends_match(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Steps end exactly at arrivals, and aborts hit waiting and running requests."""
    run_both(grid_config(tmp_path, **CLASSIC), tmp_path, monkeypatch)


def test_classic_runs_take_the_classic_core(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvsim.runner import run

    built: list[str] = []
    original = CompiledClassicSimulation._make_core

    def spy(self: CompiledClassicSimulation, *args: object) -> object:
        made = original(self, *args)  # type: ignore[arg-type]
        built.append(type(made).__name__)
        return made

    monkeypatch.setattr(CompiledClassicSimulation, "_make_core", spy)
    run(RunConfig(trace="azure_llm_2023_conv_first_2min", until=5.0, **CLASSIC))
    assert built == ["ClassicCore"]
