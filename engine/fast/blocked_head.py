"""The waiting head FastV1Scheduler knows to be blocked, so the waiting pass can be skipped.

A waiting head that could not be admitted stays unable while it is the head, the free
blocks, the budget left to it and the seats do not grow, and no block it could hit is
cached (the BlockManager flags its watched keys: ``_watch_keys``, ``_watch_hit``); arrivals,
aborts, finishes and preemptions drop the verdict. Freeing blocks is the only way free
blocks grow, and an evicted hit block only makes the head need more, except where only its
hits keep it within the budget of a run without chunked prefill: evicting them gets it
rejected, so such a head gets no verdict.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.sequence import Sequence
from engine.v1.scheduler import V1Scheduler


@dataclass(slots=True)
class HeadVerdict:
    """The head, and what it saw when it could not be admitted."""

    seq: Sequence
    free_blocks: int
    budget: int
    num_running: int


class BlockedHead:
    """The verdict on one scheduler's waiting head (None: unknown)."""

    __slots__ = ("sched", "verdict")

    def __init__(self, sched: V1Scheduler) -> None:
        self.sched = sched
        self.verdict: HeadVerdict | None = None

    def drop(self) -> None:
        if self.verdict is not None:
            self.verdict = None
            self.sched.block_manager._watch_keys = None

    def waiting_pass_may_admit(self, budget: int) -> bool:
        """Whether the waiting pass could admit (or reject) anything with ``budget`` left."""
        sched = self.sched
        waiting = sched._waiting
        if not waiting or budget <= 0 or len(sched._running) >= sched.config.max_num_seqs:
            return False
        v, bm = self.verdict, sched.block_manager
        if v is None or v.seq is not waiting[0] or bm._watch_hit:
            return True
        return not (
            bm.get_num_free_blocks() <= v.free_blocks
            and budget <= v.budget
            and len(sched._running) >= v.num_running
        )

    def note(self, budget: int) -> None:
        """After a waiting pass that stopped at a head it could not admit, remember it."""
        self.drop()
        sched = self.sched
        if not sched._waiting or budget <= 0:
            return
        if len(sched._running) >= sched.config.max_num_seqs:
            return
        head, bm = sched._waiting[0], sched.block_manager
        if self._rejectable(head):
            return
        self.verdict = HeadVerdict(head, bm.get_num_free_blocks(), budget, len(sched._running))
        if bm.enable_prefix_caching:
            bm._watch_keys = set(head.block_hashes[: (head.num_tokens - 1) // bm.block_size])
            bm._watch_hit = False

    def _rejectable(self, head: Sequence) -> bool:
        """Whether only its prefix hits keep ``head`` from being rejected (no chunked
        prefill, more tokens than the budget): others' takes may evict those hits, free
        blocks not growing, and the plain waiting pass would then reject it, so no verdict
        on it holds."""
        cfg = self.sched.config
        return (
            not cfg.enable_chunked_prefill
            and self.sched.block_manager.enable_prefix_caching
            and head.num_tokens > cfg.max_num_batched_tokens
        )

    def blocked(self, budget: int) -> bool:
        """Whether the waiting head would not be admitted with ``budget`` tokens left (the
        plain waiting pass, without its effects); remembers it when so."""
        sched = self.sched
        seq = sched._waiting[0]
        if sched._never_runs(seq) is not None:
            return False  # it would be rejected: a plain step reports it
        cfg, bm = sched.config, sched.block_manager
        hits = bm.find_cached_prefix(seq)
        bs = bm.block_size
        n = seq.num_tokens - len(hits) * bs
        eligible = len(sched._running) + sched.num_waiting
        threshold = cfg.long_prefill_token_threshold if eligible > 1 else 0
        if not cfg.enable_chunked_prefill:
            if n > cfg.max_num_batched_tokens or self._rejectable(seq):
                return False  # rejected, or it may be by the next step
            if (threshold if 0 < threshold < n else n) > budget:
                self.note(budget)
                return True
        max_len = cfg.max_model_len
        full = seq.num_tokens if max_len is None else min(seq.num_tokens, max_len)
        refs = bm._ref_counts
        evictable = sum(1 for b in hits if refs[b] == 0)
        need = max(-(-full // bs) - len(hits), 0) + evictable
        if need + sched._watermark_blocks > bm.get_num_free_blocks():
            self.note(budget)
            return True
        return False
