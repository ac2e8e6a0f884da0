"""Hostile input through the command line: hundreds of generated cases over kvsim run's
options, --config files, --out paths and trace names (HF model configs, GPU specs and
coefficients: test_hostile_specs.py; run folders edited by hand: test_hostile_folders.py).

Every case must exit 0, or exit 2 with exactly one ``error:`` line on stderr (naming the file
and field where there is one) and nothing on stdout; no traceback, nothing written for a
refused command, and no temporary left anywhere under the test's folder. Trace file contents
are the workloads tests' (tests/workloads/); here they only reach the CLI's edge.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hostile_harness import (  # noqa: F401  (one_click_command: an autouse fixture)
    HUGE_INT,
    OSC8,
    QUICK,
    Case,
    check,
    one_click_command,
    run_cases,
)
from test_hostile_folders import COMMANDS, folder_edits
from test_hostile_specs import GPU, LLAMA, spec_cases
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.config import RunConfig, option_specs

# --- kvsim run: option values ----------------------------------------------------------------

BAD_TEXTS = (
    "", " ", "-1", "0", "nan", "inf", "-inf", "1e400", HUGE_INT, "[bold]", "[/x]", "1_000",
    "\uff11\uff16", "0x10", "16.0", "true", OSC8, "a" * 10_000,
)  # fmt: skip
SKIP_FLAGS = {"--mode"}  # a Choice: click refuses anything else (covered below once)


def _run_flag_cases() -> list[Case]:
    cases = []
    for name, spec in option_specs().items():
        if not spec.run or name in ("fast_decode",):
            continue
        flag = spec.cli_flag(name)
        if flag in SKIP_FLAGS:
            continue
        for i, text in enumerate(BAD_TEXTS):
            cases.append(
                Case(
                    f"{flag}-{i}",
                    lambda f, flag=flag, text=text: ["run", flag, text, *QUICK, "--out", "o"],
                )
            )
    cases.append(Case("mode-x", lambda f: ["run", "--mode", "x", *QUICK], must_fail=True))
    return cases


def _contradiction_cases() -> list[Case]:
    combos = {
        "rate+concurrency": ["--rate", "2", "--concurrency", "3"],
        "time-scale+concurrency": ["--time-scale", "2", "--concurrency", "3"],
        "think-time-alone": ["--think-time", "1"],
        "rate+time-scale": ["--rate", "2", "--time-scale", "2"],
        "device-in-cost-mode": ["--device", "cuda"],
        "dtype-in-cost-mode": ["--dtype", "float16"],
        "threads-in-cost-mode": ["--threads", "2"],
        "contiguous-engine": ["--mode", "engine", "--allocator", "max", "--model", "tiny-llama"],
        "cuda-without-cuda": ["--mode", "engine", "--model", "tiny-llama", "--device", "cuda"],
        "block-size-1e8": ["--block-size", "100000000"],
        "block-size-float": ["--block-size", "1e8"],
        "trace-is-a-folder": ["adir.jsonl"],
        "trace-markup": ["[/x].jsonl"],
        "trace-bold": ["[bold]nope"],
        "trace-osc8": [OSC8 + ".jsonl"],
        "trace-1mb-name": ["t" * 1_000_000],
        "config-and-bad-option": ["--config", "missing.json", "--block-size", "0"],
    }
    names = {"trace-markup": ("[/x].jsonl",), "trace-bold": ("[bold]nope",)}
    return [
        Case(
            key,
            lambda f, extra=extra: ["run", *extra, *QUICK, "--out", "o"],
            names=names.get(key, ()),
            setup=lambda f: (f / "adir.jsonl").mkdir(),
            must_fail=True,
        )
        for key, extra in combos.items()
    ]


SWEEP_QUICK = ("--until", "0.5")


def _sweep_cases() -> list[Case]:
    bad = {
        "jobs-0": ["--jobs", "0"], "jobs-neg": ["--jobs", "-1"], "jobs-x": ["--jobs", "x"],
        "executor": ["--executor", "slurm"], "address": ["--address", "h:1"],
        "kv-slots-0": ["--kv-slots", "0"],
        "kv-slots-and-blocks": ["--kv-slots", "9", "--num-blocks", "9", "--block-size", "8,16"],
        "slo-neg": ["--slo-ttft", "-1"], "slo-nan": ["--slo-ttft", "nan"],
        "slo-inf": ["--slo-tpot", "inf"], "slo-percentile": ["--slo-percentile", "42"],
        "param-unknown": ["--param", "bogus=1,2"], "param-empty": ["--param", "block_size="],
        "param-no-eq": ["--param", "block_size"],
        "param-bad-value": ["--param", "max_num_seqs=1,x"],
        "param-trace": ["--param", "trace=a,b"], "param-repeat": ["--param", "seed=1,1"],
        "block-list-empty": ["--block-size", "8,,16"], "block-list-zero": ["--block-size", "0,16"],
        "block-huge": ["--block-size", "16,100000000"], "rate-list-bad": ["--rate", "1,nan"],
        "allocator-bad": ["--allocator", "paged,nope"], "engine-mode": ["--mode", "engine"],
        "markup-param": ["--param", "[bold]=1,2"], "threads": ["--param", "threads=1,2"],
    }  # fmt: skip
    return [
        Case(f"sweep-{key}", lambda f, a=args: ["sweep", *a, *SWEEP_QUICK, "--out", "s"],
             must_fail=True)
        for key, args in bad.items()
    ]  # fmt: skip


def test_sweep_option_values(tmp_path: Path) -> None:
    run_cases(_sweep_cases(), tmp_path)


def test_run_option_values(tmp_path: Path) -> None:
    # every third case in the default run (each is a CLI invocation); all of them under -m slow
    run_cases(_run_flag_cases()[::3], tmp_path)


@pytest.mark.slow
def test_run_option_values_all(tmp_path: Path) -> None:
    run_cases(_run_flag_cases(), tmp_path)


def test_contradictions_and_impossible_requests(tmp_path: Path) -> None:
    run_cases(_contradiction_cases(), tmp_path)


def test_markup_in_messages_is_printed_verbatim(tmp_path: Path) -> None:
    for name in ("[/x].jsonl", "[bold]x.jsonl", "[link=https://e.com]x[/link].jsonl"):
        for env in ({}, {"FORCE_COLOR": "1", "TERM": "xterm-256color"}):
            case = Case(name, lambda f, name=name: ["run", name, *QUICK], env=env, must_fail=True)
            folder = tmp_path / f"m{len(list(tmp_path.iterdir()))}"
            folder.mkdir()
            result = check(case, folder)
            assert name in result.stderr  # not eaten as markup, not a link


# --- --config files ---------------------------------------------------------------------------


def _bad_values(kind: Any) -> list[Any]:
    text = str(kind)
    values: list[Any] = [[], {}, [1, 2], {"a": 1}, "x" * 2000]
    if "bool" in text:
        values += ["no", "false", 0, 1, None]
    elif "int" in text:
        values += ["16", 16.5, True, -1, 0, 10**400, -(10**30), float("nan"), float("inf")]
    elif "float" in text:
        values += ["0.9", True, -1.0, float("nan"), float("inf"), -float("inf"), 10**400]
    elif "Literal" in text or text in ("str", "<class 'str'>"):
        values += [5, 1.5, True, "", "[bold]"]
    else:
        values += [5, True]
    if "None" not in text and "Optional" not in text:
        values.append(None)
    return values


PATH_FIELDS = ("trace", "model", "gpu", "coefficients")


def _config_text(options: dict[str, Any]) -> str:
    return json.dumps({"kvsim_run": 1, "options": options}, allow_nan=True)


def _config_cases() -> list[Case]:
    import typing

    base = RunConfig(trace="azure_llm_2023_conv_first_2min", until=0.5).to_dict()
    hints = typing.get_type_hints(RunConfig)
    cases = []
    for name in base:
        # a "bad" value that is the field's own default (seed 0, threshold 0) is fine
        default = base[name]
        values = [
            v for v in _bad_values(hints[name]) if not (type(v) is type(default) and v == default)
        ]
        for i, value in enumerate(values):
            text = _config_text({**base, name: value}).replace(json.dumps(10**400), "1" + "0" * 400)
            cases.append(
                Case(
                    f"config-{name}-{i}",
                    lambda f: ["run", "--config", "c.json", "--out", "o", "--no-plots"],
                    # a file name that is a string names itself (the file), not config.json
                    names=()
                    if name in PATH_FIELDS and isinstance(value, str) and value
                    else ("c.json", name),
                    setup=lambda f, text=text: (f / "c.json").write_text(text),
                    must_fail=True,
                )
            )
    structural = {
        "not-json": "{",
        "list": "[]",
        "no-options": '{"kvsim_run": 1}',
        "options-list": '{"options": []}',
        "unknown-field": _config_text({**base, "bogus": 1}),
        "missing-trace": _config_text({k: v for k, v in base.items() if k != "trace"}),
        "deep": "[" * 100_000 + "]" * 100_000,
        "huge-int": '{"options": {"trace": "t", "seed": ' + HUGE_INT + "}}",
        "nan-literal": '{"options": {"trace": "t", "rate": NaN}}',
        "bom-garbage": "\ufeff\x00\x01",
        "empty": "",
        "latin1": "{\xe9}",
    }
    for key, text in structural.items():
        cases.append(
            Case(
                f"config-{key}",
                lambda f: ["run", "--config", "c.json", "--out", "o", "--no-plots"],
                names=("c.json",),
                setup=lambda f, text=text, key=key: (f / "c.json").write_bytes(
                    text.encode("latin-1") if key == "latin1" else text.encode()
                ),
                must_fail=True,
            )
        )
    cases.append(
        Case(
            "config-is-a-folder",
            lambda f: ["run", "--config", "cdir", "--out", "o"],
            names=("cdir",),
            setup=lambda f: (f / "cdir").mkdir(),
            must_fail=True,
        )
    )
    cases.append(
        Case(
            "config-is-a-fifo",
            lambda f: ["run", "--config", "fifo.json", "--out", "o"],
            names=("fifo.json",),
            setup=lambda f: os.mkfifo(f / "fifo.json"),
            must_fail=True,
        )
    )
    return cases


def test_config_files(tmp_path: Path) -> None:
    run_cases(_config_cases(), tmp_path)


# --- --out -------------------------------------------------------------------------------------


def test_out_paths(tmp_path: Path) -> None:
    def file(name: str) -> Callable[[Path], None]:
        return lambda f: (f / name).write_text("mine")

    outs: dict[str, tuple[str, Callable[[Path], None] | None]] = {
        "dot": (".", None),
        "dotdot": ("..", None),
        "root": ("/", None),
        "file": ("notes.txt", file("notes.txt")),
        "under-file": ("notes.txt/run", file("notes.txt")),
        "markup-parent": ("[bold]/run", file("[bold]")),
        "osc8": (OSC8, None),
        "newline": ("a\nb", None),
        "long": ("x" * 300, None),
        "long-parent": ("y" * 300 + "/r", None),
        "nul": ("a\x00b", None),
    }
    cases = [
        Case(
            f"out-{key}",
            lambda f, out=out: ["run", *QUICK, "--out", out],
            setup=setup or (lambda f: None),
        )
        for key, (out, setup) in outs.items()
    ]
    run_cases(cases, tmp_path)
    assert (tmp_path / "c4" / "notes.txt").read_text() == "mine"


# --- trace names and info --------------------------------------------------------------------


def test_trace_arguments_of_info_and_run(tmp_path: Path) -> None:
    names = ["", "missing.jsonl", "adir.jsonl", "[/x].jsonl", OSC8, "x" * 5000, "a\x00b.jsonl"]
    cases = []
    for i, name in enumerate(names):
        for command in ("info", "run"):
            extra = list(QUICK) if command == "run" else []
            cases.append(
                Case(
                    f"{command}-trace-{i}",
                    lambda f, c=command, n=name, e=extra: [c, n, *e],
                    setup=lambda f: (f / "adir.jsonl").mkdir(exist_ok=True),
                    must_fail=True,
                )
            )
    run_cases(cases, tmp_path)


def _one_request_trace(path: Path, request_id: str) -> Path:
    record = {"request_id": request_id, "arrival_time_s": 0, "prompt_tokens": 8,
              "output_tokens": 4}  # fmt: skip
    path.write_text(json.dumps(record) + "\n")
    return path


@pytest.mark.slow  # seconds of end-to-end work; .ci/run runs the slow set too
def test_long_request_ids_are_refused_or_plotted_with_short_labels(tmp_path: Path) -> None:
    huge = _one_request_trace(tmp_path / "huge.jsonl", "r" * 1_000_000)
    result = CliRunner().invoke(app, ["run", str(huge), "--out", str(tmp_path / "no")])
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "request_id" in result.stderr and not (tmp_path / "no").exists()
    long_id = "[bold]$x^2$" + "r" * 1000  # as long as a trace may hold: markup, mathtext
    trace = _one_request_trace(tmp_path / "t.jsonl", long_id)
    result = CliRunner().invoke(app, ["run", str(trace), "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "run" / "plots" / "gantt.png").stat().st_size < 200_000
    frame = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    assert frame["request_id"].iloc[0] == long_id  # the data keeps it whole


def test_the_suite_is_hundreds_of_cases() -> None:
    total = (
        len(_run_flag_cases()) + len(_contradiction_cases()) + len(_config_cases())
        + len(spec_cases("--model", LLAMA, "c")) + len(spec_cases("--gpu", GPU, "g"))
        + len(folder_edits()) * len(COMMANDS)
    )  # fmt: skip
    assert total >= 500
    assert not math.isnan(total)
