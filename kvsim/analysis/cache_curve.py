"""Offline prefix-cache curves: hit rate against cache capacity, LRU and optimal, no simulation.

The model (docs/metrics.md, "Cache curves"): requests come in arrival order. Each one first
looks up its blocks — its hit is the longest run of leading blocks in the cache, at most
``(prompt_tokens - 1) // block_size`` blocks (vLLM's cap: only full blocks, never the last
prompt token) — then touches all its shareable blocks (kvsim.analysis.prefix_blocks). Between
two requests the cache holds at most C blocks. Hit rate = hit tokens / prompt tokens over all
requests (token-weighted, as vLLM's ``prefix_cache_hits / prefix_cache_queries``).

**LRU**, for every capacity in one pass (Mattson's stack distances): a block hits at capacity C
exactly when at most C - 1 distinct blocks were used more recently. Within one request block 0
becomes the most recently used and its deepest block the least (vLLM frees a block table in
reverse, so a request's deepest block is evicted first). Every touch is a root path of the
block trie, so the blocks last touched by request R are always a deep part ``[a_R, n_R)`` of
its path, and the stack distance of block j, last touched by R, is

    1 + (blocks whose last touch is a request after R) + (j - a_R).

A Fenwick tree over requests holds how many blocks each request is the last toucher of, and
one query and one update per touch segment (a run of blocks with the same last toucher) give
the distances of the whole run, which grow by one per block. Along a request's path the
distances only grow (a block's parent is used with it every time, and more recently), so the
hit at capacity C — the leading blocks whose largest distance so far is <= C — is simply the
number of lookups at distance <= C. Cost: O(S log N) for S segments and N requests, after
the O(M log M) segment build over M hash ids.

**Optimal** is the upper bound no eviction policy can beat: Belady's rule, evict the block
whose next use is farthest in the future, never-used first. In this model a block's next use is
its next lookup, and a block that some request stores again before that lookup (a request that
touches it but cannot hit it, e.g. behind the prompt_tokens - 1 cap) gains nothing from being
kept until then, so it counts as never used until it is stored again. Keeping a block from its
touch at request p to its lookup at request t occupies one slot in every gap p..t-1 between
requests; the optimal policy keeps the most such intervals with at most C in any gap, which the
greedy in order of lookup (shorter intervals first among equals) achieves — the interval form
of Belady's rule (Hawkeye's OPTgen). It is a stack algorithm too, but its one-pass update is
not logarithmic, so this module runs the greedy for the asked capacities together: an
occupancy matrix of gaps x capacities, one slice max and one slice add per touch segment kept
over more than one gap: O(K x total interval length) time and 8 x N x K bytes for K
capacities and N requests — 0.3 s for the 26 default capacities of the 12,031-request Mooncake
conversation trace. At unlimited capacity both policies hit every block stored before.
tests/kvsim/test_cache_curve.py checks both against plain per-capacity replays, and the
optimal one against an exhaustive search over all policies on tiny traces.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kvsim.analysis.prefix_blocks import PrefixBlocksError, TouchSegments, touch_segments
from workloads import Trace

if TYPE_CHECKING:
    import pandas as pd

POLICIES = ("lru", "optimal")
CURVE_COLUMNS = (
    "capacity_tokens",
    "capacity_blocks",
    "policy",
    "hit_rate",
    "hit_tokens",
    "query_tokens",
)
_NICE_STEPS = (1.0, 1.5, 2.0, 3.0, 5.0, 7.0)  # per decade, for the default capacity grid


class CacheCurveError(PrefixBlocksError):
    """Bad capacities for a cache curve."""


class Fenwick:
    """Prefix sums over ``size`` integer counters, O(log size) per update and query."""

    def __init__(self, size: int) -> None:
        self._tree = [0] * (size + 1)

    def add(self, index: int, delta: int) -> None:
        tree = self._tree
        i = index + 1
        while i < len(tree):
            tree[i] += delta
            i += i & -i

    def prefix(self, index: int) -> int:
        """Sum of counters 0..index (inclusive)."""
        tree = self._tree
        i, total = index + 1, 0
        while i > 0:
            total += tree[i]
            i -= i & -i
        return total


@dataclass(frozen=True, slots=True)
class StackDistances:
    """LRU stack distances of every block lookup, one arithmetic run per touch segment.

    For segment s, the lookups of its first ``count[s]`` blocks have distances
    ``first[s], first[s] + 1, ...`` (blocks); a lookup hits at capacity C blocks when its
    distance is <= C. Cold segments (never touched before) are left out: they miss at every
    capacity. ``segments`` is what the distances were computed from.
    """

    segments: TouchSegments
    request: np.ndarray
    first: np.ndarray
    count: np.ndarray

    def hit_blocks(self, capacity_blocks: float) -> np.ndarray:
        """Per segment, the blocks that hit at ``capacity_blocks`` (``math.inf``: unlimited)."""
        hits: np.ndarray = self.count.copy()
        if capacity_blocks < self.segments.num_distinct_blocks:  # else it holds every block
            np.minimum(np.maximum(int(capacity_blocks) - self.first + 1, 0), self.count, out=hits)
        return hits

    def hit_blocks_per_request(self, capacity_blocks: float) -> np.ndarray:
        """Blocks each request hits at ``capacity_blocks``, in arrival order."""
        hits = np.zeros(self.segments.num_requests, np.int64)
        np.add.at(hits, self.request, self.hit_blocks(capacity_blocks))
        return hits


def lru_stack_distances(segments: TouchSegments) -> StackDistances:
    """The LRU stack distance of every block lookup (see the module docstring)."""
    request = segments.request.tolist()
    first_block = segments.first_block.tolist()
    length = segments.length.tolist()
    owner = segments.owner.tolist()
    num_blocks = segments.num_blocks.tolist()
    fenwick = Fenwick(segments.num_requests)
    last_touched = [0] * segments.num_requests  # blocks each request is the last toucher of
    total = 0  # sum of last_touched
    first = [0] * len(request)
    seg, num_segments = 0, len(request)
    for r in range(segments.num_requests):
        head = seg
        while seg < num_segments and request[seg] == r:
            o = owner[seg]
            if o >= 0:  # the distances, from the state before this request touches anything
                more_recent = total - fenwick.prefix(o)
                first[seg] = 1 + more_recent + first_block[seg] - num_blocks[o] + last_touched[o]
            seg += 1
        for s in range(head, seg):
            o = owner[s]
            if o >= 0:
                fenwick.add(o, -length[s])
                last_touched[o] -= length[s]
                total -= length[s]
        if num_blocks[r]:
            fenwick.add(r, num_blocks[r])
            last_touched[r] = num_blocks[r]
            total += num_blocks[r]
    warm = segments.owner >= 0
    return StackDistances(
        segments=segments,
        request=segments.request[warm],
        first=np.array(first, np.int64)[warm],
        count=segments.lookup_length()[warm],
    )


def optimal_hit_blocks(segments: TouchSegments, capacities_blocks: Sequence[float]) -> np.ndarray:
    """Blocks the optimal (Belady) policy hits at each capacity (blocks; ``math.inf`` for
    unlimited), summed over the trace: the greedy over keep-intervals of the module docstring,
    for all capacities at once."""
    caps = np.asarray(capacities_blocks, dtype=float)
    unlimited_hits = int(segments.lookup_length()[segments.owner >= 0].sum())
    hits = np.where(np.isinf(caps), unlimited_hits, 0).astype(np.int64)
    # A capacity at least the working set keeps everything: the unlimited answer.
    limited = np.flatnonzero(~np.isinf(caps) & (caps < segments.num_distinct_blocks))
    hits[~np.isinf(caps) & (caps >= segments.num_distinct_blocks)] = unlimited_hits
    if len(limited) == 0:
        return hits
    cap = np.floor(caps[limited]).astype(np.int64)
    occupancy = np.zeros((segments.num_requests, len(cap)), np.int64)  # gap after request s
    lookups = segments.lookup_length()
    useful = (segments.owner >= 0) & (lookups > 0)
    # Kept since the request just before: the gap between them holds nothing else yet (every
    # interval through it ends at this request, and this run is its shallowest), so these
    # take min(C, n) at once, in one vectorised step, before the loop.
    adjacent = useful & (segments.owner == segments.request - 1)
    took = np.minimum(cap[None, :], lookups[adjacent][:, None])
    occupancy[segments.owner[adjacent]] = took
    taken = took.sum(axis=0)
    rest = np.flatnonzero(useful & ~adjacent)
    # Segments are in (request, block) order: by lookup time, shorter intervals first.
    take = np.empty(len(cap), np.int64)
    for p, t, n in zip(
        segments.owner[rest].tolist(), segments.request[rest].tolist(), lookups[rest].tolist()
    ):
        window = occupancy[p:t]
        np.subtract(cap, window.max(axis=0), out=take)
        np.minimum(take, n, out=take)
        if take.max() <= 0:
            continue
        np.maximum(take, 0, out=take)
        window += take
        taken += take
    hits[limited] = taken
    return hits


def default_capacities(segments: TouchSegments) -> list[float]:
    """A log grid of capacities in tokens (1, 1.5, 2, 3, 5, 7 per decade) from about 1/10,000
    of the working set up to it, then the working set itself and unlimited."""
    working_set = segments.num_distinct_blocks * segments.block_size
    low = max(segments.block_size, working_set / 1e4)
    grid: list[float] = []
    decade = 10.0 ** math.floor(math.log10(low))
    while True:
        for step in _NICE_STEPS:
            value = step * decade
            if value >= working_set:
                return [*grid, float(working_set), math.inf] if working_set else [math.inf]
            if value >= low:
                grid.append(value)
        decade *= 10


@dataclass(frozen=True, slots=True)
class CacheCurve:
    """Hit rates of both policies at each capacity, and what they were computed from.

    ``rows`` are dicts with the curve.csv columns (CURVE_COLUMNS), LRU rows first, each
    policy's rows in the order the capacities were asked. ``working_set_tokens``: the distinct
    blocks the trace touches, in tokens (the capacity beyond which nothing more is gained).
    """

    block_size: int
    rows: list[dict[str, object]]
    query_tokens: int
    working_set_tokens: int
    distances: StackDistances

    def hit_rates_at(self, capacity_tokens: float) -> dict[str, float]:
        """Each policy's hit rate at one more capacity (tokens; ``math.inf``: unlimited)."""
        check_capacities([capacity_tokens])
        blocks = capacity_blocks(capacity_tokens, self.block_size)
        segments = self.distances.segments
        hits = {
            "lru": int(self.distances.hit_blocks(blocks).sum()),
            "optimal": int(optimal_hit_blocks(segments, [blocks])[0]),
        }
        return {policy: n * self.block_size / self.query_tokens for policy, n in hits.items()}

    def frame(self) -> pd.DataFrame:
        """The rows as a pandas DataFrame (columns CURVE_COLUMNS; pandas is imported here)."""
        import pandas as pd

        return pd.DataFrame(self.rows, columns=list(CURVE_COLUMNS))


def capacity_blocks(capacity_tokens: float, block_size: int) -> float:
    """floor(capacity_tokens / block_size) blocks; ``math.inf`` stays unlimited."""
    if math.isinf(capacity_tokens):
        return math.inf
    return float(math.floor(capacity_tokens / block_size))


def check_capacities(capacities_tokens: Sequence[float]) -> None:
    """Raise CacheCurveError unless every capacity is a number > 0 (``inf``: unlimited)."""
    if not capacities_tokens:
        raise CacheCurveError("no capacities given")
    for value in capacities_tokens:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CacheCurveError(f"capacity must be a number of tokens, got {value!r}")
        if not value > 0:  # also NaN
            raise CacheCurveError(f"capacity must be > 0 tokens (or inf), got {value!r}")


def cache_curve(
    trace: Trace,
    block_size: int | None = None,
    capacities_tokens: Sequence[float] | None = None,
) -> CacheCurve:
    """Prefix-cache hit rate of ``trace`` against capacity, for LRU and the optimal policy.

    ``block_size`` in tokens (default: the trace's hash_block_size); ``capacities_tokens`` in
    tokens, ``math.inf`` for unlimited (default: :func:`default_capacities`).

    Raises:
        PrefixBlocksError: the trace has no hash_ids or the block size is bad.
        CacheCurveError: a capacity is not a number > 0.
    """
    if capacities_tokens is not None:
        check_capacities(capacities_tokens)
    segments = touch_segments(trace, block_size)
    b = segments.block_size
    capacities = list(capacities_tokens or default_capacities(segments))
    blocks = [capacity_blocks(c, b) for c in capacities]
    distances = lru_stack_distances(segments)
    query_tokens = int(segments.prompt_tokens.sum())
    hit_blocks = {
        "lru": [int(distances.hit_blocks(c).sum()) for c in blocks],
        "optimal": optimal_hit_blocks(segments, blocks).tolist(),
    }
    rows: list[dict[str, object]] = [
        {
            "capacity_tokens": float(tokens),
            "capacity_blocks": num,
            "policy": policy,
            "hit_rate": hits * b / query_tokens,
            "hit_tokens": hits * b,
            "query_tokens": query_tokens,
        }
        for policy in POLICIES
        for tokens, num, hits in zip(capacities, blocks, hit_blocks[policy])
    ]
    return CacheCurve(
        block_size=b,
        rows=rows,
        query_tokens=query_tokens,
        working_set_tokens=segments.num_distinct_blocks * b,
        distances=distances,
    )
