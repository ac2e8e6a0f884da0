"""The shipped coefficients meet issue 14's error bounds on the shipped profiles."""

from __future__ import annotations

import pytest

from kvsim.costmodel import resolve_gpu
from kvsim.costmodel.calibrate import PROFILE_DEVICE
from kvsim.costmodel.coefficients import StepCoefficients
from kvsim.costmodel.profiles import ProfileSet
from kvsim.costmodel.validate import (
    allreduce_errors,
    attention_errors,
    leave_one_model_out,
    linear_errors,
)

FITTED = ("a100-80gb", "h100-sxm")


def _mape(errors) -> float:  # type: ignore[no-untyped-def]
    return float(100 * errors["error"].abs().mean())


@pytest.mark.parametrize("gpu_name", FITTED)
def test_linear_time_within_5_percent(
    shipped: ProfileSet, presets: dict[str, StepCoefficients], gpu_name: str
) -> None:
    compute = shipped.for_device(PROFILE_DEVICE[gpu_name]).compute
    errors = linear_errors(
        presets[gpu_name], resolve_gpu(gpu_name), compute[compute["num_tokens"] <= 4096]
    )
    assert _mape(errors[errors["op"] == "sum"]) <= 5.0


def test_attention_within_10_percent(
    shipped: ProfileSet, presets: dict[str, StepCoefficients]
) -> None:
    errors = attention_errors(
        presets["a100-80gb"], resolve_gpu("a100-80gb"), shipped.for_device("a100").attention
    )
    for kind in ("decode", "prefill"):
        assert _mape(errors[errors["kind"] == kind]) <= 10.0, kind


@pytest.mark.parametrize("gpu_name", FITTED)
def test_allreduce_within_10_percent(
    shipped: ProfileSet, presets: dict[str, StepCoefficients], gpu_name: str
) -> None:
    errors = allreduce_errors(
        presets[gpu_name],
        resolve_gpu(gpu_name),
        shipped.for_device(PROFILE_DEVICE[gpu_name]).allreduce,
    )
    assert len(errors) > 2000 and _mape(errors) <= 10.0


@pytest.mark.slow
def test_left_out_models_within_8_percent_each_and_6_overall(
    shipped: ProfileSet, presets: dict[str, StepCoefficients]
) -> None:
    frames = []
    for gpu_name in FITTED:
        errors = leave_one_model_out(
            shipped, resolve_gpu(gpu_name), PROFILE_DEVICE[gpu_name], presets[gpu_name]
        )
        frames.append(errors[errors["op"] == "sum"])
        for model, group in frames[-1].groupby("model"):
            assert _mape(group) <= 8.0, (gpu_name, model)
    import pandas as pd

    assert _mape(pd.concat(frames)) <= 6.0
