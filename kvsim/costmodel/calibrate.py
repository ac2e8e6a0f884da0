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

from kvsim.costmodel.coefficients import (
    Overheads,
    Provenance,
    StepCoefficients,
    coefficients_from_json_dict,
    to_json_dict,
)
from kvsim.costmodel.fit import (
    FitError,
    fit_allreduce,
    fit_decode_attention,
    fit_linear,
    fit_prefill_attention,
)
from kvsim.costmodel.gpuspec import GPUSpec, resolve_gpu
from kvsim.costmodel.profiles import ProfileSet

# Streaming multiprocessors per GPU preset (NVIDIA datasheets / whitepapers): A100 108,
# H100 SXM5 132, H200 SXM 132 (same GH100), L4 58 (AD104).
DATASHEET_NUM_SMS = MappingProxyType(
    {"a100-40gb": 108, "a100-80gb": 108, "h100-sxm": 132, "h200": 132, "l4": 58}
)

# Which profile files describe which preset (Vidur names files by "a100" / "h100"; its A100s are
# 80 GB SXM4 in DGX A100 nodes, its H100s SXM5 in DGX H100 nodes, NVSwitch within a node).
PROFILE_DEVICE = MappingProxyType({"a100-80gb": "a100", "h100-sxm": "h100", "cpu": "cpu"})
NETWORK_SYSTEM = MappingProxyType({"a100-80gb": "a100_dgx", "h100-sxm": "h100_dgx"})

# CPU-side step costs: not in any kernel profile; kvsim's previous defaults (docs/costmodel.md).
PRIOR_OVERHEADS = Overheads(step_overhead_s=3e-3, seq_overhead_s=20e-6, block_walk_s=1.5e-9)
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
    max_efficiency: float = 1.0,
) -> StepCoefficients:
    """Fit every part ``profiles`` has rows for (device-prefixed files); the rest from ``base``.

    device: profile file prefix (default PROFILE_DEVICE[gpu.name]); system: all-reduce system
    (default NETWORK_SYSTEM[gpu.name], else the only single-node system of the device).
    """
    device = device or PROFILE_DEVICE.get(gpu.name)
    if device is None:
        raise FitError(f"gpu {gpu.name!r}: which profile files are its? pass device= (file prefix)")
    mine = profiles.for_device(device)
    sms = num_sms or (base.num_sms if base else None) or DATASHEET_NUM_SMS.get(gpu.name)
    if sms is None:
        raise FitError(f"gpu {gpu.name!r}: num_sms unknown (not a preset); pass num_sms=")
    provenance: dict[str, Provenance] = dict(base.provenance) if base else {}

    def fitted(files: list[str], note: str = "") -> Provenance:
        return Provenance(
            kind="fitted",
            source=f"profiles of device {device!r}",
            profiles=tuple(sorted(set(files))),
            note=note,
        )

    def need(part: str) -> StepCoefficients:
        if base is None:
            raise FitError(
                f"profiles: no {part} profiles for device {device!r} "
                "and no base coefficients to take them from"
            )
        return base

    if len(mine.compute):
        linear = fit_linear(mine.compute, gpu, max_tokens=max_tokens, max_efficiency=max_efficiency)
        provenance["linear"] = fitted(
            list(mine.compute["source"]), f"rows with num_tokens <= {max_tokens}"
        )
    else:
        linear = dict(need("compute").linear)
    if mine.attention["is_prefill"].any() and (~mine.attention["is_prefill"]).any():
        decode = fit_decode_attention(mine.attention, gpu, sms, max_efficiency)
        prefill = fit_prefill_attention(mine.attention, gpu, max_efficiency)
        block_sizes = sorted(set(mine.attention["block_size"]))
        if len(block_sizes) != 1:
            raise FitError(
                f"attention profiles of {device!r}: one block size expected, got {block_sizes}"
            )
        block_size = int(block_sizes[0])
        provenance["attention"] = fitted(list(mine.attention["source"]))
    else:
        decode, prefill = need("attention").decode_attention, need("attention").prefill_attention
        block_size = need("attention").profiled_block_size
    systems = sorted(set(mine.allreduce["system"]))
    system = system or NETWORK_SYSTEM.get(gpu.name) or (systems[0] if len(systems) == 1 else None)
    if system is not None and system in systems:
        allreduce = fit_allreduce(mine.allreduce, gpu, system)
        provenance["allreduce"] = fitted(
            list(mine.allreduce.loc[mine.allreduce["system"] == system, "source"]),
            "single-node rows",
        )
    else:
        allreduce = need("all-reduce").allreduce
    provenance.setdefault("overheads", PRIOR_PROVENANCE)
    return StepCoefficients(
        gpu=gpu.name,
        num_sms=sms,
        provenance=provenance,
        linear=linear,
        decode_attention=decode,
        prefill_attention=prefill,
        profiled_block_size=block_size,
        allreduce=allreduce,
        overheads=base.overheads if base else PRIOR_OVERHEADS,
    )


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
SCALED_PRESETS = MappingProxyType({"a100-40gb": "a100-80gb", "h200": "h100-sxm", "l4": "a100-80gb"})


def fit_presets(profiles: ProfileSet) -> dict[str, StepCoefficients]:
    """The coefficient files kvsim ships, from the Vidur profiles: a100-80gb fitted; h100-sxm
    fitted (its attention scaled from a100-80gb: no H100 attention profile exists);
    a100-40gb, h200 and l4 scaled from datasheets. Each as a file holds it (rounded)."""
    a100 = as_shipped(fit_gpu(profiles, resolve_gpu("a100-80gb")))
    h100_base = scale_to_gpu(a100, resolve_gpu("h100-sxm"))
    h100 = as_shipped(fit_gpu(profiles, resolve_gpu("h100-sxm"), base=h100_base))
    fitted = {"a100-80gb": a100, "h100-sxm": h100}
    for name, source in SCALED_PRESETS.items():
        fitted[name] = as_shipped(scale_to_gpu(fitted[source], resolve_gpu(name)))
    return fitted


def as_shipped(co: StepCoefficients) -> StepCoefficients:
    """``co`` after writing and reading a coefficient file (rounded as files are), so what is
    validated is what is shipped."""
    return coefficients_from_json_dict(to_json_dict(co), co.source or "in memory")
