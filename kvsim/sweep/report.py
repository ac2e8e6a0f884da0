"""report.md and report.html of a sweep folder: the best points in words, the figures, every
point's numbers (failed points with their error) and the command that reproduces the sweep.

report.html is one self-contained file (figures embedded as base64 PNGs, inline CSS), readable
without a server; report.md shows the same figures from plots/*.png.
"""

from __future__ import annotations

import base64
import html
import io
import math
import shlex
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from kvsim.sweep import slo as slos
from kvsim.sweep.cache_bound import bound_lines
from kvsim.sweep.compare import (
    Comparison,
    best_by_rate,
    labelled,
    recommendations,
    recommended_block_sizes,
    value_text,
    verdicts,
)
from kvsim.sweep.offload_advice import TABLE_HEAD, table_rows, tier_advice
from kvsim.sweep.plots import sweep_figures
from kvsim.sweep.spec import KV_SLOTS
from kvsim.sweep.table import SweepResult, max_rates

CAPTIONS = {
    "throughput": "Throughput: finished requests and generated tokens per simulated second.",
    "latency": "Latency percentiles over requests: time to first token, time per output token "
    "and end-to-end latency.",
    "normalized_latency": "Normalized latency (vLLM paper): the mean over finished requests of "
    "end-to-end latency divided by output tokens.",
    "memory": "Where the KV slots go, averaged over busy time: token states, reservation for "
    "tokens still to come, internal fragmentation (held, never used), external fragmentation "
    "(free holes too small for the waiting request) and free.",
    "batch": "Batch size per step and preemptions.",
    "prefix_cache": "The block-size trade-off: prefix-cache hit rate (prompt tokens served "
    "from cache, first admissions; only full blocks are cached, so it falls as blocks grow), "
    "TTFT, and the block-table walk's share of busy time (one entry per block in use: it "
    "grows as blocks shrink).",
    "slo": "Latency at the SLO percentile against the request rate (log scale); dotted: the SLO.",
}
# Columns of the points table: (sweep.csv column, heading, format).
POINT_COLUMNS = (
    ("throughput_requests_per_s", "req/s", "{:.3f}"),
    ("throughput_output_tokens_per_s", "out tok/s", "{:,.0f}"),
    ("ttft_s_p50", "TTFT p50 s", "{:.3f}"),
    ("ttft_s_p99", "TTFT p99 s", "{:.3f}"),
    ("tpot_s_p50", "TPOT p50 s", "{:.4f}"),
    ("tpot_s_p99", "TPOT p99 s", "{:.4f}"),
    ("e2e_latency_s_p50", "e2e p50 s", "{:.2f}"),
    ("e2e_latency_s_p99", "e2e p99 s", "{:.2f}"),
    ("normalized_latency_s_per_token", "norm. s/tok", "{:.4f}"),
    ("prefix_cache_hit_rate", "prefix hit rate", "{:.1%}"),
    ("block_walk_share", "block walk", "{:.1%}"),
    ("kv_token_state_share_mean", "token states", "{:.1%}"),
    ("num_preemptions", "preempt.", "{:,.0f}"),
    ("mean_batch_size", "mean batch", "{:.1f}"),
    ("max_batch_size", "max batch", "{:,.0f}"),
    ("num_blocks", "blocks", "{:,.0f}"),
    ("sim_wall_s", "sim wall s", "{:.2f}"),
)


BOUND_INTRO = (
    "Simulated prefix-cache hit rates beside the offline cache curve of the trace at the same "
    "block size and capacity (kvsim cache-curve: a cache holding only prefix blocks, one "
    "request at a time; the simulated pool also holds running requests' blocks, so it sits "
    "at or below LRU when they crowd it):"
)


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def _fmt(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def _points_rows(table: pd.DataFrame, axes: tuple[str, ...]) -> tuple[list[str], list[list[str]]]:
    head = ["#", *axes, "status", *(h for _, h, _ in POINT_COLUMNS)]
    rows = []
    verdict = verdicts(table)
    for i, r in table.iterrows():
        status = str(r["status"])
        if verdict[i] and verdict[i] != "stable":
            status += f", {verdict[i]}"
        if "slo_met" in table and r["status"] == "ok":
            status += ", SLO met" if r["slo_met"] else ", SLO missed"
        cells = [str(r["point"]), *(value_text(a, r[a]) for a in axes), status]
        cells += [_fmt(r.get(c), f) for c, _, f in POINT_COLUMNS]
        rows.append(cells)
    return head, rows


def _memory_note(result: SweepResult) -> str:
    base = result.spec.base
    swept = dict(result.spec.axes).get(KV_SLOTS)
    if swept is not None:
        return (
            f"KV capacity swept: {', '.join(f'{v:,}' for v in swept)} tokens, the same bytes "
            "at every block size (num_blocks = capacity / block size; kv_cache_gib in "
            "sweep.csv)."
        )
    if result.spec.kv_slots is not None:
        return (
            f"KV memory held at {result.spec.kv_slots:,} slots (num_blocks = slots / block size)."
        )
    if base.num_blocks is not None:
        return f"KV pool: {base.num_blocks:,} blocks of {base.block_size} tokens."
    return (
        f"KV memory planned from GPU memory ({base.model} on {base.tp} x {base.gpu}, "
        f"gpu_memory_utilization {base.gpu_memory_utilization}): num_blocks follows the block "
        "size, the slots stay (nearly) the same. Every allocator gets the same slots."
    )


def _facts(result: SweepResult) -> list[str]:
    t, spec = result.table, result.spec
    failed = result.num_failed
    axes = (
        ", ".join(f"{n} ∈ {{{', '.join(value_text(n, x) for x in v)}}}" for n, v in spec.axes)
        or "none"
    )
    return [
        f"Trace: {spec.base.trace}; {spec.base.model} on {spec.base.tp} x {spec.base.gpu}.",
        f"{len(t)} points ({failed} failed); swept: {axes}.",
        _memory_note(result),
        f"Sweep wall time {result.wall_s:.1f} s.",
    ]


def _slo_lines(result: SweepResult) -> list[str]:
    spec = result.spec
    if "rate" not in spec.axis_names:
        return []
    lines = [f"SLO: {slos.slo_text(spec)}."]
    rates = max_rates(result.table, spec)
    for _, r in rates.iterrows():
        who = labelled({k: r[k] for k in rates.columns if k != "max_rate"})
        rate = r["max_rate"]
        verdict = (
            f"highest rate meeting the SLO: {rate:g} requests/s"
            if rate is not None and not pd.isna(rate)
            else "no swept rate meets the SLO"
        )
        lines.append(f"{who + ': ' if who else ''}{verdict}.")
    return lines


def write_report(result: SweepResult, folder: Path) -> None:
    """Write plots/*.png, report.md and report.html into ``folder``."""
    spec = result.spec
    slo = _figure_slo(spec)
    ok = result.table[result.table["status"] == "ok"]
    figures = sweep_figures(result.table, spec.axis_names, slo=slo) if len(ok) else {}
    pngs = {name: _png(fig) for name, fig in figures.items()}
    (folder / "plots").mkdir(exist_ok=True)
    for name, data in pngs.items():
        (folder / "plots" / f"{name}.png").write_bytes(data)
    best = best_by_rate(result.table, spec)
    command = shlex.join(result.command)
    bounds = bound_lines(result.table, spec)
    (folder / "report.md").write_text(
        _markdown(result, best, pngs, command, bounds), encoding="utf-8"
    )
    (folder / "report.html").write_text(
        _html(result, best, pngs, command, bounds), encoding="utf-8"
    )


def _figure_slo(spec: Any) -> tuple[int, float | None, float | None]:
    """(percentile, TTFT bound, TPOT bound) of the SLO the points are judged by, for the
    rate sweep's figure."""
    bounds = {b.metric: b for b in slos.bounds(spec)}
    percentile = next(iter(bounds.values())).percentile
    ttft, tpot = bounds.get("ttft"), bounds.get("tpot")
    return (
        percentile,
        None if ttft is None else ttft.bound_s,
        None if tpot is None else tpot.bound_s,
    )


def _best_lines(best: list[Comparison]) -> list[tuple[str, str, str]]:
    """(group heading, objective, point and value) rows; a group's note as a row too."""
    rows = []
    for c in best:
        head = f"at {labelled(c.group)}" if c.group else ""
        if c.note is not None:
            rows.append((head, "", c.note))
        rows += [(head, b.objective, f"{b.label} ({b.value})") for b in c.best]
    return rows


def _markdown(
    result: SweepResult,
    best: list[Comparison],
    pngs: dict[str, bytes],
    command: str,
    bounds: list[str],
) -> str:
    out = [f"# kvsim sweep: {result.spec.base.trace}", ""]
    out += [f"- {line}" for line in _facts(result)]
    out += ["", "## Reproduce", "", "```sh", command, "```", ""]
    out += ["## Recommendation", "", *_md_recommendation(result), ""]
    recommended = recommended_block_sizes(result.table, result.spec, result.spec.objective)
    if recommended:
        out += ["## Recommended block size", "", *(f"- {line}" for line in recommended), ""]
    for advice in tier_advice(result.table, result.spec):  # a kv_offloading_size axis
        out += ["## CPU offload tier", "", advice.sentence, ""]
        out += ["| " + " | ".join(TABLE_HEAD) + " |", "|" + "---|" * len(TABLE_HEAD)]
        out += ["| " + " | ".join(row) + " |" for row in table_rows(advice)] + [""]
    out += ["## Best points", ""]
    best_rows = _best_lines(best)
    out += [
        f"- {head + ': ' if head else ''}" + (f"**{what}**: {text}" if what else text)
        for head, what, text in best_rows
    ] or ["No point succeeded."]
    slo = _slo_lines(result)
    if slo:
        out += ["", "## Rate sweep", "", *(f"- {line}" for line in slo)]
    if bounds:
        out += ["", "## Prefix cache against the cache curve", "", BOUND_INTRO, ""]
        out += [f"- {line}" for line in bounds]
    if pngs:
        out += ["", "## Figures", ""]
        for name in pngs:
            out += [f"![{name}](plots/{name}.png)", "", f"*{CAPTIONS[name]}*", ""]
    head, rows = _points_rows(result.table, result.spec.axis_names)
    out += ["## Points", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    failed = result.table[result.table["status"] != "ok"]
    if len(failed):
        out += ["", "## Failed points", ""]
        out += [
            f"- {r['label']}: `{r['error']}` (points/{r['folder']}/error.txt)"
            for _, r in failed.iterrows()
        ]
    out += ["", "Per-point run folders: `points/`; all columns: `sweep.csv` / `sweep.parquet`.", ""]
    return "\n".join(out)


def _indented_recommendation(result: SweepResult) -> list[str]:
    """The recommendation sentences, each other point's reason indented under them."""
    out = []
    for r in recommendations(result.table, result.spec, result.spec.objective):
        out.append(r.sentence)
        out += [f"    {name}: {why}" for name, why in r.lost]
    return out


def _md_recommendation(result: SweepResult) -> list[str]:
    return [
        f"  - {line.strip()}" if line.startswith("    ") else f"- {line}"
        for line in _indented_recommendation(result)
    ]


CSS = """
body{font:15px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;color:#1a202c;
max-width:1180px;margin:24px auto;padding:0 18px}
h1{font-size:1.6em;margin-bottom:.2em}h2{margin-top:1.6em;border-bottom:1px solid #e2e8f0}
pre{background:#f7fafc;border:1px solid #e2e8f0;padding:10px;overflow-x:auto;white-space:pre-wrap}
figure{margin:18px 0}figure img{max-width:100%;height:auto;border:1px solid #edf2f7}
figcaption{color:#4a5568;font-size:.92em}
table{border-collapse:collapse;font-size:.8em;display:block;overflow-x:auto}
th,td{border:1px solid #e2e8f0;padding:3px 5px;text-align:right;white-space:nowrap}
th{background:#f7fafc;white-space:normal;vertical-align:bottom}
tr.failed td{background:#fff5f5}.err{color:#c53030}ul.best li{margin:2px 0}
li.why{margin-left:1.5em;color:#4a5568;font-size:.92em}
"""


def _html(
    result: SweepResult,
    best: list[Comparison],
    pngs: dict[str, bytes],
    command: str,
    bounds: list[str],
) -> str:
    e = html.escape
    title = f"kvsim sweep: {result.spec.base.trace}"
    out = [
        f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{e(title)}</title>",
        f"<meta name=viewport content='width=device-width'><style>{CSS}</style></head><body>",
        f"<h1>{e(title)}</h1><ul>",
        *(f"<li>{e(x)}</li>" for x in _facts(result)),
        "</ul>",
        "<h2>Reproduce</h2>",
        f"<pre><code>{e(command)}</code></pre>",
        "<h2>Recommendation</h2><ul>",
        *(
            f"<li{' class=why' if line.startswith('    ') else ''}>{e(line.strip())}</li>"
            for line in _indented_recommendation(result)
        ),
        "</ul>",
    ]
    recommended = recommended_block_sizes(result.table, result.spec, result.spec.objective)
    if recommended:
        out += ["<h2>Recommended block size</h2><ul>"]
        out += [f"<li>{e(line)}</li>" for line in recommended] + ["</ul>"]
    for advice in tier_advice(result.table, result.spec):  # a kv_offloading_size axis
        out += ["<h2>CPU offload tier</h2>", f"<p>{e(advice.sentence)}</p><table><tr>"]
        out += [f"<th>{e(h)}</th>" for h in TABLE_HEAD] + ["</tr>"]
        out += [
            "<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>"
            for row in table_rows(advice)
        ] + ["</table>"]
    out.append("<h2>Best points</h2><ul class=best>")
    best_rows = _best_lines(best)
    out += [
        f"<li>{e(head) + ': ' if head else ''}"
        + (f"<b>{e(what)}</b>: {e(text)}" if what else e(text))
        + "</li>"
        for head, what, text in best_rows
    ]
    out += ["</ul>" if best_rows else "<li>No point succeeded.</li></ul>"]
    slo = _slo_lines(result)
    if slo:
        out += ["<h2>Rate sweep</h2><ul>", *(f"<li>{e(x)}</li>" for x in slo), "</ul>"]
    if bounds:
        out += ["<h2>Prefix cache against the cache curve</h2>", f"<p>{e(BOUND_INTRO)}</p><ul>"]
        out += [f"<li>{e(x)}</li>" for x in bounds] + ["</ul>"]
    if pngs:
        out.append("<h2>Figures</h2>")
    for name, data in pngs.items():
        b64 = base64.b64encode(data).decode("ascii")
        out.append(
            f"<figure><img alt='{e(name)}' src='data:image/png;base64,{b64}'>"
            f"<figcaption>{e(CAPTIONS[name])}</figcaption></figure>"
        )
    head, rows = _points_rows(result.table, result.spec.axis_names)
    out.append("<h2>Points</h2><table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>")
    for (_, r), row in zip(result.table.iterrows(), rows):
        cls = "" if r["status"] == "ok" else " class=failed"
        out.append(f"<tr{cls}>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>")
    out.append("</table>")
    failed = result.table[result.table["status"] != "ok"]
    if len(failed):
        out.append("<h2>Failed points</h2><ul>")
        out += [
            f"<li>{e(str(r['label']))}: <span class=err>{e(str(r['error']))}</span> "
            f"(points/{e(str(r['folder']))}/error.txt)</li>"
            for _, r in failed.iterrows()
        ]
        out.append("</ul>")
    out.append(
        "<p>Per-point run folders: <code>points/</code>; all columns: <code>sweep.csv"
        "</code> / <code>sweep.parquet</code>.</p></body></html>"
    )
    return "\n".join(out)
