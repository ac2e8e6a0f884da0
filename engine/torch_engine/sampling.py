"""Token sampling: greedy, or temperature / top-p with one seeded generator per request and token.

The generator of a request's k-th generated token is seeded from (request seed, k) alone, so a
request samples the same tokens whatever else shares its batch, and after a preemption.
Non-greedy rows are sampled on the CPU, so results do not depend on the device either.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_MASK64 = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class SamplingRow:
    """What one row of logits needs: temperature (0 = greedy), top_p and its generator seed."""

    temperature: float
    top_p: float
    seed: int


def token_seed(request_seed: int, num_generated: int) -> int:
    """Seed of the generator that samples a request's token number `num_generated` (0-based)."""
    return (request_seed * 6364136223846793005 + num_generated * 1442695040888963407 + 1) & _MASK64


def default_request_seed(engine_seed: int, seq_id: int) -> int:
    """The seed of a request that sets none: derived from the engine seed and its id."""
    return (engine_seed * 1000003 + seq_id) & _MASK64


def sample(logits: torch.Tensor, rows: list[SamplingRow]) -> list[int]:
    """logits [B, vocab] (float32) -> one token id per row."""
    tokens: list[int] = logits.argmax(dim=-1).tolist()
    for index, row in enumerate(rows):
        if row.temperature > 0.0:
            tokens[index] = _sample_row(logits[index], row)
    return tokens


def _sample_row(logits: torch.Tensor, row: SamplingRow) -> int:
    """logits [vocab] -> a token drawn from softmax(logits / T) restricted to the top-p nucleus."""
    probs = torch.softmax(logits.float().cpu() / row.temperature, dim=-1)  # [V]
    if row.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)  # [V], [V]
        before = sorted_probs.cumsum(0) - sorted_probs  # mass of strictly more likely tokens
        sorted_probs[before >= row.top_p] = 0.0  # the most likely token always stays
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    generator = torch.Generator().manual_seed(row.seed)
    return int(torch.multinomial(probs, 1, generator=generator))
