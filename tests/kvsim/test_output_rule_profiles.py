"""Issue 31's output rule for the two writers the property test (test_output_property.py)
leaves out because they measure for a minute: ``kvsim profile`` and ``kvsim validate-run``
refuse a user's folder even with --force, before any measuring, and change none of its bytes."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvsim.cli import app

SHIPPED = Path(__file__).resolve().parents[2] / "kvsim" / "costmodel" / "gpu_coefficients"


@pytest.mark.parametrize(
    ("args", "kind"),
    [
        pytest.param(  # ~7 s: torch is imported before the folder is checked
            ["profile", "--mode", "engine", "--model", "tiny-llama", "--quick"],
            "engine profile",
            marks=pytest.mark.slow,
        ),
        (["validate-run", "--coefficients", str(SHIPPED / "a100-80gb.json")], "validate-run"),
    ],
)
def test_a_users_folder_is_never_replaced(args: list[str], kind: str, tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_bytes(b"my precious bytes")
    result = CliRunner().invoke(app, [*args, "--out", str(mine), "--force"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"is not a kvsim {kind}" in lines[0], result.stderr
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    assert (mine / "notes.txt").read_bytes() == b"my precious bytes"
