"""Issue 31's property: whatever the output tree holds (user files at any depth, fake
markers and manifests, look-alike temporaries and locks), no command that writes changes a
byte of the user's, with or without --force."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvsim.atomic import names
from kvsim.cli import app

QUICK = ("--until", "1", "--no-plots")
AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
GEN = ("--rate", "2", "--num-requests", "5", "--prompt", "fixed:10", "--output", "fixed:3")
HASHED = "mooncake_fast25_conversation_first_1000"

# Names a user's tree may hold: kvsim's own file names, junk markers, look-alike temporaries.
PART = st.sampled_from([
    "config.json", "kvsim-manifest.json", "summary.json", "plots", "gantt.png", "report.html",
    "notes.txt", "sub", "curve.csv", ".out.kvsim-tmp-000000-1-ab", ".x.kvsim-lock",
    ".t.jsonl.kvsim.json",
])  # fmt: skip
CONTENT = st.sampled_from([
    b"", b"false", b"0", b'{"kvsim_run": 1}', b'{"kvsim_manifest": 1}',
    b'{"kvsim_owner": 1, "pid": 1, "host": "h", "temporaries": []}', b"my precious bytes",
])  # fmt: skip
TREE = st.dictionaries(st.lists(PART, min_size=1, max_size=4).map(tuple), CONTENT, max_size=8)
WRITERS = ["run", "gen", "import", "plot", "report", "export-trace", "cache-curve", "sweep",
           "animate", "export-kv-events"]  # fmt: skip
FAST_WRITERS = ["run", "gen", "import", "plot", "export-trace"]  # a second or less each
TARGETS = ["out", "out/sub", "out/config.json", "notes.txt", "out/notes.txt", "src.csv"]


def kvsim(*args: str | Path) -> int:
    return CliRunner().invoke(app, [str(a) for a in args]).exit_code


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


DEAD_PID = _dead_pid()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("prop") / "run"
    assert kvsim("run", *QUICK, "--out", out) == 0
    return out


def _plant(root: Path, tree: dict[tuple[str, ...], bytes]) -> set[Path]:
    """Write ``tree`` under ``root`` where nothing is yet (a path below a file is skipped),
    plus a look-alike temporary of a dead process of this host with no owner record; return
    every path made (the user's)."""
    made = set()
    for parts, content in sorted(tree.items()):
        path = root.joinpath(*parts)
        try:
            for parent in reversed(path.parents):
                if parent.is_relative_to(root) and not parent.exists():
                    parent.mkdir()
                    made.add(parent)
            if not path.exists():
                path.write_bytes(content)
                made.add(path)
        except (FileExistsError, NotADirectoryError, IsADirectoryError):
            continue
    lookalike = root / f".out.kvsim-tmp-{names._host_id()}-{DEAD_PID}-0011"
    if not lookalike.exists():
        lookalike.mkdir()
        made.add(lookalike)
    return made


def _command(writer: str, run_dir: Path, root: Path, target: Path) -> list[str | Path]:
    jsonl = target if target.suffix else target.with_suffix(".jsonl")
    commands: dict[str, list[str | Path]] = {
        "run": ["run", *QUICK, "--out", target],
        "gen": ["gen", *GEN, "-o", jsonl],
        "import": [
            "import",
            "azure",
            root / "src.csv",
            "-o",
            target if target.suffix == ".csv" else jsonl,
        ],
        "plot": ["plot", run_dir, "-w", "batch", "--out", target],
        "report": ["report", run_dir, "-o", target],
        "export-trace": ["export-trace", run_dir, "-o", target],
        "cache-curve": ["cache-curve", HASHED, "--capacity-tokens", "1e5", "--out", target],
        "sweep": ["sweep", "--until", "1", "--block-size", "16", "--out", target],
        "animate": ["animate", run_dir, "--frames", "2", "-o", target.with_suffix(".gif")],
        "export-kv-events": ["export-kv-events", run_dir, "-o", jsonl],
    }
    return commands[writer]


def check_no_user_byte_changes(
    run_dir: Path,
    tree: dict[tuple[str, ...], bytes],
    writer: str,
    target: str,
    force: bool,
    in_kvsim_folder: bool,
) -> None:
    """``root/out`` holds ``tree`` (on top of a copy of a kvsim run folder, whose own files
    kvsim may replace, when ``in_kvsim_folder``); the writer runs; every user path keeps its
    bytes."""
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        if in_kvsim_folder:
            shutil.copytree(run_dir, root / "out")
        else:
            (root / "out").mkdir()
        mine = _plant(root / "out", tree) | _plant(root, {("notes.txt",): b"mine"})
        (root / "src.csv").write_text(AZURE)
        mine.add(root / "src.csv")
        before = {p: None if p.is_dir() else p.read_bytes() for p in mine}
        kvsim(*_command(writer, run_dir, root, root / target), *(["--force"] if force else []))
        for path, content in before.items():
            assert os.path.lexists(path), (writer, target, force, path, "removed")
            assert (None if path.is_dir() else path.read_bytes()) == content, (
                writer, target, force, path, "changed"
            )  # fmt: skip


QUICKLY = settings(
    max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
THOROUGHLY = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
CASES = {"tree": TREE, "target": st.sampled_from(TARGETS), "force": st.booleans(),
         "in_kvsim_folder": st.booleans()}  # fmt: skip


# the case a weaker rule fails first: --force over a kvsim folder the user added to, deep down
DEEP = {("plots", "sub", "mine.png"): b"my precious bytes"}


@QUICKLY
@given(**CASES)
@example(tree=DEEP, target="out", force=True, in_kvsim_folder=True)
def test_no_user_byte_changes(
    run_dir: Path,
    tree: dict[tuple[str, ...], bytes],
    target: str,
    force: bool,
    in_kvsim_folder: bool,
) -> None:
    for writer in FAST_WRITERS:  # every writer over the same tree
        check_no_user_byte_changes(run_dir, tree, writer, target, force, in_kvsim_folder)


@pytest.mark.slow
@THOROUGHLY
@given(**CASES)
@example(tree=DEEP, target="out", force=True, in_kvsim_folder=True)
def test_no_user_byte_changes_thoroughly(
    run_dir: Path,
    tree: dict[tuple[str, ...], bytes],
    target: str,
    force: bool,
    in_kvsim_folder: bool,
) -> None:
    for writer in WRITERS:
        check_no_user_byte_changes(run_dir, tree, writer, target, force, in_kvsim_folder)
