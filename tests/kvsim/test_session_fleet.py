"""Agentic session traces through the CLI: ``kvsim gen --sessions`` writes a trace whose
shared prefixes a fleet's prefix-aware router can use, and refuses bad options with one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from workloads import load_trace

SESSIONS = [
    "--sessions", "40", "--session-rate", "2", "--turns", "uniform:2:6",
    "--agent-types", "2", "--system-prompt", "300", "--user-tokens", "uniform:50:300",
    "--output-tokens", "uniform:20:100", "--tool-result-tokens", "uniform:20:100",
    "--tool-call-tokens", "uniform:5:20", "--think-time", "2", "--tool-time", "0.2",
]  # fmt: skip


def kvsim(*args: str | Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


def hit_rate(trace: Path, router: str, out: Path) -> float:
    code, output = kvsim(
        "run", trace, "--replicas", "4", "--router", router, "--num-blocks", "2000",
        "--step-time", "linear:0.01:0.0001", "--out", out, "--no-plots",
    )  # fmt: skip
    assert code == 0, output
    rate: float = json.loads((out / "summary.json").read_text())["prefix_cache_hit_rate"]
    return rate


def test_the_prefix_router_finds_each_session_s_earlier_turns(tmp_path: Path) -> None:
    """Round-robin sends a session's turns to all four replicas, so each finds only the system
    prompt and what it saw of the session; llm-d's prefix scorer follows the session."""
    trace = tmp_path / "sessions.jsonl"
    code, output = kvsim("gen", "-o", trace, *SESSIONS, "--seed", "2")
    assert code == 0 and "requests of 40 sessions" in output, output
    prefix = hit_rate(trace, "prefix", tmp_path / "prefix")
    round_robin = hit_rate(trace, "round-robin", tmp_path / "rr")
    assert prefix > round_robin + 0.1, (prefix, round_robin)


def test_same_seed_same_bytes_and_no_overwrite_without_force(tmp_path: Path) -> None:
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for path in (first, second):
        assert kvsim("gen", "-o", path, *SESSIONS, "--seed", "7", "--name", "s")[0] == 0
    assert first.read_bytes() == second.read_bytes()
    trace = load_trace(first)
    assert trace.hash_block_size == 16 and len({r.session_id for r in trace.requests}) == 40
    before = first.read_bytes()
    code, output = kvsim("gen", "-o", first, *SESSIONS, "--seed", "8")
    assert code == 2 and "pass --force" in output and first.read_bytes() == before
    assert kvsim("gen", "-o", first, *SESSIONS, "--seed", "8", "--force")[0] == 0
    assert first.read_bytes() != before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sessions", "3"], "--session-rate is required with --sessions"),
        (["--sessions", "3", "--session-rate", "1", "--rate", "2"], "use --session-rate"),
        (["--sessions", "3", "--session-rate", "1", "--num-requests", "2"], "--num-requests"),
        (["--sessions", "3", "--session-rate", "1", "--prompt", "5"], "use --user-tokens"),
        (["--sessions", "3", "--session-rate", "0"], "rate must be a positive number"),
        (["--sessions", "0", "--session-rate", "1"], "--sessions must be an integer from 1"),
        (["--sessions", "3", "--session-rate", "1", "--turns", "x"], "--turns: bad length SPEC"),
        (["--sessions", "3", "--session-rate", "1", "--tool-call-prob", "-0.1"], "probability"),
        (["--sessions", "3", "--session-rate", "1", "--think-time", "inf"], "--think-time"),
        (["--sessions", "3", "--session-rate", "1", "--max-context", "0"], "--max-context"),
        (["--rate", "1", "--num-requests", "3", "--think-time", "1"], "only with --sessions"),
        (["--rate", "1", "--num-requests", "3", "--session-rate", "1"], "only with --sessions"),
    ],
)
def test_bad_options_exit_2_with_one_line_and_write_nothing(
    tmp_path: Path, args: list[str], message: str
) -> None:
    code, output = kvsim("gen", "-o", tmp_path / "x.jsonl", *args)
    assert code == 2 and message in output and output.count("error:") == 1, output
    assert list(tmp_path.iterdir()) == []
