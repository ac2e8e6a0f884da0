"""ModelRunner on hand-built vLLM v1 steps against transformers.

A small driver in this file plays the v1 scheduler's part: it sets each sequence's block table
and cached_token_count, and every step mixes decodes with prefill chunks of a chosen size
(1, 7, 64 tokens); a new request whose prompt starts with full blocks another sequence has
computed reuses those physical blocks (a prefix-cache hit: their K/V are read, never
rewritten); a preempted request drops its blocks and recomputes prompt + generated tokens.
The greedy tokens must equal transformers' generate() and the logits of every sampling row
must equal transformers' forward pass on the whole sequence. tests/engine/test_v1_engine.py
runs the same acceptance through LLMEngine and the real v1 Scheduler.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from engine.core.events import StepKind
from engine.core.scheduler_output import SchedulerOutput
from engine.core.sequence import SamplingParams, Sequence, SequenceStatus
from engine.torch_engine.kv_cache import KVCache
from engine.torch_engine.loader import load_model
from engine.torch_engine.model_runner import ModelRunner
from tests.engine.hf_llama import hf_generate, save_tiny_llama, shared_prefix_prompts

transformers = pytest.importorskip("transformers")

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    """A tiny random-weight LlamaForCausalLM saved with save_pretrained."""
    path = tmp_path_factory.mktemp("tiny-hf-llama-v1")
    return path, save_tiny_llama(path, max_position_embeddings=1024)


@dataclass
class Request:
    seq: Sequence
    chunk: int  # most prefill tokens per step
    arrives: int  # step it is admitted at
    preempt_after: int | None = None  # generated tokens after which it is preempted once
    running: bool = False
    prefix_hit_tokens: int = 0  # at its latest admission


class HandScheduler:
    """Hand-built v1 steps: every running request takes min(chunk, remaining) tokens.

    Blocks are ref-counted; a full computed block is remembered by a chained hash of the token
    ids up to its end and stays reusable after its holders free it, until it is allocated again.
    """

    def __init__(self, num_blocks: int, block_size: int, seed: int) -> None:
        self.block_size = block_size
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)  # scattered physical blocks
        self.refs = [0] * num_blocks
        self.cached: dict[int, int] = {}  # chained hash of a full block -> block
        self.key_of: dict[int, int] = {}  # block -> its hash while cached

    def _allocate(self) -> int:
        block = self.free.pop()
        key = self.key_of.pop(block, None)
        if key is not None:  # evicted
            del self.cached[key]
        self.refs[block] = 1
        return block

    def _admit(self, req: Request) -> None:
        seq, bs = req.seq, self.block_size
        table: list[int] = []
        # a hit covers whole computed blocks and leaves at least one token to compute
        for key in self._keys(seq, (seq.num_tokens - 1) // bs):
            block = self.cached.get(key)
            if block is None:
                break
            if self.refs[block] == 0:
                self.free.remove(block)
            self.refs[block] += 1
            table.append(block)
        seq.block_table = table
        seq.cached_token_count = req.prefix_hit_tokens = len(table) * bs
        req.running = True

    def _keys(self, seq: Sequence, num_blocks: int) -> list[int]:
        """Chained hashes of the sequence's first `num_blocks` blocks."""
        ids, bs, keys = seq.token_ids, self.block_size, [0]
        for i in range(num_blocks):
            keys.append(hash((keys[-1], *ids[i * bs : (i + 1) * bs])))
        return keys[1:]

    def _release(self, req: Request) -> None:
        for block in reversed(req.seq.block_table):
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self.free.append(block)
        req.running = False
        req.seq.block_table, req.seq.cached_token_count = [], 0

    def schedule(self, requests: list[Request], step: int) -> SchedulerOutput | None:
        for req in requests:
            if not req.running and req.arrives <= step and not req.seq.is_finished:
                self._admit(req)
        seqs, counts = [], []
        for req in requests:
            if not req.running:
                continue
            seq = req.seq
            n = min(req.chunk, seq.num_tokens - seq.cached_token_count)
            while len(seq.block_table) * self.block_size < seq.cached_token_count + n:
                seq.block_table.append(self._allocate())
            seqs.append(seq)
            counts.append(n)
        if not seqs:
            return None
        return SchedulerOutput(
            step=step,
            kind=StepKind.PREFILL,
            seqs=seqs,
            num_new_tokens=counts,
            block_size=self.block_size,
            preempted=[],
            rejected=[],
        )

    def update(self, out: SchedulerOutput, tokens: list[int], requests: list[Request]) -> None:
        by_id = {r.seq.seq_id: r for r in requests}
        bs = self.block_size
        for seq, n, token in zip(out.seqs, out.num_new_tokens, tokens):
            seq.cached_token_count += n
            for key, block in zip(self._keys(seq, seq.cached_token_count // bs), seq.block_table):
                if key not in self.cached and block not in self.key_of:  # full, computed
                    self.cached[key], self.key_of[block] = block, key
            if seq.cached_token_count < seq.num_tokens:
                continue  # a chunk short of the end samples nothing
            seq.generated_token_ids.append(token)
            seq.last_token_id = token
            req = by_id[seq.seq_id]
            if seq.num_generated_tokens == seq.sampling_params.max_tokens:
                self._release(req)
                seq.status = SequenceStatus.FINISHED_LENGTH
            elif req.preempt_after == seq.num_generated_tokens:
                req.preempt_after = None
                self._release(req)  # recompute preemption: it resumes two steps later
                seq.num_preemptions += 1
                req.arrives = out.step + 2


def _is_decode(seq: Sequence, n: int) -> bool:
    return n == 1 and seq.num_generated_tokens > 0 and seq.cached_token_count == seq.num_tokens - 1


def run_hand_built(
    hf: tuple[Path, torch.nn.Module], requests: list[Request], block_size: int
) -> int:
    """Drive the requests to completion through ModelRunner.run(); checks every sampling row's
    logits against transformers, and that rows which do not sample return token 0. Returns the
    number of steps that mixed decodes with prefill chunks."""
    path, model = hf
    llama = load_model(str(path))
    config = llama.config
    need = sum(-(-(r.seq.num_prompt_tokens + MAX_TOKENS) // block_size) for r in requests)
    cache = KVCache(
        num_layers=config.num_hidden_layers,
        num_blocks=need + 4,
        block_size=block_size,
        num_kv_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
    )
    runner = ModelRunner(llama, cache)
    hand = HandScheduler(need + 4, block_size, seed=block_size)
    mixed = 0
    for step in range(10_000):
        if all(r.seq.is_finished for r in requests):
            return mixed
        out = hand.schedule(requests, step)
        if out is None:
            continue
        pairs = list(zip(out.seqs, out.num_new_tokens))
        sampling = [s.cached_token_count + n == s.num_tokens for s, n in pairs]
        mixed += len({_is_decode(s, n) for s, n in pairs}) == 2
        tokens = runner.run(out)
        logits = runner.compute_logits(out)  # the same step again: the same K/V rewritten
        with torch.no_grad():
            for row, seq in enumerate(out.seqs):
                if sampling[row]:
                    expected = model(torch.tensor([seq.token_ids])).logits[0, -1]
                    torch.testing.assert_close(logits[row], expected, atol=1e-4, rtol=1e-4)
                    assert tokens[row] == int(logits[row].argmax())
                else:
                    assert tokens[row] == 0
        hand.update(out, tokens, requests)
    raise AssertionError("requests did not finish")


def _requests(prompts: list[list[int]], chunks: list[int], arrives: list[int]) -> list[Request]:
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    return [
        Request(Sequence(i, p, params), chunk=c, arrives=a)
        for i, (p, c, a) in enumerate(zip(prompts, chunks, arrives))
    ]


@pytest.mark.parametrize("block_size", [1, 16, 256])
def test_chunked_prefill_prefix_hits_and_recompute_equal_transformers(
    hf_model: tuple[Path, torch.nn.Module], block_size: int
) -> None:
    prefix = 300 if block_size == 256 else 40  # at least one full shared block
    prompts = shared_prefix_prompts(prefix, [9, 30, 1, 70], seed=block_size)
    prompts.append(shared_prefix_prompts(5, [20], seed=99)[0])  # shares nothing
    # 0 computes the prefix in chunks (7 tokens; 64 for the long one); 1 and 3 hit it while
    # 0 still runs (chunks of 64 next to decodes), 2 after 0 has finished and freed it
    # (chunks of 1); 4 is preempted after 3 tokens and recomputes in chunks of 7
    first = 64 if block_size == 256 else 7
    requests = _requests(prompts, chunks=[first, 64, 1, 64, 7], arrives=[0, 8, 40, 9, 1])
    requests[4].preempt_after = 3
    mixed = run_hand_built(hf_model, requests, block_size)
    assert mixed > 0
    reference = [hf_generate(hf_model[1], p, MAX_TOKENS) for p in prompts]
    assert [r.seq.generated_token_ids for r in requests] == reference
    full = (prefix // block_size) * block_size  # whole blocks of the common prefix
    assert [r.prefix_hit_tokens for r in requests[:4]] == [0, full, full, full]
    assert requests[4].seq.num_preemptions == 1


def test_run_samples_only_rows_that_reach_their_last_token(
    hf_model: tuple[Path, torch.nn.Module],
) -> None:
    prompts = shared_prefix_prompts(3, [20, 2], seed=5)
    requests = _requests(prompts, chunks=[7, 7], arrives=[0, 0])
    llama = load_model(str(hf_model[0]))
    cache = KVCache(num_layers=2, num_blocks=16, block_size=4, num_kv_heads=2, head_dim=16)
    runner = ModelRunner(llama, cache)
    out = HandScheduler(16, 4, seed=0).schedule(requests, 0)
    assert out is not None and out.num_new_tokens == [7, 5]
    tokens = runner.run(out)
    logits = runner.compute_logits(out)  # the same K/V rewritten: the same logits
    assert tokens[0] == 0 and tokens[1] == int(logits[1].argmax())
