"""kvsim on the held-out runs of issue 30's sim-to-real study (docs/costmodel.md, "Held-out
runs"): the other models and tensor-parallel sizes of the same vLLM 0.15.1 H100 SXM matrix as the
four Llama-2-7B runs the ``vllm-0.15`` serving stack was checked on. Nothing is fitted here: each
deployment is replayed as ``kvsim validate-real`` replays the shipped SPEC (its recipe, its
stages, its limits, the serving stack's coefficients), and each stage's signed errors are set
beside the published simulators' errors on the same stage.

    PYTHONPATH=. python benchmarks/bench_heldout_real.py [--only llama-2-70b] [--json out.json]

The figures (recipes, measured means, KV blocks, the published simulators' signed errors) are
benchmarks/data/heldout_real_runs.json: figures only, typed from the study, whose provenance it
names; none of the study's files is shipped. About 7 s (three deployments, 18 stages).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvsim.outputs.real_spec import RealSpec, real_spec_from_doc
from kvsim.outputs.validate_real import StageResult, validate_real

FIGURES = Path(__file__).parent / "data" / "heldout_real_runs.json"
FORMAT, VERSION = "kvsim-heldout-real-runs", 1
# published metric name -> kvsim's StageResult metric
METRICS = {"e2e_mean": "e2e_ms", "ttft_mean": "ttft_ms", "itl_mean": "tpot_ms"}
SHORT = {
    "blis-roofline": "roofline",
    "blis-evolved": "evolved",
    "blis-trained-physics": "trained",
    "llm-optimizer-estimate": "llm-opt",
    "aiconfigurator-estimate": "aiconf",
    "vidur": "vidur",
    "llmservingsim": "llmss",
}


class FiguresError(ValueError):
    """A figures file that cannot be read: the message names the file and the entry."""


@dataclass(frozen=True, slots=True)
class PublishedStage:
    """The published simulators' signed errors (%) on one stage, by metric then simulator."""

    spec: str
    workload: str
    stage: int
    study_experiment: str
    errors: dict[str, dict[str, float]]  # "e2e_mean" -> {"blis-evolved": 13.0, ...}


@dataclass(frozen=True, slots=True)
class Figures:
    """The held-out deployments as SPECs and the published errors on their stages."""

    provenance: str
    specs: tuple[RealSpec, ...]
    published: tuple[PublishedStage, ...]


def load_figures(path: Path, config_dir: Path) -> Figures:
    """Read the figures file; a model it describes by config (no kvsim preset) is written as
    ``config_dir/<name>/config.json`` and the deployment points there."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise FiguresError(f"{path}: cannot read: {exc}") from exc
    if doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise FiguresError(f"{path}: format must be {FORMAT!r} version {VERSION}")
    configs = {}
    for name, config in doc.get("model_configs", {}).items():
        folder = config_dir / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
        configs[name] = str(folder)
    specs = []
    for index, spec_doc in enumerate(doc["specs"]):
        model = spec_doc["deployment"]["model"]
        if model in configs:
            spec_doc = {
                **spec_doc,
                "deployment": {**spec_doc["deployment"], "model": configs[model]},
            }
        specs.append(real_spec_from_doc(spec_doc, f"{path}: specs[{index}]"))
    stages = {
        (s.name, w.recipe.name, i)
        for s in specs
        for w in s.workloads
        for i in range(len(w.measured))
    }
    published = []
    for index, row in enumerate(doc["published"]):
        key = (row["spec"], row["workload"], row["stage"])
        if key not in stages:
            raise FiguresError(f"{path}: published[{index}]: no such stage {key}")
        errors = {m: dict(row.get(f"{m}_error_pct", {})) for m in METRICS}
        published.append(PublishedStage(*key, row["study_experiment"], errors))
    return Figures(doc["provenance"], tuple(specs), tuple(published))


def _pct(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:+.1f}"


def _mape(errors: list[float]) -> float:
    return sum(abs(e) for e in errors) / len(errors) if errors else math.nan


@dataclass(frozen=True, slots=True)
class Row:
    """One stage: kvsim's result and the published errors (None: no figure published)."""

    spec: str
    result: StageResult
    published: PublishedStage | None

    @property
    def label(self) -> str:
        r = self.result
        return f"{self.spec.split('_')[-1]} {r.workload} {r.rate_per_s:g}/s"

    @property
    def served(self) -> bool:
        return not self.result.measured.overloaded

    def kvsim_pct(self, metric: str) -> float | None:
        err = self.result.error(METRICS[metric])
        return None if err is None else 100.0 * err

    def kvsim_pct_finished(self) -> float | None:
        err = self.result.error("finished")
        return None if err is None else 100.0 * err

    def sims(self, metric: str) -> dict[str, float]:
        return {} if self.published is None else self.published.errors[metric]


def evaluate(figures: Figures, only: tuple[str, ...] = ()) -> list[Row]:
    """Replay every deployment (or those whose model name contains one of ``only``)."""
    index = {(p.spec, p.workload, p.stage): p for p in figures.published}
    rows = []
    for spec in figures.specs:
        if only and not any(o in spec.name for o in only):
            continue
        for result in validate_real(spec).stages:
            published = index.get((spec.name, result.workload, result.stage))
            rows.append(Row(spec.name, result, published))
    return rows


def metric_table(rows: list[Row], metric: str, sims: list[str]) -> list[str]:
    """One line per stage: measured mean, kvsim's signed error, each simulator's, the best."""
    head = f"{'stage':<34} {'measured':>9} {'kvsim':>8} " + " ".join(
        f"{SHORT.get(s, s):>8}" for s in sims
    )
    lines = [head + f" {'best published':>22}"]
    for row in rows:
        r = row.result
        if row.served:
            measured = getattr(r.measured, METRICS[metric])
        elif metric == "e2e_mean":
            measured = r.measured.e2e_finished_ms
        else:
            continue
        published = row.sims(metric)
        best = min(published.items(), key=lambda kv: abs(kv[1]), default=None)
        best_text = "-" if best is None else f"{_pct(best[1])} ({SHORT.get(best[0], best[0])})"
        mark = "" if row.served else " (over)"
        lines.append(
            f"{row.label + mark:<34} {measured:>9,.1f} {_pct(row.kvsim_pct(metric)):>8} "
            + " ".join(f"{_pct(published.get(s)):>8}" for s in sims)
            + f" {best_text:>22}"
        )
    return lines


def summary(rows: list[Row], metric: str = "e2e_mean") -> list[dict[str, Any]]:
    """Per deployment and overall, over the served stages that have published figures:
    kvsim's MAPE, each simulator's (on the stages it covers), the best single simulator
    covering all of them, and the oracle (the best simulator of each stage)."""
    groups: dict[str, list[Row]] = {}
    for row in rows:
        if row.served:
            groups.setdefault(row.spec, []).append(row)
    groups["overall"] = [r for g in list(groups.values()) for r in g]
    out = []
    for name, group in groups.items():
        scored = [r for r in group if r.sims(metric)]
        kvsim_all = [e for r in group if (e := r.kvsim_pct(metric)) is not None]
        kvsim = [e for r in scored if (e := r.kvsim_pct(metric)) is not None]
        per_sim: dict[str, list[float]] = {}
        for r in scored:
            for sim, err in r.sims(metric).items():
                per_sim.setdefault(sim, []).append(err)
        full = {s: _mape(e) for s, e in per_sim.items() if len(e) == len(scored)}
        best = min(full.items(), key=lambda kv: kv[1], default=(None, math.nan))
        oracle = [min(abs(e) for e in r.sims(metric).values()) for r in scored]
        out.append(
            {
                "deployment": name,
                "stages_served": len(group),
                "stages_scored": len(scored),
                "kvsim_mape_all_served": _mape(kvsim_all),
                "kvsim_mape": _mape(kvsim),
                "best_simulator": best[0],
                "best_simulator_mape": best[1],
                "oracle_mape": _mape(oracle),
                "per_simulator_mape": {s: _mape(e) for s, e in per_sim.items()},
                "per_simulator_stages": {s: len(e) for s, e in per_sim.items()},
            }
        )
    return out


def overloaded_lines(rows: list[Row]) -> list[str]:
    lines = []
    for row in rows:
        if row.served:
            continue
        r, m = row.result, row.result.measured
        lines.append(
            f"{row.label:<28} measured {m.finished:,} finished / {m.timed_out:,} timed out; "
            f"kvsim {r.finished:,} finished ({_pct(row.kvsim_pct_finished())}%), "
            f"{r.timed_out:,} timed out, saturated={r.saturated}, "
            f"E2E of finished {_pct(row.kvsim_pct('e2e_mean'))}%"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--figures", type=Path, default=FIGURES)
    parser.add_argument("--only", action="append", default=[], help="model name part")
    parser.add_argument("--json", type=Path, help="also write the rows and summary here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kvsim-heldout-") as tmp:
        figures = load_figures(args.figures, Path(tmp))
        rows = evaluate(figures, tuple(args.only))
    sims = sorted({s for r in rows for m in METRICS for s in r.sims(m)}, key=list(SHORT).index)
    titles = {
        "e2e_mean": "E2E mean",
        "ttft_mean": "TTFT mean",
        # kvsim's TPOT against (E2E - TTFT) / (output - 1); the simulators' against the study's
        # ITL mean (the two measured means differ by about 1%)
        "itl_mean": "TPOT / ITL mean",
    }
    for metric, title in titles.items():
        print(f"\n{title}: measured (ms) and signed error (%)")
        print("\n".join(metric_table(rows, metric, sims)))
    print("\nOverloaded stages (real vLLM timed requests out):")
    print("\n".join(overloaded_lines(rows)) or "none")
    for metric in ("e2e_mean", "ttft_mean", "itl_mean"):
        print(f"\n{titles[metric]} MAPE over served stages with published figures (%):")
        for s in summary(rows, metric):
            print(
                f"  {s['deployment']:<34} stages {s['stages_scored']}/{s['stages_served']}  "
                f"kvsim {s['kvsim_mape']:5.1f} (all served {s['kvsim_mape_all_served']:5.1f})  "
                f"best {SHORT.get(str(s['best_simulator']), '-')} {s['best_simulator_mape']:5.1f}  "
                f"oracle {s['oracle_mape']:5.1f}"
            )
    if args.json:
        doc = {
            "provenance": figures.provenance,
            "rows": [
                {
                    "deployment": r.spec,
                    "workload": r.result.workload,
                    "stage": r.result.stage,
                    "served": r.served,
                    "kvsim": {m: r.kvsim_pct(m) for m in METRICS},
                    "published": {m: r.sims(m) for m in METRICS},
                }
                for r in rows
            ],
            "summary": {m: summary(rows, m) for m in METRICS},
        }
        args.json.write_text(json.dumps(doc, indent=1, default=str) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
