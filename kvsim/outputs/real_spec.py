"""A sim-to-real SPEC: a real deployment's limits, its workloads' recipes and the figures it
measured (format ``kvsim-real-runs``, version 1; docs/costmodel.md, "Against real vLLM runs").

The shipped SPECs live in ``kvsim/outputs/real_runs/`` and are named by their file's stem.
Every error names the file and the key path, in one line (``RealSpecError``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvsim.errors import KvsimError
from workloads.errors import SpecError
from workloads.shared_prefix import SharedPrefixRecipe, Stage

FORMAT = "kvsim-real-runs"
VERSION = 1
SHIPPED_DIR = Path(__file__).parent / "real_runs"

_DEPLOYMENT_KEYS = {
    "model": str,
    "gpu": str,
    "tp": int,
    "max_model_len": int,
    "max_num_batched_tokens": int,
    "max_num_seqs": int,
    "block_size": int,
    "num_blocks": int,
    "enable_prefix_caching": bool,
    "enable_chunked_prefill": bool,
    "serving_stack": str,
    "async_scheduling": bool,
    "frontend_latency_s": float,
}
_CLIENT_KEYS = {"timeout_s": float, "num_groups": int, "prompts_per_group": int, "seed": int}
_WORKLOAD_KEYS = {
    "name": str,
    "system_prompt_tokens": int,
    "question_tokens": int,
    "measured_prompt_tokens_mean": float,
    "output_tokens": int,
    "stages": list,
}
_STAGE_KEYS = {"rate_per_s": float, "duration_s": float, "measured": dict}
_MEASURED_KEYS = {
    "ttft_ms": float,
    "e2e_ms": float,
    "tpot_ms": float,
    "overloaded": bool,
    "finished": int,
    "timed_out": int,
    "e2e_finished_ms": float,
}


class RealSpecError(KvsimError):
    """A SPEC file that cannot be read: the message names the file and the key."""


@dataclass(frozen=True, slots=True)
class Measured:
    """What the real run measured for one stage (ms; counts of requests); None: not published."""

    ttft_ms: float | None = None
    e2e_ms: float | None = None
    tpot_ms: float | None = None
    overloaded: bool = False
    finished: int | None = None
    timed_out: int | None = None
    e2e_finished_ms: float | None = None


@dataclass(frozen=True, slots=True)
class RealWorkload:
    """One workload of the SPEC: the trace recipe and each stage's measured figures."""

    recipe: SharedPrefixRecipe
    measured: tuple[Measured, ...]  # one per recipe stage


@dataclass(frozen=True, slots=True)
class RealSpec:
    """A deployment (RunConfig option values) and the workloads it served."""

    name: str
    provenance: str
    deployment: dict[str, Any]
    workloads: tuple[RealWorkload, ...]
    source: str


def resolve_spec_path(spec: str) -> Path:
    """``spec`` as a path, else the shipped SPEC of that name."""
    path = Path(spec)
    if path.is_file():
        return path
    shipped = SHIPPED_DIR / f"{spec}.json"
    if shipped.is_file():
        return shipped
    names = ", ".join(sorted(p.stem for p in SHIPPED_DIR.glob("*.json")))
    raise RealSpecError(f"{spec}: no such file, nor a shipped SPEC (shipped: {names})")


def shipped_spec_names() -> list[str]:
    """Names of the SPECs shipped with kvsim."""
    return sorted(p.stem for p in SHIPPED_DIR.glob("*.json"))


def _checked(where: str, obj: object, keys: dict[str, type], required: set[str]) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise RealSpecError(f"{where}: must be a JSON object")
    unknown = sorted(set(obj) - set(keys))
    if unknown:
        raise RealSpecError(f"{where}: unknown key {unknown[0]!r} (known keys: {', '.join(keys)})")
    missing = sorted(required - set(obj))
    if missing:
        raise RealSpecError(f"{where}: missing key {missing[0]!r}")
    for key, value in obj.items():
        kind = keys[key]
        ok = (
            isinstance(value, bool)
            if kind is bool
            else (isinstance(value, int | float) and not isinstance(value, bool))
            if kind is float
            else (type(value) is int)
            if kind is int
            else isinstance(value, kind)
        )
        if not ok:
            raise RealSpecError(f"{where}.{key}: must be {kind.__name__}, got {value!r}")
    return obj


def _recipe(where: str, doc: dict[str, Any], client: dict[str, Any], stages: list[Stage]) -> Any:
    system, question = doc["system_prompt_tokens"], doc["question_tokens"]
    measured_mean = doc.get("measured_prompt_tokens_mean")
    if measured_mean is not None:
        # The server saw the measured mean (tokenization adds ~5%): keep the system prompt's
        # share of it, so the shared prefix grows in proportion.
        total = round(measured_mean)
        system = round(system * total / (system + question))
        question = total - system
    try:
        return SharedPrefixRecipe(
            name=doc["name"],
            system_prompt_tokens=system,
            question_tokens=question,
            output_tokens=doc["output_tokens"],
            stages=tuple(stages),
            num_groups=client.get("num_groups", 10),
            prompts_per_group=client.get("prompts_per_group", 10),
            timeout_s=client.get("timeout_s"),
            seed=client.get("seed", 0),
        )
    except SpecError as exc:
        raise RealSpecError(f"{where}: {exc}") from exc


def load_real_spec(spec: str) -> RealSpec:
    """Read a SPEC file (or a shipped SPEC's name); RealSpecError names the file and key."""
    path = resolve_spec_path(spec)
    name = str(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RealSpecError(f"{name}: cannot read a JSON SPEC: {exc}") from exc
    return real_spec_from_doc(doc, name)


def real_spec_from_doc(doc: object, name: str) -> RealSpec:
    """A SPEC from its parsed JSON document (a file of several SPECs holds them as objects);
    ``name`` is where it came from, as errors and ``RealSpec.source`` name it."""
    top = {
        "format": str,
        "version": int,
        "name": str,
        "provenance": str,
        "deployment": dict,
        "client": dict,
        "workloads": list,
    }
    doc = _checked(name, doc, top, set(top))
    if doc["format"] != FORMAT or doc["version"] != VERSION:
        raise RealSpecError(
            f"{name}: format must be {FORMAT!r} version {VERSION}, got "
            f"{doc['format']!r} version {doc['version']!r}"
        )
    optional = {"serving_stack", "async_scheduling", "frontend_latency_s"}
    deployment = _checked(
        f"{name}: deployment", doc["deployment"], _DEPLOYMENT_KEYS, set(_DEPLOYMENT_KEYS) - optional
    )
    client = _checked(f"{name}: client", doc["client"], _CLIENT_KEYS, set())
    workloads = []
    for w, wdoc in enumerate(doc["workloads"]):
        where = f"{name}: workloads[{w}]"
        required = set(_WORKLOAD_KEYS) - {"measured_prompt_tokens_mean"}
        wdoc = _checked(where, wdoc, _WORKLOAD_KEYS, required)
        stages, measured = [], []
        for s, sdoc in enumerate(wdoc["stages"]):
            swhere = f"{where}.stages[{s}]"
            sdoc = _checked(swhere, sdoc, _STAGE_KEYS, {"rate_per_s", "duration_s"})
            stages.append(Stage(float(sdoc["rate_per_s"]), float(sdoc["duration_s"])))
            mdoc = _checked(f"{swhere}.measured", sdoc.get("measured", {}), _MEASURED_KEYS, set())
            for key, value in mdoc.items():
                if type(value) is not bool and not 0 <= value < math.inf:
                    raise RealSpecError(
                        f"{swhere}.measured.{key}: must be a finite non-negative number, "
                        f"got {value!r}"
                    )
            measured.append(Measured(**mdoc))
        workloads.append(RealWorkload(_recipe(where, wdoc, client, stages), tuple(measured)))
    return RealSpec(
        name=doc["name"],
        provenance=doc["provenance"],
        deployment=deployment,
        workloads=tuple(workloads),
        source=name,
    )
