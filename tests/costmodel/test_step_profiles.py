"""Whole-step profiles: the fit recovers known step costs; bad cells are one located line."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import pytest

from kvsim.costmodel import BatchShape, CostModel, ModelSpec, resolve_gpu
from kvsim.costmodel.coefficients import Overheads
from kvsim.costmodel.profiles import ProfileError, load_profile_dir
from kvsim.costmodel.step_profiles import SHAPE_COUNTS, fit_overheads
from tests.costmodel.test_fit import KNOWN

GPU = resolve_gpu("a100-80gb")
MODEL = ModelSpec(
    name="m", num_layers=4, hidden_size=1024, num_heads=16, num_kv_heads=4, head_dim=64,
    intermediate_size=2816, vocab_size=8000, dtype_bytes=2, num_params=1, max_model_len=1 << 20,
)  # fmt: skip
TRUE = Overheads(
    step_overhead_s=1.2e-3,
    seq_overhead_s=30e-6,
    prefill_seq_overhead_s=400e-6,
    token_overhead_s=2e-6,
    block_walk_s=KNOWN.overheads.block_walk_s,
)


def shapes() -> list[BatchShape]:
    out = []
    for n in (1, 2, 4, 8, 16, 32):
        for p in (16, 128, 512):
            out.append(BatchShape.of(prefill_chunks=[(p, 0)] * n, num_blocks_walked=n * p // 16))
            for step in range(1, 6):
                ctx = n * (p + step)
                out.append(BatchShape.decode(n, ctx, n * -(-(p + step) // 16)))
    out.append(BatchShape.of(prefill_chunks=[(256, 512)], decode_contexts=(300,) * 5))
    return out


def write_steps(folder: Path, co: object) -> Path:
    cost = CostModel(MODEL, GPU, coefficients=dataclasses.replace(KNOWN, overheads=TRUE))
    rows = []
    for shape in shapes():
        rows.append({
            "n_layer": 4, "n_head": 16, "n_kv_head": 4, "n_embd": 1024, "n_expanded_embd": 2816,
            "head_dim": 64, "vocab_size": 8000, "use_gated_mlp": True, "dtype_bytes": 2,
            "block_size": 16, **dataclasses.asdict(shape),
            "time_stats.step.median": cost.step_time(shape) * 1e3,
        })  # fmt: skip
    (folder / "steps").mkdir(parents=True, exist_ok=True)
    path = folder / "steps" / "cpu__m__steps.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_fit_recovers_the_costs_outside_the_kernels(tmp_path: Path) -> None:
    write_steps(tmp_path, KNOWN)
    steps = load_profile_dir(tmp_path).steps
    assert len(steps) == len(shapes()) and list(steps.columns[-9:-1]) == list(SHAPE_COUNTS)
    fitted = fit_overheads(steps, GPU, KNOWN)
    for name in ("step_overhead_s", "seq_overhead_s", "prefill_seq_overhead_s", "token_overhead_s"):
        assert getattr(fitted, name) == pytest.approx(getattr(TRUE, name), rel=1e-6), name


@pytest.mark.parametrize(
    ("column", "value", "expected"),
    [
        ("num_decode_seqs", "99", "at most num_seqs"),
        ("num_seqs", "0", "positive integer"),
        ("time_stats.step.median", "fast", "positive time"),
        ("n_embd", "1000", "same value on every row"),
    ],
)
def test_a_bad_step_row_is_one_located_line(
    tmp_path: Path, column: str, value: str, expected: str
) -> None:
    path = write_steps(tmp_path, KNOWN)
    frame = pd.read_csv(path, dtype=str)
    frame.loc[4, column] = value
    frame.to_csv(path, index=False)
    with pytest.raises(ProfileError) as info:
        load_profile_dir(tmp_path)
    message = str(info.value)
    assert message.startswith(f"{path}: line 6, column {column!r}:") and expected in message
    assert "\n" not in message
