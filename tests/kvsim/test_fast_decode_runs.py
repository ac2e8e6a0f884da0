"""The FastDecodeScheduler must give exactly what the plain Scheduler gives, end to end."""

import pandas as pd
import pytest

from kvsim.config import RunConfig
from kvsim.runner import run
from workloads import Request, Trace


def both(config: RunConfig) -> tuple[dict, dict]:
    results = {}
    for multi in (False, True):
        r = run(config.replace(fast_decode=multi))
        results[multi] = r
    return results[False], results[True]


def assert_identical(a, b) -> None:
    for table in ("events", "steps", "requests"):
        pd.testing.assert_frame_equal(getattr(a, table), getattr(b, table))
    for key, value in a.summary.items():
        if key not in ("wall_time_s", "sim_requests_per_wall_s", "sim_steps_per_wall_s"):
            assert b.summary[key] == value, key


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
