"""The compiled CPU tier (engine/compiled: CpuTier, csrc/offload_tier.hpp and
offload_policies.hpp) against the readable one (engine/offload/cpu_manager.py's
CPUOffloadManager with policies.py's LRU and ARC): random streams of stores, store
completions, loads, load completions and request finishes, on tiers small enough that
stores evict and fail, must give the same answers after every operation — what each store
stores and evicts (or that it cannot), each key's lookup, the counters, the keys held and
ARC's target size."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.compiled import load
from engine.offload.cpu_manager import CPUOffloadManager, LookupResult, make_cpu_tier

pytestmark = pytest.mark.skipif(load() is None, reason="the compiled core is not built")

NUM_KEYS = 24


class _Pair:
    """The Python and the compiled tier, driven alike and compared after each operation."""

    def __init__(self, num_chunks: int, policy: str) -> None:
        self.py = CPUOffloadManager(num_chunks, policy)
        self.cc = make_cpu_tier(num_chunks, policy, compiled=True)
        self.ctx: dict[int, tuple[Any, Any]] = {}
        self.step = 0

    def context(self, req: int, keys: list[int], chunk_tokens: int) -> None:
        pair = (self.py.new_context(req), self.cc.new_context(req))
        self.py.add_positions(pair[0], keys, chunk_tokens, chunk_tokens)
        self.cc.add_positions(pair[1], keys, chunk_tokens, chunk_tokens)
        self.ctx[req] = pair

    def same(self, what: str, got_py: Any, got_cc: Any) -> None:
        assert got_py == got_cc, f"operation {self.step} ({what}): {got_py!r} != {got_cc!r}"

    def check(self, what: str) -> None:
        py, cc = self.py, self.cc
        for name in (
            "num_free",
            "num_held",
            "num_evictable",
            "num_write_pending",
            "num_stored",
            "num_evicted",
        ):
            self.same(f"{what}: {name}", getattr(py, name), getattr(cc, name))
        self.same(f"{what}: held keys", sorted(py.held_keys()), sorted(cc.held_keys()))
        self.same(
            f"{what}: lookups",
            [py.lookup(k) for k in range(NUM_KEYS)],
            [cc.lookup(k) for k in range(NUM_KEYS)],
        )
        if py.policy.__class__.__name__ == "ARCPolicy":
            self.same(f"{what}: ARC target", py.policy.target_t1_size, cc.target_t1_size)  # type: ignore[attr-defined]
        self.step += 1


# One check, two strengths: a sample in the default run, the full 300 examples under
# -m slow (.ci/run runs both).
_STRATEGIES = dict(
    data=st.data(),
    policy=st.sampled_from(["lru", "arc"]),
    num_chunks=st.integers(0, 10),
)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**_STRATEGIES)  # type: ignore[arg-type]
def test_compiled_tier_matches_the_python_manager(data: Any, policy: str, num_chunks: int) -> None:
    _check(data, policy, num_chunks)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**_STRATEGIES)  # type: ignore[arg-type]
def test_compiled_tier_matches_the_python_manager_slow(
    data: Any, policy: str, num_chunks: int
) -> None:
    _check(data, policy, num_chunks)


def _check(data: Any, policy: str, num_chunks: int) -> None:
    pair = _Pair(num_chunks, policy)
    # each request: a chain of distinct keys drawn from a small universe (shared heads)
    requests: dict[int, list[int]] = {}
    stores: list[list[int]] = []  # in flight
    loads: list[list[int]] = []  # pinned
    next_req = 0
    for _ in range(data.draw(st.integers(1, 150), label="operations")):
        live = sorted(requests)
        op = data.draw(
            st.sampled_from(["new", "store", "store", "done", "done", "load", "unpin", "end"])
        )
        if op == "new" or not live:
            keys = data.draw(
                st.lists(st.integers(0, NUM_KEYS - 1), min_size=1, max_size=8, unique=True)
            )
            requests[next_req] = keys
            pair.context(next_req, keys, data.draw(st.sampled_from([16, 32])))
            next_req += 1
            pair.check("new request")
            continue
        req = data.draw(st.sampled_from(live))
        keys = requests[req]
        ctx_py, ctx_cc = pair.ctx[req]
        if op == "store":
            start = data.draw(st.integers(0, len(keys) - 1))
            end = data.draw(st.integers(start + 1, len(keys)))
            out_py = pair.py.prepare_store(keys[start:end], ctx_py)
            out_cc = pair.cc.prepare_store(keys[start:end], ctx_cc)
            pair.same("prepare_store", out_py, out_cc)
            if out_py is not None and out_py.keys_to_store:
                stores.append(out_py.keys_to_store)
            pair.check("store")
        elif op == "done" and stores:
            job = stores.pop(data.draw(st.integers(0, len(stores) - 1)))
            pair.same(
                "complete_store", len(pair.py.complete_store(job)), pair.cc.complete_store(job)
            )
            pair.check("store done")
        elif op == "load":
            ready = [k for k in keys if pair.py.lookup(k) is LookupResult.HIT]
            if ready:
                chosen = data.draw(st.lists(st.sampled_from(ready), min_size=1, unique=True))
                pair.py.prepare_load(chosen, ctx_py)
                pair.cc.prepare_load(chosen, ctx_cc)
                loads.append(chosen)
                pair.check("load")
        elif op == "unpin" and loads:
            job = loads.pop(data.draw(st.integers(0, len(loads) - 1)))
            pair.py.complete_load(job)
            pair.cc.complete_load(job)
            pair.check("load done")
        elif op == "end":
            pair.py.on_request_finished(ctx_py)
            pair.cc.on_request_finished(ctx_cc)
            del requests[req]
            pair.check("request finished")


def test_compiled_tier_refuses_what_the_python_one_refuses() -> None:
    tier = make_cpu_tier(2, "lru", compiled=True)
    ctx = tier.new_context(0)
    tier.add_positions(ctx, [1, 2], 16, 16)
    with pytest.raises(ValueError, match="not ready to load"):
        tier.prepare_load([1], ctx)  # never stored
    out = tier.prepare_store([1, 2], ctx)
    assert out is not None and out.keys_to_store == [1, 2]
    with pytest.raises(ValueError, match="not ready to load"):
        tier.prepare_load([1], ctx)  # being stored
    with pytest.raises(ValueError, match="not pinned"):
        tier.complete_load([1])
    with pytest.raises(ValueError, match="offload policy"):
        make_cpu_tier(2, "fifo", compiled=True)
    # a finished request's access record is dropped (only a live request's is kept)
    assert tier.num_contexts == 1
    tier.on_request_finished(ctx)
    assert tier.num_contexts == 0
