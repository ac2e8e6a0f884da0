"""The block occupancy map: physical block id x time, coloured by state or by owning request.

The map never draws one cell per block: ``kvsim.occupancy.occupancy_grid`` aggregates blocks
and time into at most ``max_rows`` x ``cols`` cells (about the figure's pixels), each holding
the share of its block-seconds in use, so 10 blocks and 100,000 blocks draw alike and fast.
With one row per block the cells can instead take the colour of the request holding the block.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.cm import ScalarMappable
from matplotlib.colors import LinearSegmentedColormap, Normalize, to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from kvsim.analysis.occupancy import (
    FREE,
    SHARED,
    OccupancyGrid,
    block_intervals,
    cached_intervals,
    occupancy_grid,
)
from kvsim.plots._common import COLORS, new_axes

# A transfer marks every cell it touches at least this strongly: loads and stores last
# milliseconds, a cell of a whole run's map seconds, so their share alone would not show.
# Stores less so: nearly every computed block is stored, and they would hide the rest.
TRANSFER_MIN_STRENGTH = {"store": 0.35, "load": 0.6}
TRANSFER_COLORS = {"store": COLORS["store"], "load": COLORS["offload"]}
TRANSFER_LABELS = {"store": "being stored to CPU", "load": "being loaded from CPU"}

STATE_CMAP = LinearSegmentedColormap.from_list(
    "kvsim_occupancy", [COLORS["free"], "#90cdf4", COLORS["filled"], "#1a365d"]
)
# Request colours, cycled by seq_id: saturated ones only, so none reads as a free block.
OWNER_PALETTE = np.concatenate(
    [colormaps[name](np.arange(colormaps[name].N))[:, :3] for name in ("tab10", "Dark2")]
)
AUTO_BY_REQUEST_MAX_BLOCKS = 256
AUTO_BY_REQUEST_MAX_REQUESTS = 50


def owner_image(grid: OccupancyGrid) -> np.ndarray:
    """RGB image (rows, cols, 3) of an owner grid: each request its palette colour; free cells
    shaded by their in-use share (a block held only briefly within a column); shared black."""
    assert grid.owner is not None, "owner colours need one row per block"
    owner = grid.owner
    free, used = np.array(to_rgb(COLORS["free"])), np.array(to_rgb(COLORS["filled"]))
    image = free + grid.share[..., None] * (used - free)
    held = owner >= 0
    image[held] = OWNER_PALETTE[owner[held] % len(OWNER_PALETTE)]
    image[owner == SHARED] = 0.0
    return np.asarray(image)


def _cached_layer(image: np.ndarray, cached: np.ndarray, where: np.ndarray | None) -> np.ndarray:
    """``image`` with each cell moved toward the cached colour by its cached share (only
    where ``where``, if given)."""
    color = np.array(to_rgb(COLORS["cached"]))
    share = cached[..., None] if where is None else (cached * where)[..., None]
    return np.asarray(np.clip(image + share * (color - image), 0.0, 1.0))


def _transfer_layers(image: np.ndarray, transfers: dict[str, np.ndarray]) -> np.ndarray:
    """``image`` with each cell a block was being stored (then loaded, drawn over) in moved
    toward that direction's colour: by the cell's transfer share, at least
    ``TRANSFER_MIN_STRENGTH`` (of the direction) wherever there was one."""
    for direction in ("store", "load"):
        share = transfers.get(direction)
        if share is None:
            continue
        floor = TRANSFER_MIN_STRENGTH[direction]
        strength = np.where(share > 0, np.maximum(share, floor), 0.0)[..., None]
        color = np.array(to_rgb(TRANSFER_COLORS[direction]))
        image = image + strength * (color - image)
    return np.asarray(np.clip(image, 0.0, 1.0))


def state_image(grid: OccupancyGrid, cached: np.ndarray) -> np.ndarray:
    """RGB image of a v1 run's grid: held share in the in-use colour, cached-evictable share
    (``cached``, a grid of the same shape) in the cached colour, the rest free."""
    free, used = np.array(to_rgb(COLORS["free"])), np.array(to_rgb(COLORS["filled"]))
    held = grid.share[..., None]
    image = free + held * (used - free)
    return _cached_layer(image, cached, None)


def plot_occupancy_grid(
    grid: OccupancyGrid,
    num_blocks: int,
    *,
    by_request: bool,
    cached: np.ndarray | None = None,
    shown_blocks: int | None = None,
    note: str = "",
    transfers: dict[str, np.ndarray] | None = None,
) -> Figure:
    """Draw an ``OccupancyGrid`` (see ``plot_occupancy``); ``cached``: a v1 run's grid of
    cached-evictable shares (``cached_intervals``), drawn in its own colour. A grid of a
    sample of blocks spans the pool's ``shown_blocks`` on the y axis; ``note`` (what was
    sampled) goes into the title. ``transfers``: a KV offloading run's grids of the share of
    each cell its blocks were being stored (``"store"``) or loaded (``"load"``), marked in
    their colours over the rest."""
    fig, ax = new_axes("", "simulated time (s)", "physical block id", size=(10, 5))
    ax.grid(False)
    t_from, t_to = float(grid.time_edges[0]), float(grid.time_edges[-1])
    num_blocks = shown_blocks or num_blocks
    extent = (t_from, t_to, num_blocks - 0.5, -0.5)
    rows = len(grid.row_edges) - 1
    per_row = (
        f"one row per {num_blocks / rows:,.3g} blocks" if rows < num_blocks else "one row per block"
    )
    if by_request:
        rgb = owner_image(grid)
        handles = [
            Patch(color=COLORS["free"], label="free"),
            Patch(color=OWNER_PALETTE[0], label="in use (colour: request)"),
        ]
        if cached is not None:
            assert grid.owner is not None
            rgb = _cached_layer(rgb, cached, grid.owner == FREE)
            handles += [
                Patch(color=COLORS["cached"], label="cached, evictable"),
                Patch(color="black", label="shared (prefix hit)"),
            ]
        if transfers:
            rgb = _transfer_layers(rgb, transfers)
            handles += _transfer_handles(transfers)
        ax.imshow(rgb, aspect="auto", extent=extent, interpolation="nearest")
        fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize="small")
    elif cached is not None:
        rgb = state_image(grid, cached)
        handles = [
            Patch(color=COLORS["filled"], label="held (shade: share of the cell)"),
            Patch(color=COLORS["cached"], label="cached, evictable"),
            Patch(color=COLORS["free"], label="free"),
        ]
        if transfers:
            rgb = _transfer_layers(rgb, transfers)
            handles += _transfer_handles(transfers)
        ax.imshow(rgb, aspect="auto", extent=extent, interpolation="nearest")
        fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize="small")
    elif transfers:  # no cached layer: the share colours as RGB, the transfers over them
        rgb = _transfer_layers(STATE_CMAP(grid.share)[..., :3], transfers)
        ax.imshow(rgb, aspect="auto", extent=extent, interpolation="nearest")
        mappable = ScalarMappable(Normalize(0.0, 1.0), STATE_CMAP)
        fig.colorbar(mappable, ax=ax, label="share of blocks in use", fraction=0.05, pad=0.01)
        handles = _transfer_handles(transfers)
        fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize="small")
    else:
        image = ax.imshow(
            grid.share,
            aspect="auto",
            extent=extent,
            interpolation="nearest",
            cmap=STATE_CMAP,
            vmin=0.0,
            vmax=1.0,
        )
        fig.colorbar(image, ax=ax, label="share of blocks in use", fraction=0.05, pad=0.01)
    title = f"Block occupancy: {num_blocks:,} blocks, {per_row}"
    ax.set_title(f"{title}\n({note})" if note else title)
    if num_blocks <= 16:
        ax.set_yticks(np.arange(num_blocks))
    return fig


def _transfer_handles(transfers: dict[str, np.ndarray]) -> list[Patch]:
    return [
        Patch(color=TRANSFER_COLORS[d], label=TRANSFER_LABELS[d])
        for d in ("store", "load")
        if d in transfers and transfers[d].any()
    ]


def transfer_grids(
    events: pd.DataFrame,
    num_blocks: int,
    t_from: float,
    t_to: float,
    *,
    max_rows: int = 400,
    cols: int = 800,
    end_s: float | None = None,
) -> dict[str, np.ndarray]:
    """A KV offloading run's transfers as grids of ``occupancy_grid``'s shape: per direction
    (``"store"``, ``"load"``) the share of each cell's block-seconds its blocks were being
    stored or loaded (``OFFLOAD_*`` issue to completion seen:
    ``kvsim.analysis.offload_tables.transfer_intervals``). Empty without such events."""
    from kvsim.analysis.offload_tables import has_offload_events, transfer_intervals

    if not has_offload_events(events):
        return {}
    intervals = transfer_intervals(events, end_s)
    grids = {}
    for direction, rows in intervals.groupby("direction", sort=False):
        grid = occupancy_grid(rows, num_blocks, t_from, t_to, max_rows=max_rows, cols=cols)
        grids[str(direction)] = grid.share
    return grids


def plot_occupancy(
    events: pd.DataFrame,
    num_blocks: int,
    *,
    t_from: float | None = None,
    t_to: float | None = None,
    by_request: bool | None = None,
    max_rows: int = 400,
    cols: int = 800,
    end_s: float | None = None,
    intervals: pd.DataFrame | None = None,
    shown_blocks: int | None = None,
    note: str = "",
) -> Figure:
    """Block occupancy map of a run over [t_from, t_to] (s; default the whole run, ending at
    ``end_s`` or the last event). ``by_request``: colour held blocks by owning request
    (default: when the pool has at most 256 blocks); otherwise by the share of blocks in use
    per cell. Pass ``intervals`` (``block_intervals``) to reuse a reconstruction. A v1 run with
    prefix caching (``CACHE`` events) also draws its cached, evictable blocks, and a KV
    offloading run (``OFFLOAD_*`` events) the blocks being stored or loaded. ``shown_blocks``
    and ``note``: for events of a sample of blocks (``plot_occupancy_grid``)."""
    if intervals is None:
        intervals = block_intervals(events, end_s)
    if end_s is None:
        end_s = float(events["time_s"].max()) if len(events) else 1.0
    lo = 0.0 if t_from is None else t_from
    hi = end_s if t_to is None else t_to
    if hi <= lo:
        hi = lo + 1.0
    if by_request is None:
        live = (intervals["end_s"] > lo) & (intervals["start_s"] < hi)
        by_request = (
            num_blocks <= min(AUTO_BY_REQUEST_MAX_BLOCKS, max_rows)
            and intervals.loc[live, "seq_id"].nunique() <= AUTO_BY_REQUEST_MAX_REQUESTS
        )
    grid = occupancy_grid(intervals, num_blocks, lo, hi, max_rows=max_rows, cols=cols)
    cached = None
    if len(events) and (events["kind"] == "CACHE").any():
        evictable = cached_intervals(events, num_blocks, end_s)
        cached = occupancy_grid(evictable, num_blocks, lo, hi, max_rows=max_rows, cols=cols).share
    by_request = by_request and grid.owner is not None
    transfers = transfer_grids(
        events, num_blocks, lo, hi, max_rows=max_rows, cols=cols, end_s=end_s
    )
    return plot_occupancy_grid(
        grid, num_blocks, by_request=by_request, cached=cached, shown_blocks=shown_blocks,
        note=note, transfers=transfers or None,
    )  # fmt: skip
