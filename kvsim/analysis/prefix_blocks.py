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


def prefix_ids(ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """For each hash id (flat, request by request), an integer naming the whole hash prefix
    that ends with it: equal exactly when two requests' hash_ids agree up to that point.

    Requests are sorted lexicographically by their hash_ids; the prefix of depth k of a request
    is then the prefix of its predecessor whenever their common prefix is longer than k, so the
    names are a running count over (depth, sorted position) — O(M log M) for M hash ids, with
    no loop over depths."""
    num = len(lengths)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    if ids.size == 0:
        return np.zeros(0, np.int64)
    order = _lexicographic_order(ids, starts, lengths)
    # Common prefix length of each sorted request with the one before it.
    prev, cur = order[:-1], order[1:]
    span = np.minimum(lengths[prev], lengths[cur])
    lcp = np.zeros(num, np.int64)
    if span.sum():
        pair = np.repeat(np.arange(len(cur)), span)
        depth = np.arange(int(span.sum())) - np.repeat(np.cumsum(span) - span, span)
        mismatch = ids[starts[prev][pair] + depth] != ids[starts[cur][pair] + depth]
        first_mismatch = np.full(len(cur), np.iinfo(np.int64).max)
        np.minimum.at(first_mismatch, pair[mismatch], depth[mismatch])
        lcp[1:] = np.minimum(first_mismatch, span)
    # Entries of the sorted requests, ordered by (depth, sorted position).
    rank = np.empty(num, np.int64)
    rank[order] = np.arange(num)
    owner = np.repeat(np.arange(num), lengths)
    depth = np.arange(len(ids)) - np.repeat(starts, lengths)
    by_depth = np.lexsort((rank[owner], depth))
    is_new = lcp[rank[owner[by_depth]]] <= depth[by_depth]
    names = np.empty(len(ids), np.int64)
    names[by_depth] = np.cumsum(is_new) - 1
    return names


def _lexicographic_order(ids: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Request indices sorted by their hash id sequences (a proper prefix sorts first)."""
    rows = ids.tolist()
    keys = [tuple(rows[s : s + n]) for s, n in zip(starts.tolist(), lengths.tolist())]
    return np.array(sorted(range(len(keys)), key=keys.__getitem__), dtype=np.int64)


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
        n_list, r_list, e_list = n_sorted.tolist(), r_sorted.tolist(), e_sorted.tolist()
        for q in short.tolist():
            covered, stop, s = e_list[q - 1], e_list[q], q - 2
            while covered < stop and s >= 0 and n_list[s] == n_list[q]:
                if e_list[s] > covered:
                    upto = min(e_list[s], stop)
                    extra.append((r_list[q], covered, upto, r_list[s]))
                    covered = upto
                s -= 1
            if covered < stop:
                extra.append((r_list[q], covered, stop, -1))
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
    order = np.lexsort((start, request))
    request, start, stop, owner = request[order], start[order], stop[order], owner[order]
    new = np.ones(len(order), bool)
    new[1:] = (request[1:] != request[:-1]) | (owner[1:] != owner[:-1])
    heads = np.flatnonzero(new)
    tails = np.append(heads[1:], len(order))[: len(heads)] - 1
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
