"""The compiled block pool (engine/compiled) against the Python BlockManager in v1 mode.

Exactness is the compiled core's contract: driven with the same operations, the two must
return the same prefix hits and allocation results, hold the same block tables, free queue,
reference counts, owners and counters after every operation, and record the same event rows
(kind, step, seq_id, free blocks, num_tokens, block ids, and the keys of CACHE / EVICT
blocks). ``Pair`` drives both the way the v1 schedulers do (engine/v1/scheduler.py: lookups
and admissions, running steps that allocate or only cache, preemptions, finishes, aborts,
cache resets; engine/v1/decode_blocks.py: FastV1Scheduler's one-block decode takes and
caches), from random operation streams: hypothesis-drawn ones and long seeded ones over
block sizes 1 to 512, pools of 1 to 8 blocks and larger, caching on and off, with an event
sink, without CACHE / EVICT events, and with none (the Python path then defers a unique
prompt's keying), and prompts sharing prefixes through token ids, trace hash ids and none.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engine.compiled

if engine.compiled.load() is None:
    pytest.skip(str(engine.compiled.unavailable_reason()), allow_module_level=True)
from tests.engine.compiled_drive import (  # only once the extension is known to load
    NAMES,
    RARE,
    SOURCE_KINDS,
    Op,
    drive,
    make_setup,
    random_ops,
)

op_strategy = st.tuples(
    st.sampled_from(NAMES + RARE),
    st.integers(0, 60),
    st.integers(0, 60),
    st.integers(0, 60),
    st.integers(0, 60),
)


@st.composite
def setups(draw: st.DrawFn) -> dict[str, Any]:
    block_size = draw(st.sampled_from([1, 2, 3, 4, 8, 16, 64, 512]))
    return make_setup(
        num_blocks=draw(st.sampled_from([1, 2, 3, 5, 8, 13, 40])),
        block_size=block_size,
        caching=draw(st.booleans()),
        sink=draw(st.sampled_from(["events", "events", "no_cache_events", "none"])),
        seed=draw(st.integers(0, 3)),
        max_model_len=draw(st.sampled_from([None, None, 5 * block_size + 3])),
        hash_block_size=draw(st.sampled_from([1, 3, block_size, 2 * block_size])),
        kinds=draw(st.sampled_from([("tokens",), ("hash_ids",), ("unique",), SOURCE_KINDS])),
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(setup=setups(), ops=st.lists(op_strategy, min_size=1, max_size=50))
def test_compiled_pool_matches_the_python_block_manager(
    setup: dict[str, Any], ops: list[Op]
) -> None:
    drive(setup, ops)


STREAMS = [
    # (num_blocks, block_size, caching, sink)
    (1, 1, True, "events"),
    (4, 2, True, "events"),
    (8, 3, True, "none"),
    (8, 16, False, "events"),
    (24, 1, True, "events"),
    (48, 4, True, "no_cache_events"),
    (64, 16, True, "events"),
    (64, 16, True, "none"),
    (12, 512, True, "events"),
    (200, 8, False, "none"),
    (6, 2, True, "events"),  # unique prompts only: private prefixes, preempted often
]


@pytest.mark.parametrize(("num_blocks", "block_size", "caching", "sink"), STREAMS)
def test_long_streams(num_blocks: int, block_size: int, caching: bool, sink: str) -> None:
    rng = random.Random(num_blocks * 1000 + block_size)
    kinds = ("unique",) if (num_blocks, block_size) == (6, 2) else SOURCE_KINDS
    setup = make_setup(num_blocks, block_size, caching, sink, seed=block_size, kinds=kinds)
    drive(setup, random_ops(rng, 1500))


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(40))
def test_long_streams_slow(seed: int) -> None:
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 3, 5, 16, 32, 128, 512])
    setup = make_setup(
        num_blocks=rng.choice([1, 2, 4, 8, 16, 64, 256]),
        block_size=block_size,
        caching=rng.random() < 0.8,
        sink=rng.choice(["events", "no_cache_events", "none"]),
        seed=seed,
        max_model_len=rng.choice([None, 4 * block_size + 1]),
        hash_block_size=rng.choice([1, 7, block_size, 3 * block_size]),
    )
    drive(setup, random_ops(rng, 2000))
