"""The shipped coefficients meet issue 14's error bounds on the shipped profiles, and
docs/costmodel.md publishes the figures ``kvsim validate`` computes."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from kvsim.costmodel import resolve_gpu
from kvsim.costmodel.calibrate import FITTED_PRESETS, PROFILE_DEVICE
from kvsim.costmodel.coefficients import StepCoefficients
from kvsim.costmodel.profiles import ProfileSet
from kvsim.costmodel.validate import Validation, mape_table, validate_gpu

DOCS = Path(__file__).resolve().parents[2] / "docs" / "costmodel.md"


def _mape(errors: pd.DataFrame) -> float:
    return float(100 * errors["error"].abs().mean())


@pytest.fixture(scope="module")
def validations(shipped: ProfileSet, presets: dict[str, StepCoefficients]) -> dict[str, Validation]:
    return {
        name: validate_gpu(shipped, resolve_gpu(name), presets[name], PROFILE_DEVICE[name])
        for name in FITTED_PRESETS
    }


def _sum(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["op"] == "sum"]


def test_linear_time_within_5_percent_over_all_profiles(
    validations: dict[str, Validation],
) -> None:
    total = pd.concat([_sum(v.linear) for v in validations.values()])
    assert len(total) == 6216  # every TP, 1-4096 tokens
    assert _mape(total) <= 5.0
    for v in validations.values():
        assert _mape(_sum(v.linear)) <= 5.0, v.gpu


def test_attention_within_10_percent_for_decode_and_prefill(
    validations: dict[str, Validation],
) -> None:
    errors = validations["a100-80gb"].attention
    for kind in ("decode", "prefill"):
        assert _mape(errors[errors["kind"] == kind]) <= 10.0, kind


@pytest.mark.parametrize("gpu_name", FITTED_PRESETS)
def test_allreduce_within_10_percent(validations: dict[str, Validation], gpu_name: str) -> None:
    errors = validations[gpu_name].allreduce
    assert len(errors) > 2000 and _mape(errors) <= 10.0


def test_the_docs_publish_what_kvsim_validate_computes(
    validations: dict[str, Validation],
) -> None:
    docs = DOCS.read_text(encoding="utf-8")
    total = pd.concat([_sum(v.linear) for v in validations.values()])
    rows = [("all profiles", mape_table(total, []).iloc[0])]
    rows += [(name, mape_table(_sum(v.linear), []).iloc[0]) for name, v in validations.items()]
    for label, row in rows:
        line = f"| {label} | {int(row['rows'])} | {row['mape_pct']} | {row['worst_pct']} |"
        assert line in docs, f"docs/costmodel.md lacks {line!r}: rerun kvsim validate"
    attention = mape_table(validations["a100-80gb"].attention, ["kind"])
    for _, row in attention.iterrows():
        figures = f"{int(row['rows'])} | {row['mape_pct']} | {row['worst_pct']}"
        line = f"| {row['kind']} attention | {figures} |"
        assert line in docs, f"docs/costmodel.md lacks {line!r}"


@pytest.mark.slow
def test_left_out_models_within_8_percent_each_and_6_overall(
    shipped: ProfileSet, presets: dict[str, StepCoefficients]
) -> None:
    docs = DOCS.read_text(encoding="utf-8")
    frames = []
    for name in FITTED_PRESETS:
        gpu, device = resolve_gpu(name), PROFILE_DEVICE[name]
        lomo = _sum(validate_gpu(shipped, gpu, presets[name], device, lomo=True).linear_lomo)
        frames.append(lomo)
        for _, row in mape_table(lomo, ["model"]).iterrows():
            assert row["mape_pct"] <= 8.0, (name, row["model"])
            assert f"| {row['mape_pct']} | {row['worst_pct']} |" in docs, (name, row["model"])
    pooled = mape_table(pd.concat(frames), []).iloc[0]
    assert pooled["mape_pct"] <= 6.0
    assert f"| left-out models, pooled | {int(pooled['rows'])} | {pooled['mape_pct']} |" in docs
