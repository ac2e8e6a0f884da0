"""The offloading scheduler on the compiled CPU tier and transfer link (engine/compiled:
CpuTier, CompiledTransferLink), and the compiled offloading scheduler and connector
themselves (OffloadV1Core), against the readable scheduler on the readable tier and link
(CPUOffloadManager, TransferLink), driven as the simulator drives it (offload_drive.py):
random traces with shared prefixes, block sizes 1 to 8, GPU pools small enough to evict
and preempt, tiers of 0 to 24 chunks of 1 to 3 blocks, LRU and ARC, slow and fast links
with and without latency. Step by step: the step times, scheduled tokens, admissions with
their GPU and tier hits, load and store jobs (chunk keys), flushes, the transfers reported
done and preemptions, and after each step the tier's size, evictions and contents."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from offload_drive import drive

from engine.compiled import load

pytestmark = pytest.mark.skipif(load() is None, reason="the compiled core is not built")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    requests=st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 30), st.integers(1, 12), st.floats(0, 0.05)),
        min_size=1,
        max_size=30,
    ),
    block_size=st.sampled_from([1, 2, 4, 8]),
    num_blocks=st.integers(10, 60),
    num_chunks=st.integers(0, 24),
    blocks_per_chunk=st.sampled_from([1, 2, 3]),
    policy=st.sampled_from(["lru", "arc"]),
    bandwidth=st.sampled_from([1e4, 1e5, 1e7]),
    latency_s=st.sampled_from([0.0, 0.002]),
)
def test_compiled_tier_and_link_make_the_same_decisions(
    requests: list[tuple[int, int, int, float]],
    block_size: int,
    num_blocks: int,
    num_chunks: int,
    blocks_per_chunk: int,
    policy: str,
    bandwidth: float,
    latency_s: float,
) -> None:
    prefixes = [list(range(1000 * p, 1000 * p + 24)) for p in range(4)]
    rows, t = [], 0.0
    for i, (p, own, out, gap) in enumerate(requests):
        t += gap
        rows.append((prefixes[p] + [10_000 + 100 * i + j for j in range(own)], out, t))
    setup = dict(
        num_blocks=num_blocks,
        block_size=block_size,
        num_chunks=num_chunks,
        blocks_per_chunk=blocks_per_chunk,
        policy=policy,
        bandwidth=bandwidth,
        latency_s=latency_s,
        max_num_batched_tokens=32,
        record_tier=True,
    )
    py = drive(rows, compiled=False, **setup)  # type: ignore[arg-type]
    assert type(py.sched.connector.manager).__name__ == "CPUOffloadManager"
    parts = drive(rows, compiled=True, **setup)  # type: ignore[arg-type]
    assert type(parts.sched.connector.manager).__name__ == "CpuTier"
    # the offloading scheduler and connector themselves compiled (OffloadV1Core)
    core = drive(rows, core=True, **setup)  # type: ignore[arg-type]
    for cc in (parts, core):
        assert len(cc.steps) == len(py.steps)
        for k, (a, b) in enumerate(zip(cc.steps, py.steps)):
            assert a == b, f"step {k}"
            assert cc.tier[k] == py.tier[k], f"step {k}: tier"
        assert cc.end_s == py.end_s
