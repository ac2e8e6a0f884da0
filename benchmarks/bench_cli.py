"""Wall time of whole ``kvsim`` processes, as a user starts them (issue 13's CLI bar).

Side by side, in turns, medians of --repeats (the machine's speed drifts minute to minute, so
every command runs once per round):

- ``kvsim --help`` (import time and help rendering);
- for each TRACE, ``kvsim run TRACE --no-plots`` with the v1 defaults (prefix caching on) and
  with ``--scheduler classic`` beside it;

wall and CPU seconds (user + system, which drift less than wall time when other work shares
the cores). The traces default to azure_llm_2023_conv_first_2min, the trace `kvsim run`
replays by default and the one the 1.0 s bar is for (its runs took 1.4-1.5 s when the bar was
set; its ratio to the bar is printed, with how many rounds were within it and their range),
and azure_llm_2023_conv, the whole 19,366-request trace (51 k steps under classic, 42 k
under v1, with the cost model's defaults). ``--trace NAME`` (repeatable) times others instead.
``--baseline DIR`` adds the same commands run from another checkout (e.g. the main branch, made
with ``git worktree add`` or ``git archive``) in the same rounds, so a change is measured A/B.
``--pure-python`` adds each kvsim run again with ``KVSIM_PURE_PYTHON=1`` (the compiled core
off). ``--sched-sim EXE`` adds sched-sim 0.2.1's whole run on the whole Azure 2023 conversation
trace (``EXE trace conv.json --no-gantt``: its CLI takes a JSON list of id / timestamp /
prompt_tokens / output_tokens, written from kvsim's shipped copy of the trace) and prints
kvsim's speed-up over it (issue 26: kvsim's ``run --no-plots`` of that trace at least 8x faster
and within 1.0 s). sched-sim needs its own environment, e.g.
``python -m venv /tmp/ss && /tmp/ss/bin/pip install sched-sim==0.2.1``, then
``--sched-sim /tmp/ss/bin/sched-sim``.

Python's bytecode is cached as an installed package has it (pip compiles it at install): the
processes run with PYTHONPYCACHEPREFIX in a temporary folder, warmed by one untimed round, so
nothing is written into the repository. ``--no-bytecode-cache`` measures the compile-on-every-
start case instead (PYTHONDONTWRITEBYTECODE=1 with no cache).

    python benchmarks/bench_cli.py [--repeats 5] [--trace NAME ...] [--baseline DIR]
        [--no-bytecode-cache] [--pure-python] [--sched-sim EXE]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BAR_S = 1.0  # issue 13: the Azure conv `kvsim run --no-plots` process in at most 1.0 s
BAR_TRACE = "azure_llm_2023_conv_first_2min"  # the default trace, which the bar is for
FULL_TRACE = "azure_llm_2023_conv"
TRACES = (BAR_TRACE, FULL_TRACE)
FULL_BAR_S, SCHED_SIM_RATIO = 1.0, 8.0  # issue 26, for the whole trace
SCHED_SIM = "sched-sim 0.2.1 trace (whole Azure conv)"


def sched_sim_trace(path: Path) -> Path:
    """The whole Azure conv trace as sched-sim's trace JSON (a list of request objects)."""
    lines = (REPO / "workloads" / "traces" / f"{FULL_TRACE}.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines[1:]]  # line 1 is kvsim's trace header
    path.write_text(
        json.dumps(
            [
                {
                    "id": r["request_id"],
                    "timestamp": r["arrival_time_s"],
                    "prompt_tokens": r["prompt_tokens"],
                    "output_tokens": r["output_tokens"],
                }
                for r in records
            ]
        )
    )
    return path


def commands(traces: list[str], out: Path, pure_python: bool) -> dict[str, list[str]]:
    """kvsim commands by label; a label ending in PURE runs with KVSIM_PURE_PYTHON=1."""
    timed = {"kvsim --help": ["--help"]}
    for i, trace in enumerate(traces):
        run = ["run", trace, "--no-plots", "--force", "--out"]
        timed[f"kvsim run {trace} --no-plots (v1)"] = [*run, str(out / f"v1-{i}")]
        if pure_python:
            timed[f"kvsim run {trace} --no-plots (v1){PURE}"] = [*run, str(out / f"v1p-{i}")]
        timed[f"kvsim run {trace} --no-plots --scheduler classic"] = [
            *run, str(out / f"classic-{i}"), "--scheduler", "classic",
        ]  # fmt: skip
        if pure_python:  # classic runs on the compiled core too (ClassicCore)
            timed[f"kvsim run {trace} --no-plots --scheduler classic{PURE}"] = [
                *run, str(out / f"classicp-{i}"), "--scheduler", "classic",
            ]  # fmt: skip
    return timed


PURE = " KVSIM_PURE_PYTHON=1"


def environment(tree: Path, cache: Path | None) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if cache is None:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        env["PYTHONPYCACHEPREFIX"] = str(cache)
    return env


def timed(
    cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None
) -> tuple[float, float]:
    """Run ``cmd`` to completion, its output discarded: its wall and CPU (user + system)
    seconds (CPU time drifts less than wall time on a shared machine)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        check=False,
    )  # fmt: skip
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr[-2000:]}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--trace", action="append", help="a trace to time (repeatable)")
    parser.add_argument("--baseline", type=Path, help="another kvsim checkout, run A/B")
    parser.add_argument("--no-bytecode-cache", action="store_true")
    parser.add_argument("--pure-python", action="store_true", help="also KVSIM_PURE_PYTHON=1")
    parser.add_argument("--sched-sim", metavar="EXE", help="sched-sim 0.2.1's executable")
    args = parser.parse_args()

    trees = {"this": REPO}
    if args.baseline is not None:
        trees["baseline"] = args.baseline.resolve()
    with tempfile.TemporaryDirectory(prefix="kvsim-bench-cli-") as tmp:
        root = Path(tmp)
        walls: dict[tuple[str, str], list[float]] = {}
        cpus: dict[tuple[str, str], list[float]] = {}
        envs = {}
        for tree_name, tree in trees.items():
            cache = None if args.no_bytecode_cache else root / f"pycache-{tree_name}"
            envs[tree_name] = environment(tree, cache)
        traces = args.trace or list(TRACES)
        conv_json = sched_sim_trace(root / "conv.json") if args.sched_sim else None
        rounds = args.repeats if args.no_bytecode_cache else args.repeats + 1
        for round_no in range(rounds):
            keep = args.no_bytecode_cache or round_no > 0  # round 0 warms the cache
            for tree_name, tree in trees.items():
                out = root / f"runs-{tree_name}"
                for label, command in commands(traces, out, args.pure_python).items():
                    cmd = [sys.executable, "-m", "kvsim", *command]
                    env = envs[tree_name]
                    if label.endswith(PURE):
                        env = {**env, "KVSIM_PURE_PYTHON": "1"}
                    wall, cpu = timed(cmd, env, tree)
                    if keep:
                        walls.setdefault((tree_name, label), []).append(wall)
                        cpus.setdefault((tree_name, label), []).append(cpu)
                shutil.rmtree(out, ignore_errors=True)
            if conv_json is not None:
                wall, cpu = timed([args.sched_sim, "trace", str(conv_json), "--no-gantt"], cwd=root)
                if keep:
                    walls.setdefault(("this", SCHED_SIM), []).append(wall)
                    cpus.setdefault(("this", SCHED_SIM), []).append(cpu)
    cached = "compiled on every start" if args.no_bytecode_cache else "bytecode cached"
    print(f"kvsim processes, wall and CPU seconds, median of {args.repeats} rounds ({cached})")
    width = max(len(label) for _, label in walls)
    for label in dict.fromkeys(label for _, label in walls):
        cells = []
        for tree_name in trees:
            if (tree_name, label) not in walls:  # sched-sim runs once per round
                continue
            rounds_s = walls[(tree_name, label)]
            median = statistics.median(rounds_s)
            cpu = statistics.median(cpus[(tree_name, label)])
            bar = ""
            if BAR_TRACE in label:
                # the spread says how far a slow minute moves the figure
                under = sum(w <= BAR_S for w in rounds_s)
                bar = (
                    f" ({median / BAR_S:4.2f}x the {BAR_S} s bar; {under} of {len(rounds_s)}"
                    f" rounds within it, {min(rounds_s):.2f}-{max(rounds_s):.2f} s)"
                )
            cells.append(f"{tree_name} wall {median:6.2f} s{bar}, CPU {cpu:6.2f} s")
        print(f"  {label:{width}s}  " + "   ".join(cells))
    full = f"kvsim run {FULL_TRACE} --no-plots (v1)"
    if ("this", full) in walls:
        kvsim_s = statistics.median(walls[("this", full)])
        print(
            f"  whole Azure conv, v1: {kvsim_s:.2f} s, {kvsim_s / FULL_BAR_S:.2f}x the "
            f"{FULL_BAR_S} s bar (issue 26)"
        )
        if ("this", SCHED_SIM) in walls:
            ratio = statistics.median(walls[("this", SCHED_SIM)]) / kvsim_s
            print(f"  sched-sim / kvsim = {ratio:.2f}x (bar: at least {SCHED_SIM_RATIO:.0f}x)")
    if args.baseline is not None:
        for label in dict.fromkeys(label for _, label in walls):
            if ("baseline", label) not in walls:
                continue
            ratio = statistics.median(walls[("baseline", label)]) / statistics.median(
                walls[("this", label)]
            )
            print(f"  {label:{width}s}  baseline / this = {ratio:.2f}x")


if __name__ == "__main__":
    main()
