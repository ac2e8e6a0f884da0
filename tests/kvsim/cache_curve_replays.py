"""Plain reference replays for the offline prefix-cache curve tests (test_cache_curve*.py):
an explicit LRU list and an explicit Belady cache per capacity, an exhaustive search over
every policy on tiny traces, straight from the block-sharing rule; and random small traces
with hash ids (a hypothesis strategy)."""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from collections import OrderedDict

from hypothesis import strategies as st

from workloads import Request, Trace

Key = tuple[tuple[int, ...], int]
INF = math.inf


def block_keys(request: Request, hash_block_size: int, block_size: int) -> tuple[list[Key], int]:
    """A request's shareable blocks as (hash prefix, block index) keys, straight from the rule:
    block j is shareable if (j+1)*b <= min(prompt, len(hash_ids)*H) and is named by the hash ids
    of every hash block overlapping tokens [0, (j+1)*b). Also how many a lookup may hit."""
    if not request.hash_ids:
        return [], 0
    covered = min(request.prompt_tokens, len(request.hash_ids) * hash_block_size)
    keys = []
    for j in range(covered // block_size):
        last_token = (j + 1) * block_size - 1
        keys.append((tuple(request.hash_ids[: last_token // hash_block_size + 1]), j))
    cap = (request.prompt_tokens - 1) // block_size  # never the last prompt token
    return keys, min(len(keys), cap)


def leading_hits(keys: list[Key], lookup: int, cached: object) -> int:
    hits = 0
    while hits < lookup and keys[hits] in cached:  # type: ignore[operator]
        hits += 1
    return hits


def replay_lru(trace: Trace, block_size: int, capacity: float) -> list[int]:
    """Hit blocks per request with an explicit LRU list of ``capacity`` blocks."""
    cache: OrderedDict[Key, None] = OrderedDict()
    hits = []
    for request in trace.requests:
        keys, lookup = block_keys(request, trace.hash_block_size or 1, block_size)
        hits.append(leading_hits(keys, lookup, cache))
        for key in reversed(keys):  # block 0 ends most recent, the deepest block least
            cache[key] = None
            cache.move_to_end(key)
        while len(cache) > capacity:
            cache.popitem(last=False)
    return hits


def replay_belady(trace: Trace, block_size: int, capacity: float) -> int:
    """Hit blocks with an explicit Belady cache: after each request keep the ``capacity``
    blocks whose next use comes soonest. A block's next use is its next lookup, unless a request
    stores it again before that (then keeping it now gains nothing: never used until then)."""
    per_request = [block_keys(r, trace.hash_block_size or 1, block_size) for r in trace.requests]
    lookups: dict[Key, list[int]] = {}
    touches: dict[Key, list[int]] = {}
    for t, (keys, lookup) in enumerate(per_request):
        for key in keys[:lookup]:
            lookups.setdefault(key, []).append(t)
        for key in keys:
            touches.setdefault(key, []).append(t)

    def after(times: list[int], t: int) -> float:
        i = bisect.bisect_right(times, t)
        return times[i] if i < len(times) else INF

    def next_use(key: Key, t: int) -> tuple[float, int]:
        use = after(lookups.get(key, []), t)
        return (INF if after(touches[key], t) < use else use, key[1])

    cache: set[Key] = set()
    total = 0
    for t, (keys, lookup) in enumerate(per_request):
        total += leading_hits(keys, lookup, cache)
        available = cache | set(keys)
        if capacity < len(available):
            ranked = sorted(available, key=lambda k: (*next_use(k, t), repr(k)))
            available = set(ranked[: int(capacity)])
        cache = available
    return total


def best_possible(trace: Trace, block_size: int, capacity: int) -> int:
    """The most hit blocks any policy can get: every choice of what to keep, after every
    request (tiny traces only)."""
    per_request = [block_keys(r, trace.hash_block_size or 1, block_size) for r in trace.requests]

    @functools.cache
    def best(t: int, cache: frozenset[Key]) -> int:
        if t == len(per_request):
            return 0
        keys, lookup = per_request[t]
        hits = leading_hits(keys, lookup, cache)
        available = sorted(cache | set(keys))
        return hits + max(
            best(t + 1, frozenset(kept))
            for size in range(min(capacity, len(available)) + 1)
            for kept in itertools.combinations(available, size)
        )

    return best(0, frozenset())


@st.composite
def small_traces(draw: st.DrawFn, max_requests: int = 14, max_hash_blocks: int = 6) -> Trace:
    hash_block_size = draw(st.sampled_from([1, 2, 3, 4, 8]))
    alphabet = draw(st.integers(1, 3))  # few distinct ids: plenty of shared and diverging paths
    requests = []
    for i in range(draw(st.integers(1, max_requests))):
        if draw(st.integers(0, 9)) == 0:  # no hash_ids: nothing shareable
            prompt = draw(st.integers(1, 30))
            requests.append(Request(request_id=str(i), arrival_time_s=float(i),
                                    prompt_tokens=prompt, output_tokens=1))  # fmt: skip
            continue
        num_hash = draw(st.integers(1, max_hash_blocks))
        prompt = draw(st.integers((num_hash - 1) * hash_block_size + 1, num_hash * hash_block_size))
        hash_ids = draw(st.lists(st.integers(0, alphabet - 1), min_size=num_hash,
                                 max_size=num_hash))  # fmt: skip
        requests.append(Request(request_id=str(i), arrival_time_s=float(i), prompt_tokens=prompt,
                                output_tokens=1, hash_ids=hash_ids))  # fmt: skip
    if not any(r.hash_ids for r in requests):
        last = Request(request_id="last", arrival_time_s=float(len(requests)),
                       prompt_tokens=hash_block_size, output_tokens=1, hash_ids=[0])  # fmt: skip
        requests.append(last)
    return Trace(name="random", hash_block_size=hash_block_size, requests=requests)
