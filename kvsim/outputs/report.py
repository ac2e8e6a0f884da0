"""report.html for one run: a summary table, the options, and every picture, in one file.

The page is self-contained: inline CSS and the pictures as base64 PNGs, no scripts, no
network, so it opens offline and can be mailed around. The pictures are ``kvsim.plots.draw``'s,
the same the CLI writes.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt

from kvsim.analysis.load import saturation_text, warnings
from kvsim.outputs.durations import duration_text
from kvsim.plots import RunTables, draw, is_v1, png_bytes
from kvsim.plots._common import write_output
from kvsim.plots.fleet import FLEET_CAPTIONS
from kvsim.plots.offload import OFFLOAD_CAPTIONS, OFFLOAD_PICTURES
from kvsim.plots.standard import default_names

CAPTIONS = {
    "occupancy": "Block occupancy: physical block id over time, coloured by owning request "
    "(small pools, few requests) or by the share of blocks in use.",
    "free-blocks": "Free KV blocks after each step; preemptions and rejections marked.",
    "kv-breakdown": "KV slots: token states, internal fragmentation (allocated, unfilled), free.",
    "gantt": "Request states: queued, prefill, decode, preempted (requests around the first "
    "preemption, or those in the window).",
    "latency": "Latency CDFs over the requests where each is defined.",
    "batch": "Sequences per step and tokens computed per step.",
    "hit-rate": "Prefix-cache hit rate of the requests first admitted in each interval, and "
    "cumulative (vLLM's prefix_cache_hit_rate: hit tokens / prompt tokens at first admission).",
    "prompt-tokens": "Prompt tokens per second served from the prefix cache (at admission) and "
    "computed (prefill chunks, recompute after preemption).",
}
# A v1 run's captions where its pictures show more (cached blocks, evictions, mixed steps).
V1_CAPTIONS = {
    "occupancy": "Block occupancy: held blocks (by owning request on small pools, black when "
    "shared by a prefix hit) and cached, evictable ones (free, keeping their prefix-cache key).",
    "free-blocks": "Free KV blocks after each step, the cached, evictable ones shaded; "
    "evictions, preemptions and rejections marked.",
    "kv-breakdown": "KV slots: token states, reservation, internal fragmentation, cached "
    "evictable blocks, free (a block shared by several requests counts once).",
    "batch": "Sequences per step (prefill, decode and mixed steps) and tokens computed per step.",
}
CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #1a202c; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 1.8em; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #cbd5e0; padding: 0.25em 0.7em; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
th { background: #edf2f7; } .tables { display: flex; gap: 2em; flex-wrap: wrap; }
img { max-width: 100%; border: 1px solid #e2e8f0; } figcaption { color: #4a5568; }
footer { margin-top: 2em; color: #718096; font-size: 0.8em; }
.warn { background: #fffaf0; border-left: 4px solid #dd6b20; padding: 0.4em 0.8em; }
"""
DISTRIBUTIONS = (
    ("queueing delay", "queueing_delay_s"),
    ("TTFT", "ttft_s"),
    ("TPOT", "tpot_s"),
    ("ITL", "itl_s"),
    ("end-to-end", "e2e_latency_s"),
)


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.4g}{unit}" if abs(value) < 1000 else f"{value:,.0f}{unit}"
    return f"{value:,}{unit}" if isinstance(value, int) else str(value)


def _table(rows: Sequence[tuple[str, ...]], header: tuple[str, ...] | None = None) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header) if header else ""
    body = "".join(
        "<tr><th>"
        + html.escape(r[0])
        + "</th>"
        + "".join(f'<td class="num">{html.escape(c)}</td>' for c in r[1:])
        + "</tr>"
        for r in rows
    )
    return f"<table>{'<tr>' + head + '</tr>' if head else ''}{body}</table>"


def summary_rows(s: dict[str, Any]) -> list[tuple[str, str]]:
    """The headline numbers of ``summary.json`` as (name, formatted value) rows."""
    rows = [
        ("requests", _fmt(s["num_requests"])),
        (
            "finished / rejected / aborted / unfinished",
            " / ".join(
                _fmt(s[k])
                for k in ("num_finished", "num_rejected", "num_aborted", "num_unfinished")
            ),
        ),
        ("KV pool", f"{s['num_blocks']:,} blocks x {s['block_size']} tokens"),
        ("simulated time", _fmt(s["sim_duration_s"], " s")),
        ("steps", _fmt(s["num_steps"])),
        (
            "throughput",
            f"{_fmt(s['throughput_requests_per_s'])} req/s, "
            f"{_fmt(s['throughput_output_tokens_per_s'])} output tok/s",
        ),
        (
            "tokens of finished requests",
            f"{_fmt(s.get('total_prompt_tokens'))} in, {_fmt(s.get('total_output_tokens'))} out",
        ),
        ("KV usage mean / peak", f"{s['kv_usage_mean']:.1%} / {s['kv_usage_peak']:.1%}"),
        ("KV allocated, not yet filled (mean)", f"{s['internal_fragmentation_mean']:.2%}"),
        ("saturation", saturation_text(s)),
        ("timing", _fmt(s.get("timing", "cost model"))),
        ("preemptions", _fmt(s["num_preemptions"])),
        (
            "mean running / mean batch / max batch",
            f"{_fmt(s['mean_running_seqs'])} / {_fmt(s['mean_batch_size'])} / "
            f"{_fmt(s['max_batch_size'])}",
        ),
        ("simulator wall time", _fmt(s.get("wall_time_s"), " s")),
    ]
    if "prefix_cache_hits" in s:  # a v1 run
        at = [r[0] for r in rows].index("saturation")
        rate = s.get("prefix_cache_hit_rate")
        rows[at:at] = [
            ("KV cached, evictable (mean)", f"{s.get('kv_cached_share_mean', 0.0):.2%}"),
            (
                "prefix cache hit rate",
                "- (prefix caching off)"
                if rate is None
                else f"{rate:.1%} ({_fmt(s['prefix_cache_hits'])} of "
                f"{_fmt(s['prefix_cache_queries'])} prompt tokens)",
            ),
            (
                "prompt tokens cached / computed / recomputed",
                f"{_fmt(s['prompt_tokens_cached'])} / {_fmt(s['prompt_tokens_computed'])} / "
                f"{_fmt(s['prompt_tokens_recomputed'])}",
            ),
            ("prefix cache evictions (blocks)", _fmt(s["prefix_cache_evictions"])),
        ]
    return rows


def _gib(nbytes: float | None) -> str:
    """Bytes in GiB, or MiB below one GiB."""
    if nbytes is None:
        return "-"
    if nbytes < 2**30:
        return f"{nbytes / 2**20:,.1f} MiB"
    return f"{nbytes / 2**30:,.2f} GiB"


def _ms(seconds: float | None) -> str:
    return duration_text(seconds)


def offload_rows(s: dict[str, Any], requests: Any = None) -> list[tuple[str, str]]:
    """An offloading run's numbers (summary.json's ``offload``; docs/metrics.md, "KV
    offloading") as (name, formatted value) rows; with ``requests``, the loading share of the
    TTFT of the requests that loaded too. Empty for a run without offload."""
    o = s.get("offload")
    if not o:
        return []
    by_source = o["prompt_tokens_by_source"]
    all_tiers, gpu = o.get("hit_rate_all_tiers"), s.get("prefix_cache_hit_rate")
    rows = [
        (
            "CPU tier",
            f"{_fmt(o['capacity_chunks'])} chunks x {o['chunk_tokens']} tokens "
            f"({_gib(o['capacity_chunks'] * o['chunk_bytes'])})",
        ),
        (
            "hit rate: all tiers / GPU only",
            " / ".join("-" if r is None else f"{r:.1%}" for r in (all_tiers, gpu)),
        ),
        (
            "prompt tokens computed / GPU hit / loaded",
            " / ".join(
                _fmt(by_source[k])
                for k in ("local_compute", "local_cache_hit", "external_kv_transfer")
            ),
        ),
        (
            "CPU tier hit rate (past the GPU hit)",
            "-"
            if o.get("external_prefix_cache_hit_rate") is None
            else f"{o['external_prefix_cache_hit_rate']:.1%} "
            f"({_fmt(o['external_prefix_cache_hits'])} of "
            f"{_fmt(o['external_prefix_cache_queries'])} tokens)",
        ),
        (
            "requests that loaded",
            f"{_fmt(o['requests_loading'])} "
            f"({_fmt(o.get('loads_slower_than_recompute'))} loads slower than recomputing)",
        ),
    ]
    for name in ("loads", "stores"):
        moved = o[name]
        t = moved["transfer_s"]
        rows.append(
            (
                f"{name}: jobs / chunks / bytes / transfer p50, p99",
                f"{_fmt(moved['jobs'])} / {_fmt(moved['chunks'])} / {_gib(moved['bytes'])} / "
                f"{_ms(t.get('p50'))}, {_ms(t.get('p99'))}",
            )
        )
    wait = o.get("load_wait_s") or {}
    rows.append(("load wait (issue to admission) p50 / p99",
                 f"{_ms(wait.get('p50'))} / {_ms(wait.get('p99'))}"))  # fmt: skip
    if requests is not None:
        from kvsim.analysis.loading_share import loading_share

        share = loading_share(requests)
        rows.append(
            ("TTFT spent loading (requests that loaded)", "-" if share is None else f"{share:.1%}")
        )
    rows += [
        (
            "tier chunks mean / peak",
            f"{_fmt(o['tier_chunks_mean'])} / {_fmt(o['tier_chunks_peak'])} "
            f"({o['tier_usage_peak']:.1%} of capacity)",
        ),
        ("tier evictions (chunks)", _fmt(o["tier_evictions"])),
    ]
    for t in o.get("tiers", ()):  # secondary tiers (--kv-offload-tier), behind the CPU tier
        name = t["tier"]
        rows += [
            (f"{name} tier: tokens served / chunks promoted", f"{_fmt(t['hit_tokens'])} / "
             f"{_fmt(t['chunks_promoted'])}"),
            (f"{name} tier: read / written", f"{_gib(t['reads']['bytes'])} / "
             f"{_gib(t['writes']['bytes'])} (read p50 {_ms(t['reads']['transfer_s'].get('p50'))})"),
            (f"{name} tier: chunks peak / evictions", f"{_fmt(t['chunks_peak'])} "
             f"({t['usage_peak']:.1%} of capacity) / {_fmt(t['evictions'])}"),
        ]  # fmt: skip
    return rows


def latency_rows(s: dict[str, Any]) -> list[tuple[str, ...]]:
    """(name, mean, p50, p90, p99) rows, each value in the unit of its size (``12.3 ms``,
    ``1.01 h``: kvsim.outputs.durations)."""
    distributions = list(DISTRIBUTIONS)
    if "prefill_time_s" in s:  # a v1 run: TTFT = queueing delay + prefill
        distributions.insert(2, ("prefill", "prefill_time_s"))
    return [
        (name, *(duration_text((s.get(key) or {}).get(q)) for q in ("mean", "p50", "p90", "p99")))
        for name, key in distributions
    ]


def _options_rows(run: Any) -> list[tuple[str, str]]:
    config = getattr(run, "config", None)
    options = config.to_dict() if config is not None else {}
    rows = [(k, _fmt(v)) for k, v in options.items() if v is not None]
    resolved = getattr(run, "resolved", None) or {}
    for key in ("num_blocks", "max_model_len", "trace_path"):
        if key in resolved:
            rows.append((f"resolved {key}", _fmt(resolved[key])))
    return rows


def build_report(
    run: RunTables,
    *,
    title: str = "kvsim run",
    names: list[str] | None = None,
    t_from: float | None = None,
    t_to: float | None = None,
    pngs: dict[str, bytes] | None = None,
) -> str:
    """The report page of ``run`` as an HTML string (pictures ``names``, default all).

    ``pngs`` maps picture names to PNG bytes already drawn (e.g. a run folder's plots/), so
    they are embedded instead of drawn again."""
    figures: list[str] = []
    offload_figures: list[str] = []  # an offloading run's, in its own section
    v1 = is_v1(run)
    if names is None:
        names = default_names(run)
    captions = {**CAPTIONS, **V1_CAPTIONS, **FLEET_CAPTIONS} if v1 else CAPTIONS
    captions = {**captions, **OFFLOAD_CAPTIONS}
    for name in names:
        if pngs is not None and name in pngs:
            data = base64.b64encode(pngs[name]).decode("ascii")
        else:
            fig = draw(run, name, t_from=t_from, t_to=t_to)
            data = base64.b64encode(png_bytes(fig)).decode("ascii")
            plt.close(fig)
        (offload_figures if name in OFFLOAD_PICTURES else figures).append(
            f'<figure><img alt="{name}" src="data:image/png;base64,{data}">'
            f"<figcaption>{html.escape(captions.get(name, name))}</figcaption></figure>"
        )
    window = ""
    if t_from is not None or t_to is not None:
        window = f"<p>Pictures over {_fmt(t_from or 0.0)} s to {_fmt(t_to)} s.</p>"
    options = _options_rows(run)
    notes = warnings(run.summary)
    offload = offload_rows(run.summary, run.requests)
    offload_section = []  # nothing at all for a run without offload: its page is as it was
    if offload:  # an offloading run (docs/metrics.md, "KV offloading")
        offload_section = ["<h2>Offload</h2>" + _table(offload) + "".join(offload_figures)]
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>",
            f"<h1>{html.escape(title)}</h1>",
            window,
            "".join(f'<p class="warn">{html.escape(n)}</p>' for n in notes),
            '<div class="tables"><div><h2>Summary</h2>',
            _table(summary_rows(run.summary)),
            "<h2>Latency</h2>",
            _table(latency_rows(run.summary), ("", "mean", "p50", "p90", "p99")),
            "</div>",
            ("<div><h2>Options</h2>" + _table(options) + "</div>") if options else "",
            "</div>",
            *offload_section,
            "<h2>Pictures</h2>",
            *figures,
            "<footer>Written by kvsim report. Definitions: docs/metrics.md.</footer>",
            "</body></html>",
        ]
    )


def write_report(run: RunTables, out: Path, **options: Any) -> Path:
    """Write ``build_report(run, **options)`` to ``out`` atomically; returns ``out``."""
    return write_output(Path(out), build_report(run, **options).encode("utf-8"))
