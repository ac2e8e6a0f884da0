"""What the engine's events say happened: event kinds and step kinds (engine/core/events.py)."""

from __future__ import annotations

import enum


class EventKind(enum.IntEnum):
    """What happened. Stored as small integers in the recorder's columns."""

    ARRIVE = 0  # add_request: the sequence entered the waiting queue
    ADMIT = 1  # first prefill scheduled
    RESUME = 2  # prefill scheduled again after a preemption (recompute)
    ALLOCATE = 3  # blocks allocated for a prefill
    APPEND_BLOCK = 4  # one block appended for a decode token
    FREE = 5  # blocks returned to the free list
    PREEMPT = 6  # running sequence evicted (recompute mode); v1: num_tokens = its tokens
    FINISH = 7  # finished by EOS, stop token or length
    ABORT = 8  # cancelled by the caller
    REJECT = 9  # can never fit (pool, max_model_len or token budget)
    STEP = 10  # one scheduled step (prefill or decode)
    # Prefix caching (v1 scheduler only). With record_hashes (below) these carry what a
    # vLLM-style KV-event export needs: CACHE is BlockStored, EVICT is BlockRemoved,
    # CACHE_RESET is AllBlocksCleared.
    PREFIX_HIT = 11  # admission served num_tokens tokens from the cache: block_ids are the hits
    CACHE = 12  # block_ids were cached under their keys; num_tokens = table index of the first
    EVICT = 13  # block_ids, free and cached, were taken for reuse: their keys left the cache
    CACHE_RESET = 14  # reset_prefix_cache(): every key left the cache
    # KV offloading (engine/offload): transfers between the GPU pool and a CPU tier.
    OFFLOAD_LOAD = 15  # a load issued: block_ids its GPU blocks, num_tokens the tokens loaded
    OFFLOAD_STORE = 16  # a store issued: block_ids its source GPU blocks, num_tokens its tokens
    OFFLOAD_LOAD_DONE = 17  # that load completed (same block_ids and num_tokens)
    OFFLOAD_STORE_DONE = 18  # that store completed: its chunks are readable in the tier
    # v1: the sequence sampled its first token (the step that completed its prompt); a
    # chunked prompt's first token comes with its last chunk, not at its admission.
    FIRST_TOKEN = 19
    # Fleets (kvsim/fleet): a router sent the request to this replica, at its arrival, before
    # the replica's ARRIVE; num_tokens = the prompt tokens the router saw cached there. The
    # engine never records it: the fleet writes it (events.parquet's replica column says where).
    ROUTE = 20


class StepKind(enum.IntEnum):
    """What a scheduled step runs."""

    PREFILL = 0
    DECODE = 1
    MIXED = 2  # v1: decodes and prefill chunks in one step

    def __str__(self) -> str:
        return self.name.lower()


NO_SEQ = -1
