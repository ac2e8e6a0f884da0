"""Prefix keys from trace hash ids make exactly the decisions token ids make.

The reference driver derives each prompt's tokens from its hash ids (hash_block_size random
tokens per id, so equal id prefixes give equal token prefixes, and unique padding past the
last id). Running the same requests once with those token ids and once with
``prefix_from_hash_ids`` (no tokens at all) must give the same hits, block ids, events and
cache keys' structure, at any block size and hash block size.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import BlockManager, EventRecorder, SamplingParams, Scheduler, SchedulerConfig, Sequence
from engine.v1.prefix_cache import ensure_block_hashes
from engine.v1.prefix_keys import (
    UNIQUE_PREFIX,
    HashIdPrefix,
    prefix_from_hash_ids,
)


@st.composite
def requests(draw: st.DrawFn) -> tuple[int, list[tuple[list[int], int, int]]]:
    """(hash_block_size, [(hash_ids, prompt_tokens, output_tokens)]): conversations that
    extend earlier requests' ids, repeat them, or end inside their last id's block."""
    hbs = draw(st.sampled_from([1, 3, 4, 16, 24]))
    out: list[tuple[list[int], int, int]] = []
    next_id = 0
    for _ in range(draw(st.integers(1, 10))):
        if out and draw(st.booleans()):
            base = list(draw(st.sampled_from(out))[0])
            base = base[: draw(st.integers(1, len(base)))]
        else:
            base = []
        extra = draw(st.integers(0 if base else 1, 4))
        ids = base + list(range(next_id, next_id + extra))
        next_id += extra
        prompt = draw(
            st.integers((len(ids) - 1) * hbs + 1, len(ids) * hbs + draw(st.sampled_from([0, 0, 5])))
        )
        out.append((ids, prompt, draw(st.integers(1, 12))))
    return hbs, out


def driver_tokens(ids: list[int], hbs: int, prompt: int, index: int) -> list[int]:
    """As the reference driver's TokenFactory: tokens per hash id, unique padding."""
    tokens: list[int] = []
    for h in ids:
        tokens += random.Random(h * 7919 + hbs).choices(range(10, 32000), k=hbs)
    if len(tokens) < prompt:
        tokens += random.Random(-1 - index).choices(range(10, 32000), k=prompt - len(tokens))
    return tokens[:prompt]


def run(hbs, reqs, block_size, num_blocks, with_tokens):
    recorder = EventRecorder()
    bm = BlockManager(num_blocks, block_size, event_sink=recorder, enable_prefix_caching=True)
    sched = Scheduler(
        SchedulerConfig(scheduler="v1", max_num_seqs=4, max_num_batched_tokens=48), bm
    )
    pending = list(enumerate(reqs))
    steps = []
    while pending or sched.has_unfinished():
        for _ in range(2):  # two arrivals per step: sharing happens within and across steps
            if pending:
                i, (ids, prompt, output) = pending.pop(0)
                params = SamplingParams(max_tokens=output, ignore_eos=True)
                if with_tokens:
                    s = Sequence(i, driver_tokens(ids, hbs, prompt, i), params)
                else:
                    prefix = prefix_from_hash_ids(ids, hbs, prompt, block_size)
                    s = Sequence(i, range(prompt), params, prefix=prefix)
                sched.add_request(s)
        out = sched.schedule()
        steps.append(
            (
                [(s.seq_id, n) for s, n in zip(out.seqs, out.num_new_tokens)],
                [(s.seq_id, s.prefix_hit_tokens, list(s.block_table)) for s in out.admitted],
                [s.seq_id for s in out.preempted],
            )
        )
        sched.update(out, [0] * out.num_seqs)
        bm.check_invariants()
    cols, blocks = recorder.columns()
    return steps, {k: v.tolist() for k, v in cols.items()}, blocks.tolist()


@settings(max_examples=40, deadline=None)
@given(reqs=requests(), block_size=st.sampled_from([1, 2, 4, 5, 16]), spare=st.integers(0, 30))
def test_hash_ids_give_the_decisions_of_the_tokens_they_stand_for(reqs, block_size, spare):
    hash_ids_decide_as_their_tokens(reqs, block_size, spare)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(reqs=requests(), block_size=st.sampled_from([1, 2, 4, 5, 16]), spare=st.integers(0, 30))
def test_hash_ids_give_the_decisions_of_the_tokens_they_stand_for_at_full_strength(
    reqs, block_size, spare
):
    hash_ids_decide_as_their_tokens(reqs, block_size, spare)


def hash_ids_decide_as_their_tokens(reqs, block_size, spare):
    hbs, rows = reqs
    largest = max(prompt + output for _, prompt, output in rows)
    num_blocks = -(-largest // block_size) + spare
    with_tokens = run(hbs, rows, block_size, num_blocks, with_tokens=True)
    with_ids = run(hbs, rows, block_size, num_blocks, with_tokens=False)
    assert with_ids == with_tokens


def test_keys_are_shared_exactly_when_the_hash_prefix_is():
    def keys(ids, prompt, seq_id=0, bs=16):
        s = Sequence(seq_id, range(prompt), prefix=HashIdPrefix(ids, 512, prompt))
        return ensure_block_hashes(s, prompt // bs, bs)

    a = keys([1, 2, 3], 1500)
    b = keys([1, 2, 4], 1500, seq_id=1)
    assert a[:64] == b[:64] and not set(a[64:]) & set(b[64:])  # blocks of id 3 vs 4
    assert keys([1, 2, 3], 1100, seq_id=2) == a[:68]  # a shorter prompt, same prefix
    assert keys([2, 1], 1024)[0] != a[0]  # the same id after another prefix differs
    u1 = ensure_block_hashes(Sequence(5, range(40), prefix=UNIQUE_PREFIX), 2, 16)
    u2 = ensure_block_hashes(Sequence(6, range(40), prefix=UNIQUE_PREFIX), 2, 16)
    assert not set(u1) & set(u2)


def test_the_helper_checks_its_input():
    assert prefix_from_hash_ids(None, None, 10, 16) is UNIQUE_PREFIX
    assert prefix_from_hash_ids([], 512, 10, 16) is UNIQUE_PREFIX
    with pytest.raises(ValueError, match="hash_block_size"):
        prefix_from_hash_ids([1], None, 10, 16)
    with pytest.raises(ValueError, match="block_size"):
        prefix_from_hash_ids([1], 512, 10, 0)
