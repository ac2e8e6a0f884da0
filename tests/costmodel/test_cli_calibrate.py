"""``kvsim calibrate`` and ``kvsim validate`` through typer's CliRunner: files written, tables
printed, one-line errors naming the file and column, nothing of the user's overwritten."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner, Result

from kvsim.cli import app
from kvsim.costmodel import load_coefficients, resolve_gpu
from tests.costmodel.profile_factory import write_allreduce, write_attention, write_compute
from tests.costmodel.test_fit import KNOWN

GPU = resolve_gpu("a100-80gb")


def kvsim(*args: object) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args], terminal_width=200)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Profiles of device 'a100' made from KNOWN: three models, attention, DGX all-reduce."""
    folder: Path = tmp_path_factory.mktemp("profiles")
    write_compute(folder, KNOWN, GPU, "a100")
    write_attention(folder, KNOWN, GPU, "a100")
    write_allreduce(folder, KNOWN, GPU, "a100_dgx")
    return folder


def one_error_line(result: Result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_calibrate_writes_the_fit_and_prints_its_error(synthetic: Path, tmp_path: Path) -> None:
    out = tmp_path / "co.json"
    result = kvsim("calibrate", synthetic, "--gpu", "a100-80gb", "-o", out)
    assert result.exit_code == 0, result.output
    co = load_coefficients(out)
    assert co.gpu == "a100-80gb" and co.provenance["linear"].kind == "fitted"
    assert co.gemm.flops_efficiency == pytest.approx(KNOWN.gemm.flops_efficiency, rel=1e-3)
    assert co.provenance["overheads"].kind == "prior"  # no steps/: the preset's priors kept
    for fragment in ("Per operator", "mlp_down_proj", "ModelB", "decode", "mape_pct"):
        assert fragment in result.stdout
    # The same output again is refused (nothing overwritten), unless --force.
    before = out.read_bytes()
    again = kvsim("calibrate", synthetic, "--gpu", "a100-80gb", "-o", out)
    assert "exists (written by kvsim); pass --force" in one_error_line(again)
    assert out.read_bytes() == before
    forced = kvsim("calibrate", synthetic, "--gpu", "a100-80gb", "-o", out, "--force")
    assert forced.exit_code == 0, forced.output


@pytest.mark.parametrize(
    ("edit", "fragments"),
    [
        (lambda f: f.drop(columns="time_stats.mlp_act.median"),
         ["missing column 'time_stats.mlp_act.median'"]),
        (lambda f: f.assign(num_tokens=f["num_tokens"].astype(str).where(f.index != 3, "many")),
         ["line 5", "column 'num_tokens'", "positive integer", "'many'"]),
        (lambda f: f.assign(**{"time_stats.add.median": -1.0}),
         ["line 2", "column 'time_stats.add.median'", "positive time"]),
    ],
)  # fmt: skip
def test_a_bad_profile_is_one_line_naming_file_and_column(
    synthetic: Path, tmp_path: Path, edit: object, fragments: list[str]
) -> None:
    folder = tmp_path / "bad"
    (folder / "compute").mkdir(parents=True)
    source = synthetic / "compute" / "a100__ModelA__mlp.csv"
    target = folder / "compute" / source.name
    edit_frame = edit  # a callable on the frame
    assert callable(edit_frame)
    edit_frame(pd.read_csv(source)).to_csv(target, index=False)
    for command in (["calibrate", folder, "--gpu", "a100-80gb", "-o", tmp_path / "x.json"],
                    ["validate", folder, "--gpu", "a100-80gb", "-o", tmp_path / "v"]):  # fmt: skip
        line = one_error_line(kvsim(*command))
        assert str(target) in line
        for fragment in fragments:
            assert fragment in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad"]  # nothing written


def test_calibrate_usage_errors(synthetic: Path, tmp_path: Path) -> None:
    assert "pass --gpu" in one_error_line(kvsim("calibrate", synthetic, "-o", tmp_path / "a"))
    assert "pass -o" in one_error_line(kvsim("calibrate", synthetic, "--gpu", "a100-80gb"))
    line = one_error_line(kvsim("calibrate", synthetic, "--gpu", "nope", "-o", tmp_path / "a"))
    assert "nope" in line
    line = one_error_line(
        kvsim("calibrate", tmp_path / "none", "--gpu", "l4", "-o", tmp_path / "a")
    )
    assert "not a folder" in line
    line = one_error_line(
        kvsim("calibrate", synthetic, "--gpu", "a100-80gb", "--system", "a100_dgxx",
              "-o", tmp_path / "a")
    )  # fmt: skip
    assert "--system 'a100_dgxx'" in line and "a100_dgx)" in line
    assert not (tmp_path / "a").exists()


@pytest.mark.slow  # seconds of end-to-end work; .ci/run runs the slow set too
def test_validate_writes_csvs_tables_and_plots(synthetic: Path, tmp_path: Path) -> None:
    out = tmp_path / "v"
    coefficients = tmp_path / "co.json"
    assert kvsim("calibrate", synthetic, "--gpu", "a100-80gb", "-o", coefficients).exit_code == 0
    result = kvsim(
        "validate", synthetic, "--gpu", "a100-80gb", "--coefficients", coefficients, "--lomo",
        "-o", out,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    names = {p.name for p in out.iterdir()}
    for stem in ("linear", "linear_lomo", "attention", "allreduce"):
        assert f"errors_{stem}.csv" in names and (out / "plots" / f"{stem}_a100-80gb.png").is_file()
    assert json.loads((out / "validation.json").read_text())["lomo"] is True
    linear = pd.read_csv(out / "errors_linear.csv")
    assert set(linear["op"]) >= {"sum", "attn_pre_proj", "add"}
    assert linear.loc[linear["op"] == "sum", "error"].abs().max() < 1e-3  # fitted on exact data
    lomo = pd.read_csv(out / "errors_linear_lomo.csv")
    assert set(lomo["model"]) == {"ModelA", "ModelB", "ModelC"}
    tables = (out / "tables.md").read_text()
    for title in ("by GPU and TP", "token range", "Leave one model out", "Attention", "All-reduce"):
        assert title in tables
    assert "| gpu | model | rows | mape_pct | worst_pct | bias_pct |" in tables
    again = kvsim("validate", synthetic, "--gpu", "a100-80gb", "-o", out)
    assert "--force replaces it" in one_error_line(again)
    assert kvsim("validate", synthetic, "--gpu", "a100-80gb", "-o", out, "--force").exit_code == 0
    # Nothing of the user's is replaced: not a folder kvsim wrote, nor a file of another kind.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    refused = kvsim("validate", synthetic, "--gpu", "a100-80gb", "-o", mine, "--force")
    assert "not a kvsim validation folder" in one_error_line(refused)
    notes = tmp_path / "notes.json"
    notes.write_text("{}")
    refused = kvsim("calibrate", synthetic, "--gpu", "a100-80gb", "-o", notes, "--force")
    assert "not a file kvsim wrote" in one_error_line(refused)
    assert notes.read_text() == "{}" and (mine / "notes.txt").read_text() == "mine"


def test_validate_needs_one_gpu_per_coefficient_file(synthetic: Path, tmp_path: Path) -> None:
    line = one_error_line(
        kvsim(
            "validate",
            synthetic,
            "--gpu",
            "a100-80gb",
            "--gpu",
            "h100-sxm",
            "--coefficients",
            tmp_path / "co.json",
        )
    )
    assert "exactly one --gpu" in line
    assert "pass --gpu" in one_error_line(kvsim("validate", synthetic))
