"""``kvsim run`` through typer's CliRunner: exit codes, files written, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from kvsim.analysis.metrics import WALL_CLOCK_FIELDS
from kvsim.cli import app

FILES = {"config.json", "summary.json", "requests.parquet", "steps.parquet", "events.parquet",
         "kvsim-manifest.json"}  # fmt: skip


def kvsim(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


def summary_of(folder: Path) -> dict:
    summary = json.loads((folder / "summary.json").read_text())
    for field in WALL_CLOCK_FIELDS:
        summary.pop(field)
    return summary


@pytest.fixture(scope="module")
def default_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``kvsim run --out DIR --no-plots``: the whole shipped default trace."""
    out = tmp_path_factory.mktemp("cli") / "run"
    result = kvsim("run", "--out", out, "--no-plots")
    assert result.exit_code == 0, result.output
    return out


def test_run_writes_a_run_folder(default_run: Path) -> None:
    assert {p.name for p in default_run.iterdir()} == FILES
    config = json.loads((default_run / "config.json").read_text())
    assert config["options"]["trace"] == "azure_llm_2023_conv_first_2min"
    assert config["resolved"]["num_blocks"] > 0
    summary = json.loads((default_run / "summary.json").read_text())
    assert summary["num_requests"] == 456
    assert summary["num_finished"] + summary["num_rejected"] == 456


def test_run_with_plots_writes_pngs(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = kvsim("run", "--until", "20", "--out", out)
    assert result.exit_code == 0, result.output
    pngs = list((out / "plots").glob("*.png"))
    assert len(pngs) >= 4
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in pngs)


def test_rerun_from_config_json_reproduces_the_run(default_run: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    result = kvsim("run", "--config", default_run / "config.json", "--out", again, "--no-plots")
    assert result.exit_code == 0, result.output
    assert summary_of(again) == summary_of(default_run)
    for name in ("requests.parquet", "events.parquet"):
        assert (again / name).read_bytes() == (default_run / name).read_bytes()


def test_options_override_the_config_file(default_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "smaller"
    result = kvsim(
        "run", "--config", default_run / "config.json", "--num-blocks", "300", "--until", "10",
        "--out", out, "--no-plots",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    options = json.loads((out / "config.json").read_text())["options"]
    assert (options["num_blocks"], options["until"]) == (300, 10.0)
    assert options["trace"] == "azure_llm_2023_conv_first_2min"
    assert summary_of(out)["num_blocks"] == 300


BAD_TRACE = (
    '{"request_id": "a", "arrival_time_s": 0, "prompt_tokens": 5, "output_tokens": 3}\n'
    '{"request_id": "b", "arrival_time_s": 1, "prompt_tokens": 5, "output_tokens": -3}\n'
)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        pytest.param(["missing_trace.jsonl"], ["missing_trace.jsonl"], id="missing-trace"),
        pytest.param(["bad.jsonl"], ["bad.jsonl", ":2:", "output_tokens"], id="malformed-trace"),
        pytest.param(["--block-size", "0"], ["block_size", "0"], id="block-size-0"),
        pytest.param(["--num-blocks", "0"], ["num_blocks"], id="num-blocks-0"),
        pytest.param(
            ["--rate", "2", "--time-scale", "0.5"], ["--rate", "--time-scale"], id="rate-and-scale"
        ),
        pytest.param(["--model", "no-such-model"], ["no-such-model"], id="unknown-model"),
        pytest.param(["--gpu", "no-such-gpu"], ["no-such-gpu"], id="unknown-gpu"),
        pytest.param(
            ["--model", "llama-2-70b", "--gpu", "a100-40gb"],
            ["llama-2-70b", "a100-40gb", "does not fit"],
            id="model-does-not-fit",
        ),
        pytest.param(["--config", "missing.json"], ["missing.json"], id="missing-config"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_no_folder(
    args: list[str], expected: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.jsonl").write_text(BAD_TRACE)
    result = kvsim("run", *args, "--out", "out", "--no-plots")
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    for fragment in expected:
        assert fragment in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]
