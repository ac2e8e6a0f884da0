"""Measured operator profiles (Vidur's CSV layout): load a profile folder, check every value.

A profile folder holds up to three kinds of CSV file, named the way Vidur names them::

    compute/DEVICE__MODEL__mlp.csv              per-layer non-attention operators
    attention/DEVICE__MODEL__tpN__attention.csv paged attention (prefill chunks, decode batches)
    network/SYSTEM__all_reduce.csv              all-reduce by message size and worker count

Statistic columns are ``time_stats.<op>.median`` in **milliseconds** (min/max/mean/std columns may
be there too and are ignored). Loading converts times to seconds, averages duplicate keys by their
median, and returns tidy DataFrames whose column names are kvsim's vocabulary. Every bad input
raises :class:`ProfileError` with one line naming the file, the line and the column.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from kvsim.costmodel.layer_shapes import LINEAR_OPS
from kvsim.costmodel.specio import CostModelError

_COMPUTE_NAME = re.compile(r"^(?P<device>[^_].*?)__(?P<model>.+)__mlp\.csv$")
_ATTENTION_NAME = re.compile(
    r"^(?P<device>[^_].*?)__(?P<model>.+?)__tp(?P<tp>\d+)__attention\.csv$"
)
_NETWORK_NAME = re.compile(r"^(?P<system>[^_].*?)__all_reduce\.csv$")


class ProfileError(CostModelError):
    """A profile file that is missing, malformed, or holds a value the fitter cannot use."""


@dataclass(frozen=True)
class ProfileSet:
    """All profiles of one folder, times in seconds.

    compute: one row per (device, model, tp, num_tokens): the model's shape columns and one
        column per operator of LINEAR_OPS (seconds, one layer, one GPU).
    attention: one row per (device, model, tp, block_size, is_prefill, batch_size, chunk_size,
        context_len): ``time_s`` is one layer's attention kernel on one GPU.
    allreduce: one row per (system, num_workers, devices_per_node, size_bytes): ``time_s``.
    """

    compute: pd.DataFrame
    attention: pd.DataFrame
    allreduce: pd.DataFrame

    @property
    def devices(self) -> list[str]:
        """Device names that have compute or attention profiles (file-name prefixes)."""
        names = set(self.compute["device"]) | set(self.attention["device"])
        return sorted(names)

    def for_device(self, device: str) -> ProfileSet:
        """The profiles of one device; all-reduce rows of systems whose name starts with it."""
        system_device = self.allreduce["system"].str.split("_").str[0]
        return ProfileSet(
            compute=self.compute[self.compute["device"] == device].reset_index(drop=True),
            attention=self.attention[self.attention["device"] == device].reset_index(drop=True),
            allreduce=self.allreduce[system_device == device].reset_index(drop=True),
        )


# --- cell checks ---------------------------------------------------------------------------------


def _read_csv(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ProfileError(f"{path}: not a readable CSV file ({first})") from None
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read ({exc.strerror})") from None


def _require(frame: pd.DataFrame, columns: tuple[str, ...], path: Path) -> None:
    for column in columns:
        if column not in frame.columns:
            raise ProfileError(f"{path}: missing column {column!r}")
    if frame.empty:
        raise ProfileError(f"{path}: no data rows")


def _bad(path: Path, frame: pd.DataFrame, column: str, mask: pd.Series, expected: str) -> None:
    if mask.any():
        row = int(mask.to_numpy().nonzero()[0][0])
        raw = frame[column].iloc[row]
        # Line 1 is the header; data row 0 is line 2 (no quoted newlines in these files).
        raise ProfileError(
            f"{path}: line {row + 2}, column {column!r}: expected {expected}, got {raw!r}"
        )


def _ints(frame: pd.DataFrame, column: str, path: Path, *, minimum: int) -> pd.Series:
    values = pd.to_numeric(frame[column], errors="coerce")
    integral = values.notna() & (values == values.round()) & (values >= minimum)
    what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    _bad(path, frame, column, ~integral, what)
    return values.astype("int64")


def _times(
    frame: pd.DataFrame, column: str, path: Path, rows: pd.Series | None = None
) -> pd.Series:
    """Milliseconds in ``column`` (on ``rows`` only, if given) as seconds; finite and > 0."""
    values = pd.to_numeric(frame[column], errors="coerce")
    ok = values.notna() & values.map(lambda v: math.isfinite(v) if v == v else False) & (values > 0)
    if rows is not None:
        ok = ok | ~rows
    _bad(path, frame, column, ~ok, "a positive time in ms")
    return values * 1e-3


def _bools(frame: pd.DataFrame, column: str, path: Path) -> pd.Series:
    lowered = frame[column].str.strip().str.lower()
    truth = {"true": True, "1": True, "false": False, "0": False}
    _bad(path, frame, column, ~lowered.isin(list(truth)), "True or False")
    return lowered.map(truth).astype(bool)


def _constant(frame: pd.DataFrame, column: str, path: Path, values: pd.Series) -> pd.Series:
    """``values`` (parsed from ``column``), which must be one model's: equal on every row."""
    _bad(
        path,
        frame,
        column,
        values != values.iloc[0],
        f"the same value on every row ({frame[column].iloc[0]!r})",
    )
    return values


def _dtype_bytes(frame: pd.DataFrame, path: Path) -> pd.Series:
    # Vidur profiles are fp16 and have no such column; kvsim's engine-mode profiles write it.
    if "dtype_bytes" not in frame.columns:
        return pd.Series(2, index=frame.index, dtype="int64")
    values = _ints(frame, "dtype_bytes", path, minimum=1)
    _bad(path, frame, "dtype_bytes", ~values.isin([1, 2, 4]), "1, 2 or 4")
    return values


def _head_dim(frame: pd.DataFrame, path: Path, heads: pd.Series, hidden: pd.Series) -> pd.Series:
    if "head_dim" in frame.columns:
        return _ints(frame, "head_dim", path, minimum=1)
    _bad(
        path,
        frame,
        "n_embd",
        hidden % heads != 0,
        "a multiple of the head count (or a head_dim column)",
    )
    return hidden // heads


# --- the three kinds of file ---------------------------------------------------------------------

_COMPUTE_KEYS = (
    "n_head",
    "n_kv_head",
    "n_embd",
    "n_expanded_embd",
    "use_gated_mlp",
    "num_tokens",
    "num_tensor_parallel_workers",
)


def read_compute_profile(path: Path) -> pd.DataFrame:
    """One ``DEVICE__MODEL__mlp.csv`` as a tidy frame (see :class:`ProfileSet`)."""
    match = _COMPUTE_NAME.match(path.name)
    if match is None:
        raise ProfileError(f"{path}: file name must be DEVICE__MODEL__mlp.csv")
    frame = _read_csv(path)
    op_columns = tuple(f"time_stats.{op}.median" for op in LINEAR_OPS)
    _require(frame, _COMPUTE_KEYS + op_columns, path)
    heads = _constant(frame, "n_head", path, _ints(frame, "n_head", path, minimum=1))
    kv_heads = _constant(frame, "n_kv_head", path, _ints(frame, "n_kv_head", path, minimum=1))
    hidden = _constant(frame, "n_embd", path, _ints(frame, "n_embd", path, minimum=1))
    intermediate = _constant(
        frame, "n_expanded_embd", path, _ints(frame, "n_expanded_embd", path, minimum=1)
    )
    gated = _constant(frame, "use_gated_mlp", path, _bools(frame, "use_gated_mlp", path))
    tp = _ints(frame, "num_tensor_parallel_workers", path, minimum=1)
    _bad(path, frame, "n_kv_head", heads % kv_heads != 0, "a divisor of n_head")
    _bad(path, frame, "num_tensor_parallel_workers", heads % tp != 0, "a divisor of n_head")
    out = pd.DataFrame(
        {
            "source": path.name,
            "device": match["device"],
            "model": match["model"],
            "tp": tp,
            "num_tokens": _ints(frame, "num_tokens", path, minimum=1),
            "num_heads": heads,
            "num_kv_heads": kv_heads,
            "hidden_size": hidden,
            "head_dim": _head_dim(frame, path, heads, hidden),
            "intermediate_size": intermediate,
            "gated_mlp": gated,
            "dtype_bytes": _dtype_bytes(frame, path),
        }
    )
    for op, column in zip(LINEAR_OPS, op_columns):
        out[op] = _times(frame, column, path)
    keys = [c for c in out.columns if c not in LINEAR_OPS]
    return out.groupby(keys, as_index=False, sort=True)[list(LINEAR_OPS)].median()


_ATTENTION_KEYS = (
    "n_embd",
    "n_q_head",
    "n_kv_head",
    "block_size",
    "num_tensor_parallel_workers",
    "batch_size",
    "prefill_chunk_size",
    "kv_cache_size",
    "is_prefill",
    "time_stats.attn_prefill.median",
    "time_stats.attn_decode.median",
)


def read_attention_profile(path: Path) -> pd.DataFrame:
    """One ``DEVICE__MODEL__tpN__attention.csv`` as a tidy frame (see :class:`ProfileSet`).

    Prefill rows: ``chunk_size`` new tokens of one sequence after ``context_len`` cached ones.
    Decode rows: ``batch_size`` sequences of ``context_len`` tokens each.
    """
    match = _ATTENTION_NAME.match(path.name)
    if match is None:
        raise ProfileError(f"{path}: file name must be DEVICE__MODEL__tpN__attention.csv")
    frame = _read_csv(path)
    _require(frame, _ATTENTION_KEYS, path)
    heads = _ints(frame, "n_q_head", path, minimum=1)
    kv_heads = _ints(frame, "n_kv_head", path, minimum=1)
    hidden = _ints(frame, "n_embd", path, minimum=1)
    tp = _ints(frame, "num_tensor_parallel_workers", path, minimum=1)
    _bad(path, frame, "num_tensor_parallel_workers", heads % tp != 0, "a divisor of n_q_head")
    prefill = _bools(frame, "is_prefill", path)
    chunk = _ints(frame, "prefill_chunk_size", path, minimum=0)
    _bad(
        path,
        frame,
        "prefill_chunk_size",
        prefill & (chunk < 1),
        "a positive integer on a prefill row",
    )
    context = _ints(frame, "kv_cache_size", path, minimum=0)
    _bad(
        path, frame, "kv_cache_size", ~prefill & (context < 1), "a positive integer on a decode row"
    )
    prefill_s = _times(frame, "time_stats.attn_prefill.median", path, rows=prefill)
    decode_s = _times(frame, "time_stats.attn_decode.median", path, rows=~prefill)
    out = pd.DataFrame(
        {
            "source": path.name,
            "device": match["device"],
            "model": match["model"],
            "tp": tp,
            "num_heads": heads,
            "num_kv_heads": kv_heads,
            "hidden_size": hidden,
            "head_dim": _head_dim(frame, path, heads, hidden),
            "dtype_bytes": _dtype_bytes(frame, path),
            "block_size": _ints(frame, "block_size", path, minimum=1),
            "is_prefill": prefill,
            "batch_size": _ints(frame, "batch_size", path, minimum=1),
            "chunk_size": chunk.where(prefill, 0),
            "context_len": context,
            "time_s": prefill_s.where(prefill, decode_s),
        }
    )
    keys = [c for c in out.columns if c != "time_s"]
    return out.groupby(keys, as_index=False, sort=True)["time_s"].median()


_NETWORK_KEYS = ("num_workers", "devices_per_node", "size", "time_stats.all_reduce.median")


def read_allreduce_profile(path: Path) -> pd.DataFrame:
    """One ``SYSTEM__all_reduce.csv`` as a tidy frame (see :class:`ProfileSet`)."""
    match = _NETWORK_NAME.match(path.name)
    if match is None:
        raise ProfileError(f"{path}: file name must be SYSTEM__all_reduce.csv")
    frame = _read_csv(path)
    _require(frame, _NETWORK_KEYS, path)
    if "collective" in frame.columns:
        _bad(path, frame, "collective", frame["collective"] != "all_reduce", "all_reduce")
    out = pd.DataFrame(
        {
            "source": path.name,
            "system": match["system"],
            "num_workers": _ints(frame, "num_workers", path, minimum=1),
            "devices_per_node": _ints(frame, "devices_per_node", path, minimum=1),
            "size_bytes": _ints(frame, "size", path, minimum=1),
            "time_s": _times(frame, "time_stats.all_reduce.median", path),
        }
    )
    keys = [c for c in out.columns if c != "time_s"]
    return out.groupby(keys, as_index=False, sort=True)["time_s"].median()


def _concat(frames: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    if not frames:
        return pd.DataFrame(columns=columns)
    return pd.concat(frames, ignore_index=True)


_COMPUTE_COLUMNS = [
    "source",
    "device",
    "model",
    "tp",
    "num_tokens",
    "num_heads",
    "num_kv_heads",
    "hidden_size",
    "head_dim",
    "intermediate_size",
    "gated_mlp",
    "dtype_bytes",
    *LINEAR_OPS,
]
_ATTENTION_COLUMNS = [
    "source",
    "device",
    "model",
    "tp",
    "num_heads",
    "num_kv_heads",
    "hidden_size",
    "head_dim",
    "dtype_bytes",
    "block_size",
    "is_prefill",
    "batch_size",
    "chunk_size",
    "context_len",
    "time_s",
]
_ALLREDUCE_COLUMNS = ["source", "system", "num_workers", "devices_per_node", "size_bytes", "time_s"]


def load_profile_dir(path: str | Path) -> ProfileSet:
    """Every profile under ``path`` (compute/, attention/, network/); at least one must exist."""
    root = Path(path)
    if not root.is_dir():
        raise ProfileError(
            f"{root}: not a folder (expected a profile folder: compute/, attention/, network/)"
        )
    compute = [read_compute_profile(p) for p in sorted((root / "compute").glob("*.csv"))]
    attention = [read_attention_profile(p) for p in sorted((root / "attention").glob("*.csv"))]
    network = [read_allreduce_profile(p) for p in sorted((root / "network").glob("*.csv"))]
    if not (compute or attention or network):
        raise ProfileError(
            f"{root}: no profiles (expected compute/*__mlp.csv, attention/*__attention.csv "
            "or network/*__all_reduce.csv)"
        )
    return ProfileSet(
        compute=_concat(compute, _COMPUTE_COLUMNS),
        attention=_concat(attention, _ATTENTION_COLUMNS),
        allreduce=_concat(network, _ALLREDUCE_COLUMNS),
    )
