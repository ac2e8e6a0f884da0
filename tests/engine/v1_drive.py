"""Drive a v1 scheduler with random operations and trace everything it decides (shared by
the v1 property tests)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from engine import (
    BlockManager,
    EventRecorder,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    Sequence,
    StepKind,
)
from engine.fast.decode import FastDecodeScheduler
from engine.v1.prefix_keys import UNIQUE_PREFIX, prefix_from_hash_ids

# Prompts are built from a few shared segments, so prefixes are shared at every block size.
SEGMENTS = [
    list(range(100 + 10 * k, 100 + 10 * k + length)) for k, length in enumerate((3, 7, 16, 5, 33))
]

op = st.one_of(
    # (kind, a, b, c): add a prompt of segments a (bitmask) + b own tokens, c output tokens
    st.tuples(
        st.just("add"),
        st.integers(0, 31),
        st.integers(0, 12),
        st.integers(1, 30),
        st.integers(0, 3),
    ),
    st.tuples(st.just("step"), st.integers(1, 5), st.just(0), st.just(0), st.just(0)),
    st.tuples(st.just("abort"), st.integers(0, 30), st.just(0), st.just(0), st.just(0)),
    st.tuples(st.just("abort_mid_step"), st.integers(0, 30), st.just(0), st.just(0), st.just(0)),
    st.tuples(st.just("run"), st.integers(1, 12), st.just(0), st.just(0), st.just(0)),
    # "run" whose last step aborts sequence b between its schedule and update (the fast
    # scheduler: while a plain decode step is pending)
    st.tuples(st.just("run_abort"), st.integers(1, 12), st.integers(0, 30), st.just(0), st.just(0)),
)


@st.composite
def v1_setups(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "num_blocks": draw(st.integers(3, 40)),
        "block_size": draw(st.sampled_from([1, 2, 3, 4, 8, 16])),
        "max_num_seqs": draw(st.integers(1, 8)),
        "max_num_batched_tokens": draw(st.sampled_from([4, 16, 40, 256])),
        "threshold": draw(st.sampled_from([0, 0, 3, 10])),
        "policy": draw(st.sampled_from(["fcfs", "priority"])),
        "caching": draw(st.booleans()),
        "chunked": draw(st.booleans()),
        "watermark": draw(st.sampled_from([0.0, 0.0, 0.1])),
        "max_model_len": draw(st.sampled_from([None, None, 40])),
        "prefix_kind": draw(st.sampled_from(["tokens", "hash_ids", "unique"])),
        # read every step's contexts as a cost model would (the fast scheduler then brings
        # its lazy decoders up to date each step: off, lazy stretches stay long)
        "inspect": draw(st.booleans()),
    }


@dataclass
class Drive:
    trace: list[Any]
    events: dict[str, list[Any]]
    block_ids: list[int]
    block_hashes: list[int]
    scheduler: Scheduler
    sequences: list[Sequence]


def make_prompt(mask: int, own: int, seq_id: int) -> list[int]:
    tokens = [t for k, seg in enumerate(SEGMENTS) if mask >> k & 1 for t in seg]
    tokens += [5000 + 100 * seq_id + i for i in range(own)]
    return tokens or [1]


def drive(
    fast: bool,
    ops: list[tuple[str, int, int, int, int]],
    setup: dict[str, Any],
    check: bool,
    events: bool = True,
    pools: bool | None = None,
    attach_after: int | None = None,
) -> Drive:
    """Run ``ops`` through a fresh v1 scheduler (FastV1Scheduler if ``fast``). Without
    ``events`` no event sink is attached (the engine's cheaper paths). With ``pools``
    (default: without ``events``) each traced step carries the pool as scheduled: block
    tables and the free queue with its keys. ``attach_after``: attach the event sink only
    after that many ops (a run that starts without one)."""
    if pools is None:
        pools = not events
    recorder = EventRecorder(keep_block_hashes=True)
    bs = setup["block_size"]
    bm = BlockManager(
        setup["num_blocks"],
        bs,
        setup["watermark"],
        event_sink=recorder if events and attach_after is None else None,
        enable_prefix_caching=setup["caching"],
    )
    config = SchedulerConfig(
        max_num_seqs=setup["max_num_seqs"],
        max_num_batched_tokens=setup["max_num_batched_tokens"],
        max_model_len=setup["max_model_len"],
        scheduler="v1",
        enable_chunked_prefill=setup["chunked"],
        long_prefill_token_threshold=setup["threshold"],
        policy=setup["policy"],
    )
    sched = (FastDecodeScheduler if fast else Scheduler)(config, bm)
    trace: list[Any] = []
    seqs: list[Sequence] = []

    def checked() -> None:
        if check:
            sync = getattr(sched, "sync", None)
            if sync is not None:
                sync()
            bm.check_invariants()

    def step_record(
        out: Any,
        finished: list[Sequence],
        used: int,
        contexts: tuple[int, list[int]] | None,
        pool: tuple[Any, ...] | None,
    ) -> None:
        trace.append(
            (
                out.kind,
                [s.seq_id for s in out.seqs],
                list(out.num_new_tokens),
                [s.seq_id for s in out.preempted],
                [s.seq_id for s in out.rejected],
                [(s.seq_id, s.prefix_hit_tokens) for s in out.admitted],
                [s.seq_id for s in finished],
                sched.num_cached_tokens,
                used,
                contexts,
                pool,
            )
        )

    def contexts_of(out: Any) -> tuple[int, list[int]] | None:
        """What a cost model reads while the step runs: the batch's total context (computed
        + scheduled tokens) and each sequence's computed tokens. A fast step gives the total
        as scheduler.num_cached_tokens + batched tokens and exact states for its
        ``exact_seqs``: checked here, before bringing everything up to date."""
        if not setup["inspect"]:
            return None
        exact = getattr(out, "exact_seqs", None)
        if exact is not None:
            before = [(s, s.cached_token_count) for s, _ in exact]
            total = sched.num_cached_tokens + out.num_batched_tokens
            sched.sync()
            assert all(s.cached_token_count == c for s, c in before)
        contexts = [s.cached_token_count for s in out.seqs]
        if exact is not None:
            assert total == sum(contexts) + out.num_batched_tokens
        return sum(contexts) + out.num_batched_tokens, contexts

    def one_step() -> None:
        out = sched.schedule()
        used = bm.num_used_blocks
        pool = pool_state(bm) if pools else None  # as scheduled (a plain step's is)
        contexts = contexts_of(out)
        finished = sched.update(out, [0] * out.num_seqs)
        step_record(out, finished, used, contexts, pool)
        checked()

    def abort_mid_step(seq_id: int) -> None:
        out = sched.schedule()
        pool = pool_state(bm) if pools else None
        contexts = contexts_of(out)
        trace.append(("abort", seq_id, sched.abort(seq_id)))
        used = bm.num_used_blocks
        finished = sched.update(out, [0] * out.num_seqs)
        step_record(out, finished, used, contexts, pool)
        checked()

    for number, (kind, a, b, c, d) in enumerate(ops):
        if number == attach_after:
            bm.event_sink = sched.event_sink = recorder
            recorder.begin_step(sched.step)  # as if it had seen the steps so far
        if kind == "add":
            seq_id = len(seqs)
            params = SamplingParams(max_tokens=c, ignore_eos=True)
            prompt = make_prompt(a, b, seq_id)
            if setup["prefix_kind"] == "tokens":
                seq = Sequence(seq_id, prompt, params, float(seq_id // 3), priority=d)
            else:
                if setup["prefix_kind"] == "hash_ids":
                    # one id per 4 tokens: the segment mask's ids, then the own tokens' ids
                    ids = [prompt[i] for i in range(0, len(prompt), 4)]
                    prefix = prefix_from_hash_ids(ids, 4, len(prompt), bs)
                else:
                    prefix = UNIQUE_PREFIX
                seq = Sequence(
                    seq_id, range(len(prompt)), params, float(seq_id // 3), d, prefix=prefix
                )
            seqs.append(seq)
            sched.add_request(seq)
        elif kind == "abort":
            trace.append(("abort", a, sched.abort(a)))
            checked()
        elif kind == "abort_mid_step":
            abort_mid_step(a)
        elif kind == "run" and fast:
            a -= run_plain(sched, bm, a, trace, setup["inspect"], pools)
            checked()
            for _ in range(a):
                one_step()
        elif kind == "run_abort":
            if fast:
                a -= run_plain(sched, bm, a, trace, setup["inspect"], pools, abort=b)
                checked()
            if a:  # not aborted yet
                for _ in range(a - 1):
                    one_step()
                abort_mid_step(b)
        else:
            for _ in range(a):
                one_step()
    for _ in range(10_000):
        if not sched.has_unfinished():
            break
        one_step()
    assert not sched.has_unfinished(), "still unfinished after 10,000 steps"
    cols, blocks = recorder.columns()
    return Drive(
        trace,
        {k: v.tolist() for k, v in cols.items()},
        blocks.tolist(),
        recorder.block_hashes().tolist(),
        sched,
        seqs,
    )


def run_plain(
    sched: Any,
    bm: BlockManager,
    max_steps: int,
    trace: list[Any],
    inspect: bool,
    pools: bool,
    abort: int | None = None,
) -> int:
    """Up to ``max_steps`` plain steps through run_plain_decodes, traced as a step is (the
    plain scheduler runs them as ordinary steps); returns how many ran. With ``abort``, the
    last of ``max_steps`` steps (left pending) aborts that sequence before its update."""
    steps: list[list[Any]] = []

    def close_last() -> None:
        if steps and steps[-1][7] is None:
            steps[-1][7] = sched.num_cached_tokens

    def on_step(num_seqs: int, context_tokens: int, num_used_blocks: int) -> bool:
        close_last()
        assert context_tokens == sched.num_cached_tokens + num_seqs
        assert num_used_blocks == bm.num_used_blocks
        batch = [s.seq_id for s in sched.running]
        inspected = None
        if inspect:
            sched.sync()  # allowed at any time: the plain path's contexts, to compare
            contexts = [s.cached_token_count for s in sched.running]
            assert context_tokens == sum(contexts) + num_seqs
            inspected = (context_tokens, contexts)
        steps.append(
            [
                StepKind.DECODE,
                batch,
                [1] * num_seqs,
                [],
                [],
                [],
                [],
                None,
                num_used_blocks,
                inspected,
                pool_state(bm) if pools else None,
            ]
        )
        return len(steps) < max_steps

    def on_finished(seqs: list[Sequence]) -> None:
        steps[-1][6] = [s.seq_id for s in seqs]

    aborted = None
    if sched.run_plain_decodes(on_step, on_finished):
        if abort is not None:  # the last step is pending: abort_mid_step's abort
            aborted = ("abort", abort, sched.abort(abort))
            steps[-1][8] = bm.num_used_blocks
        on_finished(sched.end_plain_decode())
    close_last()
    trace.extend(tuple(step) for step in steps[: -1 if aborted else None])
    if aborted:
        trace.append(aborted)
        trace.append(tuple(steps[-1]))
    return len(steps)


def pool_state(bm: BlockManager) -> tuple[Any, ...]:
    """Everything a v1 pool decides later steps by: each holder's block table, the free
    queue in order with each free block's key (None: none), and the eviction count."""
    free = [b for i, b in enumerate(bm._free) if i >= bm._head and bm._queue_pos[b] == i]
    keys: list[int | None] = [None] * bm.num_blocks
    if bm.enable_prefix_caching:
        keys = [int(k) if h else None for k, h in zip(bm._block_key, bm._has_key)]
    tables = sorted((seq_id, list(seq.block_table)) for seq_id, seq in bm._seqs.items())
    return tables, [(b, keys[b]) for b in free], getattr(bm, "num_evictions", 0)
