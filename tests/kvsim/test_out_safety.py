"""``--out`` never destroys a user's files: kvsim run / kvsim sweep write a new folder, or
replace a folder kvsim wrote (marked, and only with --force, proven byte for byte by its
manifest). A full disk or a read-only folder: test_out_disk_failures.py; two writers, a crash
between renames, a killed writer: test_out_writers.py and test_out_locks.py."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest
from out_safety_helpers import (
    QUICK,
    an_earlier_run,
    kvsim,
    one_error_line,
    run_into,
    tree,
)

from kvsim.atomic import temp_path
from kvsim.commands.run import default_out


@pytest.fixture
def earlier_run(tmp_path: Path) -> Path:
    return an_earlier_run(tmp_path)


# --- what may be written over --------------------------------------------------------------


def test_a_new_folder_is_written_and_nothing_else(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b" / "run"
    result = run_into(out)
    assert result.exit_code == 0, result.output
    assert sorted(os.listdir(out.parent)) == ["run"]
    assert json.loads((out / "config.json").read_text())["kvsim_run"] == 1


@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
def test_a_folder_of_the_users_is_never_touched(tmp_path: Path, force: bool) -> None:
    mine = tmp_path / "mine"
    (mine / "sub").mkdir(parents=True)
    (mine / "notes.txt").write_text("important")
    (mine / "sub" / "config.json").write_text("{}")
    before = tree(tmp_path)
    one_error_line(run_into(mine, *(["--force"] if force else [])), "mine", "not a kvsim run")
    assert tree(tmp_path) == before


@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
def test_a_file_is_never_replaced(tmp_path: Path, force: bool) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("important")
    one_error_line(run_into(notes, *(["--force"] if force else [])), "notes.txt", "not a folder")
    assert tree(tmp_path) == {"notes.txt": b"important"}


@pytest.mark.parametrize("out", [".", "", "..", "./"], ids=["dot", "empty", "dotdot", "dot-slash"])
def test_the_current_folder_is_never_the_output(
    out: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cwd = tmp_path / "work"
    cwd.mkdir()
    (cwd / "notes.txt").write_text("important")
    monkeypatch.chdir(cwd)
    before = tree(tmp_path)
    one_error_line(kvsim("run", *QUICK, "--out", out, "--force"))
    one_error_line(kvsim("sweep", "--until", "1", "--out", out, "--force"))
    assert tree(tmp_path) == before


def test_a_folder_above_the_current_one_is_never_the_output(
    earlier_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inside = earlier_run / "plots"
    inside.mkdir()
    monkeypatch.chdir(inside)
    one_error_line(run_into(earlier_run, "--force"), "current folder")


def test_an_earlier_run_is_replaced_only_with_force(earlier_run: Path) -> None:
    before = tree(earlier_run)
    one_error_line(run_into(earlier_run), "earlier kvsim run", "--force")
    assert tree(earlier_run) == before
    result = run_into(earlier_run, "--force", "--num-blocks", "500")
    assert result.exit_code == 0, result.output
    assert json.loads((earlier_run / "summary.json").read_text())["num_blocks"] == 500
    assert sorted(os.listdir(earlier_run.parent)) == ["r"]  # no temporary, old folder or lock


def test_a_kvsim_folder_holding_a_users_file_is_not_replaced(earlier_run: Path) -> None:
    (earlier_run / "my-notes.md").write_text("mine")
    (earlier_run / "plots").mkdir()
    (earlier_run / "plots" / "sketch.svg").write_text("<svg/>")
    before = tree(earlier_run)
    one_error_line(run_into(earlier_run, "--force"), "my-notes.md", "did not write")
    (earlier_run / "my-notes.md").unlink()
    one_error_line(run_into(earlier_run, "--force"), "plots/sketch.svg")
    del before["my-notes.md"]
    assert tree(earlier_run) == before


@pytest.mark.slow  # seconds of end-to-end work; a sibling checks the rule by default
def test_a_hand_made_marker_is_not_enough_for_the_other_kind(earlier_run: Path) -> None:
    # a run folder is not a sweep folder, and the other way round
    one_error_line(kvsim("sweep", "--until", "1", "--out", earlier_run, "--force"), "sweep")
    sweep = earlier_run.parent / "sweep"
    assert kvsim("sweep", "--until", "1", "--out", sweep).exit_code == 0
    one_error_line(run_into(sweep, "--force"), "not a kvsim run folder")
    result = kvsim("sweep", "--until", "1", "--out", sweep, "--force", "--seed", "3")
    assert result.exit_code == 0, result.output
    assert sorted(os.listdir(sweep.parent)) == ["r", "sweep"]


def test_a_symbolic_link_is_refused(earlier_run: Path) -> None:
    link = earlier_run.parent / "link"
    link.symlink_to(earlier_run)
    one_error_line(run_into(link, "--force"), "symbolic link")
    assert link.is_symlink()


@pytest.mark.parametrize(
    ("make", "out", "fragment"),
    [
        pytest.param(lambda d: (d / "f.txt").write_text("x"), "f.txt/run", "is not a folder",
                     id="file-as-parent"),
        pytest.param(lambda d: [(d / n).write_text("x") for n in ("runs", "sweeps")], None,
                     "is not a folder", id="file-named-runs"),
        pytest.param(lambda d: None, "x" * 300, "file name too long", id="enametoolong"),
        pytest.param(lambda d: (d / "f.txt").write_text("x"), "f.txt/a/b/run", "is not a folder",
                     id="file-as-grandparent"),
    ],
)  # fmt: skip
def test_an_impossible_out_is_one_line_and_leaves_nothing(
    make: object, out: str | None, fragment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    make(tmp_path)  # type: ignore[operator]
    before = tree(tmp_path)
    args = ["--out", out] if out is not None else []
    one_error_line(kvsim("run", *QUICK, *args), fragment)
    one_error_line(kvsim("sweep", "--until", "1", *args), fragment)
    assert tree(tmp_path) == before


def test_a_long_name_still_gets_temporaries_that_fit(tmp_path: Path) -> None:
    out = tmp_path / ("r" * 250)
    result = run_into(out)
    assert result.exit_code == 0, result.output
    assert os.listdir(tmp_path) == [out.name]
    assert len(temp_path(out).name.encode()) <= 255


def test_the_default_folder_never_collides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    first = default_out("trace.jsonl")
    first.mkdir(parents=True)
    second = default_out("trace.jsonl")
    assert second != first and second.parent == first.parent
    assert second.name.startswith(first.name)


def test_a_settled_file_is_hashed_once_and_again_once_changed(
    earlier_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--force checks the earlier folder three times; a file left alone for a while is hashed
    once (kvsim/atomic/manifest.py's digests by identity and times), and any write to it
    after, even one that keeps its size and puts its mtime back, changes its ctime: hashed
    again, and refused."""
    from kvsim.atomic import manifest

    monkeypatch.setattr(manifest, "_SETTLED_NS", 0)  # every file counts as settled
    monkeypatch.setattr(manifest, "_DIGESTS", {})
    summary = earlier_run / "summary.json"
    digest = manifest.file_digest(summary)
    assert digest in manifest._DIGESTS.values()
    hashed: list[str] = []
    sha256 = hashlib.sha256

    def counted() -> hashlib._Hash:
        hashed.append("read")
        return sha256()

    monkeypatch.setattr(hashlib, "sha256", counted)
    assert manifest.file_digest(summary) == digest and not hashed  # known: not read again
    before = os.stat(summary)
    text = summary.read_bytes()
    time.sleep(0.01)  # a ctime tick on coarse file systems' clocks
    summary.write_bytes(text.replace(b"0", b"1", 1))
    os.utime(summary, ns=(before.st_atime_ns, before.st_mtime_ns))
    monkeypatch.undo()
    monkeypatch.setattr(manifest, "_SETTLED_NS", 0)
    assert manifest.file_digest(summary) != digest
    one_error_line(run_into(earlier_run, "--force"), "summary.json", "changed since")
