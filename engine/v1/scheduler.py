"""V1Scheduler: vLLM 0.33's v1 scheduler (``SchedulerConfig(scheduler="v1")``).

Every step is one token budget (``max_num_batched_tokens``) shared by every sequence; there
is no prefill or decode phase, each sequence just catches its computed tokens up with its
tokens (vllm/v1/core/sched/scheduler.py):

1. Running sequences first, in running order: each gets its missing tokens (1 for a decode,
   the rest of its prompt for a prefill in progress), capped by
   ``long_prefill_token_threshold`` (when > 0 and more than one sequence runs or waits), by
   the budget left and by ``max_model_len``. When its blocks cannot be allocated, the
   lowest-priority running sequence is preempted (recompute: blocks freed, the sequence goes
   back to the front of the waiting queue) until they can: the last running (FCFS), or the
   largest (priority, arrival time), ties to the earliest in running order; a victim already
   scheduled this step gives its tokens back. A sequence that preempts itself ends the
   running pass (FCFS), or lets the next one try (priority).
2. Then, only if nobody was preempted, waiting sequences in queue order (FCFS: arrival, the
   preempted in front; priority: (priority, arrival time, seq_id as a string)) while seats
   and budget remain: each takes its longest cached prefix (at most num_tokens - 1 tokens),
   and is admitted only if blocks for all its tokens fit (vLLM's scheduler_reserve_full_isl;
   the watermark is kept when something runs); its new tokens are cut to the budget (without
   chunked prefill it must fit whole). The first that cannot be admitted stops the pass.

Blocks are allocated, and full blocks cached, while scheduling (BlockManager.allocate_slots);
``update()`` advances each sequence by its scheduled tokens and appends the sampled token
only to sequences whose prompt (or recompute) is complete. A request that can never run (a
prompt of at least ``max_model_len`` tokens, or more blocks than the whole pool) is finished
as REJECTED when it arrives, and returned by the next ``update()``.
"""

from __future__ import annotations

from engine.core.block_manager import BlockManager, blocks_needed
from engine.core.errors import SchedulerError
from engine.core.events import EventKind, EventSink
from engine.core.scheduler import Scheduler
from engine.core.scheduler_output import SchedulerConfig, SchedulerOutput, step_kind
from engine.core.sequence import Sequence, SequenceStatus
from engine.v1.request_queue import PriorityWaitingQueue

WAITING = SequenceStatus.WAITING  # module constants: see engine/core/scheduler.py
FIRST_TOKEN = EventKind.FIRST_TOKEN
RUNNING = SequenceStatus.RUNNING
ARRIVE, ADMIT, RESUME, PREEMPT = (
    EventKind.ARRIVE,
    EventKind.ADMIT,
    EventKind.RESUME,
    EventKind.PREEMPT,
)


class V1Scheduler(Scheduler):
    """The v1 scheduler (see the module docstring). ``Scheduler(config, bm)`` returns one
    when ``config.scheduler == "v1"``."""

    is_v1 = True

    def __init__(
        self,
        config: SchedulerConfig,
        block_manager: BlockManager,
        event_sink: EventSink | None = None,
    ) -> None:
        if config.scheduler != "v1":
            raise SchedulerError(f"V1Scheduler needs scheduler='v1', got {config.scheduler!r}")
        if not isinstance(block_manager, BlockManager):
            raise SchedulerError(
                f"the v1 scheduler needs a paged BlockManager, got {type(block_manager).__name__}"
            )
        super().__init__(config, block_manager, event_sink)
        block_manager.use_v1_free_queue()
        self._by_priority = config.policy == "priority"
        if self._by_priority:
            self._waiting = PriorityWaitingQueue()  # type: ignore[assignment]
        # vLLM keeps int(watermark * num_gpu_blocks) free, its pool counting the null block.
        self._watermark_blocks = int(block_manager.watermark * (block_manager.num_blocks + 1))

    # --- queues ---------------------------------------------------------------------------

    def has_unfinished(self) -> bool:
        """Anything waits or runs, or a rejection is still to be returned by ``update()``."""
        return bool(self._waiting or self._running or self._finished_early)

    def add_request(self, seq: Sequence) -> None:
        """Queue ``seq``; one that can never run is finished as REJECTED now (see the
        module docstring) and returned by the next ``update()``."""
        if seq.seq_id in self._unfinished:
            raise SchedulerError(f"sequence {seq.seq_id} is already queued or running")
        if seq.status is not WAITING or seq.block_table:
            raise SchedulerError(f"sequence {seq.seq_id} is {seq.status.name}, not a new request")
        max_len = self.config.max_model_len
        if max_len is not None:
            seq._finish_cached_count = min(seq._finish_cached_count, max_len - 1)
        self._unfinished[seq.seq_id] = seq
        if self.event_sink is not None:
            self.event_sink.record(
                ARRIVE, seq.seq_id, self.block_manager.get_num_free_blocks(), (), seq.num_tokens
            )
        reason = self._never_runs(seq)
        if reason is not None:
            self._reject(seq, reason)
            return
        self._waiting.append(seq)

    def _never_runs(self, seq: Sequence) -> str | None:
        cfg, bm = self.config, self.block_manager
        num_tokens = seq.num_tokens
        if cfg.max_model_len is not None:
            if seq.num_prompt_tokens >= cfg.max_model_len:
                return (
                    f"prompt of {seq.num_prompt_tokens} tokens leaves no room for an output "
                    f"token within max_model_len {cfg.max_model_len}"
                )
            num_tokens = min(num_tokens, cfg.max_model_len)
        needed = blocks_needed(num_tokens, bm.block_size)
        if needed > bm.num_blocks:
            return (
                f"exceeds KV capacity: {num_tokens} tokens need {needed} blocks, the pool "
                f"has {bm.num_blocks}"
            )
        return None

    # --- schedule ---------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """Decide this step: running sequences first, then waiting ones (module docstring)."""
        if self._pending is not None:
            raise SchedulerError(f"step {self._pending.step} was scheduled but never updated")
        self.step += 1
        sink = self.event_sink
        if sink is not None:
            sink.begin_step(self.step)
        cfg = self.config
        # vLLM lets a lone sequence use the whole budget (nobody to starve).
        eligible = len(self._running) + self.num_waiting
        threshold = cfg.long_prefill_token_threshold if eligible > 1 else 0
        seqs: list[Sequence] = []
        num_new_tokens: list[int] = []
        preempted: list[Sequence] = []
        rejected = self._finished_early.copy()  # rejected on arrival, reported now
        budget = self._schedule_running(threshold, seqs, num_new_tokens, preempted)
        admitted: list[Sequence] = []
        if not preempted:
            self._schedule_waiting(threshold, budget, seqs, num_new_tokens, admitted, rejected)
        out = SchedulerOutput(
            step=self.step,
            kind=step_kind(seqs, num_new_tokens),
            seqs=seqs,
            num_new_tokens=num_new_tokens,
            block_size=self.block_manager.block_size,
            preempted=preempted,
            rejected=rejected,
            admitted=admitted,
        )
        self._after_schedule(out)
        self._pending = out
        if sink is not None and seqs:
            sink.record_step(
                out.kind,
                len(seqs),
                out.num_batched_tokens,
                self.block_manager.get_num_free_blocks(),
            )
        return out

    def _schedule_running(
        self,
        threshold: int,
        seqs: list[Sequence],
        num_new_tokens: list[int],
        preempted: list[Sequence],
    ) -> int:
        """The running pass; returns the token budget left."""
        bm, running = self.block_manager, self._running
        max_len = self.config.max_model_len
        by_priority = self._by_priority
        budget = self.config.max_num_batched_tokens
        bs = bm.block_size
        caching = bm.enable_prefix_caching
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            cached = seq.cached_token_count
            n = seq.num_prompt_tokens + len(seq.generated_token_ids) - cached
            if 0 < threshold < n:
                n = threshold
            if n > budget:
                n = budget
            if max_len is not None and n > max_len - cached - 1:
                n = max_len - cached - 1
            if n <= 0:
                i += 1
                continue
            if cached + n <= len(seq.block_table) * bs:
                # allocate_slots without a block to allocate (most decodes): it only caches
                # the blocks this step fills.
                if caching and (cached + n) // bs > seq._num_cached_blocks:
                    bm.cache_blocks(seq, cached + n)
                seqs.append(seq)
                num_new_tokens.append(n)
                budget -= n
                i += 1
                continue
            allocated = True
            while not bm.allocate_slots(
                seq, n, [], full_sequence_tokens=0, watermark_blocks=0, max_model_len=max_len
            ):
                if by_priority:
                    victim = max(running, key=_priority_key)
                    at = running.index(victim)
                    del running[at]
                    if at < i:
                        i -= 1
                    for j, s in enumerate(seqs):
                        if s is victim:
                            budget += num_new_tokens[j]
                            del seqs[j], num_new_tokens[j]
                            break
                else:
                    victim = running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    allocated = False
                    break
            if not allocated:
                if by_priority:
                    continue  # it left the running list: i already points at the next one
                break
            seqs.append(seq)
            num_new_tokens.append(n)
            budget -= n
            i += 1
        return budget

    def _schedule_waiting(
        self,
        threshold: int,
        budget: int,
        seqs: list[Sequence],
        num_new_tokens: list[int],
        admitted: list[Sequence],
        rejected: list[Sequence],
    ) -> None:
        """The waiting pass: admit in queue order until one does not fit."""
        cfg, bm, sink = self.config, self.block_manager, self.event_sink
        running = self._running
        max_len = cfg.max_model_len
        chunked = cfg.enable_chunked_prefill
        bs = bm.block_size
        while budget > 0 and len(running) < cfg.max_num_seqs:
            if not self._waiting:
                break
            seq = self._waiting[0]
            # A preempted sequence has grown: it may no longer fit anywhere.
            reason = self._never_runs(seq)
            if reason is None:
                hits = bm.find_cached_prefix(seq)
                num_hit_tokens = len(hits) * bs
                n = seq.num_tokens - num_hit_tokens
                if not chunked and n > cfg.max_num_batched_tokens:
                    reason = (
                        f"{n} tokens to compute exceed max_num_batched_tokens "
                        f"{cfg.max_num_batched_tokens} (no chunked prefill)"
                    )
            if reason is not None:
                self._waiting.popleft()
                self._reject(seq, reason)
                rejected.append(seq)
                continue
            if 0 < threshold < n:
                n = threshold
            if not chunked and n > budget:
                break
            if n > budget:
                n = budget
            full = seq.num_tokens if max_len is None else min(seq.num_tokens, max_len)
            if not bm.allocate_slots(
                seq,
                n,
                hits,
                full_sequence_tokens=full,
                watermark_blocks=self._watermark_blocks if running else 0,
                max_model_len=max_len,
            ):
                break
            self._waiting.popleft()
            running.append(seq)
            seq.status = RUNNING
            seq.cached_token_count = num_hit_tokens
            seq.prefix_hit_tokens = num_hit_tokens
            self.num_cached_tokens += num_hit_tokens
            seqs.append(seq)
            num_new_tokens.append(n)
            admitted.append(seq)
            budget -= n
            if sink is not None:
                kind = RESUME if seq.num_preemptions else ADMIT
                sink.record(kind, seq.seq_id, bm.get_num_free_blocks(), (), n)
            self._on_admit(seq)

    def _record_first_token(self, seq: Sequence) -> None:
        sink = self.event_sink
        assert sink is not None
        free = self.block_manager.get_num_free_blocks()
        sink.record(FIRST_TOKEN, seq.seq_id, free, (), seq.num_tokens)

    def _after_schedule(self, out: SchedulerOutput) -> None:
        """``out`` is decided (not yet pending); for subclasses (KV offloading)."""

    def _on_admit(self, seq: Sequence) -> None:
        """``seq`` was just admitted (it ends the running list); for subclasses."""

    def _preempt(self, seq: Sequence) -> None:
        self.num_cached_tokens -= seq.cached_token_count
        self.block_manager.free_sequence_v1(seq, preempted=True)
        seq.cached_token_count = 0
        seq.status = WAITING
        seq.num_preemptions += 1
        self._waiting.appendleft(seq)
        if self.event_sink is not None:
            # num_tokens: what its lookup will cover when it is admitted again (vLLM counts
            # a resumed request's num_tokens in preempted_queries)
            self.event_sink.record(
                PREEMPT, seq.seq_id, self.block_manager.get_num_free_blocks(), (), seq.num_tokens
            )

    # --- finish -------------------------------------------------------------------------------

    def _finish(self, seq: Sequence, status: SequenceStatus, kind: EventKind) -> None:
        seq.status = status
        self._unfinished.pop(seq.seq_id, None)
        self.num_cached_tokens -= seq.cached_token_count
        sink = self.event_sink
        if sink is not None:
            sink.record(
                kind, seq.seq_id, self.block_manager.get_num_free_blocks(), (), seq.num_tokens
            )
        self._free_blocks(seq)

    def _free_blocks(self, seq: Sequence) -> None:
        """Free a finished ``seq``'s blocks (vLLM's _free_blocks; a KV connector may delay
        it: engine/v1/offloading_scheduler.py)."""
        self.block_manager.free_sequence_v1(seq)

    # --- update -------------------------------------------------------------------------------

    def update(self, output: SchedulerOutput, sampled_token_ids: list[int]) -> list[Sequence]:
        """Apply one step: each scheduled sequence advances by its scheduled tokens; one whose
        prompt (or recompute) is now complete appends its sampled token (one id per
        ``output.seqs`` entry; ignored for the others) and may finish (stop token, max_tokens,
        max_model_len), freeing its blocks. Returns the sequences finished this step, those
        rejected while scheduling it first."""
        finished = self._take_pending(output, sampled_token_ids)
        num_done_before = len(finished)
        for seq, n, token in zip(output.seqs, output.num_new_tokens, sampled_token_ids):
            if seq.status is not RUNNING:
                continue  # aborted after it was scheduled
            cached = seq.cached_token_count + n
            seq.cached_token_count = cached
            self.num_cached_tokens += n
            if cached < seq.num_prompt_tokens + len(seq.generated_token_ids):
                continue  # a prefill chunk: nothing sampled yet
            seq.generated_token_ids.append(token)
            seq.last_token_id = token
            if len(seq.generated_token_ids) == 1 and self.event_sink is not None:
                self._record_first_token(seq)
            if token in seq._stop_ids:
                seq.finish_reason = "stop"
                finished.append(seq)
            elif cached >= seq._finish_cached_count:
                seq.finish_reason = "length"
                finished.append(seq)
        if len(finished) > num_done_before:
            self._finish_sampled(finished[num_done_before:])
        return finished


def _priority_key(seq: Sequence) -> tuple[int, float]:
    return (seq.priority, seq.arrival_time)
