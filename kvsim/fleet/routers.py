"""Routers: which replica a request goes to, each the formula of a production router.

A router sees the fleet as a list of ``ReplicaView`` (one per replica, index = replica id),
built at the request's arrival time: load figures as the replicas last published them (every
``stats_interval_s``, as vLLM's data-parallel coordinator and llm-d's metric scrapers do), the
router's own bookkeeping of what it routed, and how many of the request's leading prompt blocks
each replica holds as its KV events said (``kvsim.fleet.kv_index``). Every rule and default is
in docs/fleet.md with its source.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """One replica as a router sees it when a request arrives."""

    waiting: int  # published: requests in the waiting queue
    running: int  # published: requests running
    kv_usage: float  # published: share of KV blocks in use, 0..1
    prefix_blocks: int  # the request's leading prompt blocks the replica holds (KV events)
    cached_blocks: int  # blocks the replica holds under a key (KV events): its "tree size"
    routed_active: int  # router's count: requests routed here and not finished
    active_prefill_tokens: int  # router's count: uncached prompt tokens not yet prefilled
    active_blocks: int  # router's count: KV blocks of the requests routed here, unfinished


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What a router knows of the request it routes."""

    prompt_tokens: int
    num_prompt_blocks: int  # full KV blocks of the prompt (what a cache can hold of it)
    block_size: int


class Router(ABC):
    """Picks a replica per request. ``rng`` is the fleet's seeded generator (ties, sampling)."""

    name: ClassVar[str]
    uses_prefix: ClassVar[bool] = False  # reads ReplicaView.prefix_blocks
    follows_prefills: ClassVar[bool] = False  # reads active_prefill_tokens (each step's output)

    def __init__(self, num_replicas: int, rng: np.random.Generator) -> None:
        self.num_replicas = num_replicas
        self.rng = rng

    @abstractmethod
    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> int:
        """The replica ``request`` goes to."""

    def on_stats(self) -> None:  # noqa: B027  (most routers keep nothing between stats)
        """The replicas have just published their load (views carry the new figures)."""

    def _pick_random_among(self, best: list[int]) -> int:
        return best[0] if len(best) == 1 else best[int(self.rng.integers(len(best)))]


class RoundRobin(Router):
    """Replica 0, 1, ..., N - 1, 0, ...: blind to load and cache."""

    name = "round-robin"

    def __init__(self, num_replicas: int, rng: np.random.Generator) -> None:
        super().__init__(num_replicas, rng)
        self._next = 0

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> int:
        chosen = self._next
        self._next = (self._next + 1) % self.num_replicas
        return chosen


class RandomRouter(Router):
    """A uniformly random replica (seeded: same seed, same choices)."""

    name = "random"

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> int:
        return int(self.rng.integers(self.num_replicas))


class LeastLoaded(Router):
    """vLLM's data-parallel load balancer (``DPLBAsyncMPClient.get_core_engine_for_request``):
    argmin of 4 x waiting + running over the counts the engines last published (every 100 ms),
    the first such replica on ties; the chosen replica's waiting count is raised by one locally
    until the next publication, so a burst between two publications spreads out."""

    name = "least-loaded"

    def __init__(self, num_replicas: int, rng: np.random.Generator) -> None:
        super().__init__(num_replicas, rng)
        self._extra_waiting = [0] * num_replicas

    def on_stats(self) -> None:
        self._extra_waiting = [0] * self.num_replicas

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> int:
        extra = self._extra_waiting
        scores = [4 * (r.waiting + extra[i]) + r.running for i, r in enumerate(replicas)]
        chosen = scores.index(min(scores))
        extra[chosen] += 1
        return chosen


def min_max(values: Sequence[float]) -> list[float]:
    """(v - min) / (max - min); all 0 when every value is equal (a constant for all replicas
    leaves a weighted sum's ranking as it is, so the choice of constant does not matter)."""
    low, high = min(values), max(values)
    if high == low:
        return [0.0] * len(values)
    return [(v - low) / (high - low) for v in values]


def held_min_max(values: Sequence[int]) -> list[float]:
    """llm-d's normalisation of the precise prefix-cache scores
    (indexedScoresToNormalizedScoredPods in llm-d-inference-scheduler's preciseprefixcache):
    the KV-block indexer reports only the replicas that hold the prompt's first block (its
    longest-prefix scorer starts from the first key's holders), those are min-max normalised
    among themselves (all 1 when they hold equally many), and the others score 0. So of two
    holders the shorter match scores as if it held nothing."""
    held = [v for v in values if v > 0]
    if not held:
        return [0.0] * len(values)
    low, high = min(held), max(held)
    if high == low:
        return [1.0 if v > 0 else 0.0 for v in values]
    return [(v - low) / (high - low) if v > 0 else 0.0 for v in values]


class PrefixScorer(Router):
    """llm-d's precise prefix-cache scheduling profile: a weighted sum of

    - the precise prefix-cache scorer: the longest run of the request's consecutive prompt
      blocks from the start that the replica holds (from its KV events), min-max normalised
      over the replicas that hold at least the first block, 0 for the others
      (``held_min_max``);
    - the queue scorer: (max q - q) / (max q - min q) over the waiting queues (1 when all
      are equal);
    - the KV-cache utilisation scorer: 1 - usage;

    weights 2 : 1 : 1 by default; the highest total wins, ties broken at random (llm-d's
    max-score picker)."""

    name = "prefix"
    uses_prefix = True

    def __init__(
        self,
        num_replicas: int,
        rng: np.random.Generator,
        weights: tuple[float, float, float] = (2.0, 1.0, 1.0),
    ) -> None:
        super().__init__(num_replicas, rng)
        self.weights = weights

    def scores(self, replicas: Sequence[ReplicaView]) -> list[float]:
        """Each replica's weighted score (higher is better)."""
        prefix = held_min_max([r.prefix_blocks for r in replicas])
        queues = [r.waiting for r in replicas]
        low, high = min(queues), max(queues)
        queue = [1.0 if high == low else (high - q) / (high - low) for q in queues]
        kv = [1.0 - r.kv_usage for r in replicas]
        wp, wq, wk = self.weights
        return [wp * p + wq * q + wk * k for p, q, k in zip(prefix, queue, kv)]

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> int:
        scores = self.scores(replicas)
        top = max(scores)
        return self._pick_random_among([i for i, s in enumerate(scores) if s == top])


class KvRouter(Router):
    """NVIDIA Dynamo's KV router: per replica

        prefill_blocks = max(0, (active prefill tokens + prompt tokens) / block_size
                                - overlap_credit x overlap blocks)
        decode_blocks  = active blocks + prompt blocks - overlap blocks
        logit          = prefill_load_scale x prefill_blocks + decode_blocks

    lowest logit wins (ties at random) at temperature 0; otherwise a replica is sampled with
    probability softmax(-logit / temperature) over logits min-max normalised to 0..1.
    Active tokens and blocks are the router's own bookkeeping of what it routed (a request's
    prefill load leaves at its first token, its blocks at its end), not published figures."""

    name = "kv-router"
    uses_prefix = True
    follows_prefills = True

    def __init__(
        self,
        num_replicas: int,
        rng: np.random.Generator,
        *,
        overlap_credit: float = 1.0,
        prefill_load_scale: float = 1.0,
        temperature: float = 0.0,
    ) -> None:
        super().__init__(num_replicas, rng)
        self.overlap_credit = overlap_credit
        self.prefill_load_scale = prefill_load_scale
        self.temperature = temperature

    def logits(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> list[float]:
        """Each replica's cost (lower is better)."""
        out = []
        for r in replicas:
            prefill = (r.active_prefill_tokens + request.prompt_tokens) / request.block_size
            prefill = max(0.0, prefill - self.overlap_credit * r.prefix_blocks)
            decode = r.active_blocks + request.num_prompt_blocks - r.prefix_blocks
            out.append(self.prefill_load_scale * prefill + decode)
        return out

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> int:
        logits = self.logits(request, replicas)
        if self.temperature <= 0:
            low = min(logits)
            return self._pick_random_among([i for i, v in enumerate(logits) if v == low])
        scaled = np.array(min_max(logits)) / self.temperature
        weights = np.exp(-(scaled - scaled.min()))
        return int(self.rng.choice(len(logits), p=weights / weights.sum()))


class CacheAware(Router):
    """SGLang's cache-aware router: when the load is imbalanced (max - min routed-and-running
    requests > ``balance_abs_threshold`` and max > ``balance_rel_threshold`` x min) the
    replica with the fewest; otherwise the replica with the longest prefix match if it covers
    at least ``cache_threshold`` of the prompt; otherwise the one holding the fewest cached
    blocks (the most room). Ties go to the lowest replica id."""

    name = "cache-aware"
    uses_prefix = True

    def __init__(
        self,
        num_replicas: int,
        rng: np.random.Generator,
        *,
        cache_threshold: float = 0.3,
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
    ) -> None:
        super().__init__(num_replicas, rng)
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> int:
        loads = [r.routed_active for r in replicas]
        low, high = min(loads), max(loads)
        if high - low > self.balance_abs_threshold and high > self.balance_rel_threshold * low:
            return loads.index(low)
        matched = [r.prefix_blocks for r in replicas]
        best = max(matched)
        if best * request.block_size >= self.cache_threshold * request.prompt_tokens and best:
            return matched.index(best)
        sizes = [r.cached_blocks for r in replicas]
        return sizes.index(min(sizes))


ROUTERS: dict[str, type[Router]] = {
    cls.name: cls
    for cls in (RoundRobin, RandomRouter, LeastLoaded, PrefixScorer, KvRouter, CacheAware)
}


def make_router(
    name: str,
    num_replicas: int,
    seed: int,
    *,
    prefix_weights: tuple[float, float, float] = (2.0, 1.0, 1.0),
) -> Router:
    """The router called ``name`` (``ROUTERS``) for ``num_replicas`` replicas;
    ``prefix_weights`` are the `prefix` router's scorer weights."""
    if name not in ROUTERS:
        raise ValueError(f"unknown router {name!r}: choose one of {', '.join(ROUTERS)}")
    rng = np.random.default_rng(seed)
    if name == PrefixScorer.name:
        return PrefixScorer(num_replicas, rng, weights=prefix_weights)
    return ROUTERS[name](num_replicas, rng)


def num_full_blocks(prompt_tokens: int, block_size: int) -> int:
    """Full KV blocks of a prompt: what a prefix cache can hold of it."""
    return math.floor(prompt_tokens / block_size)
