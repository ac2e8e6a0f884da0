"""Each router's choice against its formula (docs/fleet.md) on hand-made replica states."""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.config import ROUTER_NAMES
from kvsim.fleet.routers import (
    ROUTERS,
    CacheAware,
    KvRouter,
    LeastLoaded,
    PrefixScorer,
    RandomRouter,
    ReplicaView,
    RoundRobin,
    RouteRequest,
    make_router,
)

REQUEST = RouteRequest(prompt_tokens=160, num_prompt_blocks=10, block_size=16)


def view(**fields: float) -> ReplicaView:
    base = dict(
        waiting=0, running=0, kv_usage=0.0, prefix_blocks=0, cached_blocks=0,
        routed_active=0, active_prefill_tokens=0, active_blocks=0,
    )  # fmt: skip
    base.update(fields)
    return ReplicaView(**base)  # type: ignore[arg-type]


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_the_config_offers_every_router_and_only_those() -> None:
    assert tuple(ROUTERS) == ROUTER_NAMES


def test_unknown_router_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match=r"unknown router 'best'.*round-robin"):
        make_router("best", 2, 0)


def test_round_robin_cycles_whatever_the_state() -> None:
    router = RoundRobin(3, rng())
    views = [view(waiting=100), view(), view(prefix_blocks=10)]
    assert [router.choose(REQUEST, views) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_random_is_seeded_and_covers_every_replica() -> None:
    views = [view()] * 4
    a = [RandomRouter(4, rng(7)).choose(REQUEST, views) for _ in range(1)]
    first = RandomRouter(4, rng(7))
    second = RandomRouter(4, rng(7))
    picks = [first.choose(REQUEST, views) for _ in range(400)]
    assert picks == [second.choose(REQUEST, views) for _ in range(400)]
    assert a[0] == picks[0]
    counts = np.bincount(picks, minlength=4)
    assert counts.min() > 60  # uniform: 100 expected each


def test_least_loaded_is_vllms_four_waiting_plus_running() -> None:
    router = LeastLoaded(3, rng())
    # scores 4*1+0=4, 4*0+5=5, 4*0+3=3
    views = [view(waiting=1), view(running=5), view(running=3)]
    assert router.choose(REQUEST, views) == 2


def test_least_loaded_ties_go_to_the_first_and_local_counts_spread_a_burst() -> None:
    router = LeastLoaded(3, rng())
    views = [view(), view(), view()]
    # between two publications each choice adds one waiting request locally: 0, 1, 2, 0
    assert [router.choose(REQUEST, views) for _ in range(4)] == [0, 1, 2, 0]
    router.on_stats()  # a publication resets the local counts
    assert router.choose(REQUEST, views) == 0


def test_prefix_scorer_weights_prefix_queue_and_kv_two_one_one() -> None:
    router = PrefixScorer(3, rng())
    views = [
        view(prefix_blocks=8, waiting=4, kv_usage=0.5),
        view(prefix_blocks=0, waiting=0, kv_usage=0.0),
        view(prefix_blocks=4, waiting=2, kv_usage=0.25),
    ]
    # prefix min-max over the holders (8, 4): 1, 0 (not held), 0; queue (4 - q) / 4: 0, 1,
    # 0.5; kv 1 - usage: 0.5, 1, 0.75
    assert router.scores(views) == pytest.approx([2.5, 2.0, 1.25])
    assert router.choose(REQUEST, views) == 0
    heavy_queue = PrefixScorer(3, rng(), weights=(1.0, 3.0, 1.0))
    # 1 + 0 + 0.5 = 1.5; 0 + 3 + 1 = 4; 0 + 1.5 + 0.75 = 2.25
    assert heavy_queue.choose(REQUEST, views) == 1


def test_prefix_scores_are_normalised_among_the_replicas_that_hold_the_first_block() -> None:
    """llm-d's indexer reports only replicas holding the prompt's first block; normalised
    among them, the shorter match scores 0 like a replica holding nothing, and equal holders
    all score 1 (indexedScoresToNormalizedScoredPods)."""
    router = PrefixScorer(4, rng(), weights=(1.0, 0.0, 0.0))
    assert router.scores([view(prefix_blocks=b) for b in (3, 0, 5, 4)]) == pytest.approx(
        [0.0, 0.0, 1.0, 0.5]
    )
    assert router.scores([view(prefix_blocks=b) for b in (2, 0, 2, 0)]) == [1.0, 0.0, 1.0, 0.0]
    assert router.scores([view(prefix_blocks=0) for _ in range(4)]) == [0.0] * 4


def test_prefix_scorer_with_no_prefix_anywhere_follows_load() -> None:
    router = PrefixScorer(3, rng())
    views = [view(waiting=3, kv_usage=0.2), view(waiting=1, kv_usage=0.2), view(waiting=3)]
    # all-zero prefix scores add nothing; queue 0, 1, 0; kv 0.8, 0.8, 1
    assert router.choose(REQUEST, views) == 1


def test_prefix_scorer_breaks_exact_ties_at_random_seeded() -> None:
    views = [view(), view(), view()]
    picks = [PrefixScorer(3, rng(s)).choose(REQUEST, views) for s in range(60)]
    assert set(picks) == {0, 1, 2}
    assert picks == [PrefixScorer(3, rng(s)).choose(REQUEST, views) for s in range(60)]


def test_kv_router_logit_is_prefill_blocks_after_overlap_plus_decode_blocks() -> None:
    router = KvRouter(3, rng())
    views = [
        view(prefix_blocks=0, active_prefill_tokens=0, active_blocks=40),
        view(prefix_blocks=8, active_prefill_tokens=320, active_blocks=60),
        view(prefix_blocks=10, active_prefill_tokens=0, active_blocks=100),
    ]
    # prefill: (0+160)/16 - 0 = 10; (320+160)/16 - 8 = 22; 160/16 - 10 = 0
    # decode: 40 + 10 - 0 = 50; 60 + 10 - 8 = 62; 100 + 10 - 10 = 100
    assert router.logits(REQUEST, views) == pytest.approx([60.0, 84.0, 100.0])
    assert router.choose(REQUEST, views) == 0
    scaled = KvRouter(3, rng(), prefill_load_scale=10.0)
    # 100 + 50 = 150; 220 + 62 = 282; 0 + 100 = 100
    assert scaled.choose(REQUEST, views) == 2


def test_kv_router_overlap_credit_scales_the_cached_blocks_discount() -> None:
    request = RouteRequest(prompt_tokens=40, num_prompt_blocks=2, block_size=16)
    views = [view(prefix_blocks=2)]
    # prefill 40/16 - credit * 2; decode 0 + 2 - 2
    assert KvRouter(1, rng()).logits(request, views) == [0.5]
    assert KvRouter(1, rng(), overlap_credit=0.5).logits(request, views) == [1.5]
    assert KvRouter(1, rng(), overlap_credit=0.0).logits(request, views) == [2.5]


def test_kv_router_temperature_samples_by_softmax_of_normalised_logits() -> None:
    views = [view(active_blocks=0), view(active_blocks=100)]
    router = KvRouter(2, rng(3), temperature=1.0)
    picks = np.array([router.choose(REQUEST, views) for _ in range(4000)])
    # logits normalised to 0 and 1: p(0) = 1 / (1 + e^-1) = 0.731
    assert (picks == 0).mean() == pytest.approx(1 / (1 + np.exp(-1)), abs=0.03)
    assert KvRouter(2, rng(3)).choose(REQUEST, views) == 0  # temperature 0: argmin


def test_cache_aware_goes_to_the_shortest_queue_when_imbalanced() -> None:
    router = CacheAware(3, rng())
    views = [
        view(routed_active=100, prefix_blocks=10),
        view(routed_active=30),
        view(routed_active=50),
    ]
    assert router.choose(REQUEST, views) == 1  # 100 - 30 > 64 and 100 > 1.5 * 30


def test_cache_aware_needs_both_thresholds_to_call_it_imbalanced() -> None:
    router = CacheAware(2, rng())
    # 100 - 40 = 60 is not above 64: balanced, so the prefix match decides
    views = [view(routed_active=100, prefix_blocks=10), view(routed_active=40)]
    assert router.choose(REQUEST, views) == 0
    # 300 - 220 > 64 but 300 < 1.5 * 220: balanced
    views = [view(routed_active=300, prefix_blocks=10), view(routed_active=220)]
    assert router.choose(REQUEST, views) == 0


def test_cache_aware_match_below_threshold_goes_to_the_emptiest_cache() -> None:
    router = CacheAware(3, rng())
    # best match 2 blocks = 32 of 160 tokens = 0.2 < 0.3
    views = [
        view(prefix_blocks=2, cached_blocks=500),
        view(prefix_blocks=1, cached_blocks=100),
        view(prefix_blocks=0, cached_blocks=300),
    ]
    assert router.choose(REQUEST, views) == 1
    # 3 blocks = 48 tokens = 0.3: the match wins
    views[0] = view(prefix_blocks=3, cached_blocks=500)
    assert router.choose(REQUEST, views) == 0


def test_cache_aware_with_all_zero_state_takes_replica_zero() -> None:
    assert CacheAware(4, rng()).choose(REQUEST, [view()] * 4) == 0


def test_the_prefix_router_takes_its_weights_from_the_run() -> None:
    router = make_router("prefix", 3, 0, prefix_weights=(1.0, 3.0, 1.0))
    assert isinstance(router, PrefixScorer) and router.weights == (1.0, 3.0, 1.0)
    views = [
        view(prefix_blocks=8, waiting=4, kv_usage=0.5),
        view(prefix_blocks=0, waiting=0, kv_usage=0.0),
        view(prefix_blocks=4, waiting=2, kv_usage=0.25),
    ]
    assert router.choose(REQUEST, views) == 1
    assert make_router("prefix", 3, 0).choose(REQUEST, views) == 0  # 2:1:1
