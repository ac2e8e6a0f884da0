"""The CPU tier's manager and policies (engine/offload): vLLM 0.33's LRU and ARC rules on
hand-made sequences of stores, loads and request finishes."""

from __future__ import annotations

import pytest

from engine.offload.cpu_manager import CPUOffloadManager, LookupResult
from engine.offload.policies import RequestContext


def _request(keys: list[int], chunk_tokens: int = 16) -> RequestContext:
    ctx = RequestContext()
    for i, key in enumerate(keys):
        ctx.positions[key] = (i + 1) * chunk_tokens
    return ctx


def _store(manager: CPUOffloadManager, keys: list[int], ctx: RequestContext) -> list[int]:
    out = manager.prepare_store(keys, ctx)
    assert out is not None
    manager.complete_store(out.keys_to_store)
    return out.evicted_keys


def test_a_chunk_is_pending_until_its_store_completes() -> None:
    m = CPUOffloadManager(4)
    ctx = _request([1])
    out = m.prepare_store([1], ctx)
    assert out is not None and out.keys_to_store == [1]
    assert m.lookup(1) is LookupResult.HIT_PENDING
    m.complete_store([1])
    assert m.lookup(1) is LookupResult.HIT
    assert m.lookup(2) is LookupResult.MISS


def test_lru_evicts_the_least_recent_request_tail_first() -> None:
    m = CPUOffloadManager(4, "lru")
    a = _request([1, 2])
    _store(m, [1, 2], a)
    m.on_request_finished(a)  # head (1) ends most recent: order 2, 1
    b = _request([3, 4])
    _store(m, [3, 4], b)
    m.on_request_finished(b)
    c = _request([5])
    assert _store(m, [5], c) == [2]  # request a's tail goes first
    assert _store(m, [6], _request([6])) == [1]


def test_lru_a_load_refreshes_a_chunk() -> None:
    m = CPUOffloadManager(2, "lru")
    a, b = _request([1]), _request([2])
    _store(m, [1], a)
    m.on_request_finished(a)
    _store(m, [2], b)
    m.on_request_finished(b)
    reader = _request([1])
    m.prepare_load([1], reader)
    m.complete_load([1])
    m.on_request_finished(reader)  # 1 is now more recent than 2
    assert _store(m, [3], _request([3])) == [2]


def test_a_pinned_chunk_is_not_evicted_and_a_store_needing_it_fails() -> None:
    m = CPUOffloadManager(1, "lru")
    _store(m, [1], _request([1]))
    m.prepare_load([1], _request([1]))
    assert m.prepare_store([2], _request([2])) is None
    m.complete_load([1])
    assert _store(m, [2], _request([2])) == [1]


def test_a_store_never_evicts_a_chunk_it_offers() -> None:
    m = CPUOffloadManager(2, "lru")
    _store(m, [1, 2], _request([1, 2]))
    # offering 1 (held) and 3 (new) must evict 2, not 1
    assert _store(m, [1, 3], _request([1, 3])) == [2]


def test_arc_promotes_reused_chunks_to_t2_and_evicts_from_t1_first() -> None:
    m = CPUOffloadManager(3, "arc")
    _store(m, [1, 2, 3], _request([1, 2, 3]))
    reader = _request([1])
    m.prepare_load([1], reader)
    m.complete_load([1])
    m.on_request_finished(reader)
    policy = m.policy
    assert list(policy.t2) == [1]  # type: ignore[attr-defined]
    assert _store(m, [4], _request([4])) == [2]  # T1's LRU end
    assert list(policy.b1) == [2]  # type: ignore[attr-defined]


def test_arc_a_ghost_hit_grows_t1s_target() -> None:
    m = CPUOffloadManager(2, "arc")
    _store(m, [1, 2], _request([1, 2]))
    _store(m, [3], _request([3]))  # evicts 1 into B1
    before = m.policy.target_t1_size  # type: ignore[attr-defined]
    _store(m, [1], _request([1]))  # a store miss on a B1 ghost
    assert m.policy.target_t1_size > before  # type: ignore[attr-defined]


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="lru"):
        CPUOffloadManager(2, "fifo")
