"""``kvsim export-kv-events``: a v1 run's prefix cache as vLLM KVEventBatch lines that a
consumer replaying them ends with the run's cache, and refusals as one line, exit 2."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner, Result

from kvsim.cli import app
from kvsim.config import RunConfig
from kvsim.outputs.run_folder import read_run
from kvsim.runner import run

UNSIGNED = (1 << 64) - 1


def kvsim(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


def assert_one_error_line(result: Result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


COMMON = ["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--num-blocks", "40", "--no-plots"]


@pytest.fixture(scope="module")
def v1_dir(conversation_trace: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A v1 run folder (events streamed to disk by `kvsim run`) with sharing and evictions."""
    out = tmp_path_factory.mktemp("kv") / "run"
    result = kvsim("run", conversation_trace, *COMMON, "--out", out)
    assert result.exit_code == 0, result.output
    return out


def read_batches(path: Path) -> list[list]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_consumer_replaying_the_events_ends_with_the_runs_cache(
    v1_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "events.jsonl"
    result = kvsim("export-kv-events", v1_dir, "-o", out)
    assert result.exit_code == 0, result.output
    size = out.stat().st_size  # the line says what it wrote: 12.3 kB
    assert f"({size / 1e3:.3g} kB: " in " ".join(result.stdout.split()), result.stdout
    batches = read_batches(out)
    events = read_run(v1_dir).events
    assert events is not None
    stored: Counter[int] = Counter()  # key -> blocks holding it (vLLM does not deduplicate)
    num_stored = num_removed = 0
    last_ts = 0.0
    for ts, batch, rank in batches:
        assert rank is None and ts >= last_ts and batch
        last_ts = ts
        for e in batch:
            if e["type"] == "BlockStored":
                assert set(e) == {"type", "block_hashes", "parent_block_hash", "token_ids",
                                  "block_size", "lora_id", "medium", "lora_name"}  # fmt: skip
                assert e["block_size"] == 16 and e["medium"] == "GPU"
                parent = e["parent_block_hash"]
                assert parent is None or stored[parent] > 0  # its parent is cached
                stored.update(e["block_hashes"])
                num_stored += len(e["block_hashes"])
            elif e["type"] == "BlockRemoved":
                (key,) = e["block_hashes"]
                assert stored[key] > 0, "removed a block that was never stored"
                stored[key] -= 1
                num_removed += 1
            else:
                assert e == {"type": "AllBlocksCleared"}
                stored.clear()
    kind = events["kind"].astype(str)
    assert num_stored == int((kind == "CACHE").sum())
    assert (
        num_removed
        == int((kind == "EVICT").sum())
        == read_run(v1_dir).summary["prefix_cache_evictions"]
    )
    # every stored block is removed later or still cached at the end: replay the keys
    cached: dict[int, int] = {}
    for k, b, h in zip(kind, events["block_id"], events["block_hash"]):
        if k == "CACHE":
            cached[b] = int(h) & UNSIGNED
        elif k == "EVICT":
            assert cached.pop(b) == int(h) & UNSIGNED
    assert +stored == Counter(cached.values())


def test_streamed_keys_equal_the_in_memory_runs(conversation_trace: Path, v1_dir: Path) -> None:
    """The keys written chunk by chunk while `kvsim run` streams events are the recorder's."""
    config = RunConfig(
        trace=str(conversation_trace), model="llama-3.1-8b", gpu="h100-sxm", num_blocks=40
    )
    memory = run(config).events
    streamed = read_run(v1_dir).events
    assert memory is not None and streamed is not None
    pd.testing.assert_frame_equal(memory, streamed, check_categorical=False)
    assert (memory["block_hash"] != 0).sum() == memory["kind"].isin(["CACHE", "EVICT"]).sum()


def test_an_existing_file_is_replaced_only_with_force(v1_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "mine.jsonl"
    out.write_text("keep me\n")  # the user's: never replaced, not even with --force
    for force in ([], ["--force"]):
        line = "is not a file kvsim wrote"
        assert_one_error_line(kvsim("export-kv-events", v1_dir, "-o", out, *force), line)
    assert out.read_text() == "keep me\n"
    out.unlink()
    assert kvsim("export-kv-events", v1_dir, "-o", out).exit_code == 0
    assert_one_error_line(kvsim("export-kv-events", v1_dir, "-o", out), "exists", "--force")
    assert kvsim("export-kv-events", v1_dir, "-o", out, "--force").exit_code == 0  # kvsim's
    assert read_batches(out)
    assert_one_error_line(kvsim("export-kv-events", v1_dir, "-o", tmp_path), "directory")
    # no temporaries left; the sidecar that proves the file is kvsim's
    assert sorted(p.name for p in tmp_path.iterdir()) == [".mine.jsonl.kvsim.json", "mine.jsonl"]


@pytest.mark.parametrize(
    ("options", "says"),
    [(["--scheduler", "classic"], "classic"), (["--no-enable-prefix-caching"], "caching")],
)
def test_a_run_without_a_prefix_cache_is_refused(
    conversation_trace: Path, tmp_path: Path, options: list[str], says: str
) -> None:
    out = tmp_path / "run"
    assert kvsim("run", conversation_trace, *COMMON, *options, "--out", out).exit_code == 0
    assert_one_error_line(kvsim("export-kv-events", out, "-o", tmp_path / "e.jsonl"), says)
    assert not (tmp_path / "e.jsonl").exists()


def test_a_large_export_is_announced_with_its_size(
    v1_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvsim.commands import kv_events

    monkeypatch.setattr(kv_events, "NOTICE_BYTES", 1.0)  # this small run counts as large
    result = kvsim("export-kv-events", v1_dir, "-o", tmp_path / "e.jsonl")
    assert result.exit_code == 0, result.output
    notice = " ".join(result.stderr.split())
    assert notice.startswith("notice: ") and "cache and eviction rows to export: about" in notice


def test_size_text() -> None:
    from kvsim.commands.kv_events import size_text

    assert [size_text(n) for n in (512, 12_345, 907_000_000, 1.2e9)] == [
        "512 B", "12.3 kB", "907 MB", "1.2 GB",
    ]  # fmt: skip
