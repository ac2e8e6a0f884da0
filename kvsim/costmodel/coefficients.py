"""The fitted step-time coefficients of one GPU, and their JSON file format (version 1).

Units: every ``*_s`` is seconds; every ``*_efficiency`` is a fraction in (0, 1] of a peak of the
GPU the file names (GPUSpec ``hbm_bandwidth``, ``peak_flops``, ``interconnect_bandwidth``), so the
same file scaled to another GPU's datasheet is the same numbers with other peaks. Token counts are
tokens. The format is documented in docs/costmodel.md ("Coefficient files"); a file whose
``format``/``version`` is not this one is refused by name, as is any unknown or missing key.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvsim.atomic import atomic_write_bytes
from kvsim.costmodel.custom_allreduce import CustomAllReduce, custom_from_json, custom_to_json
from kvsim.costmodel.layer_shapes import ELEMENTWISE_OPS
from kvsim.costmodel.specio import (
    CostModelError,
    check_keys,
    nonempty_str,
    nonnegative_float,
    positive_float,
    positive_int,
    read_json_object,
)
from kvsim.costmodel.systems import check_system

# GPU fits stay <= 1 (fractions of datasheet peaks); a CPU fit may exceed 1 where operands are
# cache-resident (its peak bandwidth is measured on DRAM), never by orders of magnitude.
MAX_EFFICIENCY = 100.0
# Bounds that keep every step price finite (priced over up to 2^30 tokens) and are far beyond
# any measurement: a time term (latency, per-token, per-block, per-sequence cost) of an hour, a
# token count of 2^30, an efficiency of a millionth of the datasheet peak.
MAX_TIME_TERM_S = 3600.0
MAX_TERM_TOKENS = float(2**30)
MIN_EFFICIENCY = 1e-6
FORMAT = "kvsim-step-coefficients"
VERSION = 1


def _time(doc: str) -> Any:
    return field(metadata={"kind": "time", "doc": doc})


def _eff(doc: str) -> Any:
    return field(metadata={"kind": "efficiency", "doc": doc})


def _pos(doc: str) -> Any:
    return field(metadata={"kind": "positive", "doc": doc})


def _nonneg(doc: str) -> Any:
    return field(metadata={"kind": "nonnegative", "doc": doc})


def _count(doc: str) -> Any:
    return field(metadata={"kind": "count", "doc": doc})


@dataclass(frozen=True, slots=True, kw_only=True)
class GemmCoefficients:
    """One weight GEMM of M tokens, (M x K) @ (K x N), on one GPU:

    ``latency_s + max(bytes / (B * bw_efficiency), 2*K*N*(ceil(M/m_tile)*m_tile + m_half) /
    (F * flops_efficiency))``, bytes = (K*N + M*K + M*N) * dtype_bytes.
    """

    latency_s: float = _time("fixed cost of one GEMM kernel")
    bw_efficiency: float = _eff("achieved / peak HBM bandwidth while streaming the operands")
    flops_efficiency: float = _eff("achieved / peak FLOP/s of a large GEMM")
    m_tile_tokens: int = _count("rows per output tile: M is computed in whole tiles")
    m_half_tokens: float = _nonneg("tokens of fixed work per GEMM (efficiency ramp)")


@dataclass(frozen=True, slots=True, kw_only=True)
class ElementwiseCoefficients:
    """A memory-bound operator: ``latency_s + tokens * bytes_per_token / (B * bw_efficiency)``."""

    latency_s: float = _time("fixed cost of the kernel")
    bw_efficiency: float = _eff("achieved / peak HBM bandwidth")


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeAttentionCoefficients:
    """Paged decode attention of one layer (terms in docs/costmodel.md, "Decode attention")."""

    latency_s: float = _time("fixed cost of the kernel")
    split_latency_s: float = _time("extra cost when the context is split across thread blocks")
    wave_latency_s: float = _time("cost of each wave of thread blocks after the first")
    bw_efficiency: float = _eff("achieved / peak HBM bandwidth reading K/V")
    sm_bandwidth_share: float = _pos("bandwidth one thread block draws, in units of B / num_sms")


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefillAttentionCoefficients:
    """Prefill attention of one layer: causal pairs, pairs against cached tokens, K/V read."""

    latency_s: float = _time("fixed cost of the kernel")
    causal_flops_efficiency: float = _eff("achieved / peak FLOP/s on new-token x new-token pairs")
    cached_flops_efficiency: float = _eff(
        "achieved / peak FLOP/s on new-token x cached-token pairs"
    )
    context_bw_efficiency: float = _eff("achieved / peak HBM bandwidth reading cached K/V")
    per_token_s: float = _time("cost per new token (Q/K/V load, output write)")


@dataclass(frozen=True, slots=True, kw_only=True)
class AllReduceProtocol:
    """One NCCL protocol: ``latency_s + 2(w-1)/w * bytes / (link * bw_efficiency)``."""

    latency_s: float = _time("fixed cost of one all-reduce")
    bw_efficiency: float = _eff("achieved / peak interconnect bandwidth (ring bus bandwidth)")


@dataclass(frozen=True, slots=True, kw_only=True)
class AllReduceCoefficients:
    """Per worker count, the protocols NCCL chooses between; it takes the fastest for each size."""

    system: str
    by_num_workers: Mapping[int, tuple[AllReduceProtocol, ...]]
    # A serving engine's own kernel below its size limits (a serving stack sets it); None: NCCL.
    custom: CustomAllReduce | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Overheads:
    """Costs of a step outside the profiled kernels: priors from public figures for the GPUs
    (kernel profiles cannot see them), fitted from whole steps for an engine profile."""

    step_overhead_s: float = _time("scheduling, input preparation, launches, sampling per step")
    seq_overhead_s: float = _time("per scheduled sequence per step")
    prefill_seq_overhead_s: float = _time(
        "per prefill sequence (or chunk) per step, beyond seq_overhead_s"
    )
    token_overhead_s: float = _time("per batched token per step, beyond the profiled operators")
    block_walk_s: float = _time(
        "per block-table entry, layer and KV head, relative to the profiled block size"
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Provenance:
    """Where the numbers come from: ``fitted`` (from the named profiles), ``scaled`` (another GPU's
    fit moved to this GPU's datasheet peaks) or ``prior`` (public figures)."""

    kind: str
    source: str  # profile folder / GPU scaled from / citation
    profiles: tuple[str, ...] = ()
    note: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepCoefficients:
    """Everything the step-time model needs for one GPU, besides the GPUSpec peaks."""

    gpu: str
    num_sms: int  # streaming multiprocessors (datasheet): the unit of thread-block waves
    provenance: Mapping[str, Provenance]  # per part: linear, attention, allreduce, overheads
    linear: Mapping[str, GemmCoefficients | ElementwiseCoefficients]  # "gemm" + ELEMENTWISE_OPS
    decode_attention: DecodeAttentionCoefficients
    prefill_attention: PrefillAttentionCoefficients
    profiled_block_size: int  # block size of the attention profile (block_walk_s is relative to it)
    allreduce: AllReduceCoefficients
    overheads: Overheads
    # Where these numbers were read from (a shipped preset or the user's file, as given); not
    # part of the file's content, so two loads of the same numbers compare equal.
    source: str = dataclasses.field(default="", compare=False)

    @property
    def gemm(self) -> GemmCoefficients:
        gemm = self.linear["gemm"]
        assert isinstance(gemm, GemmCoefficients)
        return gemm

    def elementwise(self, op: str) -> ElementwiseCoefficients:
        coefficients = self.linear[op]
        assert isinstance(coefficients, ElementwiseCoefficients)
        return coefficients


# --- JSON ----------------------------------------------------------------------------------------

_PARTS = ("linear", "attention", "allreduce", "overheads")


def _round(value: Any) -> Any:
    # Six significant digits: far below the fit's error, and files stay readable.
    return float(f"{value:.6g}") if isinstance(value, float) else value


def _flat(obj: Any) -> dict[str, Any]:
    return {f.name: _round(getattr(obj, f.name)) for f in dataclasses.fields(obj)}


def to_json_dict(co: StepCoefficients) -> dict[str, Any]:
    """The JSON object of ``co`` (keys in a fixed order: files diff cleanly)."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "units": "seconds; *_efficiency: fraction of the GPU's datasheet peak; tokens",
        "gpu": co.gpu,
        "num_sms": co.num_sms,
        "provenance": {
            k: {**_flat(v), "profiles": list(v.profiles)} for k, v in co.provenance.items()
        },
        "linear": {k: _flat(v) for k, v in co.linear.items()},
        "attention": {
            "profiled_block_size": co.profiled_block_size,
            "decode": _flat(co.decode_attention),
            "prefill": _flat(co.prefill_attention),
        },
        "allreduce": {
            "system": co.allreduce.system,
            "by_num_workers": {
                str(w): [_flat(p) for p in protocols]
                for w, protocols in sorted(co.allreduce.by_num_workers.items())
            },
            # only where set: files without it stay as they were
            **({"custom": custom_to_json(co.allreduce.custom)} if co.allreduce.custom else {}),
        },
        "overheads": _flat(co.overheads),
    }


def save_coefficients(co: StepCoefficients, path: str | Path) -> None:
    """Write ``co`` as JSON, all or nothing (the caller decides whether a file may be replaced)."""
    text = json.dumps(to_json_dict(co), indent=2) + "\n"
    atomic_write_bytes(Path(path), text.encode("utf-8"))


def _object(value: object, where: str) -> Mapping[str, object]:
    if not isinstance(value, dict):
        raise CostModelError(f"{where} must be a JSON object, got {value!r}")
    return value


def _dataclass_from(cls: type, value: object, where: str) -> Any:
    data = _object(value, where)
    fields = dataclasses.fields(cls)
    names = [f.name for f in fields]
    check_keys(data, allowed=names, required=names, source=where)
    values: dict[str, object] = {}
    for f in fields:
        raw, key = data[f.name], f"{where}.{f.name}"
        kind = f.metadata.get("kind")
        if kind in ("time", "nonnegative"):
            term = nonnegative_float(raw, "value", key)
            bound, unit = (MAX_TIME_TERM_S, " s") if kind == "time" else (MAX_TERM_TOKENS, "")
            if term > bound:  # larger ones overflow the step prices
                raise CostModelError(f"{key}: must be at most {bound:g}{unit}, got {raw!r}")
            values[f.name] = term
        elif kind == "efficiency":
            number = positive_float(raw, "value", key)
            if number > MAX_EFFICIENCY:
                raise CostModelError(
                    f"{key}: an efficiency must be in (0, {MAX_EFFICIENCY:g}], got {raw!r}"
                )
            if number < MIN_EFFICIENCY:  # smaller ones overflow the step prices
                raise CostModelError(
                    f"{key}: an efficiency must be at least {MIN_EFFICIENCY:g}, got {raw!r}"
                )
            values[f.name] = number
        elif kind == "count":
            values[f.name] = positive_int(raw, "value", key)
        elif kind == "positive":
            share = positive_float(raw, "value", key)
            if not MIN_EFFICIENCY <= share <= MAX_TERM_TOKENS:
                raise CostModelError(
                    f"{key}: must be in [{MIN_EFFICIENCY:g}, {MAX_TERM_TOKENS:g}], got {raw!r}"
                )
            values[f.name] = share
        elif f.name == "profiles":
            if not isinstance(raw, list) or not all(isinstance(p, str) for p in raw):
                raise CostModelError(f"{key} must be a list of file names, got {raw!r}")
            values[f.name] = tuple(raw)
        else:
            values[f.name] = (
                raw
                if f.name == "note" and isinstance(raw, str)
                else nonempty_str(raw, "value", key)
            )
    return cls(**values)


def coefficients_from_json_dict(data: Mapping[str, object], source: str) -> StepCoefficients:
    """Validate a parsed coefficient file; every error names ``source`` and the key path."""
    if "format" not in data:
        raise CostModelError(
            f"{source}: not a {FORMAT} file (no 'format' key); fit one with kvsim calibrate "
            "(earlier kvsim's per-field override files are no longer read)"
        )
    top = ("format", "version", "units", "gpu", "num_sms", "provenance", *_PARTS)
    check_keys(data, allowed=top, required=top, source=source)
    if data["format"] != FORMAT or data["version"] != VERSION:
        raise CostModelError(
            f"{source}: format {data['format']!r} version {data['version']!r} is not "
            f"{FORMAT!r} version {VERSION} (refit with kvsim calibrate)"
        )
    provenance = _object(data["provenance"], f"{source}: provenance")
    check_keys(provenance, allowed=_PARTS, required=_PARTS, source=f"{source}: provenance")
    linear = _object(data["linear"], f"{source}: linear")
    ops = ("gemm", *ELEMENTWISE_OPS)
    check_keys(linear, allowed=ops, required=ops, source=f"{source}: linear")
    attention = _object(data["attention"], f"{source}: attention")
    keys: tuple[str, ...] = ("profiled_block_size", "decode", "prefill")
    check_keys(attention, allowed=keys, required=keys, source=f"{source}: attention")
    allreduce = _object(data["allreduce"], f"{source}: allreduce")
    keys = ("system", "by_num_workers")
    check_keys(allreduce, allowed=(*keys, "custom"), required=keys, source=f"{source}: allreduce")
    by_workers: dict[int, tuple[AllReduceProtocol, ...]] = {}
    for w, protocols in _object(
        allreduce["by_num_workers"], f"{source}: allreduce.by_num_workers"
    ).items():
        where = f"{source}: allreduce.by_num_workers.{w}"
        if not w.isdigit() or int(w) < 2 or not isinstance(protocols, list) or not protocols:
            raise CostModelError(f"{where}: expected a worker count >= 2 with a list of protocols")
        by_workers[int(w)] = tuple(
            _dataclass_from(AllReduceProtocol, p, f"{where}[{i}]") for i, p in enumerate(protocols)
        )
    provenances = {
        k: _dataclass_from(Provenance, provenance[k], f"{source}: provenance.{k}") for k in _PARTS
    }
    return StepCoefficients(
        gpu=nonempty_str(data["gpu"], "gpu", source),
        num_sms=positive_int(data["num_sms"], "num_sms", source),
        provenance=provenances,
        linear={
            op: _dataclass_from(
                GemmCoefficients if op == "gemm" else ElementwiseCoefficients,
                linear[op],
                f"{source}: linear.{op}",
            )
            for op in ops
        },
        decode_attention=_dataclass_from(
            DecodeAttentionCoefficients, attention["decode"], f"{source}: attention.decode"
        ),
        prefill_attention=_dataclass_from(
            PrefillAttentionCoefficients, attention["prefill"], f"{source}: attention.prefill"
        ),
        profiled_block_size=positive_int(
            attention["profiled_block_size"], "attention.profiled_block_size", source
        ),
        allreduce=AllReduceCoefficients(
            system=check_system(
                allreduce["system"], by_workers, provenances["allreduce"].profiles, source
            ),
            by_num_workers=by_workers,
            custom=custom_from_json(allreduce["custom"], f"{source}: allreduce.custom")
            if "custom" in allreduce
            else None,
        ),
        overheads=_dataclass_from(Overheads, data["overheads"], f"{source}: overheads"),
        source=source,
    )


def load_coefficients(path: str | Path) -> StepCoefficients:
    """Read and validate a coefficient file (CostModelError naming the file and key). A bare
    name that is no file but a shipped serving-stack file's stem (``h100-sxm+vllm-0.15``)
    reads that file (kvsim/costmodel/stacks.py)."""
    given = Path(path)
    shipped = STACK_DIR / f"{given.name}.json"
    if not given.exists() and str(path) == given.name and shipped.is_file():
        return coefficients_from_json_dict(
            read_json_object(shipped), STACK_SOURCE.format(name=given.name)
        )
    return coefficients_from_json_dict(read_json_object(path), str(path))


# --- the shipped presets -------------------------------------------------------------------------

PRESET_DIR = Path(__file__).parent / "gpu_coefficients"
# How describe() and config.json name a shipped file: relative to the package, so a run folder
# does not depend on where kvsim is installed.
PRESET_SOURCE = "kvsim/costmodel/gpu_coefficients/{name}.json (shipped preset)"
# The presets with a serving stack's corrections (kvsim.costmodel.stacks writes them).
STACK_DIR = Path(__file__).parent / "stack_coefficients"
STACK_SOURCE = "kvsim/costmodel/stack_coefficients/{name}.json (shipped serving-stack preset)"


def preset_coefficient_names() -> tuple[str, ...]:
    """GPU names that have shipped coefficient files."""
    return tuple(sorted(p.stem for p in PRESET_DIR.glob("*.json")))


@functools.cache
def preset_coefficients(gpu_name: str) -> StepCoefficients:
    """The shipped coefficients of GPU preset ``gpu_name`` (read once per process; the result
    is immutable). CostModelError naming the presets for a GPU without a file."""
    path = PRESET_DIR / f"{gpu_name}.json"
    if not path.is_file():
        names = ", ".join(preset_coefficient_names())
        raise CostModelError(
            f"gpu {gpu_name!r} has no shipped step-time coefficients (presets: {names}); pass "
            "--coefficients FILE (fit one with kvsim calibrate) or name the GPU spec after a preset"
        )
    data = read_json_object(path)
    return coefficients_from_json_dict(data, PRESET_SOURCE.format(name=gpu_name))
