"""Whole-step profiles (kvsim's own layout, written by ``kvsim profile --mode engine``) and the
fit of the CPU-side step costs from them.

``steps/DEVICE__MODEL__steps.csv`` holds one row per measured engine step: the model's shape,
the block size, the step's BatchShape counts and ``time_stats.step.median`` (milliseconds; the
other statistics are ignored). Kernel profiles cannot see what a step spends outside its
kernels (input preparation, the embedding, sampling, per-sequence Python work); the residual
of whole steps over the kernel terms is what the Overheads (per step, per sequence, per
prefill sequence, per token) are fitted to (non-negative least squares on relative error).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from kvsim.costmodel.coefficients import Overheads, StepCoefficients
from kvsim.costmodel.gpuspec import GPUSpec
from kvsim.costmodel.model import CostModel
from kvsim.costmodel.modelspec import ModelSpec
from kvsim.costmodel.profile_checks import (
    ProfileError,
    bad_cells,
    bool_column,
    constant_column,
    int_column,
    read_csv,
    require_columns,
    time_column,
)

STEPS_NAME = re.compile(r"^(?P<device>[^_].*?)__(?P<model>.+)__steps\.csv$")
SHAPE_COUNTS = (
    "num_seqs",
    "num_batched_tokens",
    "num_decode_seqs",
    "decode_context_tokens",
    "prefill_causal_pairs",
    "prefill_cached_pairs",
    "prefill_cached_tokens",
    "num_blocks_walked",
)
# CSV column -> tidy column (the ModelSpec field it becomes).
MODEL_COLUMNS = {
    "n_layer": "num_layers",
    "n_head": "num_heads",
    "n_kv_head": "num_kv_heads",
    "n_embd": "hidden_size",
    "head_dim": "head_dim",
    "n_expanded_embd": "intermediate_size",
    "vocab_size": "vocab_size",
    "dtype_bytes": "dtype_bytes",
}
STEP_TIME_COLUMN = "time_stats.step.median"
STEPS_COLUMNS = [
    "source",
    "device",
    "model",
    *MODEL_COLUMNS.values(),
    "gated_mlp",
    "block_size",
    *SHAPE_COUNTS,
    "time_s",
]


def read_steps_profile(path: Path) -> pd.DataFrame:
    """One ``DEVICE__MODEL__steps.csv`` as a tidy frame (columns STEPS_COLUMNS)."""
    match = STEPS_NAME.match(path.name)
    if match is None:
        raise ProfileError(f"{path}: file name must be DEVICE__MODEL__steps.csv")
    frame = read_csv(path)
    keys = (*MODEL_COLUMNS, "use_gated_mlp", "block_size", *SHAPE_COUNTS, STEP_TIME_COLUMN)
    require_columns(frame, keys, path)
    out = pd.DataFrame(
        {"source": path.name, "device": match["device"], "model": match["model"]}, index=frame.index
    )
    for column, name in MODEL_COLUMNS.items():
        values = int_column(frame, column, path, minimum=1)
        out[name] = constant_column(frame, column, path, values)
    bad_cells(path, frame, "dtype_bytes", ~out["dtype_bytes"].isin([1, 2, 4]), "1, 2 or 4")
    gated = bool_column(frame, "use_gated_mlp", path)
    out["gated_mlp"] = constant_column(frame, "use_gated_mlp", path, gated)
    out["block_size"] = int_column(frame, "block_size", path, minimum=1)
    for column in SHAPE_COUNTS:
        out[column] = int_column(frame, column, path, minimum=0)
    for column in ("num_seqs", "num_batched_tokens"):
        out[column] = int_column(frame, column, path, minimum=1)
    too_many = out["num_decode_seqs"] > out["num_seqs"]
    bad_cells(path, frame, "num_decode_seqs", too_many, "at most num_seqs")
    out["time_s"] = time_column(frame, STEP_TIME_COLUMN, path)
    return out[STEPS_COLUMNS]


def model_of_steps(rows: pd.DataFrame) -> ModelSpec:
    """The ModelSpec of one model's step rows (the parameter count only sizes memory)."""
    first = rows.iloc[0]
    return ModelSpec(
        name=str(first["model"]),
        num_layers=int(first["num_layers"]),
        hidden_size=int(first["hidden_size"]),
        num_heads=int(first["num_heads"]),
        num_kv_heads=int(first["num_kv_heads"]),
        head_dim=int(first["head_dim"]),
        intermediate_size=int(first["intermediate_size"]),
        vocab_size=int(first["vocab_size"]),
        dtype_bytes=int(first["dtype_bytes"]),
        num_params=1,
        max_model_len=1 << 20,
        gated_mlp=bool(first["gated_mlp"]),
    )


def predicted_step_times(steps: pd.DataFrame, gpu: GPUSpec, co: StepCoefficients) -> np.ndarray:
    """Each step row priced by a CostModel with ``co`` (tp 1: engine profiles are one device)."""
    out = np.empty(len(steps))
    for _, index in steps.groupby("model", sort=True).groups.items():
        rows = steps.loc[index]
        cost = CostModel(model_of_steps(rows), gpu, tp=1, coefficients=co)
        counts = rows[list(SHAPE_COUNTS)].to_numpy(dtype=np.int64).tolist()
        out[steps.index.get_indexer(index)] = [cost.step_time_of(*c) for c in counts]
    return out


def fit_overheads(steps: pd.DataFrame, gpu: GPUSpec, co: StepCoefficients) -> Overheads:
    """The costs outside the kernels from whole steps: measured = kernels + a + b * seqs +
    c * prefill seqs + d * tokens, by NNLS on relative error (``co``'s block_walk_s kept)."""
    if len(steps) < 8:
        raise ProfileError(f"profiles: {len(steps)} whole-step rows, at least 8 are needed")
    zero = dataclasses.replace(
        co,
        overheads=dataclasses.replace(
            co.overheads,
            step_overhead_s=0.0,
            seq_overhead_s=0.0,
            prefill_seq_overhead_s=0.0,
            token_overhead_s=0.0,
        ),
    )
    kernels = predicted_step_times(steps, gpu, zero)
    measured = steps["time_s"].to_numpy(dtype=np.float64)
    seqs = steps["num_seqs"].to_numpy(dtype=float)
    prefill_seqs = seqs - steps["num_decode_seqs"].to_numpy(dtype=float)
    tokens = steps["num_batched_tokens"].to_numpy(dtype=float)
    features = np.column_stack([np.ones(len(steps)), seqs, prefill_seqs, tokens])
    x, _ = nnls(features / measured[:, None], 1.0 - kernels / measured)
    return dataclasses.replace(
        co.overheads,
        step_overhead_s=float(x[0]),
        seq_overhead_s=float(x[1]),
        prefill_seq_overhead_s=float(x[2]),
        token_overhead_s=float(x[3]),
    )
