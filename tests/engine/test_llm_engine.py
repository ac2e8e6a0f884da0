"""The engine against transformers: same greedy tokens, same logits, under paging, preemption
and aborts. transformers is a test-only dependency.

Set KVSIM_TEST_DEVICE=cuda to run the same checks on a GPU.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from engine.core.events import EventKind, EventRecorder
from engine.core.sequence import SamplingParams
from engine.torch_engine.llm_engine import LLMEngine
from tests.engine.hf_llama import save_tiny_llama

transformers = pytest.importorskip("transformers")

DEVICE = os.environ.get("KVSIM_TEST_DEVICE", "cpu")
PROMPT_LENS = (1, 5, 17, 33, 40, 12)
MAX_TOKENS = 20
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    """A tiny random-weight LlamaForCausalLM saved with save_pretrained."""
    path = tmp_path_factory.mktemp("tiny-hf-llama")
    return path, save_tiny_llama(path, max_position_embeddings=512)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, 256, (n,), generator=gen).tolist() for n in PROMPT_LENS]


@pytest.fixture(scope="module")
def reference(hf_model: tuple[Path, torch.nn.Module], prompts: list[list[int]]) -> list[list[int]]:
    """transformers generate(), greedy, one prompt at a time (no padding)."""
    model = hf_model[1]
    outs = []
    with torch.no_grad():
        for prompt in prompts:
            ids = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, do_sample=False)
            outs.append(ids[0, len(prompt) :].tolist())
    return outs


def _assert_all_blocks_free(engine: LLMEngine) -> None:
    bm = engine.block_manager
    assert not engine.has_unfinished()
    assert bm.get_num_free_blocks() == bm.num_blocks
    bm.check_invariants()


@pytest.mark.parametrize("block_size", [1, 16, 256])
def test_greedy_batch_equals_transformers_generate(
    hf_model: tuple[Path, torch.nn.Module],
    prompts: list[list[int]],
    reference: list[list[int]],
    block_size: int,
) -> None:
    engine = LLMEngine(str(hf_model[0]), block_size=block_size, device=DEVICE)
    outs = engine.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == reference
    assert all(o.finish_reason == "length" for o in outs)
    _assert_all_blocks_free(engine)


def test_preemption_and_recompute_keep_generations_exact(
    hf_model: tuple[Path, torch.nn.Module],
    prompts: list[list[int]],
    reference: list[list[int]],
) -> None:
    recorder = EventRecorder()
    # 20 blocks of 4 = 80 slots: each request fits alone (<= 60 tokens), all together do not.
    engine = LLMEngine(
        str(hf_model[0]), block_size=4, num_blocks=20, device=DEVICE, event_sink=recorder
    )
    outs = engine.generate(prompts, GREEDY)
    assert any(EventKind.PREEMPT in recorder.kinds_of(o.request_id) for o in outs)
    assert sum(o.num_preemptions for o in outs) > 0
    assert [o.token_ids for o in outs] == reference
    _assert_all_blocks_free(engine)


def test_aborted_requests_leave_the_others_unaffected(
    hf_model: tuple[Path, torch.nn.Module],
    prompts: list[list[int]],
    reference: list[list[int]],
) -> None:
    engine = LLMEngine(str(hf_model[0]), block_size=8, device=DEVICE)
    ids = [engine.add_request(p, GREEDY) for p in prompts]
    for _ in range(6):  # one prefill, then decodes
        engine.step()
    aborted = {ids[1], ids[4]}
    assert all(engine.abort(i) for i in aborted)
    assert not engine.abort(ids[1])  # already finished
    finished = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    assert set(finished) == set(ids) - aborted
    for i in set(ids) - aborted:
        assert finished[i].token_ids == reference[i]
    _assert_all_blocks_free(engine)


def test_logits_match_transformers_at_every_step(
    hf_model: tuple[Path, torch.nn.Module], prompts: list[list[int]]
) -> None:
    engine = LLMEngine(str(hf_model[0]), block_size=16, device=DEVICE)
    model = hf_model[1]
    for prompt in prompts[:4]:
        engine.add_request(prompt, SamplingParams(max_tokens=6, ignore_eos=True))
    scheduler, runner = engine.scheduler, engine.model_runner
    while scheduler.has_unfinished():
        output = scheduler.schedule()
        logits = runner.compute_logits(output).cpu()
        with torch.no_grad():
            for row, seq in enumerate(output.seqs):
                expected = model(torch.tensor([seq.token_ids])).logits[0, -1]
                torch.testing.assert_close(logits[row], expected, atol=1e-4, rtol=1e-4)
        scheduler.update(output, logits.argmax(-1).tolist())
    _assert_all_blocks_free(engine)


def test_seeded_sampling_is_reproducible_whatever_the_batch(prompts: list[list[int]]) -> None:
    params = SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.9, top_p=0.9, seed=7)
    alone = LLMEngine("tiny-llama", num_blocks=64, device=DEVICE).generate([prompts[2]], params)[0]
    crowd = LLMEngine("tiny-llama", num_blocks=64, device=DEVICE).generate(
        [prompts[0], prompts[2], prompts[3]], [GREEDY, params, GREEDY]
    )[1]
    assert alone.token_ids == crowd.token_ids
    other = SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.9, top_p=0.9, seed=8)
    assert LLMEngine("tiny-llama", num_blocks=64, device=DEVICE).generate([prompts[2]], other)[
        0
    ].token_ids != (alone.token_ids)


def test_same_engine_seed_same_random_model_and_samples(prompts: list[list[int]]) -> None:
    params = SamplingParams(max_tokens=8, ignore_eos=True, temperature=1.0)
    first = LLMEngine("tiny-llama", seed=3, num_blocks=64, device=DEVICE).generate(
        prompts[:3], params
    )
    second = LLMEngine("tiny-llama", seed=3, num_blocks=64, device=DEVICE).generate(
        prompts[:3], params
    )
    assert [o.token_ids for o in first] == [o.token_ids for o in second]


def test_eos_stops_a_request_and_rejected_ones_are_reported(prompts: list[list[int]]) -> None:
    engine = LLMEngine("tiny-llama", block_size=4, num_blocks=8, device=DEVICE)
    first = engine.generate([prompts[1]], SamplingParams(max_tokens=4))[0].token_ids[0]
    outs = engine.generate(
        [prompts[1], list(range(40))], SamplingParams(max_tokens=4, eos_token_id=first)
    )
    assert outs[0].token_ids == [first] and outs[0].finish_reason == "stop"
    assert outs[1].token_ids == [] and "exceeds KV capacity" in str(outs[1].finish_reason)
    _assert_all_blocks_free(engine)


def test_pool_sizing_and_input_checks() -> None:
    engine = LLMEngine("tiny-llama", block_size=16, kv_cache_bytes=2**20)
    per_block = engine.kv_cache.bytes_per_block
    assert per_block == 2 * 4 * 16 * 2 * 32 * 4  # K+V, layers, block, kv heads, head_dim, fp32
    assert engine.block_manager.num_blocks == 2**20 // per_block
    default = LLMEngine("tiny-llama", block_size=16)
    assert default.kv_cache.num_bytes <= 256 * 2**20
    with pytest.raises(ValueError, match="vocabulary"):
        engine.add_request([5, 1 << 20])
    with pytest.raises(ValueError, match="not both"):
        LLMEngine("tiny-llama", num_blocks=4, kv_cache_bytes=2**20)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("block_size", [1, 16, 256])
def test_cuda_greedy_equals_transformers_on_cpu(
    hf_model: tuple[Path, torch.nn.Module],
    prompts: list[list[int]],
    reference: list[list[int]],
    block_size: int,
) -> None:
    engine = LLMEngine(str(hf_model[0]), block_size=block_size, num_blocks=64, device="cuda")
    outs = engine.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == reference
    _assert_all_blocks_free(engine)


def test_checkpoint_eos_ids_stop_requests_unless_ignored(tmp_path: Path) -> None:
    torch.manual_seed(4)
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        eos_token_id=None,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)
    free = LLMEngine(str(tmp_path), num_blocks=16).generate([[1, 2, 3]], SamplingParams())[0]
    first = free.token_ids[0]
    config_json = tmp_path / "config.json"
    config_json.write_text(
        config_json.read_text().replace('"eos_token_id": null', f'"eos_token_id": [63, {first}]')
    )
    engine = LLMEngine(str(tmp_path), num_blocks=16)
    stopped = engine.generate([[1, 2, 3]], SamplingParams())[0]
    assert (stopped.token_ids, stopped.finish_reason) == ([first], "stop")
    ignored = engine.generate([[1, 2, 3]], SamplingParams(ignore_eos=True))[0]
    assert ignored.token_ids == free.token_ids and ignored.finish_reason == "length"
