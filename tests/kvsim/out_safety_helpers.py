"""What the output-rule and --out safety tests share (test_output_rule.py, test_out_*.py):
kvsim's CLI in process, its one error line, a folder's tree with its bytes, a quick run into a
folder, an earlier run to write over."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner, Result

from kvsim.cli import app

ROOT = Path(__file__).parents[2]
QUICK = ("--until", "2", "--no-plots")  # a run of about a tenth of a second


def kvsim(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


def one_error_line(result: Result, *fragments: str) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines
    # the message is kvsim's, not a raw OSError's repr
    assert "Error" not in lines[0].split(":", 1)[1] or "OSError" not in lines[0], lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def tree(folder: Path) -> dict[str, bytes | None]:
    """Every path under ``folder`` with its bytes (None for folders)."""
    return {
        str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes()
        for p in sorted(folder.rglob("*"))
    }


def run_into(out: Path, *extra: str) -> Result:
    return kvsim("run", *QUICK, "--out", out, *extra)


def an_earlier_run(tmp_path: Path) -> Path:
    """A quick run folder at ``tmp_path/runs/r``: an earlier kvsim run to write over."""
    out = tmp_path / "runs" / "r"
    assert run_into(out).exit_code == 0
    return out
