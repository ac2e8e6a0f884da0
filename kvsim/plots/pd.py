"""A P/D fleet's picture (docs/fleet.md, "Prefill/decode disaggregation"): how long the KV
pulls took, as a distribution and against the tokens each moved (the link's formula is the
lower edge: latency + tokens x bytes per token / bandwidth; what lies above it shared the
link with other pulls)."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

BINS = 50


def draw_pd_transfer(requests: pd.DataFrame, summary: dict[str, Any]) -> Figure:
    """Histogram of pull times (ms) and pull time against tokens pulled, per decode replica,
    with the time a pull alone on the link would take."""
    pd_section = summary["fleet"]["pd"]
    pulled = requests[requests["pd_transfer_time_s"].notna()]
    times_ms = 1e3 * pulled["pd_transfer_time_s"].to_numpy(float)
    fig, (hist, scatter) = plt.subplots(1, 2, figsize=(10, 3.8))
    if len(pulled):
        hist.hist(times_ms, bins=BINS)
        for replica, rows in pulled.groupby("decode_replica", sort=True):
            scatter.scatter(rows["pd_transfer_tokens"], 1e3 * rows["pd_transfer_time_s"], s=6,
                            label=f"decode replica {replica}")  # fmt: skip
        tokens = np.linspace(0, float(pulled["pd_transfer_tokens"].max()), 50)
        alone = 1e3 * (
            pd_section["link_latency_us"] * 1e-6
            + tokens * pd_section["kv_bytes_per_token"] / (pd_section["link_gbps"] * 1e9)
        )
        scatter.plot(tokens, alone, color="black", lw=1, label="alone on the link")
        scatter.legend(fontsize="small")
    else:
        hist.text(0.5, 0.5, "no request was disaggregated", transform=hist.transAxes,
                  ha="center")  # fmt: skip
    dist = pd_section["transfer_time_s"]
    p50 = dist.get("p50") if dist else None
    note = f", p50 {1e3 * p50:.2f} ms" if p50 is not None else ""
    hist.set_title(
        f"{pd_section['transfers']} pulls{note}; "
        f"{100 * pd_section['disaggregated_share']:.0f}% of requests disaggregated",
        fontsize="medium",
    )
    hist.set_xlabel("KV pull time (ms)")
    hist.set_ylabel("requests")
    scatter.set_xlabel("tokens pulled")
    scatter.set_ylabel("KV pull time (ms)")
    fig.suptitle(
        f"--pd {pd_section['num_prefill_replicas']}:{pd_section['num_decode_replicas']}, "
        f"{pd_section['link_gbps']:g} GB/s, {pd_section['link_latency_us']:g} µs per pull"
    )
    fig.tight_layout()
    return fig
