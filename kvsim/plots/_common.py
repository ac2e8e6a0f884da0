"""Shared pieces of the plot modules: colours, thinning, windows, PNG bytes."""

from __future__ import annotations

import io
import os
from pathlib import Path

# No backend is chosen here: importing kvsim must leave a notebook's inline backend (or a
# script's choice) alone. The CLI selects Agg in kvsim.cli.main; elsewhere matplotlib's own
# choice holds, Agg where there is no display.
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from kvsim.atomic import atomic_write_bytes

MAX_POINTS = 20_000  # steps drawn at most per time series (evenly thinned)
PNG_DPI = 110
COLORS = {
    "filled": "#2b6cb0",
    "internal": "#ed8936",
    "free": "#edf2f7",
    "prefill": "#805ad5",
    "decode": "#2f855a",
    "queued": "#ecc94b",
    "preempted": "#c53030",
    "reject": "#1a202c",
    "running": "#4a5568",
    "mixed": "#d53f8c",  # v1 steps running decodes and prefill chunks together
    "cached": "#68d391",  # v1: free blocks that keep their prefix-cache key
    "evict": "#d69e2e",
    "offload": "#0987a0",  # KV offload: tokens loaded from the CPU tier, loads
    "store": "#b83280",  # KV offload: stores to the CPU tier
}


MAX_LABEL_CHARS = 24  # a request id can be any length; a tick label cannot


def text_label(value: object, max_chars: int = MAX_LABEL_CHARS) -> str:
    """``value`` as plain text for a tick label or legend: one line, cut to ``max_chars``
    (ending in an ellipsis), ``$`` escaped so that matplotlib never reads it as mathtext."""
    text = " ".join(str(value).split())
    if len(text) > max_chars:
        text = text[: max_chars - 1] + "\u2026"
    return text.replace("$", r"\$")


def thin(frame: pd.DataFrame, max_points: int = MAX_POINTS) -> pd.DataFrame:
    """At most ``max_points`` rows of ``frame``, evenly spaced, first and last kept."""
    if len(frame) <= max_points:
        return frame
    index = np.linspace(0, len(frame) - 1, max_points).astype(int)
    return frame.iloc[index]


def window(
    frame: pd.DataFrame, t_from: float | None, t_to: float | None, column: str = "time_s"
) -> pd.DataFrame:
    """Rows of ``frame`` with ``column`` (s) in [t_from, t_to]; None leaves a side open."""
    mask = np.ones(len(frame), dtype=bool)
    if t_from is not None:
        mask &= frame[column].to_numpy() >= t_from
    if t_to is not None:
        mask &= frame[column].to_numpy() <= t_to
    return frame if mask.all() else frame[mask]


def new_axes(
    title: str, xlabel: str, ylabel: str, size: tuple[float, float] = (9, 4)
) -> tuple[Figure, Axes]:
    """A constrained-layout figure with one gridded axes (size in inches)."""
    fig, ax = plt.subplots(figsize=size, layout="constrained")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def set_time_limits(ax: Axes, t_from: float | None, t_to: float | None) -> None:
    """Pin the x axis to the asked window (s), where one was asked."""
    if t_from is not None or t_to is not None:
        ax.set_xlim(left=t_from, right=t_to)


def empty_note(ax: Axes, text: str = "nothing in this window") -> None:
    """Say so on an axes that has nothing to draw, instead of leaving it blank."""
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="#718096")


def png_bytes(fig: Figure, dpi: int = PNG_DPI) -> bytes:
    """``fig`` as PNG bytes (no timestamp metadata, so the same figure gives the same bytes)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, metadata={"Software": None})
    return buffer.getvalue()


def write_output(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically, readable like any file the user makes (the
    temporary file behind ``atomic_write_bytes`` is private: mode 0600)."""
    atomic_write_bytes(path, data)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)
    return Path(path)


def save_png(fig: Figure, path: Path, dpi: int = PNG_DPI) -> Path:
    """Write ``fig`` to ``path`` atomically and close it."""
    try:
        return write_output(path, png_bytes(fig, dpi))
    finally:
        plt.close(fig)
