"""The terminal summary of ``kvsim run``: counts, throughput, latencies (each in the unit of its
size: kvsim.outputs.durations), KV memory, and
the warnings that say when the numbers mean less than they seem."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from kvsim.commands.console import console, plain, say
from kvsim.outputs.durations import duration_text

LATENCIES = (
    ("TTFT", "ttft_s"),
    ("TPOT", "tpot_s"),
    ("ITL", "itl_s"),
    ("end-to-end", "e2e_latency_s"),
    ("queueing", "queueing_delay_s"),
    ("prefill", "prefill_time_s"),  # v1 runs: TTFT = queueing + prefill
)


def _pool(s: dict[str, Any], allocator: str) -> str:
    slots = s["num_blocks"] * s["block_size"]
    if allocator != "paged":  # contiguous reservations work at slot granularity
        return f"{slots:,} slots, contiguous ({allocator} reservations)"
    return f"{s['num_blocks']:,} blocks x {s['block_size']} tokens ({slots:,} slots)"


def summary_rows(
    s: dict[str, Any], allocator: str = "paged", requests: Any = None
) -> list[tuple[str, str]]:
    """(name, value) rows of the headline numbers of ``summary.json``; an offloading run's
    rows after its prefix-cache line (``requests``: for its TTFT loading share)."""
    from kvsim.analysis.kv_breakdown import SUMMARY_FIELDS as BREAKDOWN_FIELDS
    from kvsim.analysis.load import saturation_text

    counts = (
        f"{s['num_requests']:,}: {s['num_finished']:,} finished, {s['num_rejected']:,} "
        f"rejected, {s['num_aborted']:,} aborted, {s['num_unfinished']:,} unfinished"
    )
    v1 = "prefix_cache_hits" in s
    breakdown_name = "KV slots: tokens / reserved / never used / ext. frag / free"
    breakdown = [s[k] for k in BREAKDOWN_FIELDS]
    if v1:  # the cached-evictable share sits before free
        breakdown_name = (
            "KV slots: tokens / reserved / never used / ext. frag / cached, evictable / free"
        )
        breakdown.insert(len(breakdown) - 1, s.get("kv_cached_share_mean", 0.0))
    rows = [
        ("requests", counts),
        ("KV pool", _pool(s, allocator)),
        ("simulated time", f"{s['sim_duration_s']:,.3f} s"),
        ("throughput", f"{s['throughput_requests_per_s']:.2f} req/s, "
                       f"{s['throughput_output_tokens_per_s']:,.0f} output tok/s, "
                       f"{s['throughput_total_tokens_per_s']:,.0f} total tok/s"),
        ("tokens (finished requests)", f"{s.get('total_prompt_tokens', 0):,} in, "
                                       f"{s.get('total_output_tokens', 0):,} out"),
        ("KV usage mean / peak", f"{s['kv_usage_mean']:.1%} / {s['kv_usage_peak']:.1%}"),
        ("KV allocated, not yet filled (mean)", f"{s['internal_fragmentation_mean']:.2%}"),
        (breakdown_name, " / ".join(f"{v:.1%}" for v in breakdown)),
        ("preemptions", f"{s['num_preemptions']:,}"),
        ("saturation", saturation_text(s)),
        ("mean running sequences", f"{s['mean_running_seqs']:.1f}"),
        ("simulator wall time",
         f"{s['wall_time_s']:.2f} s ({s['sim_steps_per_wall_s']:,.0f} steps/s)"),
    ]  # fmt: skip
    if v1:
        at = rows.index(("preemptions", f"{s['num_preemptions']:,}"))
        rows[at:at] = [_hit_rate_row(s), *_offload_rows(s, requests)]
    if "fleet" in s:
        rows[1:2] = _fleet_rows(s)
    return rows


def _fleet_rows(s: dict[str, Any]) -> list[tuple[str, str]]:
    """A fleet's pool (per replica) and its router, spread and per-replica hit rates."""
    fleet = s["fleet"]
    replica = s["replicas"][0]
    rates = ["-" if r is None else f"{r:.1%}" for r in fleet["prefix_cache_hit_rate_per_replica"]]
    weights = f" ({fleet['router_weights']})" if fleet.get("router_weights") else ""
    delay = fleet["router_event_delay_s"]
    events = "caches read directly" if fleet["router_oracle"] else f"KV events {delay:g} s late"
    if fleet.get("router_speculative_ttl_s"):
        events += f", routed prompts held {fleet['router_speculative_ttl_s']:g} s (speculative)"
    pd = fleet.get("pd")
    shape = (
        _pd_shape(s["replicas"], pd)
        if pd
        else f"{fleet['num_replicas']} replicas x {_pool(replica, 'paged')}"
    )
    return [
        ("fleet", shape),
        ("router", f"{fleet['router']}{weights}, {events}"),
        ("requests per replica", " / ".join(f"{n:,}" for n in fleet["requests_per_replica"])
         + f" (CV {fleet['requests_cv']:.2f}; busy time CV {fleet['busy_time_cv']:.2f})"),
        ("hit rate per replica", " / ".join(rates)),
        *(_pd_rows(pd) if pd else []),
    ]  # fmt: skip


def _pd_shape(replicas: list[dict[str, Any]], pd: dict[str, Any]) -> str:
    """A P/D fleet's pools: prefill replicas first (summary.json's ``replicas`` order), each
    pool with its own KV pool (and its GPU x TP when the pools differ)."""
    num_prefill = pd["num_prefill_replicas"]
    hardware = [(h["tp"], h["gpu"]) if h else None for h in (pd.get("prefill"), pd.get("decode"))]
    differ = hardware[0] != hardware[1]
    parts = []
    for name, pool, gpus in (
        ("prefill", replicas[:num_prefill], hardware[0]),
        ("decode", replicas[num_prefill:], hardware[1]),
    ):
        on = f" ({gpus[0]} x {gpus[1]})" if differ and gpus else ""
        parts.append(f"{len(pool)} {name}{on} x {_pool(pool[0], 'paged')}" if pool else "")
    return " + ".join(p for p in parts if p)


def _pd_rows(pd: dict[str, Any]) -> list[tuple[str, str]]:
    """A P/D fleet's lines (summary.json ``fleet.pd``; docs/fleet.md): llm-d's decider,
    the pulls and their time on the decode replicas' links."""
    times = pd.get("transfer_time_s") or {}
    return [
        ("P/D disaggregated",
         f"{pd['requests_disaggregated']:,} requests ({pd['disaggregated_share']:.1%}: the decode "
         f"replica's uncached prompt >= {pd['threshold_tokens']:,} tokens)"),
        ("P/D KV pulls",
         f"{pd['transfers']:,} of {pd['transfer_tokens']:,} tokens, "
         f"{_gib(round(pd['transfer_bytes']))} ({pd['kv_bytes_per_token']:,.0f} B/token over "
         f"{pd['link_gbps']:g} GB/s + {pd['link_latency_us']:g} us links)"),
        ("P/D pull time p50 / p99",
         " / ".join(duration_text(times.get(q)) for q in ("p50", "p99"))),
    ]  # fmt: skip


def _gib(nbytes: int | None) -> str:
    """Bytes in GiB, or MiB below one GiB."""
    if nbytes is None:
        return "-"
    if nbytes < 2**30:
        return f"{nbytes / 2**20:,.1f} MiB"
    return f"{nbytes / 2**30:,.2f} GiB"


def _offload_rows(s: dict[str, Any], requests: Any) -> list[tuple[str, str]]:
    """An offloading run's lines (summary.json ``offload``; docs/metrics.md, "KV offloading"):
    the hit rate with the CPU tier against the GPU's alone, the loads, the bytes moved each
    way and the share of the loading requests' TTFT spent waiting for loads."""
    o = s.get("offload")
    if not o:
        return []
    rate = o.get("hit_rate_all_tiers")
    gpu = s.get("prefix_cache_hit_rate")
    loaded = o["prompt_tokens_by_source"]["external_kv_transfer"]
    rows = [
        ("hit rate all tiers / GPU only",
         " / ".join("-" if r is None else f"{r:.1%}" for r in (rate, gpu))
         + f" ({loaded:,} prompt tokens loaded from the CPU tier)"),
        ("offload loads",
         f"{o['loads']['jobs']:,} ({o['requests_loading']:,} requests loaded at first "
         f"admission; {o.get('loads_slower_than_recompute', 0):,} loads slower than "
         "recomputing)"),
        ("offload bytes loaded / stored",
         f"{_gib(o['loads']['bytes'])} / {_gib(o['stores']['bytes'])} "
         f"({o['tier_evictions']:,} chunks evicted from the tier)"),
    ]  # fmt: skip
    for t in o.get("tiers", ()):
        rows.append(
            (f"{t['tier']} tier: hit tokens / read / written",
             f"{t['hit_tokens']:,} / {_gib(t['reads']['bytes'])} / {_gib(t['writes']['bytes'])} "
             f"({t['chunks_peak']:,} of {t['capacity_chunks']:,} chunks at peak, "
             f"{t['evictions']:,} evicted)")
        )  # fmt: skip
    if requests is not None:
        from kvsim.analysis.loading_share import loading_share

        share = loading_share(requests)
        value = "- (no request loaded)" if share is None else f"{share:.1%}"
        rows.append(("TTFT spent loading (requests that loaded)", value))
    return rows


def _hit_rate_row(s: dict[str, Any]) -> tuple[str, str]:
    """The prefix-cache line of a v1 run: vLLM's hit rate, its tokens, evictions."""
    rate = s.get("prefix_cache_hit_rate")
    if rate is None:
        return ("prefix cache hit rate", "- (prefix caching off)")
    value = (
        f"{rate:.1%} ({s['prefix_cache_hits']:,} of {s['prefix_cache_queries']:,} prompt "
        f"tokens; {s['prefix_cache_evictions']:,} blocks evicted)"
    )
    return ("prefix cache hit rate", value)


def print_summary(
    s: dict[str, Any],
    out_dir: object,
    allocator: str = "paged",
    option_warnings: list[str] | tuple[str, ...] = (),
    requests: Any = None,
) -> None:
    """Print ``summary.json`` ``s`` of the run written to ``out_dir``, then the run's warnings:
    ``option_warnings`` (what-if settings, from config.json's ``resolved.warnings``) first.
    ``requests`` (requests.parquet's rows): an offloading run's TTFT loading share."""
    table = Table(title="kvsim run", show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in summary_rows(s, allocator, requests):
        table.add_row(name, value)
    console.print(table)
    latencies = Table(title=f"latency ({s.get('timing', 'cost model')})", header_style="bold")
    for column in ("", "mean", "p50", "p90", "p99"):
        latencies.add_column(column, justify="right" if column else "left")
    for name, key in LATENCIES:
        if key not in s:
            continue  # prefill_time_s: v1 runs only
        d = s.get(key) or {}
        latencies.add_row(name, *(duration_text(d.get(q)) for q in ("mean", "p50", "p90", "p99")))
    console.print(latencies)
    from kvsim.analysis.load import warnings

    for line in [*option_warnings, *warnings(s)]:
        say("warning: ", plain(line), style="yellow")
    say("run folder: ", out_dir)
