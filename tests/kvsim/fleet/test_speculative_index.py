"""llm-d's speculative indexing (--router-speculative-ttl): a routed prompt's block keys count
as held by the chosen replica for the TTL, before (or without) the KV events that confirm
them; confirmed keys and predictions are kept apart (kvsim/fleet/kv_index.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.config import RunConfig
from kvsim.errors import KvsimError
from kvsim.fleet.kv_index import REMOVED, STORED, KvEventIndex


def test_a_prediction_is_seen_at_once_and_expires_after_its_ttl() -> None:
    index = KvEventIndex(2, delay_s=5.0, speculative_ttl_s=2.0)
    index.speculate(10.0, 1, [7, 8, 9])
    index.advance(10.0)
    assert index.prefix_blocks(1, [7, 8, 9, 4]) == 3
    assert index.prefix_blocks(0, [7, 8, 9]) == 0  # only the chosen replica
    index.advance(11.999)
    assert index.prefix_blocks(1, [7, 8]) == 2
    index.advance(12.0)
    assert index.prefix_blocks(1, [7, 8]) == 0
    assert index.num_cached_blocks(1) == 0  # predictions are not the cache's size


def test_predicting_again_extends_and_confirmed_keys_outlive_predictions() -> None:
    index = KvEventIndex(1, delay_s=0.5, speculative_ttl_s=2.0)
    index.speculate(0.0, 0, [1, 2])
    index.speculate(1.0, 0, [1])  # key 1 predicted again: its expiry moves to 3 s
    index.publish(0.2, 0, STORED, [2])  # key 2 confirmed at 0.7 s
    index.advance(2.0)  # the first prediction expires: key 1 stays (predicted again)
    assert index.prefix_blocks(0, [1, 2]) == 2
    index.advance(3.0)
    assert index.prefix_blocks(0, [1]) == 0
    assert index.prefix_blocks(0, [2]) == 1  # confirmed: no expiry drops it
    index.speculate(3.0, 0, [5])
    index.publish(3.0, 0, REMOVED, [5])  # a BlockRemoved does not drop a prediction
    index.advance(3.5)
    assert index.prefix_blocks(0, [5]) == 1


def test_no_ttl_no_prediction() -> None:
    index = KvEventIndex(1, delay_s=0.05)
    index.speculate(0.0, 0, [1, 2])
    assert index.prefix_blocks(0, [1]) == 0
    with pytest.raises(ValueError, match="speculative TTL"):
        KvEventIndex(1, 0.0, speculative_ttl_s=-1.0)


def test_the_option_needs_the_prefix_router_in_a_fleet() -> None:
    t = "azure_llm_2023_conv"
    RunConfig(trace=t, replicas=2, router="prefix", router_speculative_ttl_s=2.0)
    for bad in ({"replicas": 2, "router": "kv-router"}, {"router": "prefix"}):
        with pytest.raises(KvsimError, match="--router-speculative-ttl is llm-d's"):
            RunConfig(trace=t, router_speculative_ttl_s=2.0, **bad)  # type: ignore[arg-type]
    assert "router_speculative_ttl_s" not in RunConfig(trace=t).to_dict()


def test_predictions_as_long_as_the_event_delay_win_back_what_late_events_lose(
    tmp_path: Path,
) -> None:
    runner = CliRunner()
    trace = tmp_path / "agents.jsonl"
    made = runner.invoke(app, ["gen", "-o", str(trace), "--sessions", "30", "--session-rate",
                               "2", "--tool-call-prob", "0.8", "--tool-time", "0.3",
                               "--seed", "1"])  # fmt: skip
    assert made.exit_code == 0, made.output

    def hit_rate(name: str, *extra: str) -> dict:  # type: ignore[type-arg]
        out = tmp_path / name
        result = runner.invoke(app, [
            "run", str(trace), "--replicas", "4", "--router", "prefix", "--num-blocks", "2000",
            "--step-time", "linear:0.01:0.0001", "--no-plots", "--out", str(out), *extra,
        ])  # fmt: skip
        assert result.exit_code == 0, result.output
        summary: dict = json.loads((out / "summary.json").read_text())  # type: ignore[type-arg]
        return summary

    fresh = hit_rate("fresh")
    late = hit_rate("late", "--router-event-delay", "5")
    predicted = hit_rate("predicted", "--router-event-delay", "5", "--router-speculative-ttl",
                         "5")  # fmt: skip
    rate = "prefix_cache_hit_rate"
    assert late[rate] < fresh[rate] - 0.01
    assert predicted[rate] > late[rate] + 0.01
    assert predicted["fleet"]["router_speculative_ttl_s"] == 5.0
    assert "router_speculative_ttl_s" not in late["fleet"]
