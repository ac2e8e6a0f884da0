"""kvsim's offloading scheduler replays vLLM 0.33.0's OffloadingConnector goldens
(golden/offload/, recorded with the reference driver) step for step: what each step
schedules, admits, loads, stores, flushes and evicts, what the CPU tier holds, and who
finishes — zero differences (tests/engine/offload_replay.py); and on kvsim's own clock, the
same step times and reported transfer completions. The *_disk goldens run vLLM's tiering spec
with a disk tier behind the CPU tier (benchmarks/vllm_reference/offload_tier.py): its
cascades, lookups (probes), promotions and contents are compared too."""

from __future__ import annotations

import pytest
from offload_golden import GOLDEN, load_offload_golden
from offload_replay import BACKENDS, replay_offload

from engine.compiled import load

FILES = sorted(GOLDEN.glob("*.steps.jsonl.gz"))
# the compiled backends run where the extension is built
RUNNABLE = [b for b in BACKENDS if b == "python" or load() is not None]


def _name(path) -> str:  # type: ignore[no-untyped-def]
    return str(path.name.split(".")[0])


def _cases(slow: bool) -> list:  # type: ignore[type-arg]
    """(golden, backend) pairs: every golden on the readable parts; on the compiled parts the
    hand-made goldens by default and the Mooncake ones under -m slow. The *_disk goldens run
    the compiled parts nowhere: with a tier behind it the CPU tier is the readable one
    (engine/offload/connector.py), so that replay would be the readable one again."""
    out = []
    for path in FILES:
        for backend in RUNNABLE:
            if backend != "python" and ("_disk" in path.name or ("mooncake" in path.name) != slow):
                continue
            if backend == "python" and slow:
                continue
            out.append(pytest.param(path, backend, id=f"{_name(path)}-{backend}"))
    return out


@pytest.mark.parametrize(("path", "backend"), _cases(slow=False))
def test_offload_golden_replays_with_zero_differences(path, backend) -> None:  # type: ignore[no-untyped-def]
    check_replay(path, backend)


@pytest.mark.slow
@pytest.mark.parametrize(("path", "backend"), _cases(slow=True))
def test_offload_golden_replays_with_zero_differences_slow(path, backend) -> None:  # type: ignore[no-untyped-def]
    check_replay(path, backend)


def check_replay(path, backend) -> None:  # type: ignore[no-untyped-def]
    replay = replay_offload(path, backend=backend)
    assert replay.differences == []
    assert replay.steps_compared == len(load_offload_golden(path).steps) > 30
    assert not replay.scheduler.has_unfinished()


@pytest.mark.parametrize(("path", "backend"), _cases(slow=False))
def test_offload_golden_replays_on_kvsims_own_clock(path, backend) -> None:  # type: ignore[no-untyped-def]
    check_own_clock(path, backend)


@pytest.mark.slow
@pytest.mark.parametrize(("path", "backend"), _cases(slow=True))
def test_offload_golden_replays_on_kvsims_own_clock_slow(path, backend) -> None:  # type: ignore[no-untyped-def]
    check_own_clock(path, backend)


def check_own_clock(path, backend) -> None:  # type: ignore[no-untyped-def]
    # kvsim's worker and transfer model time every step: same arrivals, start times, flush
    # waits and reported completions as the reference (the goldens' step-time model)
    replay = replay_offload(path, own_clock=True, backend=backend)
    assert replay.differences == []
