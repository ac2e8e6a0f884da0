"""The share of TTFT an offloading run's loading requests spent waiting for their loads
(docs/metrics.md, "KV offloading"), from numpy columns: `kvsim run` prints it, and a run
that computes it imports no pandas (``kvsim.analysis.table``; on the whole Mooncake
conversation trace pandas' import and the DataFrame cost 0.2 s of the 4 s process).
``kvsim.analysis.offload_tables.ttft_split`` gives the same split per request, as a
DataFrame."""

from __future__ import annotations

import numpy as np

from kvsim.analysis.table import TableLike, column


def loading_share(requests: TableLike) -> float | None:
    """Σ loading / Σ TTFT over the requests that loaded at their first admission
    (``ttft_split``): the share of their time to first token spent waiting for loads; None
    when none loaded. ``requests``: a Table or a DataFrame (``kvsim.analysis.table``): `kvsim
    run` prints it from the Table, so a run imports no pandas for it (0.2 s of the whole
    Mooncake trace's 4 s process); the same sums, in ``ttft_split``'s order, as from it."""
    loaded = column(requests, "offload_hit_tokens") > 0
    start, arrival, admit, first = (
        column(requests, name, np.float64)[loaded]
        for name in ("offload_load_start_s", "arrival_time_s", "admit_time_s", "first_token_time_s")
    )
    kept = ~(np.isnan(start) | np.isnan(admit) | np.isnan(first))  # ttft_split's dropna
    start, arrival, admit, first = start[kept], arrival[kept], admit[kept], first[kept]
    loading = admit - start
    ttft = (start - arrival) + loading + (first - admit)
    order = np.argsort(ttft, kind="stable")
    total = float(ttft[order].sum())
    return float(loading[order].sum()) / total if len(ttft) and total > 0 else None
