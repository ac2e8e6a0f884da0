"""Issue 31: a full disk (or any OS error while writing) is one line naming the file and the
error in words, exit code 2, and no temporary left behind, for every command that writes."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from kvsim.cli import app

AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
    f"2023-11-16 18:15:{s:02d}.0,{100 + s},{10 + s}\n" for s in range(50)
)


HASHED = "mooncake_fast25_conversation_first_1000"  # a shipped trace with hash_ids
PROFILES = Path(__file__).resolve().parents[2] / "profiles" / "vidur"


def kvsim(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "r"
    result = kvsim("run", HASHED, "--until", "20", "--no-plots", "--out", out)
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture
def full_disk(tmp_path: Path) -> object:
    """A 64 KiB tmpfs, nearly filled."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)],
                          capture_output=True)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.decode().strip()}")
    try:
        _fill(disk / "filler")
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def _fill(filler: Path) -> None:
    """Fill the disk, then free 8 KiB: room for a lock file, not for an output."""
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"x" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    os.truncate(filler, max(0, filler.stat().st_size - 8192))


def commands(run_dir: Path, src: Path, out: Path) -> dict[str, list[str | Path]]:
    gen = ["--rate", "50", "--num-requests", "2000", "--prompt", "fixed:10", "--output", "fixed:3"]
    return {
        "gen": ["gen", "-o", out / "t.jsonl", *gen],
        "import": ["import", "azure", src, "-o", out / "t.jsonl"],
        "report": ["report", run_dir, "-o", out / "r.html"],
        "plot": ["plot", run_dir, "-w", "gantt", "--out", out / "pics"],
        "export-trace": ["export-trace", run_dir, "-o", out / "t.json"],
        "cache-curve": ["cache-curve", HASHED, "--out", out / "c"],
        "animate": ["animate", run_dir, "-o", out / "a.gif", "--frames", "3"],
        "export-kv-events": ["export-kv-events", run_dir, "-o", out / "kv.jsonl"],
        "calibrate": ["calibrate", PROFILES, "--gpu", "a100-80gb", "-o", out / "co.json"],
        "validate": ["validate", PROFILES, "--gpu", "a100-80gb", "-o", out / "val"],
        "run": ["run", "--until", "20", "--out", out / "run"],
    }


@pytest.mark.parametrize(
    "name",
    ["gen", "import", "report", "plot", "export-trace", "cache-curve", "run", "animate",
     "export-kv-events", pytest.param("calibrate", marks=pytest.mark.slow),
     pytest.param("validate", marks=pytest.mark.slow)],
)  # fmt: skip
def test_a_full_disk_is_one_line_exit_2_and_leaves_nothing(
    name: str, run_dir: Path, full_disk: Path, tmp_path: Path
) -> None:
    src = tmp_path / "azure.csv"
    src.write_text(AZURE)
    before = sorted(os.listdir(full_disk))
    result = kvsim(*commands(run_dir, src, full_disk)[name])
    assert result.exit_code == 2, (result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "No space left on device" in lines[0], lines[0]
    assert str(full_disk) in lines[0], lines[0]  # names where
    if name != "run":  # (the run's events writer names its own file)
        assert ".kvsim-tmp-" not in lines[0], lines[0]  # the output, not kvsim's temporary
    assert not re.search(r"\b[A-Z]\w*(Error|Exception)\b", lines[0]), lines[0]  # no class names
    assert sorted(os.listdir(full_disk)) == before  # no temporary, no lock, no half file
