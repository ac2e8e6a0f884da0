"""Secondary tiers behind the CPU tier (engine/offload/tiering.py, secondary_tier.py): each
rule of vLLM 0.33's TieringOffloadingManager and fs tier on a hand-made case, plus the
capacity kvsim adds (vLLM's fs tier has none). docs/offload.md, "Secondary tiers"."""

from __future__ import annotations

import pytest

from engine.offload.cpu_manager import CPUOffloadManager, LookupResult
from engine.offload.policies import RequestContext
from engine.offload.secondary_tier import (
    SecondaryTier,
    SecondaryTierConfig,
    TierLookup,
)
from engine.offload.tiering import RETRY, TieringManager

CHUNK = 1000  # bytes a chunk
DISK = SecondaryTierConfig("disk", 8, CHUNK, 1e6, 5e5, 1e-3)  # 1 MB/s read, 0.5 MB/s write


def _ctx(keys: list[int]) -> RequestContext:
    ctx = RequestContext()
    for i, key in enumerate(keys):
        ctx.positions[key] = (i + 1) * 16
    return ctx


def _tiering(cpu_chunks: int = 4, disk: SecondaryTierConfig = DISK) -> TieringManager:
    return TieringManager(CPUOffloadManager(cpu_chunks), [SecondaryTier(disk)])


def _store_and_cascade(t: TieringManager, keys: list[int], ctx: RequestContext) -> None:
    """A GPU -> CPU store of ``keys`` completing at t.now (cascades them to the disk)."""
    out = t.prepare_store(keys, ctx)
    assert out is not None
    t.complete_store(out.keys_to_store, ctx)


def _step(t: TieringManager, now: float) -> None:
    """One schedule() with no lookups: its end (polls, promotions, probes)."""
    t.now = now
    t.on_schedule_end()


def test_a_completed_store_cascades_and_pins_its_cpu_chunks_until_written() -> None:
    t = _tiering(cpu_chunks=2)
    a = _ctx([1, 2])
    t.on_new_request(a, 0)
    _store_and_cascade(t, [1, 2], a)
    disk = t.tiers[0]
    assert not disk.holds(1)  # the write takes 1 ms + 2,000 bytes / 0.5 MB/s = 5 ms
    b = _ctx([3])
    t.on_new_request(b, 1)
    t.now = 0.004
    assert t.prepare_store([3], b) is None  # both CPU chunks are pinned by the cascade
    t.now = 0.005
    out = t.prepare_store([3], b)  # the poll first: the cascade completed, chunks unpinned
    assert out is not None and out.evicted_keys == [2]
    assert disk.holds(1) and disk.holds(2)


def test_the_first_disk_lookup_answers_retry_then_the_probe_answer() -> None:
    t = _tiering(cpu_chunks=1)
    a = _ctx([1, 2])
    t.on_new_request(a, 0)
    _store_and_cascade(t, [1], a)
    t.now = 1.0  # the write completed (3 ms); storing 2 evicts 1 from the CPU tier
    _store_and_cascade(t, [2], a)
    assert t.primary.lookup(1) is LookupResult.MISS
    b = _ctx([1])
    t.on_new_request(b, 1)
    assert t.lookup(1, b) == RETRY  # a probe is queued ...
    _step(t, 1.0)  # ... posted at the step's end, answered with the disk's contents then
    _step(t, 1.0)  # (the CPU chunk 2 is still pinned by its cascade until 1.003)
    t.now = 1.003
    assert t.lookup(1, b) is LookupResult.HIT_PENDING  # a hit: promoted into the CPU tier
    assert t.take_evicted() == [2]


def test_a_probe_answer_is_kept_while_the_request_lives() -> None:
    disk = SecondaryTier(DISK)
    assert disk.lookup(7, seq_id=0) is TierLookup.RETRY
    disk.on_schedule_end(0.0)  # nothing on the disk: the answer is a miss
    disk.submit_store(0, (7,), 0.0)
    disk.get_finished_jobs(1.0)
    assert disk.holds(7)
    assert disk.lookup(7, seq_id=0) is TierLookup.MISS  # kept (vLLM's AsyncLookupManager)
    assert disk.lookup(7, seq_id=1) is TierLookup.MISS  # another request shares the probe
    disk.on_request_finished(0)
    disk.on_request_finished(1)  # nobody asks any more: the answer is dropped
    assert disk.lookup(7, seq_id=2) is TierLookup.RETRY
    disk.on_schedule_end(1.0)
    assert disk.lookup(7, seq_id=2) is TierLookup.HIT


def test_a_promotion_takes_a_cpu_slot_at_lookup_and_is_ready_when_read() -> None:
    t = _tiering(cpu_chunks=2)
    disk = t.tiers[0]
    disk.submit_store(100, (1, 2), 0.0)
    disk.get_finished_jobs(1.0)
    r = _ctx([1, 2])
    t.on_new_request(r, 0)
    t.now = 1.0
    assert [t.lookup(k, r) for k in (1, 2)] == [RETRY, RETRY]
    _step(t, 1.0)
    assert [t.lookup(k, r) for k in (1, 2)] == [LookupResult.HIT_PENDING] * 2
    assert t.primary.num_held == 2 and t.primary.lookup(1) is LookupResult.HIT_PENDING
    _step(t, 1.0)  # one job for the request's two chunks: 1 ms + 2,000 bytes at 1 MB/s
    (job,) = [j for j in disk.history if j.is_promotion]
    assert job.keys == (1, 2) and job.nbytes == 2 * CHUNK
    t.now = 1.0029
    assert t.lookup(1, r) is LookupResult.HIT_PENDING  # not yet (1.003)
    _step(t, 1.0029)
    t.now = 1.003
    assert t.lookup(1, r) is LookupResult.HIT
    assert job.completed_s == pytest.approx(1.003)
    t.prepare_load([1, 2], r)
    assert t.loaded_chunks == [2] and t.promoted_chunks == [2]


def test_a_promotion_the_cpu_tier_cannot_hold_is_a_miss() -> None:
    t = _tiering(cpu_chunks=1)
    disk = t.tiers[0]
    disk.submit_store(100, (1, 2), 0.0)
    disk.get_finished_jobs(1.0)
    r = _ctx([1, 2])
    t.on_new_request(r, 0)
    t.now = 1.0
    t.lookup(1, r), t.lookup(2, r)
    _step(t, 1.0)
    assert t.lookup(1, r) is LookupResult.HIT_PENDING  # takes the only slot (not evictable)
    assert t.lookup(2, r) is LookupResult.MISS


def test_kvsims_capacity_evicts_the_least_recently_used_idle_chunk() -> None:
    disk = SecondaryTier(SecondaryTierConfig("disk", 2, CHUNK, 1e6, 1e6, 0.0))
    disk.submit_store(0, (1, 2), 0.0)
    disk.get_finished_jobs(1.0)
    disk.submit_load(1, (1,), 1.0)  # 1 is being read (pinned) and now the most recent
    disk.submit_store(2, (3,), 1.0)  # full: 2 goes (1 is pinned)
    assert not disk.holds(2) and disk.stats.evictions == 1
    disk.submit_store(3, (4,), 1.0)  # full, 1 pinned, 3 being written: 4 is dropped
    assert disk.stats.dropped == 1
    disk.get_finished_jobs(2.0)
    assert sorted(disk.stored_keys()) == [1, 3]


def test_an_evicted_chunks_kept_answer_becomes_a_miss() -> None:
    disk = SecondaryTier(SecondaryTierConfig("disk", 1, CHUNK, 1e6, 1e6, 0.0))
    disk.submit_store(0, (1,), 0.0)
    disk.get_finished_jobs(1.0)
    disk.lookup(1, seq_id=0)
    disk.on_schedule_end(1.0)
    assert disk.lookup(1, seq_id=0) is TierLookup.HIT
    disk.submit_store(1, (2,), 1.0)  # evicts 1
    assert disk.lookup(1, seq_id=0) is TierLookup.MISS


def test_two_concurrent_promotions_share_the_read_bandwidth() -> None:
    disk = SecondaryTier(SecondaryTierConfig("disk", 8, CHUNK, 1e6, 1e6, 1e-3))
    disk.submit_store(0, (1, 2), 0.0)
    disk.get_finished_jobs(1.0)
    disk.submit_load(1, (1,), 1.0)
    disk.submit_load(2, (2,), 1.0)
    done = disk.get_finished_jobs(2.0)
    # alone: 1 ms + 1 ms; together each takes 1 ms + 2 ms
    assert [j.completed_s for j in done] == pytest.approx([1.003, 1.003])


def test_pending_work_and_the_next_event() -> None:
    t = _tiering()
    assert not t.has_pending_work() and t.next_event_time() is None
    a = _ctx([1])
    t.on_new_request(a, 0)
    _store_and_cascade(t, [1], a)
    assert t.has_pending_work() and t.next_event_time() == pytest.approx(0.003)
    b = _ctx([9])
    t.on_new_request(b, 1)
    assert t.lookup(9, b) == RETRY
    _step(t, 0.001)
    assert t.next_event_time() == 0.001  # a probe answer waits for the next step: now
