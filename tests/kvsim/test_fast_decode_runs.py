"""The FastDecodeScheduler must give exactly what the plain Scheduler gives, end to end."""

import pytest
from frame_equality import assert_frame_equal

from kvsim.config import RunConfig
from kvsim.runner import run
from workloads import Request, Trace


def both(config: RunConfig) -> tuple[dict, dict]:
    results = {}
    for multi in (False, True):
        r = run(config.replace(fast_decode=multi))
        results[multi] = r
    return results[False], results[True]


def assert_identical_summaries(a: dict, b: dict) -> None:
    for key, value in a.items():
        if key not in ("wall_time_s", "sim_requests_per_wall_s", "sim_steps_per_wall_s"):
            assert b[key] == value, key


def assert_identical(a, b) -> None:
    for table in ("events", "steps", "requests"):
        assert_frame_equal(getattr(a, table), getattr(b, table))
    assert_identical_summaries(a.summary, b.summary)


@pytest.mark.parametrize(
    "options",
    [
        {},  # roomy pool, open loop
        {"num_blocks": 900},  # preemptions
        {"num_blocks": 700, "block_size": 4, "watermark": 0.0, "until": 50.0},
        {"num_blocks": 600, "concurrency": 40},  # closed loop, no think time
        {"num_blocks": 900, "concurrency": 16, "think_time_s": 0.5},
        {"block_size": 64, "max_num_seqs": 8},  # seats, not blocks, hold the queue
    ],
)
def test_fast_decode_matches_the_plain_scheduler(options):
    a, b = both(RunConfig(trace="azure_llm_2023_conv_first_2min", **options))
    assert a.summary["num_steps"] > 1000
    assert_identical(a, b)


def test_fast_decode_matches_the_plain_scheduler_with_cancellations(tmp_path):
    requests = [
        Request(
            request_id=str(i),
            arrival_time_s=0.05 * i,
            prompt_tokens=100 + 37 * (i % 11),
            output_tokens=50 + 23 * (i % 7),
            cancel_after_s=1.5 if i % 3 == 0 else None,
        )
        for i in range(120)
    ]
    path = tmp_path / "cancel.jsonl"
    from workloads import save_trace

    save_trace(Trace(name="cancel", hash_block_size=None, requests=requests), path)
    a, b = both(RunConfig(trace=str(path), num_blocks=400))
    assert (a.requests["status"] == "aborted").sum() > 0
    assert_identical(a, b)


def test_a_run_that_keeps_no_events_measures_the_same(tmp_path):
    config = RunConfig(trace="azure_llm_2023_conv_first_2min", num_blocks=900)
    kept = run(config)
    lean = run(config, keep_events=False)
    assert lean.events is None and lean.events_path is None
    assert_frame_equal(kept.steps, lean.steps)
    assert_frame_equal(kept.requests, lean.requests)
    assert_identical_summaries(kept.summary, lean.summary)
    from kvsim.outputs.run_folder import write_run

    folder = write_run(lean, tmp_path / "run", plots=False)
    assert not (folder / "events.parquet").exists()


@pytest.mark.parametrize(
    "options",
    [
        {},  # shared prefixes (hash ids, prefix caching on): lazy decoders beside chunks
        {"long_prefill_token_threshold": 64, "num_blocks": 800},  # many chunks, preemptions
    ],
)
def test_fast_v1_prices_mixed_prefix_steps_as_the_plain_scheduler(options):
    # FastV1's steps list only their exact sequences; the executor counts the lazy decoders
    # from the scheduler's counters, and every step's time must equal the plain pricing.
    config = RunConfig(trace="mooncake_fast25_conversation_first_1000", until=200.0, **options)
    a, b = both(config)
    assert (a.steps["kind"] == "mixed").sum() > 100
    assert a.summary["num_preemptions"] > 0 or not options
    assert_identical(a, b)
