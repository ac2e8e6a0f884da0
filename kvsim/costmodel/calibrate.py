"""Fit a whole StepCoefficients for one GPU from a profile folder; datasheet facts; scaling;
the shipped presets.

Parts the folder has no profiles for come from ``base`` (for the shipped presets: another GPU's
fit scaled to this GPU's datasheet) and keep its provenance, so a file always says which numbers
were measured on this GPU and which were not. Imports scipy (through fit): not imported by
``import kvsim.costmodel``.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any

import pandas as pd

from kvsim.costmodel.coefficients import (
    MAX_EFFICIENCY,
    AllReduceCoefficients,
    Overheads,
    Provenance,
    StepCoefficients,
    coefficients_from_json_dict,
    to_json_dict,
)
from kvsim.costmodel.fit import (
    FitError,
    fit_allreduce,
    fit_block_walk,
    fit_decode_attention,
    fit_linear,
    fit_prefill_attention,
)
from kvsim.costmodel.gpuspec import GPUSpec, resolve_gpu
from kvsim.costmodel.profiles import ProfileSet
from kvsim.costmodel.specio import positive_float, positive_int
from kvsim.costmodel.step_profiles import fit_overheads

# Streaming multiprocessors per GPU preset (NVIDIA datasheets / whitepapers): A100 108,
# H100 SXM5 132, H200 SXM 132 (same GH100), L4 58 (AD104), L40S 142 (AD102, 18,176 CUDA cores
# at 128 per SM).
DATASHEET_NUM_SMS = MappingProxyType(
    {"a100-40gb": 108, "a100-80gb": 108, "h100-sxm": 132, "h200": 132, "l4": 58, "l40s": 142}
)

# Which profile files describe which preset (Vidur names files by "a100" / "h100"; its A100s are
# 80 GB SXM4 in DGX A100 nodes, its H100s SXM5 in DGX H100 nodes, NVSwitch within a node).
PROFILE_DEVICE = MappingProxyType({"a100-80gb": "a100", "h100-sxm": "h100", "cpu": "cpu"})
NETWORK_SYSTEM = MappingProxyType({"a100-80gb": "a100_dgx", "h100-sxm": "h100_dgx"})

# CPU-side step costs: not in any kernel profile; kvsim's previous defaults (docs/costmodel.md).
PRIOR_OVERHEADS = Overheads(
    step_overhead_s=3e-3,
    seq_overhead_s=20e-6,
    prefill_seq_overhead_s=0.0,
    token_overhead_s=0.0,
    block_walk_s=1.5e-9,
)
PRIOR_PROVENANCE = Provenance(kind="prior", source="docs/costmodel.md (public figures, not fitted)")


def fit_gpu(
    profiles: ProfileSet,
    gpu: GPUSpec,
    *,
    device: str | None = None,
    system: str | None = None,
    num_sms: int | None = None,
    base: StepCoefficients | None = None,
    max_tokens: int = 4096,
    max_efficiency: float | None = None,
    source: str | None = None,
) -> StepCoefficients:
    """Fit every part ``profiles`` has rows for (device-prefixed files); the rest from ``base``.

    device: profile file prefix (default PROFILE_DEVICE[gpu.name], else the folder's only
    device); system: all-reduce system (default NETWORK_SYSTEM[gpu.name], else the only
    single-node system of the device); num_sms and max_efficiency (the cap on fitted
    efficiencies: 1 for GPUs, whose peaks are datasheet figures) default to the folder's
    profile.json, then to the datasheet / base / 1; source names the folder in the provenance
    (default: the folder as given). Parts without profiles and without ``base``: attention and
    overheads are errors, all-reduce is left absent (tp must then be 1).
    """
    meta = profiles.meta
    device = profile_device(profiles, gpu, device)
    mine = profiles.for_device(device)
    sms = num_sms or meta_int(meta, "num_sms") or (base.num_sms if base else None)
    sms = sms or DATASHEET_NUM_SMS.get(gpu.name)
    if sms is None:
        raise FitError(f"gpu {gpu.name!r}: num_sms unknown (not a preset); pass --num-sms")
    cap = max_efficiency or meta_float(meta, "max_efficiency") or 1.0
    where = f"{source or profiles.root or 'profiles'}, device {device!r}"
    provenance: dict[str, Provenance] = dict(base.provenance) if base else {}

    def fitted(files: list[str], note: str = "") -> Provenance:
        profiles = tuple(sorted(set(files)))
        return Provenance(kind="fitted", source=where, profiles=profiles, note=note)

    def need(part: str) -> StepCoefficients:
        if base is None:
            raise FitError(
                f"profiles: no {part} profiles for device {device!r} "
                "and no base coefficients to take them from (--base FILE)"
            )
        return base

    if len(mine.compute):
        linear = fit_linear(mine.compute, gpu, max_tokens=max_tokens, max_efficiency=cap)
        provenance["linear"] = fitted(
            list(mine.compute["source"]), f"rows with num_tokens <= {max_tokens}"
        )
    else:
        linear = dict(need("compute").linear)
    overheads = base.overheads if base else PRIOR_OVERHEADS
    attention = mine.attention
    if attention["is_prefill"].any() and (~attention["is_prefill"]).any():
        block_size = reference_block_size(attention)
        at_reference = attention[attention["block_size"] == block_size]
        decode = fit_decode_attention(at_reference, gpu, sms, cap)
        prefill = fit_prefill_attention(at_reference, gpu, cap)
        note = f"block size {block_size}"
        if attention["block_size"].nunique() > 1:
            walk = fit_block_walk(attention, gpu, sms, decode, block_size)
            overheads = dataclasses.replace(overheads, block_walk_s=walk)
            sizes = sorted(int(b) for b in set(attention["block_size"]))
            note = f"block size {block_size}; block_walk_s fitted on block sizes {sizes}"
        provenance["attention"] = fitted(list(attention["source"]), note)
    else:
        decode, prefill = need("attention").decode_attention, need("attention").prefill_attention
        block_size = need("attention").profiled_block_size
    systems = sorted(set(mine.allreduce["system"]))
    if system is not None and system not in systems:
        raise FitError(
            f"--system {system!r}: no all-reduce profile of device {device!r} names it in "
            f"{profiles.root or 'the profiles'} (network/{device}_*__all_reduce.csv: "
            f"{', '.join(systems) or 'none'})"
        )
    system = system or NETWORK_SYSTEM.get(gpu.name) or (systems[0] if len(systems) == 1 else None)
    if system is not None and system in systems:
        allreduce = fit_allreduce(mine.allreduce, gpu, system)
        provenance["allreduce"] = fitted(
            list(mine.allreduce.loc[mine.allreduce["system"] == system, "source"]),
            "single-node rows",
        )
    elif base is not None:
        allreduce = base.allreduce
    else:
        allreduce = AllReduceCoefficients(system="none", by_num_workers={})
        provenance["allreduce"] = Provenance(
            kind="absent", source=where, note="no all-reduce profile: tp must be 1"
        )
    provenance.setdefault("overheads", PRIOR_PROVENANCE)
    co = StepCoefficients(
        gpu=gpu.name,
        num_sms=sms,
        provenance=provenance,
        linear=linear,
        decode_attention=decode,
        prefill_attention=prefill,
        profiled_block_size=block_size,
        allreduce=allreduce,
        overheads=overheads,
    )
    if len(mine.steps):
        co = dataclasses.replace(
            co,
            overheads=fit_overheads(mine.steps, gpu, co),
            provenance={
                **co.provenance,
                "overheads": fitted(
                    list(mine.steps["source"]),
                    "whole steps' time beyond the kernel terms; block_walk_s from attention",
                ),
            },
        )
    return co


def profile_device(profiles: ProfileSet, gpu: GPUSpec, device: str | None = None) -> str:
    """The file prefix of ``gpu``'s profiles: ``device`` if given, else the preset's
    (PROFILE_DEVICE), profile.json's, or the folder's only device."""
    found = device or PROFILE_DEVICE.get(gpu.name) or profiles.meta.get("device")
    if found is None and len(profiles.devices) == 1:
        found = profiles.devices[0]
    if not isinstance(found, str):
        devices = ", ".join(profiles.devices) or "none"
        raise FitError(
            f"gpu {gpu.name!r}: which profile files are its? pass --device PREFIX "
            f"(devices in {profiles.root or 'the folder'}: {devices})"
        )
    return found


# An engine profile is refused for fitting (unless the user insists) when its repeated timings
# spread more than this (median over points of (p90 - p10) / median), or the machine's measured
# peaks drifted more than this between the start and the end of the run.
NOISY_SPREAD = 0.10
NOISY_DRIFT = 0.05


def noise_refusal(meta: dict[str, Any]) -> str | None:
    """Why an engine profile's timings are too noisy to fit (profile.json's ``noise``), or
    None (and None for profiles without that record, such as Vidur's)."""
    noise = meta.get("noise")
    if not isinstance(noise, dict):
        return None
    spread = noise.get("spread_median")
    if isinstance(spread, float | int) and spread > NOISY_SPREAD:
        return (
            f"repeated timings spread {spread:.0%} (median over points of (p90 - p10) / "
            f"median; limit {NOISY_SPREAD:.0%})"
        )
    drift = noise.get("peak_drift")
    if isinstance(drift, dict):
        for key, value in drift.items():
            if isinstance(value, float | int) and abs(value) > NOISY_DRIFT:
                return (
                    f"the measured {key} drifted {value:+.0%} during the run "
                    f"(limit {NOISY_DRIFT:.0%})"
                )
    return None


def reference_block_size(attention: pd.DataFrame) -> int:
    """The block size the attention terms are fitted at: the one with the most rows (16, the
    default, on a tie)."""
    counts = attention.groupby("block_size").size()
    best = counts.max()
    sizes = sorted(int(b) for b in counts[counts == best].index)
    return 16 if 16 in sizes else sizes[0]


def meta_int(meta: dict[str, Any], key: str) -> int | None:
    """``meta[key]`` as a positive int, None when absent (ProfileError when bad)."""
    if key not in meta:
        return None
    return positive_int(meta[key], key, "profile.json")


def meta_float(meta: dict[str, Any], key: str) -> float | None:
    """``meta[key]`` as a positive number up to MAX_EFFICIENCY, None when absent."""
    if key not in meta:
        return None
    value = positive_float(meta[key], key, "profile.json")
    if value > MAX_EFFICIENCY:
        raise FitError(f"profile.json: {key} must be at most {MAX_EFFICIENCY:g}, got {value!r}")
    return value


def scale_to_gpu(
    source: StepCoefficients,
    target: GPUSpec,
    *,
    num_sms: int | None = None,
    parts: tuple[str, ...] = ("linear", "attention", "allreduce"),
) -> StepCoefficients:
    """``source``'s coefficients for ``target``: the same latencies and efficiencies, applied to
    ``target``'s datasheet peaks (HBM bandwidth, FLOP/s, interconnect) and SM count.

    This is what "scaled from datasheets" means in a coefficient file: exact when the two GPUs
    share an architecture and differ in clocks, memory or SM count (A100 40/80 GB, H100/H200);
    an estimate otherwise (L4 from A100), and labelled so.
    """
    sms = num_sms or DATASHEET_NUM_SMS.get(target.name) or source.num_sms
    provenance = dict(source.provenance)
    for part in parts:
        was = source.provenance[part]
        origin = was.source if was.kind == "scaled" else f"{source.gpu} ({was.kind}: {was.source})"
        provenance[part] = Provenance(
            kind="scaled",
            source=origin,
            profiles=was.profiles,
            note=f"{source.gpu} efficiencies and latencies applied to {target.name}'s "
            f"datasheet peaks and {sms} SMs",
        )
    return dataclasses.replace(source, gpu=target.name, num_sms=sms, provenance=provenance)


# The shipped presets: fitted where profiles exist, scaled from the fitted GPU of the same (or the
# closest) architecture otherwise.
FITTED_PRESETS = ("a100-80gb", "h100-sxm")
SHIPPED_PROFILES = "profiles/vidur"  # the repository folder fitted (Vidur, MIT: its README)
SCALED_PRESETS = MappingProxyType(
    {"a100-40gb": "a100-80gb", "h200": "h100-sxm", "l4": "a100-80gb", "l40s": "a100-80gb"}
)


def fit_presets(profiles: ProfileSet) -> dict[str, StepCoefficients]:
    """The coefficient files kvsim ships, from the Vidur profiles: a100-80gb fitted; h100-sxm
    fitted (its attention scaled from a100-80gb: no H100 attention profile exists);
    a100-40gb, h200, l4 and l40s scaled from datasheets. Each as a file holds it (rounded)."""
    a100 = as_shipped(fit_gpu(profiles, resolve_gpu("a100-80gb"), source=SHIPPED_PROFILES))
    h100_base = scale_to_gpu(a100, resolve_gpu("h100-sxm"))
    h100 = as_shipped(
        fit_gpu(profiles, resolve_gpu("h100-sxm"), base=h100_base, source=SHIPPED_PROFILES)
    )
    fitted = {"a100-80gb": a100, "h100-sxm": h100}
    for name, source in SCALED_PRESETS.items():
        fitted[name] = as_shipped(scale_to_gpu(fitted[source], resolve_gpu(name)))
    return fitted


def as_shipped(co: StepCoefficients) -> StepCoefficients:
    """``co`` after writing and reading a coefficient file (rounded as files are), so what is
    validated is what is shipped."""
    return coefficients_from_json_dict(to_json_dict(co), co.source or "in memory")
