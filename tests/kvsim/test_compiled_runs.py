"""Whole cost-mode runs on the compiled core (kvsim/sim/compiled_v1.py) against the pure-Python
path (KVSIM_PURE_PYTHON=1): the same tables, summary (wall times aside) and run-folder files,
byte for byte."""

from __future__ import annotations

from pathlib import Path

import pytest
from frame_equality import assert_frame_equal

import engine.compiled
from kvsim.config import RunConfig
from kvsim.outputs.run_folder import write_run
from kvsim.runner import run
from kvsim.runner.resolve import load_workload
from kvsim.sim.compiled_v1 import CompiledV1Simulation
from workloads import Request, Trace, load_trace, resolve_trace, save_trace
from workloads.formats import jsonl
from workloads.request_columns import RequestColumns

if engine.compiled.load() is None:
    pytest.skip(str(engine.compiled.unavailable_reason()), allow_module_level=True)

WALL = ("wall_time_s", "sim_requests_per_wall_s", "sim_steps_per_wall_s")
FILES = ("requests.parquet", "steps.parquet", "events.parquet", "config.json")


def run_both(
    config: RunConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, uses_core: bool = True
) -> None:
    """Run ``config`` on both paths, write both run folders, and compare everything."""
    results, folders = {}, {}
    seen: list[str] = []
    original = CompiledV1Simulation.run

    def spy(self: CompiledV1Simulation, *args: object, **kwargs: object) -> object:
        seen.append(self.__class__.__name__)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(CompiledV1Simulation, "run", spy)
    for path in ("compiled", "python"):
        if path == "python":
            monkeypatch.setenv("KVSIM_PURE_PYTHON", "1")
        engine.compiled.cache_clear()
        seen.clear()
        try:
            results[path] = run(config)
        finally:
            monkeypatch.delenv("KVSIM_PURE_PYTHON", raising=False)
            engine.compiled.cache_clear()
        assert bool(seen) == (path == "compiled" and uses_core), path
        folders[path] = write_run(results[path], tmp_path / path, plots=False)
    a, b = results["compiled"], results["python"]
    for table in ("steps", "requests"):
        assert_frame_equal(getattr(a, table), getattr(b, table))
    assert {k: v for k, v in a.summary.items() if k not in WALL} == {
        k: v for k, v in b.summary.items() if k not in WALL
    }
    for name in FILES:
        assert (folders["compiled"] / name).read_bytes() == (
            folders["python"] / name
        ).read_bytes(), name


@pytest.mark.parametrize(
    "options",
    [
        {},  # the default trace, v1 with prefix caching
        {"num_blocks": 500, "block_size": 8},  # preemption storms
        {"enable_prefix_caching": False, "num_blocks": 900},
        {"enable_chunked_prefill": False, "max_num_seqs": 8, "until": 40.0},
        # block size 1: the first minute (23 preemptions) by default, the whole trace (1,081
        # preemptions, 3.4 million events, 5 s in Python) under -m slow
        {"long_prefill_token_threshold": 64, "block_size": 1, "num_blocks": 40_000, "until": 60.0},
        pytest.param(
            {"long_prefill_token_threshold": 64, "block_size": 1, "num_blocks": 40_000},
            marks=pytest.mark.slow,
        ),
        {"num_blocks": 600, "concurrency": 24, "think_time_s": 0.2},  # closed loop
        {"step_time": "linear:0.005:0.00001", "num_blocks": 800},  # the reference's clock
    ],
)
def test_compiled_runs_match_python(
    options: dict[str, object], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_both(RunConfig(trace="azure_llm_2023_conv_first_2min", **options), tmp_path, monkeypatch)


def test_shared_prefixes_from_hash_ids_match(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = RunConfig(trace="mooncake_fast25_conversation_first_1000", num_blocks=3000)
    run_both(config, tmp_path, monkeypatch)


def test_priorities_and_cancellations_match(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    requests = [
        Request(
            request_id=str(i),
            arrival_time_s=0.05 * i,
            prompt_tokens=100 + 37 * (i % 11),
            output_tokens=50 + 23 * (i % 7),
            priority=i % 3,
            cancel_after_s=1.5 if i % 3 == 0 else None,
        )
        for i in range(150)
    ]
    path = tmp_path / "cancel.jsonl"
    save_trace(Trace(name="cancel", hash_block_size=None, requests=requests), path)
    config = RunConfig(trace=str(path), num_blocks=300, scheduling_policy="priority")
    run_both(config, tmp_path, monkeypatch)


def test_contiguous_runs_stay_on_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # classic runs on paged KV run on the core: tests/kvsim/test_compiled_classic_runs.py
    config = RunConfig(trace="azure_llm_2023_conv_first_2min", allocator="pow2")
    run_both(config, tmp_path, monkeypatch, uses_core=False)


def test_session_ids_without_hash_ids_match(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conversation's turns share its earlier prompt through its session id alone (a key
    stream of 2**40 tokens per id, which the core takes at the prompt's length)."""
    requests = [
        Request(
            request_id=str(i),
            arrival_time_s=0.3 * i,
            prompt_tokens=120 + 90 * (i // 5),  # each turn re-reads the ones before it
            output_tokens=20 + i % 9,
            session_id=f"s{i % 5}" if i % 7 else None,
        )
        for i in range(60)
    ]
    path = tmp_path / "sessions.jsonl"
    save_trace(Trace(name="sessions", hash_block_size=None, requests=requests), path)
    run_both(RunConfig(trace=str(path), num_blocks=400), tmp_path, monkeypatch)


def test_steps_ending_exactly_at_an_arrival_match(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every step takes 0.25 s and requests arrive on the half second: steps end exactly at
    arrivals, which the core must leave to the simpy clock (a step only runs inside the core
    when it ends strictly before the next simpy event)."""
    run_both(grid_config(tmp_path), tmp_path, monkeypatch)


def grid_config(tmp_path: Path, **options: object) -> RunConfig:
    """A run whose steps take 0.25 s each while requests arrive on the half second, a
    quarter of them cancelled a second later (written to ``tmp_path``)."""
    requests = [
        Request(
            request_id=str(i),
            arrival_time_s=0.5 * (i // 3),
            prompt_tokens=30 + 7 * (i % 5),
            output_tokens=3 + i % 4,
            cancel_after_s=1.0 if i % 4 == 0 else None,
        )
        for i in range(90)
    ]
    path = tmp_path / "grid.jsonl"
    save_trace(Trace(name="grid", hash_block_size=None, requests=requests), path)
    return RunConfig(trace=str(path), num_blocks=60, step_time="linear:0.25:0", **options)


def test_the_loop_outcomes_are_the_cores() -> None:
    from engine.compiled import _core
    from kvsim.sim import compiled_v1

    names = ("idle", "wait", "pending")
    assert [_core.LOOP_OUTCOMES.index(n) for n in names] == [
        compiled_v1.IDLE,
        compiled_v1.WAIT,
        compiled_v1.PENDING,
    ]


@pytest.mark.slow  # seconds of end-to-end work; a sibling checks the rule by default
def test_offload_runs_on_the_compiled_tier_match_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 16 GiB CPU tier (2,048 chunks) behind 1,000 GPU blocks: 20,673 tier evictions, 12
    # loads, long prompts rejected.
    # The compiled path here is the compiled CPU tier (CpuTier) under the Python scheduler,
    # as runs with secondary tiers take it (the compiled offloading scheduler is held to
    # Python by tests/kvsim/test_compiled_offload_runs.py).
    import engine.offload.connector as connector_module
    import kvsim.sim.compiled_offload as compiled_offload_module
    from engine.offload.cpu_manager import make_cpu_tier

    # kvsim.runner.replay imports it at the call (a run without a tier does not import it)
    monkeypatch.setattr(compiled_offload_module, "compiled_offload_applies", lambda *a: False)

    tiers: list[str] = []

    def spy(*args: object, **kwargs: object) -> object:
        tier = make_cpu_tier(*args, **kwargs)  # type: ignore[arg-type]
        tiers.append(type(tier).__name__)
        return tier

    monkeypatch.setattr(connector_module, "make_cpu_tier", spy)
    config = RunConfig(
        trace="mooncake_fast25_conversation_first_1000",
        num_blocks=1000,
        kv_offloading_size=16.0,
        until=600.0,
    )
    monkeypatch.setattr(f"{__name__}.FILES", (*FILES, "transfers.parquet"))
    run_both(config, tmp_path, monkeypatch, uses_core=False)
    assert tiers == ["CpuTier", "CPUOffloadManager"]


@pytest.mark.parametrize(
    "name",
    [
        "azure_llm_2023_conv_first_2min",
        # hash ids (kept whole beside the columns): 1.5 s, under -m slow
        pytest.param("mooncake_fast25_conversation_first_1000", marks=pytest.mark.slow),
    ],
)
def test_traces_held_as_columns_run_as_lists(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's JSON Lines trace comes as columns (workloads/request_columns.py, and
    kvsim.runner.resolve asks for them whatever the trace's length): both paths run them as
    they run the same requests in a list (a JSON document's, which has no columns)."""
    config = RunConfig(trace=name, num_blocks=600)
    document = tmp_path / f"{name}.json"
    save_trace(load_trace(resolve_trace(name)), document)
    assert isinstance(load_workload(config.replace(trace=str(document)))[1].requests, list)
    as_list = run(config.replace(trace=str(document)))
    assert isinstance(load_workload(config)[1].requests, RequestColumns)
    monkeypatch.setattr(jsonl, "COLUMNS_FROM_REQUESTS", 0)  # every trace as columns
    assert isinstance(load_trace(resolve_trace(name)).requests, RequestColumns)
    run_both(config, tmp_path, monkeypatch)
    as_columns = run(config)
    for table in ("steps", "requests"):
        assert_frame_equal(getattr(as_columns, table), getattr(as_list, table))
    assert {k: v for k, v in as_columns.summary.items() if k not in WALL} == {
        k: v for k, v in as_list.summary.items() if k not in WALL
    }


def test_a_streamed_run_drops_what_its_summary_used(tmp_path: Path) -> None:
    """A streamed run's kept events and residency samples are let go once its tables and
    summary are made; what it returns is the same as when they are kept."""
    config = RunConfig(trace="azure_llm_2023_conv_first_2min")
    kept = run(config)
    streamed = run(config, events_path=tmp_path / "events.parquet")
    for table in ("steps", "requests", "marks"):
        assert_frame_equal(getattr(streamed, table), getattr(kept, table))
    assert {k: v for k, v in streamed.summary.items() if k not in WALL} == {
        k: v for k, v in kept.summary.items() if k not in WALL
    }
