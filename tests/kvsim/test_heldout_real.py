"""The held-out sim-to-real figures (benchmarks/data/heldout_real_runs.json) read as SPECs, and
one shortened stage of them replays (the whole evaluation is benchmarks/bench_heldout_real.py)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from kvsim.costmodel import resolve_model
from kvsim.outputs.validate_real import validate_real
from workloads.shared_prefix import Stage

BENCH = Path(__file__).parents[2] / "benchmarks" / "bench_heldout_real.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_heldout_real", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def figures(bench: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> object:
    return bench.load_figures(bench.FIGURES, tmp_path_factory.mktemp("configs"))


def test_the_figures_are_the_studys_other_deployments(figures: object) -> None:
    specs = {s.deployment["tp"]: s for s in figures.specs}  # type: ignore[attr-defined]
    assert sorted(specs) == [2, 4] and len(figures.specs) == 3  # type: ignore[attr-defined]
    by_name = {s.name.split("_")[-1]: s for s in figures.specs}  # type: ignore[attr-defined]
    assert by_name["llama-2-70b"].deployment["num_blocks"] == 31357
    assert by_name["mixtral-8x7b"].deployment["tp"] == 2
    # CodeLlama-34B has no preset: its config.json numbers give the checkpoint's 33.7B params.
    codellama = resolve_model(by_name["codellama-34b"].deployment["model"])
    assert codellama.num_params == 33_743_970_304 and codellama.num_kv_heads == 8
    for spec in figures.specs:  # type: ignore[attr-defined]
        assert spec.deployment["serving_stack"] == "vllm-0.15" and spec.deployment["tp"] > 1
        stages = [m for w in spec.workloads for m in w.measured]
        assert len(stages) == 6 and sum(m.overloaded for m in stages) == 1


def test_published_errors_are_on_the_measured_figures(bench: ModuleType, figures: object) -> None:
    """Every published row names a stage of the file, and the study's 'actual' E2E there is
    the measured mean the SPEC holds (the two were typed from different files)."""
    doc = json.loads(bench.FIGURES.read_text())
    specs = {s.name: s for s in figures.specs}  # type: ignore[attr-defined]
    assert len(doc["published"]) == len(figures.published) == 12  # type: ignore[attr-defined]
    for row in doc["published"]:
        workload = next(w for w in specs[row["spec"]].workloads if w.recipe.name == row["workload"])
        measured = workload.measured[row["stage"]]
        e2e = measured.e2e_finished_ms if measured.overloaded else measured.e2e_ms
        assert row["measured_e2e_mean_ms"] == pytest.approx(e2e, rel=1e-3)


def test_a_shortened_held_out_stage_replays_unsaturated(figures: object) -> None:
    """Mixtral-8x7B TP2 roleplay at 6/s, cut to 20 s: served, its TPOT near the measured."""
    spec = next(s for s in figures.specs if "mixtral" in s.name)  # type: ignore[attr-defined]
    workload = next(w for w in spec.workloads if w.recipe.name == "roleplay")
    short = dataclasses.replace(
        workload, recipe=dataclasses.replace(workload.recipe, stages=(Stage(6.0, 20.0),))
    )
    only = dataclasses.replace(spec, workloads=(short,))
    (stage,) = validate_real(only).stages
    assert stage.finished == 120 and not stage.saturated
    assert abs(stage.error("tpot_ms")) < 0.3  # type: ignore[arg-type]
