"""Without the compiled core `kvsim run` still runs (pure Python) and says so in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def kvsim_run(out: Path, *, missing_core: bool, pure_python: bool) -> subprocess.CompletedProcess:
    code = (
        "import sys\n"
        # None in sys.modules makes `import engine.compiled._core` raise ImportError, as on a
        # machine where the extension was never built
        + ("sys.modules['engine.compiled._core'] = None\n" if missing_core else "")
        + "from kvsim.cli import main\n"
        f"sys.argv = ['kvsim', 'run', '--no-plots', '--until', '5', '--out', {str(out)!r}]\n"
        "main()\n"
    )
    env = dict(os.environ)
    env.pop("KVSIM_PURE_PYTHON", None)
    if pure_python:
        env["KVSIM_PURE_PYTHON"] = "1"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env
    )


def test_a_missing_core_is_a_one_line_notice_not_a_failure(tmp_path: Path) -> None:
    done = kvsim_run(tmp_path / "run", missing_core=True, pure_python=False)
    assert done.returncode == 0, done.stderr
    notices = [line for line in done.stderr.splitlines() if line.startswith("notice:")]
    assert len(notices) == 1, done.stderr
    assert "compiled core is not built" in notices[0] and "pure-Python" in notices[0]
    assert (tmp_path / "run" / "summary.json").is_file()


def test_asking_for_pure_python_gives_no_notice(tmp_path: Path) -> None:
    done = kvsim_run(tmp_path / "run", missing_core=False, pure_python=True)
    assert done.returncode == 0, done.stderr
    assert "notice:" not in done.stderr
