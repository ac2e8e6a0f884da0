"""``kvsim run`` under the v1 scheduler: vLLM's per-GPU defaults, what-if settings accepted
with a warning, the priority policy, the linear step-time clock, and classic where v1 cannot go."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner, Result

from kvsim import RunConfig, run
from kvsim.cli import app


def kvsim(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


def write_trace(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def resolved_of(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())["resolved"]


@pytest.mark.parametrize(
    ("gpu", "tokens", "seqs"),
    [("h100-sxm", 8192, 1024), ("h200", 8192, 1024), ("a100-80gb", 2048, 256)],
)
def test_v1_batch_limits_follow_vllm_serving_defaults_per_gpu(
    tmp_path: Path, gpu: str, tokens: int, seqs: int
) -> None:
    out = tmp_path / "run"
    result = kvsim("run", "--gpu", gpu, "--until", "5", "--no-plots", "--out", out)
    assert result.exit_code == 0, result.output
    resolved = resolved_of(out)
    assert resolved["scheduler"] == "v1"
    assert resolved["enable_prefix_caching"] is True
    assert (resolved["max_num_batched_tokens"], resolved["max_num_seqs"]) == (tokens, seqs)
    assert resolved["watermark"] == 0.0


def test_classic_keeps_its_own_defaults(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = kvsim("run", "--scheduler", "classic", "--until", "5", "--no-plots", "--out", out)
    assert result.exit_code == 0, result.output
    resolved = resolved_of(out)
    assert resolved["scheduler"] == "classic"
    assert resolved["enable_prefix_caching"] is False  # classic never reuses a block
    assert (resolved["max_num_batched_tokens"], resolved["max_num_seqs"]) == (8192, 256)
    assert resolved["watermark"] == 0.01


def test_what_if_pool_and_context_are_accepted_with_one_warning_each(tmp_path: Path) -> None:
    """A context past the model's needs --allow-long-max-model-len, as vLLM needs
    VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (tests/kvsim/test_boundary_values.py: refused without)."""
    out = tmp_path / "run"
    result = kvsim(
        "run", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--num-blocks", "200000",
        "--max-model-len", "200000", "--allow-long-max-model-len", "--until", "5",
        "--no-plots", "--out", out,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("warning: ")]
    pool = [line for line in lines if "--num-blocks 200,000" in line]
    context = [line for line in lines if "--max-model-len 200,000" in line]
    assert len(pool) == 1 and "what-if" in pool[0]
    assert len(context) == 1 and "131,072" in context[0]  # the model's own context
    assert resolved_of(out)["num_blocks"] == 200000


def test_priority_policy_serves_priority_0_before_priority_5(tmp_path: Path) -> None:
    # Two requests at once, one sequence at a time: FCFS serves the file's order, the
    # priority policy the lower value first (vLLM: (priority, arrival time) order).
    trace = write_trace(
        tmp_path / "two.jsonl",
        [
            {"request_id": "low", "arrival_time_s": 0.0, "prompt_tokens": 64,
             "output_tokens": 8, "priority": 5},
            {"request_id": "high", "arrival_time_s": 0.0, "prompt_tokens": 64,
             "output_tokens": 8, "priority": 0},
        ],
    )  # fmt: skip
    first: dict[str, str] = {}
    for policy in ("fcfs", "priority"):
        out = tmp_path / policy
        result = kvsim(
            "run", trace, "--scheduling-policy", policy, "--max-num-seqs", "1",
            "--no-plots", "--out", out,
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        requests = pd.read_parquet(out / "requests.parquet").set_index("request_id")
        assert (requests["status"] == "finished").all()
        first[policy] = str(requests["first_token_time_s"].idxmin())
        # one at a time: the second starts after the first finished
        other = "low" if first[policy] == "high" else "high"
        assert requests.at[other, "admit_time_s"] >= requests.at[first[policy], "finish_time_s"]
    assert first == {"fcfs": "low", "priority": "high"}


def test_linear_step_time_is_the_references_clock(tmp_path: Path) -> None:
    # One request alone: its prefill step lasts base + per_token * prompt, each decode step
    # base + per_token * 1 (the clock of vllm_reference's driver).
    trace = write_trace(
        tmp_path / "one.jsonl",
        [{"request_id": "r", "arrival_time_s": 0.0, "prompt_tokens": 100, "output_tokens": 3}],
    )
    out = tmp_path / "run"
    result = kvsim(
        "run", trace, "--step-time", "linear:0.005:1e-5", "--no-plots", "--out", out
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    steps = pd.read_parquet(out / "steps.parquet")
    assert steps["num_batched_tokens"].tolist() == [100, 1, 1]
    assert steps["duration_s"].tolist() == pytest.approx([0.005 + 100e-5, 0.00501, 0.00501])
    request = pd.read_parquet(out / "requests.parquet").iloc[0]
    assert request["ttft_s"] == pytest.approx(0.005 + 100e-5)
    assert resolved_of(out)["step_time"] is not None


def test_a_prompt_longer_than_the_token_budget_is_chunked_not_rejected(tmp_path: Path) -> None:
    trace = write_trace(
        tmp_path / "long.jsonl",
        [{"request_id": "r", "arrival_time_s": 0.0, "prompt_tokens": 20000, "output_tokens": 2}],
    )
    for scheduler, finished in (("v1", 1), ("classic", 0)):
        out = tmp_path / scheduler
        result = kvsim(
            "run", trace, "--scheduler", scheduler, "--max-num-batched-tokens", "8192",
            "--max-model-len", "32768", "--allow-long-max-model-len", "--no-plots", "--out", out,
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        summary = json.loads((out / "summary.json").read_text())
        assert summary["num_finished"] == finished
    steps = pd.read_parquet(tmp_path / "v1" / "steps.parquet")
    assert steps["num_batched_tokens"].tolist()[:3] == [8192, 8192, 20000 - 2 * 8192]


def test_contiguous_allocator_defaults_to_classic_and_refuses_v1(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = kvsim(
        "run", "--allocator", "max", "--until", "5", "--no-plots", "--out", out
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert resolved_of(out)["scheduler"] == "classic"
    refused = kvsim(
        "run", "--allocator", "max", "--scheduler", "v1", "--no-plots",
        "--out", tmp_path / "v1",
    )  # fmt: skip
    assert refused.exit_code == 2
    assert len(refused.output.strip().splitlines()) == 1
    assert "classic" in refused.output and not (tmp_path / "v1").exists()


def hit_tokens_by_request(folder: Path) -> dict[str, int]:
    """Tokens each request was served from the prefix cache (its PREFIX_HIT events)."""
    events = pd.read_parquet(folder / "events.parquet")
    requests = pd.read_parquet(folder / "requests.parquet")
    hits = events[events["kind"] == "PREFIX_HIT"].groupby("seq_id")["num_tokens"].first()
    return {
        row.request_id: int(hits.get(row.seq_id, 0)) for row in requests.itertuples(index=False)
    }


@pytest.mark.parametrize("block_size", [16, 64, 1024])
def test_hash_ids_share_whole_blocks_at_any_block_size(tmp_path: Path, block_size: int) -> None:
    # 512-token hash blocks; "b" repeats "a"'s first two hash ids, "c" only the first.
    rows = [
        {"request_id": "a", "arrival_time_s": 0.0, "prompt_tokens": 1500, "output_tokens": 2,
         "hash_ids": [1, 2, 3]},
        {"request_id": "b", "arrival_time_s": 10.0, "prompt_tokens": 1500, "output_tokens": 2,
         "hash_ids": [1, 2, 9]},
        {"request_id": "c", "arrival_time_s": 20.0, "prompt_tokens": 1500, "output_tokens": 2,
         "hash_ids": [1, 7, 8]},
    ]  # fmt: skip
    trace = tmp_path / "h.jsonl"
    trace.write_text(
        json.dumps({"kvsim_trace": 1, "name": "h", "hash_block_size": 512})
        + "\n"
        + "".join(json.dumps(r) + "\n" for r in rows)
    )
    out = tmp_path / "run"
    result = kvsim("run", trace, "--block-size", block_size, "--no-plots", "--out", out)
    assert result.exit_code == 0, result.output
    shared = {"a": 0, "b": 1024, "c": 512}  # tokens of equal hash prefix
    # only whole blocks of the run's block size inside the shared prefix hit
    expected = {r: tokens // block_size * block_size for r, tokens in shared.items()}
    assert hit_tokens_by_request(out) == expected


def test_session_ids_share_the_conversation_so_far_without_hash_ids(tmp_path: Path) -> None:
    rows = [
        {"request_id": "t1", "arrival_time_s": 0.0, "prompt_tokens": 100, "output_tokens": 4,
         "session_id": "s"},
        {"request_id": "t2", "arrival_time_s": 10.0, "prompt_tokens": 300, "output_tokens": 4,
         "session_id": "s"},
        {"request_id": "other", "arrival_time_s": 20.0, "prompt_tokens": 300,
         "output_tokens": 4, "session_id": "u"},
        {"request_id": "alone", "arrival_time_s": 30.0, "prompt_tokens": 300,
         "output_tokens": 4},
    ]  # fmt: skip
    trace = write_trace(tmp_path / "s.jsonl", rows)
    out = tmp_path / "run"
    result = kvsim("run", trace, "--no-plots", "--out", out)
    assert result.exit_code == 0, result.output
    # t2 re-reads t1's prompt: its 6 full blocks of 16 (t1's output is model-made, not shared)
    assert hit_tokens_by_request(out) == {"t1": 0, "t2": 96, "other": 0, "alone": 0}
    off = tmp_path / "off"
    result = kvsim("run", trace, "--no-enable-prefix-caching", "--no-plots", "--out", off)
    assert result.exit_code == 0, result.output
    assert set(hit_tokens_by_request(off).values()) == {0}


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    num_blocks=st.integers(8, 60),
    block_size=st.sampled_from([4, 8, 16]),
    fast_decode=st.booleans(),
    max_num_batched_tokens=st.sampled_from([64, 512, 8192]),
)
def test_a_v1_run_always_ends_every_request(
    conversation_trace: Path,
    num_blocks: int,
    block_size: int,
    fast_decode: bool,
    max_num_batched_tokens: int,
) -> None:
    """Whatever the pool: every request finishes or is rejected with a reason, never waits
    forever. (A step whose only running request preempted itself once left the simulator
    waiting for an arrival that never came; the request, now too long for the pool, must be
    rejected at the next step.)"""
    config = RunConfig(
        trace=str(conversation_trace), model="llama-3.1-8b", gpu="h100-sxm",
        num_blocks=num_blocks, block_size=block_size, fast_decode=fast_decode,
        max_num_batched_tokens=max_num_batched_tokens, max_model_len=4096,
    )  # fmt: skip
    result = run(config, keep_events=False)
    summary = result.summary
    assert summary["num_unfinished"] == 0
    assert summary["num_finished"] + summary["num_rejected"] == summary["num_requests"] == 51
    rejected = result.requests[result.requests["status"] == "rejected"]
    assert rejected["finish_reason"].str.contains("exceeds KV capacity").all()
