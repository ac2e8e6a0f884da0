"""``kvsim cache-curve``: curve.csv and curve.png in a folder it owns, the table alone without
--out, one error line for bad input, and the picture (both policies on a log axis, the KV
pool marked)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from cache_curve_replays import (
    INF,
)
from PIL import Image
from typer.testing import CliRunner, Result

from kvsim.analysis.cache_curve import (
    CURVE_COLUMNS,
    cache_curve,
)
from kvsim.cli import app
from workloads import load_trace, shipped_trace_path


def kvsim(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


def assert_one_error_line(result: Result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    for fragment in fragments:
        assert fragment in lines[0]


SAMPLE = "mooncake_fast25_conversation_first_1000"


def test_cli_writes_curve_csv_and_png(tmp_path: Path) -> None:
    out = tmp_path / "curve"
    result = kvsim("cache-curve", SAMPLE, "--capacity-tokens", "1e5,1e6,3e6,inf", "--out", out)
    assert result.exit_code == 0, result.output
    assert "KV pool of llama-2-7b on a100-80gb" in result.output
    assert sorted(p.name for p in out.iterdir()) == [
        "curve.csv",
        "curve.png",
        "kvsim-manifest.json",
    ]
    with open(out / "curve.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == CURVE_COLUMNS
    assert [(r["capacity_tokens"], r["capacity_blocks"], r["policy"]) for r in rows] == [
        (c, b, policy)
        for policy in ("lru", "optimal")
        for c, b in (("100000", "195"), ("1000000", "1953"), ("3000000", "5859"), ("inf", "inf"))
    ]
    expected = cache_curve(load_trace(shipped_trace_path(SAMPLE)), 512, [1e5, 1e6, 3e6, INF])
    assert [int(r["hit_tokens"]) for r in rows] == [r["hit_tokens"] for r in expected.rows]
    assert [float(r["hit_rate"]) for r in rows] == [r["hit_rate"] for r in expected.rows]
    with Image.open(out / "curve.png") as image:
        assert image.width > 400 and image.height > 200
    # A cache-curve folder is recognised and replaced with --force; the block size changes
    # the rows.
    args = ["cache-curve", SAMPLE, "--block-size", "64", "--capacity-tokens", "1e6", "--out", out]
    assert_one_error_line(kvsim(*args), "--force")
    again = kvsim(*args, "--force")
    assert again.exit_code == 0, again.output
    assert (out / "curve.csv").read_text().splitlines()[1].startswith("1000000,15625,lru,")


def test_cli_default_grid_without_out_prints_the_table_only(tmp_path: Path) -> None:
    result = kvsim("cache-curve", SAMPLE, "--gpu", "h100-sxm", "--model", "llama-3-70b",
                   "--tp", "4")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (
        "unlimited" in result.output and "KV pool of llama-3-70b on 4 x h100-sxm" in result.output
    )


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["azure_llm_2023_conv_first_2min"], ["has no hash_ids"]),
        ([SAMPLE, "--capacity-tokens", "1e5,lots"], ["--capacity-tokens", "'lots'"]),
        ([SAMPLE, "--capacity-tokens", "-5"], ["> 0 tokens"]),
        ([SAMPLE, "--capacity-tokens", "nan"], ["'nan' is not a number"]),
        ([SAMPLE, "--capacity-tokens", "1e400"], ["1e400 is too large", "write inf"]),
        ([SAMPLE, "--capacity-tokens", "1_000"], ["'1_000' is not a number"]),
        ([SAMPLE, "--capacity-tokens", "1e5,,1e6"], ["is not a number"]),
        ([SAMPLE, "--block-size", "0"], ["block size must be a positive integer"]),
        (["no_such_trace"], ["no such file"]),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(args: list[str], fragments: list[str]) -> None:
    assert_one_error_line(kvsim("cache-curve", *args), *fragments)


def test_cli_never_replaces_a_folder_it_did_not_write(tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    refusal = "not a kvsim cache-curve folder"
    assert_one_error_line(kvsim("cache-curve", SAMPLE, "--out", out, "--force"), refusal)
    # A curve.csv among other files is not enough either.
    (out / "curve.csv").write_text(",".join(CURVE_COLUMNS) + "\n")
    assert_one_error_line(kvsim("cache-curve", SAMPLE, "--out", out, "--force"), refusal)
    assert (out / "notes.txt").read_text() == "keep me"
    (tmp_path / "file").write_text("x")
    assert_one_error_line(kvsim("cache-curve", SAMPLE, "--out", tmp_path / "file"), "not a folder")


def test_cli_echoes_odd_capacities(tmp_path: Path) -> None:
    # A fraction of a block holds nothing; a capacity past the working set holds everything.
    out = tmp_path / "odd"
    result = kvsim("cache-curve", SAMPLE, "--capacity-tokens", "1.5,1e30,inf", "--out", out)
    assert result.exit_code == 0, result.output
    rows = [line.split(",") for line in (out / "curve.csv").read_text().splitlines()[1:4]]
    assert [r[:3] for r in rows] == [["1.5", "0", "lru"], ["1e+30", "1.953125e+27", "lru"],
                                     ["inf", "inf", "lru"]]  # fmt: skip
    assert rows[0][4] == "0" and rows[1][4] == rows[2][4] != "0"


def test_plot_draws_both_policies_on_a_log_axis_with_the_pool_marked() -> None:
    from kvsim.plots import plot_cache_curve

    trace = load_trace(shipped_trace_path(SAMPLE))
    frame = cache_curve(trace, 512, [1e5, 1e6, 3e6, INF]).frame()
    fig = plot_cache_curve(frame, pool_tokens=5e5, pool_label="pool")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels[:2] == ["LRU", "optimal (Belady)"]
    lru = ax.get_lines()[0]
    assert list(lru.get_xdata()) == [1e5, 1e6, 3e6]  # unlimited is a level, not a point
    assert list(lru.get_ydata()) == [100 * r for r in frame["hit_rate"][:3]]
    assert any("pool: 500,000 tokens" in label for label in labels)
    assert any("unlimited capacity" in label for label in labels)
