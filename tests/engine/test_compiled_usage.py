"""The compiled usage tracker (engine/compiled/csrc/usage.hpp) gives the Python
PagedUsageTracker's U and held references at every STEP event (kvsim/analysis/kv_breakdown.py),
on random event streams cut into chunks at different places and on compiled v1 runs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from engine import EventKind
from engine.compiled import load
from kvsim.analysis.kv_breakdown import PagedUsageTracker

core = load()
pytestmark = pytest.mark.skipif(core is None, reason="the compiled core is not built")

TAKE = [EventKind.ALLOCATE, EventKind.APPEND_BLOCK, EventKind.PREFIX_HIT]
OTHER = [EventKind.STEP, EventKind.ARRIVE, EventKind.CACHE, EventKind.EVICT, EventKind.FINISH]


def random_stream(seed: int, num_events: int, num_seqs: int) -> dict[str, np.ndarray]:
    """Sequences take blocks and free their whole tables, between steps and other events."""
    rng = np.random.default_rng(seed)
    held = np.zeros(num_seqs, dtype=np.int64)
    kinds, seqs, counts = [], [], []
    for _ in range(num_events):
        r = rng.random()
        s = int(rng.integers(0, num_seqs))
        if r < 0.45:
            kind, n = TAKE[int(rng.integers(0, 3))], int(rng.integers(1, 6))
            held[s] += n
        elif r < 0.55 and held[s]:
            kind, n = EventKind.FREE, int(held[s])
            held[s] = 0
        else:
            kind, n, s = OTHER[int(rng.integers(0, len(OTHER)))], 0, -1
        kinds.append(kind)
        seqs.append(s)
        counts.append(n)
    return {
        "kind": np.array(kinds, dtype=np.int8),
        "seq_id": np.array(seqs, dtype=np.int32),
        "num_blocks": np.array(counts, dtype=np.int32),
    }


def cuts(rng: np.random.Generator, n: int) -> list[int]:
    return [0, *sorted(set(rng.integers(0, n, int(rng.integers(0, 6))).tolist())), n]


@pytest.mark.parametrize("seed", range(8))
def test_random_streams_give_the_python_sums(seed: int) -> None:
    block_size = [1, 3, 16, 64][seed % 4]
    num_seqs = 30
    finals = np.random.default_rng(seed + 100).integers(1, 400, num_seqs)
    stream = random_stream(seed, 4000, num_seqs)
    python = PagedUsageTracker(block_size, lambda s: int(finals[s]))
    for lo, hi in itertools.pairwise(cuts(np.random.default_rng(seed), 4000)):
        python.consume({k: v[lo:hi] for k, v in stream.items()})
    compiled = core.UsageTracker(block_size)
    for s in range(num_seqs):
        compiled.set_final_length(s, int(finals[s]))
    states = []
    for lo, hi in itertools.pairwise(cuts(np.random.default_rng(seed + 1), 4000)):
        compiled.consume(
            stream["kind"][lo:hi], stream["seq_id"][lo:hi], stream["num_blocks"][lo:hi]
        )
        states.append(compiled.state())
    num_steps = int((stream["kind"] == EventKind.STEP).sum())
    usable = np.concatenate([s["usable_at_steps"] for s in states])
    refs = np.concatenate([s["refs_at_steps"] for s in states])
    want_usable = python.usable_at_steps(num_steps)
    assert len(usable) == num_steps > 100
    assert (want_usable > 0).any() and (
        want_usable < python.refs_at_steps(num_steps) * block_size
    ).any()
    np.testing.assert_array_equal(usable, want_usable)
    np.testing.assert_array_equal(refs, python.refs_at_steps(num_steps))


def test_a_block_event_without_a_final_length_is_refused() -> None:
    tracker = core.UsageTracker(16)
    with pytest.raises(RuntimeError, match="final length"):
        tracker.consume([EventKind.ALLOCATE], [3], [1])


@pytest.mark.parametrize(("block_size", "num_blocks"), [(16, 60), (1, 700)])
def test_compiled_runs_give_the_python_sums(block_size: int, num_blocks: int) -> None:
    rng = np.random.default_rng(block_size)
    v1 = core.V1Core(num_blocks, block_size, True, max_num_seqs=16, max_num_batched_tokens=256,
                     track_usage=True)  # fmt: skip
    finals: dict[int, int] = {}
    python = PagedUsageTracker(block_size, finals.__getitem__)
    prompts = [list(range(int(rng.integers(1, 20)) * 8)) for _ in range(12)]
    states = []
    for seq_id in range(120):
        tokens = prompts[int(rng.integers(0, 12))] + [1000 + seq_id] * int(rng.integers(0, 40))
        output = int(rng.integers(1, 30))
        finals[seq_id] = len(tokens) + output
        v1.set_final_length(seq_id, finals[seq_id])
        v1.add_token_request(seq_id, tokens, output)
        for _ in range(3):
            v1.schedule()
            v1.update()
        cols, _, _, _ = v1.take_events()
        python.consume(cols)
        states.append(v1.usage_state())
    num_steps = v1.step
    usable = np.concatenate([s["usable_at_steps"] for s in states])
    assert len(usable) > 100 and usable.any()
    np.testing.assert_array_equal(usable, python.usable_at_steps(len(usable)))
    refs = np.concatenate([s["refs_at_steps"] for s in states])
    np.testing.assert_array_equal(refs, python.refs_at_steps(len(refs)))
    assert len(usable) <= num_steps
