"""LLMEngine under the v1 scheduler against transformers: greedy tokens equal generate() token
for token with prefix caching, chunked prefill (chunks of 1, 7 and 64 tokens), preemption and
priorities, at block sizes 1, 16 and 256 (CPU, float32). The heavier combinations are marked
slow; the default run keeps one case of each.

Set KVSIM_TEST_DEVICE=cuda to run the same checks on a GPU.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from engine.core.events import EventKind, EventRecorder
from engine.core.sequence import SamplingParams, Sequence
from engine.torch_engine.llm_engine import LLMEngine
from tests.engine.hf_llama import hf_generate, save_tiny_llama, shared_prefix_prompts

transformers = pytest.importorskip("transformers")

DEVICE = os.environ.get("KVSIM_TEST_DEVICE", "cpu")
MAX_TOKENS = 10
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    """A tiny random-weight LlamaForCausalLM saved with save_pretrained."""
    path = tmp_path_factory.mktemp("tiny-hf-llama-v1-engine")
    return path, save_tiny_llama(path, max_position_embeddings=1024)


_REFERENCE: dict[tuple[int, ...], list[int]] = {}


def reference(model: torch.nn.Module, prompts: list[list[int]]) -> list[list[int]]:
    """transformers generate(), greedy, one prompt at a time (memoised per prompt)."""
    for prompt in prompts:
        if tuple(prompt) not in _REFERENCE:
            _REFERENCE[tuple(prompt)] = hf_generate(model, prompt, MAX_TOKENS)
    return [_REFERENCE[tuple(p)] for p in prompts]


def _engine(path: Path, **options: object) -> LLMEngine:
    return LLMEngine(str(path), device=DEVICE, **options)  # type: ignore[arg-type]


def _assert_all_blocks_free(engine: LLMEngine) -> None:
    bm = engine.block_manager
    assert not engine.has_unfinished()
    assert bm.get_num_free_blocks() == bm.num_blocks
    bm.check_invariants()


def _is_decode(seq: Sequence, n: int) -> bool:
    return n == 1 and seq.num_generated_tokens > 0 and seq.cached_token_count + 1 == seq.num_tokens


def run_steps(engine: LLMEngine, prompts: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """Run the prompts through schedule / execute_model / update; returns the generated ids in
    prompt order and the length of every prefill chunk (non-decode row) scheduled."""
    scheduler = engine.scheduler
    ids = [engine.add_request(p, GREEDY) for p in prompts]
    chunks: list[int] = []
    done = {}
    while scheduler.has_unfinished():
        out = scheduler.schedule()
        for seq, n in zip(out.seqs, out.num_new_tokens):
            if not (
                n == 1 and seq.num_generated_tokens and seq.cached_token_count + 1 == seq.num_tokens
            ):
                chunks.append(n)
        for seq in scheduler.update(out, engine.execute_model(out)):
            done[seq.seq_id] = list(seq.generated_token_ids)
    return [done[i] for i in ids], chunks


def test_engine_defaults_to_v1_and_passes_its_options(
    hf_model: tuple[Path, torch.nn.Module],
) -> None:
    engine = _engine(
        hf_model[0],
        num_blocks=64,
        max_num_batched_tokens=96,
        enable_prefix_caching=True,
        long_prefill_token_threshold=7,
        policy="priority",
    )
    config = engine.scheduler.config
    assert engine.scheduler.is_v1 and config.scheduler == "v1"
    assert (config.max_num_batched_tokens, config.long_prefill_token_threshold) == (96, 7)
    assert config.policy == "priority" and config.enable_chunked_prefill
    assert engine.block_manager.enable_prefix_caching
    classic = _engine(hf_model[0], num_blocks=64, scheduler="classic")
    assert not classic.scheduler.is_v1 and not classic.block_manager.enable_prefix_caching
    with pytest.raises(ValueError, match="policy"):
        _engine(hf_model[0], num_blocks=64, policy="lifo")


# --- prefix caching ---------------------------------------------------------------------------

PREFIX_CASES = [
    pytest.param(16, id="block16"),
    pytest.param(1, id="block1", marks=pytest.mark.slow),
    pytest.param(256, id="block256", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("block_size", PREFIX_CASES)
def test_prefix_sharing_requests_equal_transformers(
    hf_model: tuple[Path, torch.nn.Module], block_size: int
) -> None:
    path, model = hf_model
    prefix = 300 if block_size == 256 else 45
    prompts = shared_prefix_prompts(prefix, [3, 20, 1, 40], seed=block_size)
    engine = _engine(path, block_size=block_size, enable_prefix_caching=True)
    # all at once: the later requests hit blocks the first computes in the same step
    outs = engine.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == reference(model, prompts)
    full = (prefix // block_size) * block_size
    assert [o.prefix_hit_tokens for o in outs] == [0, full, full, full]
    # later: a new request reuses the finished ones' cached blocks (evictable, not evicted)
    late = [prompts[0][:prefix] + list(range(9))]
    again = engine.generate(late, GREEDY)[0]
    assert again.token_ids == reference(model, late)[0]
    assert again.prefix_hit_tokens == full
    _assert_all_blocks_free(engine)


def test_prefix_hit_of_a_whole_prompt_recomputes_its_last_token(
    hf_model: tuple[Path, torch.nn.Module],
) -> None:
    """A prompt that is all full cached blocks still computes its last token (a hit is at most
    num_tokens - 1), next to another request's decodes."""
    path, model = hf_model
    prompt = shared_prefix_prompts(32, [0], seed=3)[0]  # exactly 2 blocks of 16
    engine = _engine(path, block_size=16, enable_prefix_caching=True)
    first = engine.generate([prompt], GREEDY)[0]
    outs = engine.generate([prompt, prompt[:17]], GREEDY)
    assert first.token_ids == outs[0].token_ids == reference(model, [prompt])[0]
    assert outs[1].token_ids == reference(model, [prompt[:17]])[0]
    assert [o.prefix_hit_tokens for o in outs] == [16, 16]
    _assert_all_blocks_free(engine)


# --- chunked prefill --------------------------------------------------------------------------

CHUNK_CASES = [
    pytest.param({"long_prefill_token_threshold": 7}, True, id="threshold7-cached"),
    pytest.param({"max_num_batched_tokens": 64}, False, id="budget64"),
    pytest.param(
        {"long_prefill_token_threshold": 1}, True, id="threshold1-cached", marks=pytest.mark.slow
    ),
    pytest.param({"max_num_batched_tokens": 7}, False, id="budget7", marks=pytest.mark.slow),
    pytest.param(
        {"long_prefill_token_threshold": 64}, True, id="threshold64-cached", marks=pytest.mark.slow
    ),
    pytest.param({"max_num_batched_tokens": 1}, False, id="budget1", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("chunking", "caching"), CHUNK_CASES)
def test_chunked_prefill_equals_transformers(
    hf_model: tuple[Path, torch.nn.Module], chunking: dict[str, int], caching: bool
) -> None:
    path, model = hf_model
    prompts = shared_prefix_prompts(40, [1, 30, 90, 5], seed=11)
    prompts.append(shared_prefix_prompts(2, [150], seed=12)[0])
    engine = _engine(path, block_size=16, enable_prefix_caching=caching, **chunking)
    generated, chunks = run_steps(engine, prompts)
    assert generated == reference(model, prompts)
    cap = chunking.get("long_prefill_token_threshold") or chunking["max_num_batched_tokens"]
    assert len(chunks) > len(prompts)  # prompts really ran in chunks ...
    if "max_num_batched_tokens" in chunking:
        assert max(chunks) <= cap  # ... sharing the step's budget
    else:
        assert chunks.count(cap) >= 3  # ... of the threshold's size
    _assert_all_blocks_free(engine)


def test_chunks_are_cut_as_configured_and_mixed_with_decodes(
    hf_model: tuple[Path, torch.nn.Module],
) -> None:
    """Drive the loop by hand: every step's chunks respect the threshold, some steps mix
    decodes with chunks, and each sampling row's logits equal transformers' forward."""
    path, model = hf_model
    prompts = shared_prefix_prompts(20, [1, 50, 9], seed=21)
    engine = _engine(path, block_size=16, long_prefill_token_threshold=7)
    for p in prompts:
        engine.add_request(p, SamplingParams(max_tokens=6, ignore_eos=True))
    scheduler, runner = engine.scheduler, engine.model_runner
    sizes, mixed = set(), 0
    while scheduler.has_unfinished():
        out = scheduler.schedule()
        pairs = list(zip(out.seqs, out.num_new_tokens))
        sampling = [s.cached_token_count + n == s.num_tokens for s, n in pairs]
        decodes = [
            n == 1 and s.cached_token_count + 1 == s.num_tokens and s.num_generated_tokens > 0
            for s, n in pairs
        ]
        mixed += any(decodes) and not all(decodes)
        sizes.update(n for (s, n), d in zip(pairs, decodes) if not d)
        assert max((n for (_, n), d in zip(pairs, decodes) if not d), default=0) <= 7
        logits = runner.compute_logits(out).cpu()
        with torch.no_grad():
            for row, seq in enumerate(out.seqs):
                if sampling[row]:
                    expected = model(torch.tensor([seq.token_ids])).logits[0, -1]
                    torch.testing.assert_close(logits[row], expected, atol=1e-4, rtol=1e-4)
        scheduler.update(out, logits.argmax(-1).tolist())
    assert 7 in sizes and mixed > 0
    _assert_all_blocks_free(engine)


# --- preemption and priorities ----------------------------------------------------------------

PREEMPT_CASES = [
    pytest.param(4, True, id="block4-cached"),
    pytest.param(1, True, id="block1-cached", marks=pytest.mark.slow),
    pytest.param(16, False, id="block16", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("block_size", "caching"), PREEMPT_CASES)
def test_preemption_and_recompute_keep_generations_exact(
    hf_model: tuple[Path, torch.nn.Module], block_size: int, caching: bool
) -> None:
    path, model = hf_model
    prompts = shared_prefix_prompts(24, [8, 20, 30, 2, 14], seed=31)
    need = -(-max(len(p) + MAX_TOKENS for p in prompts) // block_size)  # the longest alone
    recorder = EventRecorder()
    engine = _engine(
        path,
        block_size=block_size,
        num_blocks=need + 2,
        enable_prefix_caching=caching,
        long_prefill_token_threshold=7,
        event_sink=recorder,
    )
    outs = engine.generate(prompts, GREEDY)
    assert sum(o.num_preemptions for o in outs) > 0
    assert any(EventKind.PREEMPT in recorder.kinds_of(o.request_id) for o in outs)
    assert [o.token_ids for o in outs] == reference(model, prompts)
    _assert_all_blocks_free(engine)


def test_priority_policy_preempts_and_keeps_generations_exact(
    hf_model: tuple[Path, torch.nn.Module],
) -> None:
    path, model = hf_model
    prompts = shared_prefix_prompts(16, [10, 30, 20, 6], seed=41)
    engine = _engine(
        path, block_size=4, num_blocks=16, policy="priority", enable_prefix_caching=True
    )
    ids = [engine.add_request(p, GREEDY, priority=prio) for p, prio in zip(prompts, [3, 0, 2, 1])]
    done = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    outs = [done[i] for i in ids]
    assert sum(o.num_preemptions for o in outs) > 0
    assert outs[1].num_preemptions == 0  # priority 0 is never the victim
    assert [o.token_ids for o in outs] == reference(model, prompts)
    _assert_all_blocks_free(engine)


@pytest.mark.slow
@pytest.mark.parametrize("block_size", [1, 16, 256])
def test_everything_at_once_equals_transformers(
    hf_model: tuple[Path, torch.nn.Module], block_size: int
) -> None:
    """Prefix sharing, chunks of 7, preemption and staggered arrivals in one run."""
    path, model = hf_model
    prefix = 260 if block_size == 256 else 40
    prompts = shared_prefix_prompts(prefix, [5, 30, 1, 70, 12, 3], seed=block_size + 50)
    need = -(-max(len(p) + MAX_TOKENS for p in prompts) // block_size)
    engine = _engine(
        path,
        block_size=block_size,
        num_blocks=need + (2 if block_size == 256 else 3 * need // 2),
        enable_prefix_caching=True,
        long_prefill_token_threshold=7,
        max_num_batched_tokens=64,
    )
    ids = [engine.add_request(p, GREEDY) for p in prompts[:3]]
    done = {}
    for step in range(100_000):
        if step == 5:
            ids += [engine.add_request(p, GREEDY) for p in prompts[3:]]
        if step > 5 and not engine.has_unfinished():
            break
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    assert [done[i].token_ids for i in ids] == reference(model, prompts)
    assert sum(done[i].prefix_hit_tokens for i in ids) > 0
    _assert_all_blocks_free(engine)
