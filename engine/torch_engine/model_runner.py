"""ModelRunner: one SchedulerOutput in, one sampled token per scheduled sequence out.

It turns the scheduler's decision into tensors (input_ids, positions, slot_mapping, padded block
tables, context lengths), runs the model over the paged KV cache and samples. It makes no policy
decision and never changes a Sequence: the Scheduler applies the sampled tokens in update().

A step may mix decodes and prefill chunks (vLLM v1 scheduling): sequence b computes its tokens
[cached, cached + n) and only a sequence whose step reaches its last token (cached + n ==
num_tokens) samples; the others' rows get token 0, which update() ignores, and no LM head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.core.events import StepKind
from engine.core.scheduler_output import SchedulerOutput
from engine.core.sequence import Sequence
from engine.torch_engine.attention import (
    AttentionMetadata,
    GatherWorkspace,
    build_attention_metadata,
)
from engine.torch_engine.kv_cache import KVCache
from engine.torch_engine.models.llama import LlamaForCausalLM
from engine.torch_engine.sampling import SamplingRow, default_request_seed, sample, token_seed


@dataclass(frozen=True, slots=True)
class StepInputs:
    """The device tensors of one step."""

    input_ids: torch.Tensor  # [T] int64, every scheduled sequence's new tokens, batch order
    positions: torch.Tensor  # [T] int64, token index of each within its sequence
    last_index: torch.Tensor  # [B] int64, row in [T] of each sequence's last new token
    meta: AttentionMetadata
    sampling: list[int] | None  # batch rows that sample this step; None: every row


class ModelRunner:
    """Owns the model and the KV cache of one engine; `seed` seeds requests without a seed."""

    def __init__(self, model: LlamaForCausalLM, kv_cache: KVCache, *, seed: int = 0) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.seed = seed
        self.device = model.model.embed_tokens.weight.device
        self.workspace = GatherWorkspace()

    def prepare(self, output: SchedulerOutput) -> StepInputs:
        """Tensors for a non-empty SchedulerOutput (read before scheduler.update())."""
        seqs, num_new = output.seqs, output.num_new_tokens
        sampling: list[int] | None = None
        if output.kind is StepKind.DECODE and output.num_batched_tokens == len(seqs):
            input_ids = [s.last_token_id for s in seqs]
            positions = [s.cached_token_count for s in seqs]
        else:
            input_ids, positions = [], []
            for seq, n in zip(seqs, num_new):
                start = seq.cached_token_count
                input_ids.extend(_token_ids(seq, start, start + n))
                positions.extend(range(start, start + n))
            complete = [s.cached_token_count + n == s.num_tokens for s, n in zip(seqs, num_new)]
            if not all(complete):  # a chunk short of the sequence's end samples nothing
                sampling = [b for b, done in enumerate(complete) if done]
        meta = build_attention_metadata(
            query_lens=num_new,
            context_lens=output.context_lengths,
            block_tables=output.block_tables,
            slot_mapping=output.slot_mapping,
            block_size=self.kv_cache.block_size,
            device=self.device,
            dtype=self.kv_cache.dtype,
            workspace=self.workspace,
        )
        last = torch.tensor(num_new, dtype=torch.int64).cumsum(0) - 1  # [B]
        return StepInputs(
            input_ids=torch.tensor(input_ids, dtype=torch.int64).to(self.device),
            positions=torch.tensor(positions, dtype=torch.int64).to(self.device),
            last_index=last.to(self.device),
            meta=meta,
            sampling=sampling,
        )

    @torch.inference_mode()
    def compute_logits(self, output: SchedulerOutput) -> torch.Tensor:
        """Run the model for one step (writing its K/V) -> logits [B, vocab] float32 at each
        sequence's last new token (also for chunks that sample nothing)."""
        inputs = self.prepare(output)
        return self.model.compute_logits(self._last_hidden(inputs))

    def _last_hidden(self, inputs: StepInputs, rows: list[int] | None = None) -> torch.Tensor:
        """Forward -> final hidden states [len(rows), hidden] at the last new token of the
        batch rows `rows` (all rows when None)."""
        hidden: torch.Tensor = self.model(
            inputs.input_ids, inputs.positions, inputs.meta, self.kv_cache
        )
        last = inputs.last_index
        if rows is not None:
            last = last[torch.tensor(rows, dtype=torch.int64, device=last.device)]
        return hidden.index_select(0, last)

    def sampling_rows(self, output: SchedulerOutput) -> list[SamplingRow]:
        """Per scheduled sequence: its temperature, top_p and the seed of this token's draw."""
        rows = []
        for seq in output.seqs:
            params = seq.sampling_params
            base = params.seed
            if base is None:
                base = default_request_seed(self.seed, seq.seq_id)
            seed = token_seed(base, len(seq.generated_token_ids))
            rows.append(SamplingRow(params.temperature, params.top_p, seed))
        return rows

    @torch.inference_mode()
    def run(self, output: SchedulerOutput) -> list[int]:
        """Forward and sample: one token id per scheduled sequence ([] for an empty step); 0
        for a sequence whose prefill chunk stops short of its last token."""
        if not output.seqs:
            return []
        inputs = self.prepare(output)
        rows = inputs.sampling
        if rows is None:
            logits = self.model.compute_logits(self._last_hidden(inputs))
            return sample(logits, self.sampling_rows(output))
        tokens = [0] * len(output.seqs)
        if rows:
            logits = self.model.compute_logits(self._last_hidden(inputs, rows))
            params = self.sampling_rows(output)
            for row, token in zip(rows, sample(logits, [params[r] for r in rows])):
                tokens[row] = token
        else:  # no sequence samples: the layers still run, to write the step's K/V
            self._last_hidden(inputs, [])
        return tokens


def _token_ids(seq: Sequence, start: int, stop: int) -> list[int]:
    """Token ids [start, stop) of prompt + generated, without copying the whole sequence."""
    prompt = seq.num_prompt_tokens
    if stop <= prompt:
        return list(seq.prompt_token_ids[start:stop])
    generated = seq.generated_token_ids
    if start >= prompt:
        return generated[start - prompt : stop - prompt]
    return [*seq.prompt_token_ids[start:], *generated[: stop - prompt]]
