"""The block pool over time as an animation (GIF through pillow, MP4 when ffmpeg exists).

Each frame shows the pool at one instant: blocks laid out row by row in a grid, coloured by
owning request (small pools) or in use / free; pools with more blocks than ``MAX_CELLS``
aggregate consecutive blocks into one cell shaded by the share in use. Below it, free blocks
over the window with a cursor at the frame's time. Ownership comes from
``kvsim.occupancy.block_intervals`` (the event stream), never from the engine.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib import animation
from matplotlib.colors import to_rgb

from kvsim.analysis.occupancy import FREE, block_intervals, owners_at
from kvsim.errors import KvsimError
from kvsim.plots._common import COLORS, thin, write_output  # also selects the Agg backend
from kvsim.plots.occupancy_map import OWNER_PALETTE, STATE_CMAP

MAX_CELLS = 64 * 128  # cells of the pool picture; larger pools aggregate blocks per cell
BY_REQUEST_MAX_BLOCKS = 1024
MAX_FRAMES = 2000
SUFFIXES = (".gif", ".mp4")


class AnimationError(KvsimError):
    """The animation cannot be written (bad window, frame count, format or missing ffmpeg)."""


def _layout(num_cells: int) -> tuple[int, int]:
    """(rows, cols) of a grid about twice as wide as tall holding ``num_cells`` cells."""
    cols = max(1, math.ceil(math.sqrt(2 * num_cells)))
    return math.ceil(num_cells / cols), cols


def pool_image(owner: np.ndarray, by_request: bool) -> np.ndarray:
    """RGB image (rows, cols, 3) of the pool from each block's owner (``owners_at``)."""
    num_blocks = len(owner)
    per_cell = max(1, math.ceil(num_blocks / MAX_CELLS))
    used = (owner != FREE).astype(np.float64)
    if per_cell > 1:
        pad = (-num_blocks) % per_cell
        share = np.concatenate([used, np.zeros(pad)]).reshape(-1, per_cell).sum(axis=1)
        share /= np.minimum(per_cell, num_blocks - per_cell * np.arange(len(share)))
        rgb = STATE_CMAP(share)[:, :3]
    elif by_request:
        rgb = np.tile(to_rgb(COLORS["free"]), (num_blocks, 1))
        held = owner >= 0
        rgb[held] = OWNER_PALETTE[owner[held] % len(OWNER_PALETTE)]
        rgb[owner < FREE] = 0.0  # shared
    else:
        rgb = STATE_CMAP(used * 0.8)[:, :3]
    rows, cols = _layout(len(rgb))
    image = np.ones((rows * cols, 3))
    image[: len(rgb)] = rgb
    return image.reshape(rows, cols, 3)


def _check(out: Path, t_from: float, t_to: float, frames: int) -> None:
    if out.suffix not in SUFFIXES:
        raise AnimationError(f"{out}: write a .gif or an .mp4, not {out.suffix or 'no suffix'!r}")
    if out.suffix == ".mp4" and not animation.writers.is_available("ffmpeg"):
        raise AnimationError(f"{out}: mp4 needs ffmpeg on PATH (not found); write a .gif instead")
    if not t_to > t_from:
        raise AnimationError(f"empty time window: from {t_from} s to {t_to} s")
    if not 1 <= frames <= MAX_FRAMES:
        raise AnimationError(f"frames must be in 1..{MAX_FRAMES}, got {frames}")


def animate_occupancy(
    events: pd.DataFrame,
    num_blocks: int,
    out: Path,
    *,
    t_from: float | None = None,
    t_to: float | None = None,
    frames: int = 60,
    fps: int = 10,
    by_request: bool | None = None,
    end_s: float | None = None,
) -> Path:
    """Write an animation of the pool over [t_from, t_to] (s; default the whole run, ending at
    ``end_s`` or the last event) with ``frames`` evenly spaced frames at ``fps`` to ``out``
    (.gif, or .mp4 with ffmpeg), atomically. Returns ``out``."""
    out = Path(out)
    end = float(events["time_s"].max()) if end_s is None else end_s
    lo, hi = (0.0 if t_from is None else t_from), (end if t_to is None else t_to)
    _check(out, lo, hi, frames)
    intervals = block_intervals(events, end)
    if by_request is None:
        by_request = num_blocks <= BY_REQUEST_MAX_BLOCKS
    times = np.linspace(lo, hi, frames)
    fig, image_artist, cursor, title = _figure(events, num_blocks, lo, hi)

    def draw(i: int) -> list[Any]:
        owner = owners_at(intervals, float(times[i]), num_blocks)
        image_artist.set_data(pool_image(owner, by_request))
        cursor.set_xdata([times[i], times[i]])
        used = int((owner != FREE).sum())
        title.set_text(f"t = {times[i]:.2f} s   {used:,} / {num_blocks:,} blocks in use")
        return [image_artist, cursor, title]

    anim = animation.FuncAnimation(fig, draw, frames=frames, blit=False)
    writer = (
        animation.PillowWriter(fps=fps) if out.suffix == ".gif" else animation.FFMpegWriter(fps)
    )
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"animation{out.suffix}"
            anim.save(path, writer=writer, dpi=90)
            write_output(out, path.read_bytes())
    finally:
        plt.close(fig)
    return out


def events_in_window(events: pd.DataFrame, lo: float, hi: float) -> int:
    """How many events fall in [lo, hi] (s): none means every frame shows the same pool."""
    t = events["time_s"].to_numpy()
    return int(np.count_nonzero((t >= lo) & (t <= hi)))


def free_blocks_over(
    events: pd.DataFrame, num_blocks: int, lo: float, hi: float
) -> tuple[np.ndarray, np.ndarray]:
    """Free blocks over [lo, hi] as step points (times s, counts): the count the window
    starts with (the last event's before ``lo``; all blocks before the first event), each
    event's in the window (thinned), and the last count held to ``hi``. A window without
    events is one flat line, not an empty panel."""
    t = events["time_s"].to_numpy()
    before = np.flatnonzero(t < lo)
    start = int(events["free_blocks"].iloc[before[-1]]) if len(before) else num_blocks
    inside = thin(events[(t >= lo) & (t <= hi)])
    times = np.concatenate([[lo], inside["time_s"].to_numpy(dtype=float), [hi]])
    counts = inside["free_blocks"].to_numpy(dtype=float)
    last = counts[-1] if len(counts) else start
    return times, np.concatenate([[start], counts, [last]])


def _figure(events: pd.DataFrame, num_blocks: int, lo: float, hi: float) -> tuple[Any, ...]:
    fig, (pool_ax, free_ax) = plt.subplots(
        2, 1, figsize=(8, 5.5), height_ratios=(3, 1), layout="constrained"
    )
    rows, cols = _layout(min(num_blocks, MAX_CELLS))
    image_artist = pool_ax.imshow(np.ones((rows, cols, 3)), interpolation="nearest", aspect="auto")
    pool_ax.set_xticks([])
    pool_ax.set_yticks([])
    if rows * cols <= BY_REQUEST_MAX_BLOCKS:  # cell borders, while cells are big enough
        pool_ax.set_xticks(np.arange(-0.5, cols), minor=True)
        pool_ax.set_yticks(np.arange(-0.5, rows), minor=True)
        pool_ax.tick_params(which="minor", length=0)
        pool_ax.grid(which="minor", color="white", lw=0.6)
    per_cell = max(1, math.ceil(num_blocks / MAX_CELLS))
    pool_ax.set_xlabel(
        f"{num_blocks:,} blocks, row by row" + (f", {per_cell} per cell" if per_cell > 1 else "")
    )
    title = pool_ax.set_title("")
    t, free = free_blocks_over(events, num_blocks, lo, hi)
    free_ax.step(t, free, where="post", color=COLORS["filled"], lw=0.8)
    free_ax.set_xlim(lo, hi)
    free_ax.set_ylim(0, num_blocks * 1.05)
    free_ax.set_ylabel("free blocks")
    free_ax.set_xlabel("simulated time (s)")
    free_ax.grid(alpha=0.3)
    cursor = free_ax.axvline(lo, color=COLORS["preempted"], lw=1.2)
    return fig, image_artist, cursor, title
