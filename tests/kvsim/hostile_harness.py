"""The harness of the hostile-input CLI tests (test_hostile_cli.py, test_hostile_specs.py,
test_hostile_folders.py): a ``Case`` is a kvsim command line run in a fresh folder, and
``check`` holds it to the rule every case must keep.

Every case must exit 0, or exit 2 with exactly one ``error:`` line on stderr (naming the file
and field where there is one) and nothing on stdout; no traceback, nothing written for a
refused command, and no temporary left anywhere under the test's folder.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from kvsim.cli import app

QUICK = ("--until", "0.5", "--no-plots")
HUGE_INT = "9" * 5000  # past Python's 4,300-digit int conversion limit
OSC8 = "\x1b]8;;https://example.com\x1b\\click\x1b]8;;\x1b\\"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture(autouse=True)
def one_click_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """Build the click command once, not once per invocation (26 ms each, a thousand times):
    CliRunner.invoke(app) calls typer.main.get_command(app) every time."""
    import typer.testing

    command = typer.main.get_command(app)
    monkeypatch.setattr(typer.testing, "_get_command", lambda typer_app: command)


@dataclass
class Case:
    """``args`` for kvsim, run in a fresh folder after ``setup(folder)``; an exit-2 line must
    contain every ``names`` fragment (a file, a field)."""

    id: str
    args: Callable[[Path], list[str]]
    names: tuple[str, ...] = ()
    setup: Callable[[Path], None] = lambda folder: None
    env: dict[str, str] = field(default_factory=dict)
    must_fail: bool = False


def temporaries(folder: Path) -> list[str]:
    return [
        str(p.relative_to(folder))
        for p in folder.rglob("*")
        if ".kvsim-" in p.name or ".tmp-" in p.name or p.name.startswith("kvsim-point-")
    ]


def check(case: Case, folder: Path) -> Result:
    """Run ``case`` in ``folder`` (set up already) and check what it did."""
    before = set(os.listdir(folder))
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        result = CliRunner().invoke(app, case.args(folder), env=case.env or None)
    finally:
        os.chdir(cwd)
    assert result.exit_code in (0, 2), (case.id, result.exit_code, result.output[-2000:])
    assert "Traceback" not in result.output, (case.id, result.output[-2000:])
    assert not temporaries(folder), (case.id, temporaries(folder))
    if case.must_fail:
        assert result.exit_code == 2, (case.id, result.output[-2000:])
    if result.exit_code == 2:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, (case.id, lines)
        assert lines[0].startswith("error: "), (case.id, lines)
        # nothing on stdout (a forced-colour terminal may get the cursor shown again)
        assert not ANSI.sub("", result.stdout).strip(), (case.id, result.stdout[-2000:])
        for name in case.names:
            assert name in lines[0], (case.id, name, lines[0])
        assert "\x1b]8;;" not in result.stderr, case.id  # no link smuggled into the terminal
        assert set(os.listdir(folder)) == before, (case.id, "wrote something")
    return result


def run_cases(cases: list[Case], tmp_path: Path) -> None:
    """Each case in its own folder (a case's leftovers cannot hide another's)."""
    for i, case in enumerate(cases):
        folder = tmp_path / f"c{i}"
        folder.mkdir()
        case.setup(folder)
        check(case, folder)
