"""workloads stays independent: it imports nothing of kvsim or engine."""

from __future__ import annotations

import ast
from pathlib import Path

import workloads

FORBIDDEN = ("kvsim", "engine")


def test_workloads_imports_nothing_of_ours() -> None:
    root = Path(workloads.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN]
    assert offenders == []


def test_save_under_a_file_names_it_and_a_missing_folder_is_made(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from kvsim.cli import app

    # kvsim's one output rule (README, "Output folders"): parents are made, as for --out DIR
    args = ["--rate", "1", "--num-requests", "2", "--prompt", "8", "--output", "8"]
    missing = tmp_path / "nope"
    result = CliRunner().invoke(app, ["gen", "-o", str(missing / "t.jsonl"), *args])
    assert result.exit_code == 0, result.output
    assert (missing / "t.jsonl").is_file()
    (tmp_path / "file").write_text("x")
    result = CliRunner().invoke(app, ["gen", "-o", str(tmp_path / "file" / "t.jsonl"), *args])
    assert result.exit_code == 2
    assert f"{tmp_path / 'file'}: is not a folder" in result.output
