"""The memory roofline of a decode step: the least time any engine can take for it.

A decode step reads, on each of ``tp`` GPUs, its slice of every layer's weights once (for a
mixture of experts the experts the batch routes to, plus the router and any shared expert),
its slice of the LM head, and every sequence's K/V of every layer; nothing can do that faster
than the GPU's HBM bandwidth. A price below this bound is a bug in the cost model, whatever it
is calibrated to (docs/costmodel.md, "Decode at full batch and long context: the roofline").
FLOPs, all-reduces and launch costs only add to it, so they are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.costmodel.gpuspec import GPUSpec
from kvsim.costmodel.layer_shapes import LayerShapes
from kvsim.costmodel.modelspec import ModelSpec
from kvsim.costmodel.moe import expected_experts_touched


@dataclass(frozen=True, slots=True)
class DecodeRoofline:
    """Bytes one GPU must read from HBM for one decode step, and the time that takes."""

    weight_bytes: float  # every layer's matmul weights the step touches (this GPU's slice)
    lm_head_bytes: float
    kv_bytes: float  # every sequence's K and V of every layer (this GPU's KV heads)
    hbm_bandwidth: float  # bytes/s

    @property
    def total_bytes(self) -> float:
        return self.weight_bytes + self.lm_head_bytes + self.kv_bytes

    @property
    def seconds(self) -> float:
        """The bound (s): every byte once, at peak HBM bandwidth."""
        return self.total_bytes / self.hbm_bandwidth


def layer_weight_bytes(shapes: LayerShapes, num_tokens: float) -> float:
    """Bytes of one layer's matmul weights on one GPU that a step of ``num_tokens`` tokens
    reads: QKV and output projections, and the dense MLP or, for a mixture of experts, the
    router, the experts the tokens route to (expected count under uniform routing, an upper
    estimate: skewed routers touch fewer) and any shared expert, the experts at their own
    width in bytes (FP8 experts: 1)."""
    b = float(shapes.dtype_bytes)
    gemms = shapes.gemm_shapes()
    attention = sum(float(k * n) for op, (k, n) in gemms.items() if op.startswith("attn_"))
    moe = shapes.moe
    if moe is None:
        mlp = sum(float(k * n) for op, (k, n) in gemms.items() if op.startswith("mlp_"))
        return (attention + mlp) * b
    h = float(shapes.hidden_size)
    touched = float(expected_experts_touched(moe.num_experts, moe.top_k, num_tokens))
    expert = h * moe.expert_up_width + moe.expert_width * h
    shared = h * moe.shared_up_width + moe.shared_width * h
    experts = (touched * expert + shared) * float(moe.weight_bytes)
    return (attention + h * moe.num_experts) * b + experts


def decode_roofline(
    model: ModelSpec, gpu: GPUSpec, *, tp: int, num_seqs: int, context_tokens: int
) -> DecodeRoofline:
    """The roofline of ``num_seqs`` decodes whose contexts sum to ``context_tokens`` tokens,
    on one of ``tp`` GPUs (any tp that divides the query heads)."""
    shapes = LayerShapes.from_model(model, tp)
    b = float(model.dtype_bytes)
    weights = model.num_layers * layer_weight_bytes(shapes, float(num_seqs))
    lm_head = float(model.hidden_size) * (model.vocab_size // tp) * b
    kv_per_token = model.num_layers * 2.0 * float(shapes.kv_heads_per_gpu) * model.head_dim * b
    return DecodeRoofline(
        weight_bytes=weights,
        lm_head_bytes=lm_head,
        kv_bytes=float(context_tokens) * kv_per_token,
        hbm_bandwidth=gpu.hbm_bandwidth,
    )
