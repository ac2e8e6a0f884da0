"""Predicted vs measured: per-row errors, MAPE tables, leave-one-model-out.

Error is relative: ``predicted / measured - 1``. MAPE is the mean of its absolute value (in %),
"worst" its largest absolute value. The shipped coefficients are validated as their files hold
them (rounded), so the tables describe the shipped numbers, not the fitter's floats. Plots of
these frames: kvsim.plots.calibration. Imports pandas and scipy: not imported by
``import kvsim.costmodel``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvsim.costmodel.calibrate import as_shipped, fit_gpu
from kvsim.costmodel.coefficients import StepCoefficients
from kvsim.costmodel.fit import prefill_features, single_node_rows
from kvsim.costmodel.gpuspec import GPUSpec
from kvsim.costmodel.layer_shapes import LINEAR_OPS, LayerShapes
from kvsim.costmodel.profiles import ProfileSet
from kvsim.costmodel.step_profiles import predicted_step_times
from kvsim.costmodel.terms import (
    allreduce_time,
    decode_attention_time,
    linear_op_times,
    prefill_attention_time,
)

FIT_MAX_TOKENS = 4096  # compute rows the fits use; longer rows check extrapolation
TOKEN_RANGES = (1, 16, 64, 256, 1024, 4096, 32768)  # bins (1-16], ... ; first bin includes 1
SIZE_RANGES = (0, 1 << 16, 1 << 20, 1 << 24, 1 << 40)  # all-reduce message bytes
SIZE_LABELS = ("<= 64 KiB", "64 KiB-1 MiB", "1-16 MiB", "> 16 MiB")


def _range_labels(
    values: pd.Series, edges: Sequence[int], unit: str, labels: Sequence[str] | None = None
) -> pd.Series:
    if labels is None:
        labels = [
            f"{lo + 1 if i else 1}-{hi}{unit}"
            for i, (lo, hi) in enumerate(itertools.pairwise(edges))
        ]
    return pd.cut(values, bins=[0, *edges[1:]], labels=labels)  # ordered: tables sort by range


def linear_errors(co: StepCoefficients, gpu: GPUSpec, compute: pd.DataFrame) -> pd.DataFrame:
    """One row per (profile row, operator) plus operator ``sum`` (the linear_time_s quantity)."""
    shapes = LayerShapes.from_frame(compute)
    predicted = linear_op_times(co, gpu, shapes, compute["num_tokens"].to_numpy())
    keys = compute[["device", "model", "tp", "num_tokens"]].reset_index(drop=True)
    frames = []
    total_pred = np.zeros(len(compute))
    for op in LINEAR_OPS:
        total_pred = total_pred + predicted[op]
        frames.append(
            keys.assign(op=op, measured_s=compute[op].to_numpy(), predicted_s=predicted[op])
        )
    measured_sum = compute[list(LINEAR_OPS)].sum(axis=1).to_numpy()
    frames.append(keys.assign(op="sum", measured_s=measured_sum, predicted_s=total_pred))
    out = pd.concat(frames, ignore_index=True)
    out["error"] = out["predicted_s"] / out["measured_s"] - 1.0
    out["token_range"] = _range_labels(out["num_tokens"], TOKEN_RANGES, "")
    return out


def attention_errors(co: StepCoefficients, gpu: GPUSpec, attention: pd.DataFrame) -> pd.DataFrame:
    """One row per attention profile row; ``kind`` is decode or prefill."""
    shapes = LayerShapes.from_frame(attention)
    prefill = attention["is_prefill"].to_numpy()
    decode_s = decode_attention_time(
        co.decode_attention,
        gpu,
        co.num_sms,
        shapes,
        attention["batch_size"].to_numpy(),
        attention["context_len"].to_numpy(),
    )
    f = prefill_features(attention)
    prefill_s = prefill_attention_time(
        co.prefill_attention,
        gpu,
        shapes,
        f["causal_pairs"],
        f["cached_pairs"],
        f["cached_tokens"],
        f["new_tokens"],
    )
    out = attention[
        ["device", "model", "tp", "batch_size", "chunk_size", "context_len"]
    ].reset_index(drop=True)
    out["kind"] = np.where(prefill, "prefill", "decode")
    out["measured_s"] = attention["time_s"].to_numpy()
    out["predicted_s"] = np.where(prefill, prefill_s, decode_s)
    out["error"] = out["predicted_s"] / out["measured_s"] - 1.0
    return out


def allreduce_errors(co: StepCoefficients, gpu: GPUSpec, allreduce: pd.DataFrame) -> pd.DataFrame:
    """One row per single-node all-reduce row of the coefficients' system."""
    rows = single_node_rows(allreduce, co.allreduce.system)
    out = rows[["system", "num_workers", "size_bytes"]].reset_index(drop=True)
    out["measured_s"] = rows["time_s"].to_numpy()
    out["predicted_s"] = 0.0
    for workers, index in out.groupby("num_workers").groups.items():
        sizes = out.loc[index, "size_bytes"].to_numpy()
        out.loc[index, "predicted_s"] = allreduce_time(co.allreduce, gpu, int(workers), sizes)
    out["error"] = out["predicted_s"] / out["measured_s"] - 1.0
    out["size_range"] = _range_labels(out["size_bytes"], SIZE_RANGES, "", SIZE_LABELS)
    return out


def step_errors(co: StepCoefficients, gpu: GPUSpec, steps: pd.DataFrame) -> pd.DataFrame:
    """One row per measured whole step, priced by a CostModel with ``co``; ``kind`` is decode,
    prefill or mixed."""
    out = steps[["device", "model", "block_size", "num_seqs", "num_batched_tokens"]].copy()
    decodes, seqs = steps["num_decode_seqs"], steps["num_seqs"]
    out["kind"] = np.where(decodes == seqs, "decode", np.where(decodes == 0, "prefill", "mixed"))
    out["measured_s"] = steps["time_s"].to_numpy()
    out["predicted_s"] = predicted_step_times(steps, gpu, co)
    out["error"] = out["predicted_s"] / out["measured_s"] - 1.0
    out["token_range"] = _range_labels(out["num_batched_tokens"], TOKEN_RANGES, "")
    return out.reset_index(drop=True)


def mape_table(errors: pd.DataFrame, by: Sequence[str]) -> pd.DataFrame:
    """MAPE %, worst %, mean signed error % and row count per group (``by`` empty: one row)."""
    err = errors.assign(abs_error=errors["error"].abs())
    grouped = (
        err.groupby(list(by), sort=True, observed=True)
        if by
        else err.assign(_all="all").groupby("_all")
    )
    table = grouped.agg(
        rows=("error", "size"),
        mape_pct=("abs_error", "mean"),
        worst_pct=("abs_error", "max"),
        bias_pct=("error", "mean"),
    )
    for column in ("mape_pct", "worst_pct", "bias_pct"):
        table[column] = (100 * table[column]).round(2)
    table = table.reset_index()
    return table.drop(columns="_all") if not by else table


def leave_one_model_out(
    profiles: ProfileSet,
    gpu: GPUSpec,
    device: str,
    base: StepCoefficients,
    max_tokens: int = FIT_MAX_TOKENS,
) -> pd.DataFrame:
    """Linear errors of each model, predicted by coefficients fitted without that model's rows
    (attention and all-reduce, not under test, come from ``base``)."""
    compute = profiles.for_device(device).compute
    compute = compute[compute["num_tokens"] <= max_tokens]
    frames = []
    for model in sorted(set(compute["model"])):
        others = ProfileSet(
            compute=compute[compute["model"] != model],
            attention=profiles.attention.iloc[:0],
            allreduce=profiles.allreduce.iloc[:0],
        )
        co = as_shipped(fit_gpu(others, gpu, device=device, base=base, max_tokens=max_tokens))
        frames.append(linear_errors(co, gpu, compute[compute["model"] == model]))
    return pd.concat(frames, ignore_index=True)


@dataclass(frozen=True)
class Validation:
    """One GPU's coefficients against one device's profiles: per-row error frames (empty
    where the folder has no rows of a kind). ``linear`` holds rows up to FIT_MAX_TOKENS,
    ``extrapolation`` the longer ones; ``linear_lomo`` is filled by leave-one-model-out."""

    gpu: str
    device: str
    linear: pd.DataFrame
    extrapolation: pd.DataFrame
    attention: pd.DataFrame
    allreduce: pd.DataFrame
    linear_lomo: pd.DataFrame
    steps: pd.DataFrame


def validate_gpu(
    profiles: ProfileSet,
    gpu: GPUSpec,
    co: StepCoefficients,
    device: str,
    *,
    lomo: bool = False,
) -> Validation:
    """Every row of ``device``'s profiles predicted by ``co`` (and, with ``lomo``, each model's
    compute rows by coefficients fitted without that model; needs two models or more)."""
    mine = profiles.for_device(device)
    compute = mine.compute
    inside = compute[compute["num_tokens"] <= FIT_MAX_TOKENS]
    beyond = compute[compute["num_tokens"] > FIT_MAX_TOKENS]
    empty = pd.DataFrame()
    tag = {"gpu": gpu.name}
    systems = set(mine.allreduce["system"])
    return Validation(
        gpu=gpu.name,
        device=device,
        linear=linear_errors(co, gpu, inside).assign(**tag) if len(inside) else empty,
        extrapolation=linear_errors(co, gpu, beyond).assign(**tag) if len(beyond) else empty,
        attention=attention_errors(co, gpu, mine.attention).assign(**tag)
        if len(mine.attention)
        else empty,
        allreduce=allreduce_errors(co, gpu, mine.allreduce).assign(**tag)
        if co.allreduce.system in systems
        else empty,
        linear_lomo=leave_one_model_out(profiles, gpu, device, co).assign(**tag)
        if lomo and inside["model"].nunique() >= 2
        else empty,
        steps=step_errors(co, gpu, mine.steps).assign(**tag) if len(mine.steps) else empty,
    )


def error_tables(validations: Sequence[Validation]) -> list[tuple[str, pd.DataFrame]]:
    """The published tables, titled: non-attention (the nine-operator sum) overall and by GPU,
    model, TP and token range, per operator; left-out models; extrapolation; attention by
    kind; all-reduce by system, worker count and size; whole steps by kind and tokens."""

    def stack(name: str) -> pd.DataFrame:
        frames = [getattr(v, name) for v in validations if len(getattr(v, name))]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    linear, lomo, beyond = stack("linear"), stack("linear_lomo"), stack("extrapolation")
    attention, allreduce, steps = stack("attention"), stack("allreduce"), stack("steps")
    tables: list[tuple[str, pd.DataFrame]] = []
    if len(linear):
        total = linear[linear["op"] == "sum"]
        title = f"Non-attention time (linear_time_s), 1-{FIT_MAX_TOKENS} tokens"
        tables += [
            (f"{title}, all rows", mape_table(total, [])),
            (f"{title}, by GPU", mape_table(total, ["gpu"])),
            (f"{title}, by GPU and model", mape_table(total, ["gpu", "model"])),
            (f"{title}, by GPU and TP", mape_table(total, ["gpu", "tp"])),
            (f"{title}, by GPU and token range", mape_table(total, ["gpu", "token_range"])),
            ("Per operator (one layer)", mape_table(linear[linear["op"] != "sum"], ["gpu", "op"])),
        ]
    if len(lomo):
        total = lomo[lomo["op"] == "sum"]
        title = "Leave one model out (fitted without the model, validated on it)"
        tables += [
            (f"{title}, all left-out models", mape_table(total, [])),
            (f"{title}, by GPU and model", mape_table(total, ["gpu", "model"])),
            (f"{title}, by GPU and token range", mape_table(total, ["gpu", "token_range"])),
        ]
    if len(beyond):
        title = f"Extrapolation: fitted on <= {FIT_MAX_TOKENS} tokens, validated beyond"
        tables.append((title, mape_table(beyond[beyond["op"] == "sum"], ["gpu", "model"])))
    if len(attention):
        by = ["gpu", "model", "tp", "kind"]
        tables.append(("Attention (one layer)", mape_table(attention, by)))
    if len(allreduce):
        tables += [
            ("All-reduce (single node)", mape_table(allreduce, ["gpu", "system"])),
            ("All-reduce by worker count", mape_table(allreduce, ["gpu", "num_workers"])),
            ("All-reduce by message size", mape_table(allreduce, ["gpu", "size_range"])),
        ]
    if len(steps):
        tables += [
            ("Whole steps by kind", mape_table(steps, ["gpu", "model", "kind"])),
            ("Whole steps by batched tokens", mape_table(steps, ["gpu", "token_range"])),
        ]
    return tables


def markdown_table(table: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table of ``table`` (values as str() prints them)."""
    header = "| " + " | ".join(str(c) for c in table.columns) + " |"
    rule = "| " + " | ".join("---" for _ in table.columns) + " |"
    body = ["| " + " | ".join(str(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join([header, rule, *body])


def markdown_report(tables: Sequence[tuple[str, pd.DataFrame]]) -> str:
    """Every table under its title, as Markdown (what docs/costmodel.md publishes)."""
    return "\n\n".join(f"#### {title}\n\n{markdown_table(table)}" for title, table in tables) + "\n"
