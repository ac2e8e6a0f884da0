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


def test_save_into_a_missing_folder_names_the_folder(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from kvsim.cli import app

    missing = tmp_path / "nope"
    result = CliRunner().invoke(
        app, ["gen", "-o", str(missing / "t.jsonl"), "--rate", "1", "--num-requests", "2",
              "--prompt", "8", "--output", "8"],
    )  # fmt: skip
    assert result.exit_code == 2
    assert f"{missing}: No such file or directory" in result.output
