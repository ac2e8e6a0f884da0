"""A small block pool drawn slot by slot: which token's K/V sits in which slot of which block.

For teaching pools of a few dozen blocks (the block table walkthrough notebook): ``pool_frame``
reads a live BlockManager and its sequences, ``plot_block_pool`` draws the result.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from engine import BlockManager, Sequence
from kvsim.plots._common import COLORS, new_axes
from kvsim.plots.occupancy_map import OWNER_PALETTE

SLOT_STATES = ("written", "pending", "empty")


def pool_frame(
    block_manager: BlockManager,
    seqs: Iterable[Sequence],
    token_label: Callable[[int], str] = str,
) -> pd.DataFrame:
    """One row per slot of every block held by ``seqs``: block_id, offset, slot (flat index),
    seq_id, token_index (or -1), label, state. ``written``: the token's K/V is in the cache
    (index < cached_token_count); ``pending``: the token exists but its K/V is written by the
    next step (e.g. the token just sampled); ``empty``: allocated, no token yet."""
    bs = block_manager.block_size
    rows = []
    for seq in seqs:
        tokens = seq.token_ids
        for logical, block_id in enumerate(seq.block_table):
            for offset in range(bs):
                index = logical * bs + offset
                has_token = index < len(tokens)
                if index < seq.cached_token_count:
                    state = "written"
                else:
                    state = "pending" if has_token else "empty"
                rows.append(
                    (
                        block_id,
                        offset,
                        block_id * bs + offset,
                        seq.seq_id,
                        index if has_token else -1,
                        token_label(tokens[index]) if has_token else "",
                        state,
                    )
                )
    columns = ["block_id", "offset", "slot", "seq_id", "token_index", "label", "state"]
    return pd.DataFrame(rows, columns=columns)


def plot_block_pool(
    slots: pd.DataFrame, num_blocks: int, block_size: int, *, title: str = "KV block pool"
) -> Figure:
    """Each physical block as a row of ``block_size`` slots: free blocks grey; held slots in
    their sequence's colour (solid: K/V written, hatched: pending, white: empty), labelled
    with the token and the flat slot index."""
    cell = 0.55  # inches
    size = (2.4 + cell * block_size, 1.5 + cell * num_blocks)
    fig, ax = new_axes(title, "offset in block", "physical block", size=size)
    ax.grid(False)
    for b in range(num_blocks):
        for o in range(block_size):
            ax.add_patch(Rectangle((o, b), 1, 1, facecolor=COLORS["free"], edgecolor="white"))
    for row in slots.itertuples(index=False):
        color = OWNER_PALETTE[row.seq_id % len(OWNER_PALETTE)]
        tint = 0.45 * color + 0.55  # light enough for the labels to read
        face = {"written": tint, "pending": "white", "empty": "white"}[row.state]
        ax.add_patch(
            Rectangle(
                (row.offset, row.block_id),
                1,
                1,
                facecolor=face,
                edgecolor=color,
                lw=1.5,
                hatch="///" if row.state == "pending" else None,
            )
        )
        ax.text(
            row.offset + 0.5,
            row.block_id + 0.45,
            row.label,
            ha="center",
            va="center",
            fontsize=11,
            weight="bold",
        )
        ax.text(
            row.offset + 0.95,
            row.block_id + 0.9,
            str(row.slot),
            ha="right",
            va="bottom",
            fontsize=6,
            color="#4a5568",
        )
    owners = slots.drop_duplicates("block_id").set_index("block_id")["seq_id"]
    ax.set_yticks(
        np.arange(num_blocks) + 0.5,
        [
            f"{b}  (seq {owners[b]})" if b in owners.index else f"{b}  (free)"
            for b in range(num_blocks)
        ],
    )
    ax.set_xticks(np.arange(block_size) + 0.5, [str(o) for o in range(block_size)])
    ax.set_xlim(0, block_size)
    ax.set_ylim(num_blocks, 0)
    ax.set_aspect("equal")
    handles = [
        Patch(facecolor="#cbd5e0", edgecolor="#4a5568", label="K/V written"),
        Patch(facecolor="white", edgecolor="#4a5568", hatch="///", label="pending"),
        Patch(facecolor="white", edgecolor="#4a5568", label="empty"),
        Patch(facecolor=COLORS["free"], label="free block"),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncol=2, fontsize="small")
    return fig
