"""Two-tier cache curves: the prefix-cache hit rate a GPU tier of g blocks plus a CPU tier of c
chunks could reach, as vLLM 0.33's native KV offloading (OffloadingConnector, CPU backend, LRU)
serves it, for a grid of (g, c) from one pass over the trace. No simulation, no time.

The model (docs/metrics.md, "Two tiers: GPU and CPU"): chunks are GPU blocks
(``blocks_per_chunk = 1``, vLLM's default). Requests come in arrival order. A request's GPU hit
G is its GPU prefix hit, as in kvsim.analysis.cache_curve (capped at ``(prompt - 1) // b``
blocks). vLLM's connector then looks the CPU tier up from chunk G on and loads the consecutive
chunks it holds, L of them, up to the prompt's last full block (``get_num_new_matched_tokens``
-> ``_lookup_complete_chunks``: the hit may cover the whole prompt; the scheduler recomputes
the last token after the load). The request's hit is G + L blocks. Afterwards every prompt
chunk the request computed is stored in the CPU tier (``offload_prompt_only``, stored as
computed, not when the GPU evicts it) and every chunk it stored, loaded or found there is made
most recently used when it finishes, head last (``LRUCachePolicy.on_request_finished``
updates recency tail to head). So the CPU tier is an *inclusive* LRU cache fed by the same
stream of prompt blocks as the GPU's, and in one pass:

* the LRU stack distance d of every block use (kvsim.analysis.cache_curve) serves both tiers:
  the GPU of g blocks holds a request's leading blocks with d <= g, the CPU of c chunks those
  with d <= c, and because distances grow along a request's path both are prefixes;
* G(g) = leading blocks with d <= g, at most ``(prompt - 1) // b``; C(c) = leading blocks
  with d <= c, at most the prompt's full blocks; the hit is max(G(g), C(c)) blocks, of which
  G(g) from the GPU and the rest loaded from the CPU.

A CPU tier no larger than the GPU's therefore adds only what the GPU's cap leaves (the last
full block of a prompt that ends on a block boundary): inclusive tiers hold the same blocks.

One rule of vLLM's is left out of the one-pass model: a request that loads from the CPU tier
(L > 0) does not offer its GPU-hit chunks [0, G) to the CPU tier (OffloadPolicy.CHUNK_LEVEL:
``update_state_after_alloc`` starts its stores after the loaded chunks), so their CPU recency
is not refreshed. :func:`replay_tiers` replays one (g, c) block by block with that rule too;
on the Mooncake conversation trace it stays within 0.05 points of the model at every point
measured (docs/metrics.md), on tiny random traces it sometimes differs more (either way).

The optimal column is Belady's rule (kvsim.analysis.cache_curve.optimal_hit_blocks) for one
cache of g + c blocks, with the CPU's lookup cap when c > 0: two tiers of g and c blocks hold
at most g + c blocks between requests, so no eviction policy of either tier, and no store
rule, can hit more. At c = 0 it is the 1-D optimal curve at g.
"""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvsim.analysis.cache_curve import (
    CacheCurveError,
    StackDistances,
    lru_stack_distances,
    optimal_hit_blocks,
)
from kvsim.analysis.prefix_blocks import (
    TouchSegments,
    _flat_hash_ids,
    prefix_ids,
    touch_segments,
)
from workloads import Trace

TIER_COLUMNS = (
    "gpu_capacity_blocks",
    "cpu_capacity_blocks",
    "gpu_capacity_tokens",
    "cpu_capacity_tokens",
    "gpu_capacity_bytes",
    "cpu_capacity_bytes",
    "hit_rate",
    "hit_tokens",
    "gpu_hit_tokens",
    "cpu_hit_tokens",
    "optimal_hit_rate",
    "optimal_hit_tokens",
    "query_tokens",
)


@dataclass(frozen=True, slots=True)
class TierHits:
    """Hit blocks of a two-tier cache summed over the trace: from the GPU prefix cache and
    loaded from the CPU tier (blocks of ``block_size`` tokens)."""

    gpu_blocks: int
    cpu_blocks: int

    @property
    def total_blocks(self) -> int:
        return self.gpu_blocks + self.cpu_blocks


def _check_blocks(values: Sequence[float], tier: str) -> None:
    if not values:
        raise CacheCurveError(f"no {tier} capacities given")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise CacheCurveError(f"{tier} capacity must be >= 0 blocks (or inf), got {value!r}")
    if len(set(values)) < len(values):
        raise CacheCurveError(f"{tier} capacities repeat: each must be a different block count")


class _Leading:
    """Per request, how many leading blocks a cache of C blocks holds, from stack distances:
    each warm segment's blocks have distances first, first + 1, ...; ``limit`` cuts each
    segment at the lookup cap (the GPU's) or at its length (the CPU's)."""

    def __init__(self, distances: StackDistances, limit: np.ndarray) -> None:
        self._request = distances.request
        self._first = distances.first
        self._limit = limit
        self._num_requests = distances.segments.num_requests

    def blocks(self, capacity: float) -> np.ndarray:
        """Leading blocks each request finds in an LRU cache of ``capacity`` blocks."""
        if math.isinf(capacity):
            held = self._limit
        else:
            held = np.clip(int(capacity) - self._first + 1, 0, self._limit)
        counts = np.bincount(self._request, weights=held, minlength=self._num_requests)
        return counts.astype(np.int64)


def _leading_pair(distances: StackDistances) -> tuple[_Leading, _Leading]:
    """The GPU's view (capped like the 1-D curve) and the CPU's (every full prompt block)."""
    segments = distances.segments
    warm = segments.owner >= 0
    return _Leading(distances, distances.count), _Leading(distances, segments.length[warm])


def cpu_lookup_segments(segments: TouchSegments) -> TouchSegments:
    """``segments`` with the CPU tier's lookup cap: every shareable full prompt block."""
    return dataclasses.replace(segments, num_lookup_blocks=segments.num_blocks)


@dataclass(frozen=True, slots=True)
class TierCurve:
    """Hit rates of a GPU tier of each capacity plus a CPU tier of each capacity.

    ``gpu_blocks`` / ``cpu_blocks``: the capacities (blocks of ``block_size`` tokens, ``inf``
    unlimited, 0 none). ``lru[i, j]``: TierHits of GPU ``gpu_blocks[i]`` with CPU
    ``cpu_blocks[j]`` under vLLM's rules (module docstring); ``optimal[i, j]``: Belady's hit
    blocks for ``gpu_blocks[i] + cpu_blocks[j]``. ``query_tokens``: all prompt tokens.
    """

    block_size: int
    gpu_blocks: list[float]
    cpu_blocks: list[float]
    gpu_hit_blocks: np.ndarray
    cpu_hit_blocks: np.ndarray
    optimal_blocks: np.ndarray
    query_tokens: int
    distances: StackDistances

    def hit_rate(self) -> np.ndarray:
        """Share of prompt tokens hit, GPU x CPU capacities."""
        hits: np.ndarray = (self.gpu_hit_blocks + self.cpu_hit_blocks) * self.block_size
        return hits / self.query_tokens

    def optimal_hit_rate(self) -> np.ndarray:
        rate: np.ndarray = self.optimal_blocks * self.block_size / self.query_tokens
        return rate

    def hits_at(self, gpu_blocks: float, cpu_blocks: float) -> TierHits:
        """The model's hits at one more (GPU, CPU) point (blocks; ``inf``: unlimited)."""
        _check_blocks([gpu_blocks], "GPU")
        _check_blocks([cpu_blocks], "CPU")
        gpu_view, cpu_view = _leading_pair(self.distances)
        on_gpu = gpu_view.blocks(gpu_blocks)
        total = np.maximum(on_gpu, cpu_view.blocks(cpu_blocks)) if cpu_blocks else on_gpu
        return TierHits(int(on_gpu.sum()), int(total.sum() - on_gpu.sum()))

    def optimal_at(self, gpu_blocks: float, cpu_blocks: float) -> int:
        """Belady's hit blocks for one cache of ``gpu_blocks + cpu_blocks``."""
        segments = self.distances.segments
        if cpu_blocks:
            segments = cpu_lookup_segments(segments)
        return int(optimal_hit_blocks(segments, [gpu_blocks + cpu_blocks])[0])


def tier_curve(
    trace: Trace,
    gpu_blocks: Sequence[float],
    cpu_blocks: Sequence[float],
    block_size: int | None = None,
) -> TierCurve:
    """Two-tier hit rates of ``trace`` on the grid ``gpu_blocks`` x ``cpu_blocks`` (blocks of
    ``block_size`` tokens, default the trace's hash_block_size; ``math.inf`` unlimited, 0 no
    tier). See the module docstring for the model.

    Raises:
        PrefixBlocksError: the trace has no hash_ids or the block size is bad.
        CacheCurveError: a capacity is not a number >= 0.
    """
    _check_blocks(gpu_blocks, "GPU")
    _check_blocks(cpu_blocks, "CPU")
    segments = touch_segments(trace, block_size)
    distances = lru_stack_distances(segments)
    gpu_view, cpu_view = _leading_pair(distances)
    on_gpu = np.stack([gpu_view.blocks(g) for g in gpu_blocks])  # GPU capacities x requests
    gpu_hits = np.repeat(on_gpu.sum(axis=1)[:, None], len(cpu_blocks), axis=1)
    cpu_hits = np.zeros_like(gpu_hits)
    for j, c in enumerate(cpu_blocks):
        if c:  # the CPU extends a request's GPU hit up to the leading blocks it holds
            cpu_hits[:, j] = np.maximum(on_gpu, cpu_view.blocks(c)[None, :]).sum(axis=1)
            cpu_hits[:, j] -= gpu_hits[:, j]
    no_cpu = np.asarray(cpu_blocks, dtype=float) == 0
    optimal = np.zeros((len(gpu_blocks), len(cpu_blocks)), np.int64)
    sums = np.add.outer(np.asarray(gpu_blocks, float), np.asarray(cpu_blocks, float))
    for cap_segments, columns in (
        (segments, no_cpu),
        (cpu_lookup_segments(segments), ~no_cpu),
    ):
        if columns.any():
            wanted = sums[:, columns]
            caps, inverse = np.unique(wanted, return_inverse=True)
            found = optimal_hit_blocks(cap_segments, caps.tolist())
            optimal[:, columns] = found[inverse.reshape(wanted.shape)]
    return TierCurve(
        block_size=segments.block_size,
        gpu_blocks=[float(g) for g in gpu_blocks],
        cpu_blocks=[float(c) for c in cpu_blocks],
        gpu_hit_blocks=gpu_hits,
        cpu_hit_blocks=cpu_hits,
        optimal_blocks=optimal,
        query_tokens=int(segments.prompt_tokens.sum()),
        distances=distances,
    )


def request_block_keys(trace: Trace, block_size: int) -> list[list[int]]:
    """Each request's shareable blocks (kvsim.analysis.prefix_blocks' rule) as integers,
    equal exactly when the blocks are: (name of the hash prefix the block ends in) x M + the
    block's index, M beyond any index."""
    hash_block = trace.hash_block_size or 1
    ids, lengths = _flat_hash_ids(trace.requests)
    names = prefix_ids(ids, lengths)
    starts = (np.cumsum(lengths) - lengths).tolist()
    prompt = [r.prompt_tokens for r in trace.requests]
    num_blocks = [min(p, n * hash_block) // block_size for p, n in zip(prompt, lengths.tolist())]
    stride = max(num_blocks, default=0) + 1
    keys = []
    for start, n in zip(starts, num_blocks):
        index = np.arange(n, dtype=np.int64)
        ends_in = start + ((index + 1) * block_size - 1) // hash_block
        keys.append((names[ends_in] * stride + index).tolist())
    return keys


def replay_tiers(
    trace: Trace, gpu_blocks: float, cpu_blocks: float, block_size: int | None = None
) -> TierHits:
    """Replay one (GPU, CPU) point block by block with vLLM's rules, including the one the
    one-pass model leaves out: a request that loads from the CPU tier does not touch its
    GPU-hit chunks there. The GPU hits come from the stack distances (exact for an LRU GPU
    cache); the CPU tier is an explicit LRU list. Seconds on a 12,000-request trace at
    16-token blocks.

    Raises:
        PrefixBlocksError: the trace has no hash_ids or the block size is bad.
        CacheCurveError: a capacity is not a number >= 0.
    """
    _check_blocks([gpu_blocks], "GPU")
    _check_blocks([cpu_blocks], "CPU")
    segments = touch_segments(trace, block_size)
    gpu_view, _ = _leading_pair(lru_stack_distances(segments))
    on_gpu = gpu_view.blocks(gpu_blocks)
    if not cpu_blocks:
        return TierHits(int(on_gpu.sum()), 0)
    keys = request_block_keys(trace, segments.block_size)
    cpu: OrderedDict[int, None] = OrderedDict()
    loaded = 0
    for blocks, hit in zip(keys, on_gpu.tolist()):
        run = hit
        while run < len(blocks) and blocks[run] in cpu:
            run += 1
        loaded += run - hit
        # CHUNK_LEVEL: a request that loads offers only the chunks after its GPU hit
        for key in reversed(blocks[hit if run > hit else 0 :]):
            cpu[key] = None
            cpu.move_to_end(key)
        while len(cpu) > cpu_blocks:
            cpu.popitem(last=False)
    return TierHits(int(on_gpu.sum()), loaded)


def _scaled(blocks: float, per_block: float | None) -> float:
    """``blocks`` x ``per_block`` (tokens or bytes); unlimited stays ``inf``, unknown is NaN."""
    if per_block is None:
        return math.nan
    return math.inf if math.isinf(blocks) else blocks * per_block


def tier_rows(
    curve: TierCurve,
    gpu_block_bytes: float | None = None,
    cpu_chunk_bytes: float | None = None,
) -> list[dict[str, float]]:
    """tiers.csv's rows (TIER_COLUMNS), GPU capacities outer, CPU inner, as asked.
    ``gpu_block_bytes`` / ``cpu_chunk_bytes``: bytes of one GPU block / CPU chunk (None:
    the bytes columns are NaN)."""
    b = curve.block_size
    rate, optimal = curve.hit_rate(), curve.optimal_hit_rate()
    rows = []
    for i, g in enumerate(curve.gpu_blocks):
        for j, c in enumerate(curve.cpu_blocks):
            gpu_hits, cpu_hits = int(curve.gpu_hit_blocks[i, j]), int(curve.cpu_hit_blocks[i, j])
            rows.append(
                {
                    "gpu_capacity_blocks": g,
                    "cpu_capacity_blocks": c,
                    "gpu_capacity_tokens": _scaled(g, b),
                    "cpu_capacity_tokens": _scaled(c, b),
                    "gpu_capacity_bytes": _scaled(g, gpu_block_bytes),
                    "cpu_capacity_bytes": _scaled(c, cpu_chunk_bytes),
                    "hit_rate": float(rate[i, j]),
                    "hit_tokens": (gpu_hits + cpu_hits) * b,
                    "gpu_hit_tokens": gpu_hits * b,
                    "cpu_hit_tokens": cpu_hits * b,
                    "optimal_hit_rate": float(optimal[i, j]),
                    "optimal_hit_tokens": int(curve.optimal_blocks[i, j]) * b,
                    "query_tokens": curve.query_tokens,
                }
            )
    return rows
