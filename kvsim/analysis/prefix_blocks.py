"""Prefix identity of a trace's KV blocks, from its ``hash_ids``, at any block size.

A trace's ``hash_ids`` name its prompts' hash blocks of ``H = hash_block_size`` tokens (equal
ids after equal prefixes mean equal tokens: the engine-mode prompt tokens and the vLLM
reference's TokenFactory both derive H tokens per hash id, truncated to the prompt). At block
size ``b``, block ``j`` of a request (tokens ``[j*b, (j+1)*b)``) can be shared only if it is full
and covered by hash blocks: ``(j+1)*b <= min(prompt_tokens, len(hash_ids)*H)``; tokens beyond
what hash_ids cover are unique to their request. Two requests' block ``j`` are the same block
exactly when their hash_ids agree on every hash block overlapping ``[0, (j+1)*b)``, i.e. on the
hash prefix up to hash block ``k_j = ((j+1)*b - 1) // H``. So a 16-token block inside a 512-token
hash block is shared exactly when the hash prefix up to it is, and a 1,024-token block exactly
when both hash blocks under it (and all before) agree.

The blocks every request touches form a root path in a trie (sharing block ``j`` means sharing
every block before it). :func:`touch_segments` describes a whole trace by *segments*: maximal
runs of consecutive blocks of one request that were last touched by the same earlier request
(or never). A segment is the unit the cache curves work in (kvsim.analysis.cache_curve): a
conversation trace of 12,000 requests and 9 million 16-token block touches has ~30,000 of
them, so nothing downstream runs per block, let alone per token, in Python.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvsim.errors import KvsimError
from workloads import Request, Trace


class PrefixBlocksError(KvsimError):
    """A trace cannot give prefix identity (no hash_ids) or the block size is invalid."""


@dataclass(frozen=True, slots=True)
class TouchSegments:
    """What each request of a trace touches in a prefix cache of ``block_size``-token blocks.

    Per request (arrival order): ``prompt_tokens``; ``num_blocks``, the shareable full blocks it
    touches (stores after its prefill); ``num_lookup_blocks``, the most blocks a lookup may hit,
    ``min(num_blocks, (prompt_tokens - 1) // block_size)`` (vLLM never serves the last prompt
    token from cache, and hits whole blocks only).

    Per segment (sorted by request, then block): ``request``; ``first_block`` (block index j of
    its first block); ``length`` (blocks); ``owner``, the latest earlier request that touched
    these blocks (-1: never touched before, cold misses). ``num_distinct_blocks`` is the number
    of different blocks the whole trace touches (its working set, in blocks).
    """

    block_size: int
    prompt_tokens: np.ndarray
    num_blocks: np.ndarray
    num_lookup_blocks: np.ndarray
    request: np.ndarray
    first_block: np.ndarray
    length: np.ndarray
    owner: np.ndarray
    num_distinct_blocks: int

    @property
    def num_requests(self) -> int:
        return len(self.prompt_tokens)

    def lookup_length(self) -> np.ndarray:
        """Per segment, how many of its blocks a lookup may hit (those below the request's
        ``num_lookup_blocks``)."""
        limit = self.num_lookup_blocks[self.request] - self.first_block
        lookup: np.ndarray = np.minimum(np.maximum(limit, 0), self.length)
        return lookup


def _flat_hash_ids(requests: Sequence[Request]) -> tuple[np.ndarray, np.ndarray]:
    """All hash ids in request order as dense int64 codes (equal ids, equal codes), and the
    number of ids per request."""
    lengths = np.fromiter(
        (len(r.hash_ids) if r.hash_ids else 0 for r in requests), np.int64, len(requests)
    )
    chained = itertools.chain.from_iterable(r.hash_ids or () for r in requests)
    try:
        ids = np.fromiter(chained, np.int64, int(lengths.sum()))
    except OverflowError:  # ids beyond 64 bits: intern them one by one
        codes: dict[int, int] = {}
        flat = itertools.chain.from_iterable(r.hash_ids or () for r in requests)
        ids = np.fromiter((codes.setdefault(h, len(codes)) for h in flat), np.int64)
    return ids, lengths


def prefix_ids(ids: np.ndarray, lengths: np.ndarray, *, numpy_level_min: int = 16) -> np.ndarray:
    """For each hash id (flat, request by request), an integer naming the whole hash prefix
    that ends with it: equal exactly when two requests' hash_ids agree up to that point.

    Prefixes are interned depth by depth: the name at depth d is that of the pair (name at
    depth d-1, hash id), one ``np.unique`` per depth over all requests that deep. Depths held by
    fewer than ``numpy_level_min`` requests (the long tail of a few very long prompts) are
    interned with a dict instead, so one 100,000-block prompt does not cost 100,000 numpy
    calls."""
    if ids.size == 0:
        return np.zeros(0, np.int64)
    starts = np.cumsum(lengths) - lengths
    depth = np.arange(len(ids)) - np.repeat(starts, lengths)
    by_depth = np.argsort(depth, kind="stable")
    bounds = np.searchsorted(depth[by_depth], np.arange(int(lengths.max()) + 1))
    _, codes = np.unique(ids, return_inverse=True)
    codes = codes.reshape(-1)
    num_codes = int(codes.max()) + 1
    names = np.empty(len(ids), np.int64)
    next_name = 0
    tail = len(bounds) - 1
    for d in range(len(bounds) - 1):
        entries = by_depth[bounds[d] : bounds[d + 1]]
        if len(entries) < numpy_level_min:
            tail = d
            break
        parents = names[entries - 1] + 1 if d else np.zeros(len(entries), np.int64)
        pairs, inverse = np.unique(parents * num_codes + codes[entries], return_inverse=True)
        names[entries] = next_name + inverse.reshape(-1)
        next_name += len(pairs)
    rest = by_depth[bounds[tail] :]  # depth order: parents before children
    if len(rest):
        # Parents above the tail were named by numpy; those inside it are named here.
        named_parent = np.where(depth[rest] > 0, names[rest - 1], -1).tolist()
        interned: dict[tuple[int, int], int] = {}
        tail_names: dict[int, int] = {}
        for e, code, d, parent in zip(
            rest.tolist(), codes[rest].tolist(), depth[rest].tolist(), named_parent
        ):
            key = (tail_names[e - 1] if d > tail else parent, code)
            tail_names[e] = interned.setdefault(key, next_name + len(interned))
        names[rest] = list(tail_names.values())  # insertion order is rest's order
    return names


def touch_segments(trace: Trace, block_size: int | None = None) -> TouchSegments:
    """The touch segments of ``trace`` at ``block_size`` tokens per block (default: the trace's
    ``hash_block_size``). See the module docstring for the prefix-identity rule.

    Raises:
        PrefixBlocksError: the trace has no hash_ids, or ``block_size`` is not a positive int.
    """
    hash_block = trace.hash_block_size
    requests = trace.requests
    if hash_block is None or not any(r.hash_ids for r in requests):
        raise PrefixBlocksError(
            f"trace {trace.name!r} has no hash_ids: prefix identity needs them "
            "(e.g. a Mooncake trace, kvsim import mooncake)"
        )
    b = hash_block if block_size is None else block_size
    if type(b) is not int or b < 1:
        raise PrefixBlocksError(f"block size must be a positive integer, got {b!r}")
    prompt = np.fromiter((r.prompt_tokens for r in requests), np.int64, len(requests))
    ids, lengths = _flat_hash_ids(requests)
    num_blocks = np.minimum(prompt, lengths * hash_block) // b
    num_lookup = np.minimum(num_blocks, (prompt - 1) // b)

    # One group per (request, hash block k): the blocks j whose key ends in hash block k,
    # j in [k*H // b, (k+1)*H // b), cut at the request's num_blocks. Groups of one node (one
    # hash prefix) always start at the same block, and each touch covers a leading part.
    node = prefix_ids(ids, lengths)
    request = np.repeat(np.arange(len(requests)), lengths)
    k = np.arange(len(ids)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    lo = k * hash_block // b
    end = np.minimum((k + 1) * hash_block // b, num_blocks[request])
    keep = lo < end
    node, request, lo, end = node[keep], request[keep], lo[keep], end[keep]
    pieces = _owner_pieces(node, request, lo, end)
    return _merge_pieces(b, prompt, num_blocks, num_lookup, *pieces)


def _owner_pieces(
    node: np.ndarray, request: np.ndarray, lo: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Split each group [lo, end) into pieces by owner: the owner of block i of a node is the
    latest earlier touch of that node that covered i. Almost always the previous touch covers
    the whole group; only the rest of a group that reaches past it walks further back."""
    order = np.argsort(node, kind="stable")  # groups are in request order: time within a node
    n_sorted, r_sorted, e_sorted = node[order], request[order], end[order]
    has_prev = np.zeros(len(order), bool)
    has_prev[1:] = n_sorted[1:] == n_sorted[:-1]
    prev_request = np.full(len(order), -1, np.int64)
    prev_end = np.zeros(len(order), np.int64)
    prev_request[1:][has_prev[1:]] = r_sorted[:-1][has_prev[1:]]
    prev_end[1:][has_prev[1:]] = e_sorted[:-1][has_prev[1:]]
    owner = np.empty(len(order), np.int64)
    first_end = np.empty(len(order), np.int64)
    owner[order] = prev_request
    first_end[order] = np.where(has_prev, np.minimum(prev_end, e_sorted), e_sorted)
    # The main piece: [lo, first_end) owned by the previous touch (or cold).
    reqs, starts, stops, owners = [request], [lo], [first_end], [owner]
    short = np.flatnonzero(has_prev & (prev_end < e_sorted))
    if len(short):
        extra: list[tuple[int, int, int, int]] = []
        # Few groups walk, and not far: read the arrays element by element.
        for q in short.tolist():
            covered, stop, s = int(e_sorted[q - 1]), int(e_sorted[q]), q - 2
            here, toucher = n_sorted[q], int(r_sorted[q])
            while covered < stop and s >= 0 and n_sorted[s] == here:
                if e_sorted[s] > covered:
                    upto = min(int(e_sorted[s]), stop)
                    extra.append((toucher, covered, upto, int(r_sorted[s])))
                    covered = upto
                s -= 1
            if covered < stop:
                extra.append((toucher, covered, stop, -1))
        more = np.array(extra, np.int64).reshape(-1, 4)
        reqs.append(more[:, 0])
        starts.append(more[:, 1])
        stops.append(more[:, 2])
        owners.append(more[:, 3])
    return (np.concatenate(reqs), np.concatenate(starts), np.concatenate(stops),
            np.concatenate(owners))  # fmt: skip


def _merge_pieces(
    block_size: int,
    prompt: np.ndarray,
    num_blocks: np.ndarray,
    num_lookup: np.ndarray,
    request: np.ndarray,
    start: np.ndarray,
    stop: np.ndarray,
    owner: np.ndarray,
) -> TouchSegments:
    """Sort pieces by (request, block) and merge neighbours with the same owner."""
    in_order = (request[1:] > request[:-1]) | (
        (request[1:] == request[:-1]) & (start[1:] > start[:-1])
    )
    if not in_order.all():  # only the pieces of groups reaching past their last toucher
        order = np.lexsort((start, request))
        request, start, stop, owner = request[order], start[order], stop[order], owner[order]
    new = np.ones(len(request), bool)
    new[1:] = (request[1:] != request[:-1]) | (owner[1:] != owner[:-1])
    heads = np.flatnonzero(new)
    tails = np.append(heads[1:], len(request))[: len(heads)] - 1
    length = stop[tails] - start[heads]
    cold = owner[heads] < 0
    return TouchSegments(
        block_size=block_size,
        prompt_tokens=prompt,
        num_blocks=num_blocks,
        num_lookup_blocks=num_lookup,
        request=request[heads],
        first_block=start[heads],
        length=length,
        owner=owner[heads],
        num_distinct_blocks=int(length[cold].sum()),
    )
