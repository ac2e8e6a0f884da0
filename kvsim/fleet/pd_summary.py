"""summary.json's ``fleet.pd`` section of a P/D fleet (docs/fleet.md)."""

from __future__ import annotations

from typing import Any

import numpy as np

from kvsim.analysis.load import distribution
from kvsim.analysis.table import Table
from kvsim.config import RunConfig
from kvsim.fleet.pd_pools import PDPool


def pd_section(
    requests: Table,
    config: RunConfig,
    num_prefill: int,
    num_decode: int,
    bytes_per_token: float,
    pools: tuple[PDPool, PDPool],
) -> dict[str, Any]:
    """The fleet's shape, each pool's GPU, TP, KV blocks and limits (``prefill``,
    ``decode``), the decider and link settings, and what moved: requests
    disaggregated (and their share), pulls completed, tokens and bytes moved, the pulls'
    time distribution (s: submission to completion on the decode replica's link)."""
    disaggregated = np.asarray(requests["disaggregated"], dtype=bool)
    times = np.asarray(requests["pd_transfer_time_s"], dtype=np.float64)
    done = ~np.isnan(times)
    n = len(disaggregated)
    return {
        "num_prefill_replicas": num_prefill,
        "num_decode_replicas": num_decode,
        "prefill": pools[0].describe(),
        "decode": pools[1].describe(),
        "threshold_tokens": config.pd_threshold,
        "link_gbps": config.pd_link_gbps,
        "link_latency_us": config.pd_link_latency_us,
        "kv_bytes_per_token": bytes_per_token,
        "requests_disaggregated": int(disaggregated.sum()),
        "disaggregated_share": float(disaggregated.sum() / n) if n else 0.0,
        "transfers": int(done.sum()),
        "transfer_tokens": int(np.asarray(requests["pd_transfer_tokens"])[done].sum()),
        "transfer_bytes": float(np.asarray(requests["pd_transfer_bytes"])[done].sum()),
        "transfer_time_s": distribution(times[done]),
    }
