"""ModelRunner: one SchedulerOutput in, one sampled token per scheduled sequence out.

It turns the scheduler's decision into tensors (input_ids, positions, slot_mapping, padded block
tables, context lengths), runs the model over the paged KV cache and samples. It makes no policy
decision and never changes a Sequence: the Scheduler applies the sampled tokens in update().
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention import AttentionMetadata, GatherWorkspace, build_attention_metadata
from engine.events import StepKind
from engine.kv_cache import KVCache
from engine.models.llama import LlamaForCausalLM
from engine.sampling import SamplingRow, default_request_seed, sample, token_seed
from engine.scheduler_output import SchedulerOutput


@dataclass(frozen=True, slots=True)
class StepInputs:
    """The device tensors of one step."""

    input_ids: torch.Tensor  # [T] int64, every scheduled sequence's new tokens, batch order
    positions: torch.Tensor  # [T] int64, token index of each within its sequence
    last_index: torch.Tensor  # [B] int64, row in [T] of each sequence's last new token
    meta: AttentionMetadata


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
        if output.kind is StepKind.DECODE:
            input_ids = [s.last_token_id for s in seqs]
            positions = [s.cached_token_count for s in seqs]
        else:
            input_ids, positions = [], []
            for seq, n in zip(seqs, num_new):
                start = seq.cached_token_count
                input_ids.extend(seq.token_ids[start : start + n])
                positions.extend(range(start, start + n))
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
        )

    @torch.inference_mode()
    def compute_logits(self, output: SchedulerOutput) -> torch.Tensor:
        """Run the model for one step (writing its K/V) -> logits [B, vocab] float32 at each
        sequence's last new token."""
        inputs = self.prepare(output)
        hidden = self.model(inputs.input_ids, inputs.positions, inputs.meta, self.kv_cache)
        return self.model.compute_logits(hidden.index_select(0, inputs.last_index))

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

    def run(self, output: SchedulerOutput) -> list[int]:
        """Forward and sample: one token id per scheduled sequence ([] for an empty step)."""
        if not output.seqs:
            return []
        logits = self.compute_logits(output)
        return sample(logits, self.sampling_rows(output))
