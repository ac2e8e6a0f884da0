"""Issue 31: one output rule for every command that writes. A user's file or folder is never
replaced (with or without --force), the command's input is never its output, a marker or a
copied config.json proves nothing, and --force replaces only what kvsim's manifest or sidecar
proves it wrote."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from out_safety_helpers import QUICK, kvsim, one_error_line, tree

from kvsim.atomic.manifest import MANIFEST, sidecar_path

AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
GEN = ("--rate", "2", "--num-requests", "5", "--prompt", "fixed:10", "--output", "fixed:3")


# --- single files: gen, import --------------------------------------------------------------


def test_import_never_writes_over_its_own_source(tmp_path: Path) -> None:
    src = tmp_path / "src.csv"
    src.write_text(AZURE)
    link = tmp_path / "link.csv"
    link.symlink_to(src)
    hard = tmp_path / "hard.csv"
    os.link(src, hard)
    for out in (src, link, hard):
        for force in ([], ["--force"]):
            one_error_line(kvsim("import", "azure", src, "-o", out, *force), "input")
    assert src.read_text() == AZURE and link.is_symlink()


@pytest.mark.parametrize("command", ["gen", "import"])
def test_a_users_trace_file_is_never_replaced(command: str, tmp_path: Path) -> None:
    src = tmp_path / "src.csv"
    src.write_text(AZURE)
    args = ["gen", *GEN] if command == "gen" else ["import", "azure", src]
    mine = tmp_path / "data.jsonl"
    mine.write_text("mine\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(mine)
    before = tree(tmp_path)
    for out in (mine, link):
        one_error_line(kvsim(*args, "-o", out), str(out))
        one_error_line(kvsim(*args, "-o", out, "--force"), str(out))
    # a sidecar that does not match these bytes proves nothing
    sidecar_path(mine).write_text(json.dumps({"kvsim_file": 1, "name": "data.jsonl", "size": 5,
                                              "sha256": "0" * 64}))  # fmt: skip
    one_error_line(kvsim(*args, "-o", mine, "--force"), "not a file kvsim wrote")
    sidecar_path(mine).unlink()
    assert tree(tmp_path) == before


@pytest.mark.parametrize("command", ["gen", "import"])
def test_a_trace_kvsim_wrote_is_replaced_only_with_force(command: str, tmp_path: Path) -> None:
    src = tmp_path / "src.csv"
    src.write_text(AZURE)
    args = ["gen", *GEN] if command == "gen" else ["import", "azure", src]
    out = tmp_path / "t.jsonl"
    assert kvsim(*args, "-o", out).exit_code == 0
    first = out.read_bytes()
    one_error_line(kvsim(*args, "-o", out), "exists", "--force")
    assert kvsim(*args, "-o", out, "--force").exit_code == 0
    assert out.read_bytes() == first
    assert sorted(os.listdir(tmp_path)) == [".t.jsonl.kvsim.json", "src.csv", "t.jsonl"]
    out.write_bytes(first + b"\n")  # edited by the user: theirs now
    one_error_line(kvsim(*args, "-o", out, "--force"), "not a file kvsim wrote")
    assert out.read_bytes() == first + b"\n"


# --- folders: the manifest is the proof ----------------------------------------------------


@pytest.fixture
def earlier_run(tmp_path: Path) -> Path:
    out = tmp_path / "prev"
    result = kvsim("run", *QUICK, "--out", out)
    assert result.exit_code == 0, result.output
    return out


def test_a_user_file_at_any_depth_stops_force(earlier_run: Path) -> None:
    deep = earlier_run / "plots" / "mine"
    deep.mkdir(parents=True)
    (deep / "my_annotated.png").write_bytes(b"mine")
    before = tree(earlier_run)
    one_error_line(kvsim("run", *QUICK, "--out", earlier_run, "--force"), "my_annotated.png")
    assert tree(earlier_run) == before


def test_an_edited_kvsim_file_stops_force(earlier_run: Path) -> None:
    summary = earlier_run / "summary.json"
    summary.write_text(summary.read_text().replace("{", "{ ", 1))
    before = tree(earlier_run)
    one_error_line(kvsim("run", *QUICK, "--out", earlier_run, "--force"), "summary.json",
                   "changed")  # fmt: skip
    assert tree(earlier_run) == before


@pytest.mark.parametrize("marker", ["", "false", "0", '{"kvsim_run": 1}', "COPY"])
def test_a_marker_or_a_copied_config_is_no_proof(marker: str, earlier_run: Path,
                                                 tmp_path: Path) -> None:  # fmt: skip
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "report.html").write_text("my report")
    config = (earlier_run / "config.json").read_text() if marker == "COPY" else marker
    (proj / "config.json").write_text(config)
    (proj / MANIFEST).write_text(marker)  # a junk manifest is not one either
    before = tree(proj)
    for force in ([], ["--force"]):
        line = one_error_line(kvsim("run", *QUICK, "--out", proj, *force), str(proj))
        assert "not a kvsim run folder" in line or "delete it yourself" in line, line
    assert tree(proj) == before


def test_a_run_folder_without_a_manifest_is_left_to_the_user(earlier_run: Path) -> None:
    (earlier_run / MANIFEST).unlink()  # as an older kvsim wrote it
    before = tree(earlier_run)
    one_error_line(kvsim("run", *QUICK, "--out", earlier_run, "--force"), "delete it yourself")
    assert tree(earlier_run) == before


@pytest.mark.slow  # seconds of end-to-end work; .ci/run runs the slow set too
def test_rerunning_over_a_kvsim_run_still_works(earlier_run: Path) -> None:
    result = kvsim("run", "--until", "2", "--out", earlier_run, "--force")  # with plots
    assert result.exit_code == 0, result.output
    assert kvsim("report", earlier_run).exit_code == 0  # rewrites its own report.html
    assert kvsim("plot", earlier_run, "-w", "gantt").exit_code == 0
    assert kvsim("export-trace", earlier_run).exit_code == 0  # added to the manifest
    result = kvsim("run", *QUICK, "--out", earlier_run, "--force")
    assert result.exit_code == 0, result.output
    assert not (earlier_run / "run.perfetto.json").exists()


def test_plot_never_writes_into_a_users_folder(earlier_run: Path, tmp_path: Path) -> None:
    mine = tmp_path / "pics"
    mine.mkdir()
    (mine / "gantt.png").write_bytes(b"my own gantt")
    for force in ([], ["--force"]):
        one_error_line(kvsim("plot", earlier_run, "-w", "gantt", "--out", mine, *force),
                       "not a kvsim pictures folder")  # fmt: skip
    assert tree(mine) == {"gantt.png": b"my own gantt"}
    out = tmp_path / "new"
    assert kvsim("plot", earlier_run, "-w", "gantt", "--out", out).exit_code == 0
    one_error_line(kvsim("plot", earlier_run, "-w", "gantt", "--out", out), "--force")
    assert kvsim("plot", earlier_run, "-w", "gantt", "--out", out, "--force").exit_code == 0


def test_plot_into_the_run_folder_keeps_a_users_picture(earlier_run: Path) -> None:
    (earlier_run / "plots").mkdir()
    (earlier_run / "plots" / "gantt.png").write_bytes(b"my annotated gantt")
    one_error_line(kvsim("plot", earlier_run, "-w", "gantt"), "not a file kvsim wrote")
    assert (earlier_run / "plots" / "gantt.png").read_bytes() == b"my annotated gantt"


@pytest.mark.slow  # seconds of end-to-end work; a sibling checks the rule by default
def test_a_sweep_points_pictures_keep_the_sweep_replaceable(tmp_path: Path) -> None:
    sweep = tmp_path / "sw"
    assert kvsim("sweep", "--until", "1", "--out", sweep).exit_code == 0
    point = next((sweep / "points").iterdir())
    assert kvsim("plot", point, "-w", "batch").exit_code == 0
    result = kvsim("sweep", "--until", "1", "--out", sweep, "--force")
    assert result.exit_code == 0, result.output


def test_default_run_folders_in_the_same_second_take_the_next_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvsim.commands import run as run_command

    monkeypatch.chdir(tmp_path)
    taken = run_command.default_out("trace.jsonl")
    # another kvsim process took the name between our choosing it and writing it
    monkeypatch.setattr(run_command, "default_out", lambda trace, folder="runs": taken)
    taken.mkdir(parents=True)
    (taken / "theirs.txt").write_text("x")
    result = kvsim("run", *QUICK)
    assert result.exit_code == 0, result.output
    assert (taken / "theirs.txt").read_text() == "x"
    assert taken.with_name(f"{taken.name}-2").is_dir()


def test_look_alike_temporaries_survive_the_sigkill_clean_up(tmp_path: Path) -> None:
    import subprocess
    import sys

    from kvsim.atomic import names

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # a dead pid of this host: its name alone must not doom a file
    runs = tmp_path / "runs"
    runs.mkdir()
    lookalikes = {
        f".run.kvsim-tmp-{names._host_id()}-{child.pid}-abcd": b"my notes",
        ".important.kvsim-lock": b"my lock-shaped notes",
        ".x.kvsim-lock": b'{"kvsim_owner": 1, "pid": "1"}',  # a record kvsim never writes
    }
    for name, content in lookalikes.items():
        (runs / name).write_bytes(content)
    result = kvsim("run", *QUICK, "--out", runs / "other")
    assert result.exit_code == 0, result.output
    assert {n: (runs / n).read_bytes() for n in lookalikes} == lookalikes


@pytest.mark.slow  # importing torch: ~10-20 s on a loaded machine
def test_a_failed_engine_start_leaves_no_torch_cache(tmp_path: Path) -> None:
    import subprocess
    import sys

    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA for the start to fail")
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env["TMPDIR"] = str(tmp_path / "tmp")
    (tmp_path / "tmp").mkdir()
    args = ["run", "--mode", "engine", "--model", "tiny-llama", "--device", "cuda",
            "--out", tmp_path / "run"]  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "kvsim", *map(str, args)], env=env,
                          capture_output=True, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert os.listdir(tmp_path / "tmp") == []  # no torchinductor_* folder
    assert os.listdir(tmp_path) == ["tmp"]


@pytest.mark.parametrize("command", ["animate", "plot", "report", "export-trace"])
def test_a_window_after_the_run_is_refused(command: str, earlier_run: Path, tmp_path: Path) -> None:
    out = {
        "animate": ["-o", tmp_path / "a.gif"],
        "plot": ["--out", tmp_path / "p"],
        "report": ["-o", tmp_path / "r.html"],
        "export-trace": ["-o", tmp_path / "t.json"],
    }
    one_error_line(kvsim(command, earlier_run, "--from", "100", "--to", "200", *out[command]),
                   "--from 100", "end of the run")  # fmt: skip
    assert sorted(os.listdir(tmp_path)) == ["prev"]


def test_a_users_file_named_like_the_outputs_lock_is_never_taken(tmp_path: Path) -> None:
    lock = tmp_path / ".r.kvsim-lock"
    for content in (b"my notes", b"", b'{"kvsim_owner": 1}'):
        lock.write_bytes(content)
        one_error_line(kvsim("run", *QUICK, "--out", tmp_path / "r"), str(lock),
                       "not a kvsim lock")  # fmt: skip
        assert lock.read_bytes() == content
        assert sorted(os.listdir(tmp_path)) == [".r.kvsim-lock"]


def test_errors_name_the_output_never_kvsims_temporary(earlier_run: Path, tmp_path: Path) -> None:
    line = one_error_line(kvsim("animate", earlier_run, "-o", tmp_path / "a.txt"), "a.txt")
    assert ".kvsim-tmp-" not in line
