"""Mixture-of-experts layers (Mixtral, Qwen2-MoE, Qwen3-MoE): per-GPU shapes and routing counts.

An MoE layer replaces the dense MLP by ``num_experts`` gated MLPs of width
``moe_intermediate_size``; a router (``hidden x num_experts``, replicated on every GPU as vLLM's
``ReplicatedLinear`` gate) sends each token to its ``top_k`` experts, and an optional shared
expert (Qwen2-MoE) runs on every token. Under tensor parallelism every GPU holds a ``1/tp``
slice of every expert's intermediate dimension (vLLM's default; expert parallelism, which would
give each GPU whole experts instead, is not modelled).

Routing is not simulated token by token: a step of ``n`` tokens is priced from its expected
counts under uniform routing (docs/costmodel.md, "Mixture of experts").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvsim.costmodel.modelspec import ModelSpec

# vLLM's fused MoE kernel pads each expert's group of routed tokens to a whole block of
# BLOCK_SIZE_M rows (moe_align_block_size); 16 is its smallest block, the one its default and
# tuned configurations pick for decode-sized groups. A constant of the kernel, not a fit.
MOE_BLOCK_ROWS = 16

Float = float | npt.NDArray[np.float64]


def expected_experts_touched(num_experts: int, top_k: int, num_tokens: Float) -> Float:
    """Expected number of distinct experts a step of ``num_tokens`` tokens routes to.

    Under uniform routing an expert is missed by one token with probability ``1 - k/E``, so by
    all ``n`` tokens with ``(1 - k/E)^n``: ``E * (1 - (1 - k/E)^n)`` experts are touched (0 for
    no tokens, ``k`` for one, tending to ``E``). Real routers are skewed, which touches fewer
    experts than this at a given batch; the formula is an upper estimate of weight reads.
    """
    n = np.asarray(num_tokens, dtype=np.float64)
    touched = num_experts * (1.0 - (1.0 - top_k / num_experts) ** n)
    return touched if touched.ndim else float(touched)


@dataclass(frozen=True, slots=True)
class MoEShapes:
    """One MoE layer on one of ``tp`` GPUs (widths in elements, per GPU)."""

    num_experts: int
    top_k: int
    hidden_size: int
    expert_width: int  # moe_intermediate_size / tp
    shared_width: int  # shared_expert_intermediate_size / tp (0: no shared expert)
    gated: bool
    dtype_bytes: int  # activations
    weight_bytes: int  # one expert weight (routed or shared): dtype_bytes, or 1 for FP8

    @classmethod
    def from_model(cls, model: ModelSpec, tp: int) -> MoEShapes | None:
        """``model``'s MoE layer on one of ``tp`` GPUs; None for a dense model."""
        if not model.is_moe:
            return None
        return cls(
            num_experts=model.num_experts,
            top_k=model.num_experts_per_tok,
            hidden_size=model.hidden_size,
            expert_width=max(1, model.moe_intermediate_size // tp),
            shared_width=model.shared_expert_intermediate_size // tp,
            gated=model.gated_mlp,
            dtype_bytes=model.dtype_bytes,
            weight_bytes=model.expert_bytes_per_weight,
        )

    @property
    def expert_up_width(self) -> int:
        """Output width of one expert's first GEMM (gate and up fused when gated)."""
        return (2 if self.gated else 1) * self.expert_width

    @property
    def shared_up_width(self) -> int:
        return (2 if self.gated else 1) * self.shared_width
