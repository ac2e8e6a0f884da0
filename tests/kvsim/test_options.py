"""One definition per run option: RunConfig's fields drive `kvsim run`, `kvsim sweep`, the
sweep's reproduce command and docs/options.md."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner, Result

from kvsim.cli import app
from kvsim.commands.options import TABLE_END, TABLE_START, options_table
from kvsim.config import RunConfig, option_specs
from kvsim.sweep.spec import FIELD_OPTIONS

DOCS = Path(__file__).parents[2] / "docs" / "options.md"


def kvsim(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


def command_flags(name: str) -> set[str]:
    sub = typer.main.get_command(app).get_command(None, name)  # type: ignore[attr-defined]
    return {opt for p in sub.params for opt in p.opts if opt.startswith("--")}


def test_every_run_field_is_a_run_option_with_its_flag() -> None:
    flags = command_flags("run")
    for name, spec in option_specs().items():
        assert (spec.cli_flag(name) in flags) == spec.run, name
    assert {"--config", "--gpu-spec", "--out", "--no-plots"} <= flags


def test_sweep_offers_exactly_the_fields_marked_for_it() -> None:
    flags = command_flags("sweep")
    for name, spec in option_specs().items():
        offered = spec.sweep in ("option", "axis")
        assert (spec.cli_flag(name) in flags) == offered, name
        assert (name in FIELD_OPTIONS) == offered, name


def test_docs_option_table_is_generated_from_the_fields() -> None:
    text = DOCS.read_text(encoding="utf-8")
    table = text.split(TABLE_START, 1)[1].split(TABLE_END, 1)[0].strip()
    assert table == options_table(), "run: python -m kvsim.commands.options docs/options.md"
    assert len(table.splitlines()) == 2 + len(option_specs())


def test_help_shows_defaults_and_units() -> None:
    result = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "TOKENS" in result.output
    assert "[default: 16]" in result.output
    assert "planned from GPU memory" in result.output


def test_given_options_reach_config_json_and_others_keep_the_config_file(
    tmp_path: Path,
) -> None:
    first = tmp_path / "first"
    result = kvsim(
        "run", "--until", "5", "--no-plots", "--out", first,
        "--max-num-seqs", "7", "--think-time", "0", "--concurrency", "3",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    options = json.loads((first / "config.json").read_text())["options"]
    assert (options["max_num_seqs"], options["concurrency"], options["until"]) == (7, 3, 5.0)
    # --config keeps what the file says unless an option is given, even one equal to the
    # default (given means typed on the command line, not "differs from the default").
    second = tmp_path / "second"
    result = kvsim(
        "run", "--config", first / "config.json", "--max-num-seqs", "256",
        "--no-plots", "--out", second,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    again = json.loads((second / "config.json").read_text())["options"]
    assert again == {**options, "max_num_seqs": 256}
    assert RunConfig.from_dict(again).max_num_seqs == 256


def test_sweep_reproduce_command_uses_the_derived_flags() -> None:
    result = kvsim(
        "sweep", "--dry-run", "--block-size", "8,32", "--think-time", "1",
        "--concurrency", "4", "--param", "watermark=0,0.05",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    line = next(t for t in result.output.splitlines() if t.startswith("reproduce:"))
    assert "--think-time 1.0" in line
    assert "--concurrency 4" in line
    assert "--block-size 8,32" in line
    assert "--param watermark=0.0,0.05" in line
