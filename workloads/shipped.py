"""Traces shipped inside the package (workloads/traces/), found without reading anything else."""

from __future__ import annotations

from pathlib import Path

from workloads.errors import WorkloadError, shorten

TRACES_DIR = Path(__file__).parent / "traces"
DEFAULT_TRACE_NAME = "azure_llm_2023_conv_first_2min"
_SUFFIX = ".jsonl"
_SHOWN_PATH = 200  # characters of a path that names no file, in the error


def shipped_trace_names() -> list[str]:
    """Names of the shipped traces (file names without ``.jsonl``), sorted."""
    return sorted(path.stem for path in TRACES_DIR.glob(f"*{_SUFFIX}"))


def shipped_trace_path(name: str) -> Path:
    """Path of the shipped trace ``name`` (with or without ``.jsonl``).

    Raises:
        WorkloadError: no shipped trace has that name (the message lists the names).
    """
    path = TRACES_DIR / (name if name.endswith(_SUFFIX) else name + _SUFFIX)
    if "/" in name or not path.is_file():
        raise WorkloadError(
            f"no shipped trace named {shorten(name)!r}; shipped: {', '.join(shipped_trace_names())}"
        )
    return path


def resolve_trace(arg: str | Path) -> Path:
    """A CLI argument as a trace path: an existing file, else the shipped trace of that name.

    Raises:
        WorkloadError: neither exists (the message lists the shipped names).
    """
    path = Path(arg)
    try:
        if path.exists():
            return path
    except OSError as err:  # e.g. a name too long for the file system
        raise WorkloadError(f"{shorten(str(arg), _SHOWN_PATH)}: {err.strerror or err}") from None
    try:
        return shipped_trace_path(str(arg))
    except WorkloadError:
        raise WorkloadError(
            f"{shorten(str(arg), _SHOWN_PATH)}: no such file, and no shipped trace of that name "
            f"(shipped: {', '.join(shipped_trace_names())})"
        ) from None


DEFAULT_TRACE: Path = TRACES_DIR / (DEFAULT_TRACE_NAME + _SUFFIX)
