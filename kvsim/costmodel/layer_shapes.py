"""Per-GPU shapes of one decoder layer's operators under tensor parallelism (Megatron, as vLLM).

The fitted step-time terms price an operator from its shape, never from the model's name, so that a
model no profile has seen is priced by the same physics. Fields are plain ints for one model, or
numpy arrays (one entry per profile row) when the fitter prices a whole profile at once.

Split rules (kvsim/costmodel/sharding.py): query heads and the MLP's intermediate dimension are
split ``tp`` ways; KV heads are split while ``tp <= num_kv_heads`` and replicated beyond (one per
GPU).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from kvsim.costmodel.modelspec import ModelSpec
from kvsim.costmodel.moe import MoEShapes
from kvsim.costmodel.sharding import check_heads_divide, kv_heads_on_gpu

if TYPE_CHECKING:
    import pandas as pd

# A count for one model (int) or one per profile row (array), when the fitter prices a frame.
Int = int | npt.NDArray[np.int64]

# The nine operators of one decoder layer that CostModel.linear_time_s predicts, in the order of
# a profile's mlp.csv (the embedding lookup ``emb`` is not one of them).
LINEAR_OPS = (
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "input_layernorm",
    "post_attention_layernorm",
    "add",
)
GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
# An MoE layer's MLP (kvsim/costmodel/moe.py), in the place of mlp_up_proj, mlp_act and
# mlp_down_proj: router GEMM, top-k selection and grouping, the experts' grouped GEMMs and their
# activation, the weighted sum of each token's k outputs; then the shared expert, if any.
MOE_OPS = ("moe_router", "moe_routing", "moe_up_proj", "moe_act", "moe_down_proj", "moe_combine")
SHARED_EXPERT_OPS = ("shared_up_proj", "shared_act", "shared_down_proj", "shared_gate")
_DENSE_MLP_OPS = ("mlp_up_proj", "mlp_act", "mlp_down_proj")


def layer_ops(shapes: LayerShapes) -> tuple[str, ...]:
    """The operators of one layer of ``shapes``, in the order their times are summed:
    LINEAR_OPS for a dense MLP; for an MoE one, its three MLP operators replaced by MOE_OPS
    (and SHARED_EXPERT_OPS where the model has a shared expert)."""
    if shapes.moe is None:
        return LINEAR_OPS
    mlp = MOE_OPS + (SHARED_EXPERT_OPS if shapes.moe.shared_width else ())
    at = LINEAR_OPS.index("mlp_up_proj")
    rest = tuple(op for op in LINEAR_OPS[at:] if op not in _DENSE_MLP_OPS)
    return LINEAR_OPS[:at] + mlp + rest


ELEMENTWISE_OPS = ("attn_rope", "mlp_act", "input_layernorm", "post_attention_layernorm", "add")


@dataclass(frozen=True)
class LayerShapes:
    """What one GPU computes per decoder layer (widths in elements, per GPU)."""

    hidden_size: Int
    heads_per_gpu: Int
    kv_heads_per_gpu: Int
    head_dim: Int
    mlp_width: Int  # intermediate_size / tp
    gated_mlp: bool | npt.NDArray[np.bool_]
    dtype_bytes: Int
    moe: MoEShapes | None = None  # the MLP is a mixture of experts (one model only)

    @classmethod
    def from_model(cls, model: ModelSpec, tp: int) -> LayerShapes:
        """The shapes of ``model`` on one of ``tp`` GPUs (any tp that divides the query heads;
        CostModelError otherwise)."""
        check_heads_divide(model, tp)
        return cls(
            hidden_size=model.hidden_size,
            heads_per_gpu=model.num_heads // tp,
            kv_heads_per_gpu=kv_heads_on_gpu(model, tp),
            head_dim=model.head_dim,
            mlp_width=model.intermediate_size // tp,
            gated_mlp=model.gated_mlp,
            dtype_bytes=model.dtype_bytes,
            moe=MoEShapes.from_model(model, tp),
        )

    @classmethod
    def from_frame(cls, frame: pd.DataFrame) -> LayerShapes:
        """Shapes of every row of a profile frame (columns as in profiles.ProfileSet)."""
        tp = frame["tp"].to_numpy()
        return cls(
            hidden_size=frame["hidden_size"].to_numpy(),
            heads_per_gpu=frame["num_heads"].to_numpy() // tp,
            kv_heads_per_gpu=-(-frame["num_kv_heads"].to_numpy() // tp),
            head_dim=frame["head_dim"].to_numpy(),
            mlp_width=frame["intermediate_size"].to_numpy() // tp
            if "intermediate_size" in frame
            else 0,
            gated_mlp=frame["gated_mlp"].to_numpy() if "gated_mlp" in frame else True,
            dtype_bytes=frame["dtype_bytes"].to_numpy(),
        )

    @property
    def q_width(self) -> Int:
        return self.heads_per_gpu * self.head_dim

    @property
    def kv_width(self) -> Int:
        return self.kv_heads_per_gpu * self.head_dim

    @property
    def up_width(self) -> Int:
        """Output width of mlp_up_proj: gate and up fused for a gated (SwiGLU) MLP."""
        if isinstance(self.gated_mlp, bool):
            return (2 if self.gated_mlp else 1) * self.mlp_width
        factor: npt.NDArray[np.int64] = np.where(self.gated_mlp, 2, 1)
        return factor * self.mlp_width

    def gemm_shapes(self) -> dict[str, tuple[Int, Int]]:
        """(K, N) of each weight matrix: a step of M tokens multiplies (M x K) by (K x N)."""
        h = self.hidden_size
        return {
            "attn_pre_proj": (h, self.q_width + 2 * self.kv_width),  # fused QKV
            "attn_post_proj": (self.q_width, h),
            "mlp_up_proj": (h, self.up_width),
            "mlp_down_proj": (self.mlp_width, h),
        }

    def elementwise_bytes_per_token(self) -> dict[str, Int]:
        """Bytes each elementwise operator reads and writes per token (weights ignored)."""
        d, h = self.dtype_bytes, self.hidden_size
        return {
            "attn_rope": 2 * (self.q_width + self.kv_width) * d,  # read and write q and k
            "mlp_act": (self.up_width + self.mlp_width) * d,  # read gate+up, write the product
            "input_layernorm": 2 * h * d,
            "post_attention_layernorm": 2 * h * d,
            "add": 3 * h * d,  # residual add: two reads, one write
        }

    @property
    def kv_bytes_per_token_per_kv_head(self) -> Int:
        """K and V of one token for one KV head, one layer (bytes)."""
        return 2 * self.head_dim * self.dtype_bytes
