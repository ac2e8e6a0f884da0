"""What a new user meets first: -h and --version, help with units and defaults (no <bool>),
one-line usage errors, the terminal summary, report.html's options, events.parquet's mode,
reruns of a config.json from another folder, and the Ray hint printed as it is."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from kvsim.cli import app
from kvsim.config import RunConfig
from kvsim.runner import run
from workloads import DEFAULT_TRACE_NAME, load_trace, resolve_trace, save_trace, truncate

WIDE = {"COLUMNS": "200"}


def kvsim(*args: str | Path, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args], env=env)


def test_short_help_and_version() -> None:
    for args in (["-h"], ["run", "-h"], ["sweep", "-h"], ["plot", "-h"]):
        result = kvsim(*args, env=WIDE)
        assert result.exit_code == 0 and "Usage:" in result.output, args
    result = kvsim("--version")
    assert result.exit_code == 0 and result.output.startswith("kvsim ")


@pytest.mark.parametrize("command", ["run", "sweep", "gen", "import", "info", "plot", "animate"])
def test_help_shows_units_and_defaults_and_no_bool(command: str) -> None:
    text = kvsim(command, "-h", env=WIDE).output
    assert "<bool>" not in text  # a flag takes no value
    options = [line for line in text.splitlines() if " --" in line]
    assert options
    for line in options:  # every option names its unit (arguments show their type)
        assert not re.search(r"<(str|int|float|path)>", line), line


def test_sweep_and_gen_help_name_their_defaults() -> None:
    sweep = kvsim("sweep", "-h", env=WIDE).output
    assert "[default: process]" in sweep and "[default: 99]" in sweep
    assert "(the CPU count)" in sweep and "NAME=V1,V2,..." in sweep
    gen = kvsim("gen", "-h", env=WIDE).output
    assert "REQ/S" in gen and "[default: (poisson)]" in gen and "[default: (0)]" in gen


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["run", "--block-size", "x"], "--block-size"),
        (["run", "--no-such-option"], "--no-such-option"),
        (["bogus"], "bogus"),
        (["plot"], "RUN_DIR"),
        (["plot", "x", "--what", "nope"], "nope"),
    ],
)
def test_usage_errors_are_one_line(args: list[str], fragment: str) -> None:
    result = kvsim(*args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], lines


def test_the_ray_hint_is_printed_as_it_is(tmp_path: Path) -> None:
    try:
        import ray  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("Ray is installed")
    result = kvsim("sweep", "--until", "1", "--executor", "ray", "--out", tmp_path / "s")
    assert result.exit_code == 2
    assert "pip install 'kvsim[ray]'" in result.stderr
    assert not (tmp_path / "s").exists()


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Result]:
    folder = tmp_path_factory.mktemp("cuts")
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        trace = truncate(load_trace(resolve_trace(DEFAULT_TRACE_NAME)), max_requests=40)
        save_trace(trace, Path("mine.jsonl"))
        result = kvsim("run", "mine.jsonl", "--out", "run", env=WIDE)
    finally:
        os.chdir(cwd)
    assert result.exit_code == 0, result.output
    return folder / "run", result


def test_the_terminal_summary(small_run: tuple[Path, Result]) -> None:
    _, result = small_run
    text = result.stdout
    for fragment in ("latency (cost model)", "TTFT", "TPOT", "ITL", "end-to-end",
                     "p90", "total tok/s", " in, ", " out", "unfinished",
                     "KV allocated, not yet filled", "reserved", "never used"):  # fmt: skip
        assert fragment in text, fragment


def test_contiguous_pools_are_counted_in_slots(tmp_path: Path) -> None:
    result = kvsim(
        "run", "--allocator", "max", "--until", "2", "--no-plots", "--out", tmp_path / "r",
        env=WIDE,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "slots, contiguous (max reservations)" in result.stdout
    assert "blocks x 1 tokens" not in result.stdout


def test_the_run_report_has_the_options_and_the_warnings(small_run: tuple[Path, Result]) -> None:
    folder, _ = small_run
    page = (folder / "report.html").read_text()
    assert "<h2>Options</h2>" in page and "<th>block_size</th>" in page
    assert "resolved num_blocks" in page and "<h2>Latency</h2>" in page


def test_every_file_of_a_run_folder_is_an_ordinary_file(small_run: tuple[Path, Result]) -> None:
    folder, _ = small_run
    umask = os.umask(0)
    os.umask(umask)
    for path in [*folder.iterdir(), *(folder / "plots").iterdir()]:
        want = 0o777 & ~umask if path.is_dir() else 0o666 & ~umask
        assert path.stat().st_mode & 0o777 == want, path.name


def test_a_config_json_reruns_from_another_folder(
    small_run: tuple[Path, Result], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, _ = small_run
    config = json.loads((folder / "config.json").read_text())
    assert config["options"]["trace"] == "mine.jsonl"  # as given
    assert config["resolved"]["trace_path_absolute"] == str(folder.parent / "mine.jsonl")
    monkeypatch.chdir(tmp_path)  # where mine.jsonl is not
    result = kvsim("run", "--config", folder / "config.json", "--out", "again", "--no-plots")
    assert result.exit_code == 0, result.output
    for name in ("requests.parquet", "steps.parquet", "events.parquet"):
        assert (tmp_path / "again" / name).read_bytes() == (folder / name).read_bytes()


def test_the_progress_bar_learns_the_number_of_requests() -> None:
    totals: list[int] = []
    run(RunConfig(trace=DEFAULT_TRACE_NAME, until=1.0), on_start=totals.append)
    assert totals == [456]


@pytest.mark.parametrize("columns", ["80", "100"])
def test_help_never_cuts_an_option_name(columns: str) -> None:
    from kvsim.cli import COMMAND_MODULES, command_group

    for module in dict.fromkeys(COMMAND_MODULES.values()):
        for name, command in command_group(module).commands.items():
            text = kvsim(name, "-h", env={"COLUMNS": columns}).output
            assert "\u2026" not in text, (name, columns)
            for param in command.params:
                for option in [*param.opts, *param.secondary_opts]:
                    if option.startswith("--"):
                        assert re.search(rf"{re.escape(option)}\b", text), (name, option)


@pytest.mark.parametrize("command", ["calibrate", "validate", "profile", "validate-run"])
def test_calibration_help_names_real_metavars(command: str) -> None:
    text = kvsim(command, "-h", env=WIDE).output
    assert not re.search(r"<[a-z_|]+>", text), re.findall(r"<[a-z_|]+>", text)


def test_validate_run_help_offers_what_it_uses() -> None:
    text = kvsim("validate-run", "-h", env=WIDE).output
    assert not re.search(r"--mode\b", text)  # it runs both modes
    model = next(line for line in text.splitlines() if line.lstrip().startswith("--model"))
    assert "[default: tiny-llama]" in model  # the model it runs when none is given
    assert "--coefficients" in text and "--timer" in text


def test_until_says_what_never_arrived(tmp_path: Path) -> None:
    result = kvsim(
        "run", "--rate", "0.5", "--until", "30", "--no-plots", "--out", tmp_path / "r", env=WIDE
    )
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    # the default trace's second request comes 4.3 s after its first: 32.7 s at 0.5 req/s
    assert "--until 30 s: 1 of the trace's 456 requests arrived" in text
    assert "the other 455 would arrive from 32.75 s" in text and "--rate 0.5 req/s" in text
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert any("455" in w for w in config["resolved"]["warnings"])


def test_a_run_that_replays_the_whole_trace_says_nothing_of_until(tmp_path: Path) -> None:
    result = kvsim("run", "--until", "1000", "--no-plots", "--out", tmp_path / "r", env=WIDE)
    assert result.exit_code == 0, result.output
    assert "--until" not in result.stdout
