"""Measured operator profiles (Vidur's CSV layout): load a profile folder, check every value.

A profile folder holds up to three kinds of CSV file, named the way Vidur names them, and two
that ``kvsim profile --mode engine`` adds::

    compute/DEVICE__MODEL__mlp.csv              per-layer non-attention operators
    attention/DEVICE__MODEL__tpN__attention.csv paged attention (prefill chunks, decode batches)
    network/SYSTEM__all_reduce.csv              all-reduce by message size and worker count
    steps/DEVICE__MODEL__steps.csv              whole engine steps (kvsim.costmodel.step_profiles)
    profile.json                                how an engine profile was measured (threads,
                                                repeats, noise), read by kvsim calibrate

Statistic columns are ``time_stats.<op>.median`` in **milliseconds** (min/max/mean/std columns may
be there too and are ignored). Loading converts times to seconds, averages duplicate keys by their
median, and returns tidy DataFrames whose column names are kvsim's vocabulary. Every bad input
raises :class:`ProfileError` with one line naming the file, the line and the column.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from kvsim.costmodel.layer_shapes import LINEAR_OPS
from kvsim.costmodel.profile_checks import (
    ProfileError,
    bad_cells,
    bool_column,
    constant_column,
    dtype_bytes_column,
    head_dim_column,
    int_column,
    read_csv,
    require_columns,
    time_column,
)
from kvsim.costmodel.specio import read_json_object
from kvsim.costmodel.step_profiles import STEPS_COLUMNS, read_steps_profile

__all__ = [
    "PROFILE_META_FORMAT",
    "ProfileError",
    "ProfileSet",
    "load_profile_dir",
    "read_allreduce_profile",
    "read_attention_profile",
    "read_compute_profile",
]

PROFILE_META_FORMAT = "kvsim-profile"

_COMPUTE_NAME = re.compile(r"^(?P<device>[^_].*?)__(?P<model>.+)__mlp\.csv$")
_ATTENTION_NAME = re.compile(
    r"^(?P<device>[^_].*?)__(?P<model>.+?)__tp(?P<tp>\d+)__attention\.csv$"
)
_NETWORK_NAME = re.compile(r"^(?P<system>[^_].*?)__all_reduce\.csv$")


@dataclass(frozen=True)
class ProfileSet:
    """All profiles of one folder, times in seconds.

    compute: one row per (device, model, tp, num_tokens): the model's shape columns and one
        column per operator of LINEAR_OPS (seconds, one layer, one GPU).
    attention: one row per (device, model, tp, block_size, is_prefill, batch_size, chunk_size,
        context_len): ``time_s`` is one layer's attention kernel on one GPU.
    allreduce: one row per (system, num_workers, devices_per_node, size_bytes): ``time_s``.
    steps: one row per measured whole step (step_profiles.STEPS_COLUMNS): ``time_s``.
    root: the folder, as given; meta: its profile.json (empty without one).
    """

    compute: pd.DataFrame
    attention: pd.DataFrame
    allreduce: pd.DataFrame
    steps: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=STEPS_COLUMNS))
    root: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def devices(self) -> list[str]:
        """Device names that have compute or attention profiles (file-name prefixes)."""
        names = set(self.compute["device"]) | set(self.attention["device"])
        names |= set(self.steps["device"])
        return sorted(names)

    def for_device(self, device: str) -> ProfileSet:
        """The profiles of one device; all-reduce rows of systems whose name starts with it."""
        system_device = self.allreduce["system"].str.split("_").str[0]
        return ProfileSet(
            compute=self.compute[self.compute["device"] == device].reset_index(drop=True),
            attention=self.attention[self.attention["device"] == device].reset_index(drop=True),
            allreduce=self.allreduce[system_device == device].reset_index(drop=True),
            steps=self.steps[self.steps["device"] == device].reset_index(drop=True),
            root=self.root,
            meta=self.meta,
        )


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
    frame = read_csv(path)
    op_columns = tuple(f"time_stats.{op}.median" for op in LINEAR_OPS)
    require_columns(frame, _COMPUTE_KEYS + op_columns, path)
    heads = constant_column(frame, "n_head", path, int_column(frame, "n_head", path, minimum=1))
    kv_heads = constant_column(
        frame, "n_kv_head", path, int_column(frame, "n_kv_head", path, minimum=1)
    )
    hidden = constant_column(frame, "n_embd", path, int_column(frame, "n_embd", path, minimum=1))
    intermediate = constant_column(
        frame, "n_expanded_embd", path, int_column(frame, "n_expanded_embd", path, minimum=1)
    )
    gated = constant_column(frame, "use_gated_mlp", path, bool_column(frame, "use_gated_mlp", path))
    tp = int_column(frame, "num_tensor_parallel_workers", path, minimum=1)
    bad_cells(path, frame, "n_kv_head", heads % kv_heads != 0, "a divisor of n_head")
    bad_cells(path, frame, "num_tensor_parallel_workers", heads % tp != 0, "a divisor of n_head")
    out = pd.DataFrame(
        {
            "source": path.name,
            "device": match["device"],
            "model": match["model"],
            "tp": tp,
            "num_tokens": int_column(frame, "num_tokens", path, minimum=1),
            "num_heads": heads,
            "num_kv_heads": kv_heads,
            "hidden_size": hidden,
            "head_dim": head_dim_column(frame, path, heads, hidden),
            "intermediate_size": intermediate,
            "gated_mlp": gated,
            "dtype_bytes": dtype_bytes_column(frame, path),
        }
    )
    for op, column in zip(LINEAR_OPS, op_columns):
        out[op] = time_column(frame, column, path)
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
    frame = read_csv(path)
    require_columns(frame, _ATTENTION_KEYS, path)
    heads = int_column(frame, "n_q_head", path, minimum=1)
    kv_heads = int_column(frame, "n_kv_head", path, minimum=1)
    hidden = int_column(frame, "n_embd", path, minimum=1)
    tp = int_column(frame, "num_tensor_parallel_workers", path, minimum=1)
    bad_cells(path, frame, "num_tensor_parallel_workers", heads % tp != 0, "a divisor of n_q_head")
    prefill = bool_column(frame, "is_prefill", path)
    chunk = int_column(frame, "prefill_chunk_size", path, minimum=0)
    bad_cells(
        path,
        frame,
        "prefill_chunk_size",
        prefill & (chunk < 1),
        "a positive integer on a prefill row",
    )
    context = int_column(frame, "kv_cache_size", path, minimum=0)
    bad_cells(
        path, frame, "kv_cache_size", ~prefill & (context < 1), "a positive integer on a decode row"
    )
    prefill_s = time_column(frame, "time_stats.attn_prefill.median", path, rows=prefill)
    decode_s = time_column(frame, "time_stats.attn_decode.median", path, rows=~prefill)
    out = pd.DataFrame(
        {
            "source": path.name,
            "device": match["device"],
            "model": match["model"],
            "tp": tp,
            "num_heads": heads,
            "num_kv_heads": kv_heads,
            "hidden_size": hidden,
            "head_dim": head_dim_column(frame, path, heads, hidden),
            "dtype_bytes": dtype_bytes_column(frame, path),
            "block_size": int_column(frame, "block_size", path, minimum=1),
            "is_prefill": prefill,
            "batch_size": int_column(frame, "batch_size", path, minimum=1),
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
    frame = read_csv(path)
    require_columns(frame, _NETWORK_KEYS, path)
    if "collective" in frame.columns:
        bad_cells(path, frame, "collective", frame["collective"] != "all_reduce", "all_reduce")
    out = pd.DataFrame(
        {
            "source": path.name,
            "system": match["system"],
            "num_workers": int_column(frame, "num_workers", path, minimum=1),
            "devices_per_node": int_column(frame, "devices_per_node", path, minimum=1),
            "size_bytes": int_column(frame, "size", path, minimum=1),
            "time_s": time_column(frame, "time_stats.all_reduce.median", path),
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
    """Every profile under ``path`` (compute/, attention/, network/, steps/, profile.json); at
    least one CSV must exist."""
    root = Path(path)
    if not root.is_dir():
        raise ProfileError(
            f"{root}: not a folder (expected a profile folder: compute/, attention/, network/)"
        )
    compute = [read_compute_profile(p) for p in sorted((root / "compute").glob("*.csv"))]
    attention = [read_attention_profile(p) for p in sorted((root / "attention").glob("*.csv"))]
    network = [read_allreduce_profile(p) for p in sorted((root / "network").glob("*.csv"))]
    steps = [read_steps_profile(p) for p in sorted((root / "steps").glob("*.csv"))]
    if not (compute or attention or network or steps):
        raise ProfileError(
            f"{root}: no profiles (expected compute/*__mlp.csv, attention/*__attention.csv, "
            "network/*__all_reduce.csv or steps/*__steps.csv)"
        )
    meta: dict[str, Any] = {}
    if (root / "profile.json").exists():
        meta = read_json_object(root / "profile.json")
        if meta.get("format") != PROFILE_META_FORMAT:
            raise ProfileError(
                f"{root / 'profile.json'}: format must be {PROFILE_META_FORMAT!r}, "
                f"got {meta.get('format')!r}"
            )
    return ProfileSet(
        compute=_concat(compute, _COMPUTE_COLUMNS),
        attention=_concat(attention, _ATTENTION_COLUMNS),
        allreduce=_concat(network, _ALLREDUCE_COLUMNS),
        steps=_concat(steps, STEPS_COLUMNS),
        root=str(path),
        meta=meta,
    )
