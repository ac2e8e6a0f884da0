"""Model architectures for the cost model: ModelSpec and its parameter count (the presets are
model_presets.py; Hugging Face config.json reading is hf_config.py).

Pure data and arithmetic (stdlib only): no torch, no weights are ever loaded. Sizes are in
parameters or bytes; ``dtype_bytes`` is the serving dtype (2 for fp16/bf16); an MoE model's
experts may be stored narrower (``expert_weight_bytes``, 1 for FP8).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.costmodel.specio import CostModelError, nonempty_str, positive_int


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer, as far as memory and step time care.

    ``num_params`` is the true parameter count (weights in memory = num_params * dtype_bytes);
    ``gated_mlp`` says the MLP has three matrices (SwiGLU: gate, up, down) rather than two
    (OPT's fc1/fc2); ``tie_word_embeddings`` says the LM head shares the embedding matrix.

    Mixture of experts (``num_experts > 0``): every layer's MLP is ``num_experts`` MLPs of width
    ``moe_intermediate_size``, of which a router picks ``num_experts_per_tok`` per token, plus
    an optional shared expert of width ``shared_expert_intermediate_size`` that every token
    runs; ``intermediate_size`` is then the config's dense width, which no layer uses. A dense
    model leaves the MoE fields at 0.

    ``expert_weight_bytes`` (MoE only; 0: ``dtype_bytes``) is the bytes of one weight of the
    routed and shared experts when the checkpoint stores them narrower than the rest: 1 for an
    FP8 checkpoint that quantizes the expert MLPs and keeps attention, router, embeddings and
    LM head at ``dtype_bytes`` (llm-compressor's Llama 4 recipes). Activations and the KV cache
    stay at ``dtype_bytes``.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    dtype_bytes: int
    num_params: int
    max_model_len: int
    gated_mlp: bool = True
    tie_word_embeddings: bool = False
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    expert_weight_bytes: int = 0

    def __post_init__(self) -> None:
        source = f"model {self.name!r}"
        nonempty_str(self.name, "name", "model")
        for field in (
            "num_layers",
            "hidden_size",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
            "vocab_size",
            "num_params",
            "max_model_len",
        ):
            positive_int(getattr(self, field), field, source)
        if self.dtype_bytes not in (1, 2, 4) or isinstance(self.dtype_bytes, bool):
            raise CostModelError(
                f"{source}: dtype_bytes must be 1, 2 or 4, got {self.dtype_bytes!r}"
            )
        if self.num_heads % self.num_kv_heads != 0:
            raise CostModelError(
                f"{source}: num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        for field in ("gated_mlp", "tie_word_embeddings"):
            if not isinstance(getattr(self, field), bool):
                raise CostModelError(
                    f"{source}: {field} must be a bool, got {getattr(self, field)!r}"
                )
        self._check_moe(source)

    def _check_moe(self, source: str) -> None:
        fields = (
            "num_experts_per_tok",
            "moe_intermediate_size",
            "shared_expert_intermediate_size",
            "expert_weight_bytes",
        )
        for field in ("num_experts", *fields):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise CostModelError(f"{source}: {field} must be an integer >= 0, got {value!r}")
        if self.num_experts == 0:
            for field in fields:
                if getattr(self, field):
                    raise CostModelError(
                        f"{source}: {field} ({getattr(self, field)}) needs num_experts > 0"
                    )
            return
        if not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise CostModelError(
                f"{source}: num_experts_per_tok must be in 1..num_experts ({self.num_experts}), "
                f"got {self.num_experts_per_tok!r}"
            )
        positive_int(self.moe_intermediate_size, "moe_intermediate_size", source)
        if self.expert_weight_bytes not in (0, 1, 2, 4):
            raise CostModelError(
                f"{source}: expert_weight_bytes must be 0 (as dtype_bytes), 1, 2 or 4, "
                f"got {self.expert_weight_bytes!r}"
            )

    @property
    def is_moe(self) -> bool:
        """Whether the MLPs are mixtures of experts."""
        return self.num_experts > 0

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V one token occupies in the cache, all layers, one replica (bytes)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def expert_bytes_per_weight(self) -> int:
        """Bytes of one weight of the routed and shared experts (bytes)."""
        return self.expert_weight_bytes or self.dtype_bytes

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights, unsharded: ``num_params * dtype_bytes``, less what narrower
        expert weights save (bytes)."""
        saved = self.dtype_bytes - self.expert_bytes_per_weight
        return self.num_params * self.dtype_bytes - self.all_expert_params * saved

    @property
    def layer_matmul_params(self) -> int:
        """Parameters of the per-layer matrices (QKV, O, MLP), all layers; no norms or biases.

        This is what the linear layers multiply every token by: 2 FLOPs per parameter per token.
        For an MoE model these are the matrices one token meets: attention, the router, its
        ``num_experts_per_tok`` experts and the shared expert (the active parameters per layer).
        """
        return self.num_layers * _layer_matmul_params(
            hidden_size=self.hidden_size,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            intermediate_size=self.intermediate_size,
            gated_mlp=self.gated_mlp,
            moe=self._moe_sizes(active=True),
        )

    def _moe_sizes(self, *, active: bool) -> tuple[int, int, int, int] | None:
        """(experts counted, num_experts, expert width, shared width): _layer_matmul_params."""
        if not self.is_moe:
            return None
        experts = self.num_experts_per_tok if active else self.num_experts
        return (
            experts,
            self.num_experts,
            self.moe_intermediate_size,
            self.shared_expert_intermediate_size,
        )

    @property
    def router_params(self) -> int:
        """Parameters of the routers (hidden x num_experts per layer): replicated under tp."""
        return self.num_layers * self.hidden_size * self.num_experts

    @property
    def expert_params(self) -> int:
        """Parameters of all routed experts, all layers (0 for a dense model)."""
        mult = 3 if self.gated_mlp else 2
        return (
            self.num_layers
            * self.num_experts
            * mult
            * self.hidden_size
            * self.moe_intermediate_size
        )

    @property
    def shared_expert_params(self) -> int:
        """Parameters of the shared experts' matrices, all layers (their gate not counted)."""
        mult = 3 if self.gated_mlp else 2
        return self.num_layers * mult * self.hidden_size * self.shared_expert_intermediate_size

    @property
    def all_expert_params(self) -> int:
        """Parameters stored at ``expert_bytes_per_weight``: routed and shared experts."""
        return self.expert_params + self.shared_expert_params

    @property
    def active_params(self) -> int:
        """Parameters one token's forward pass uses: num_params less the experts it skips."""
        if not self.is_moe:
            return self.num_params
        skipped = self.num_experts - self.num_experts_per_tok
        return self.num_params - self.expert_params // self.num_experts * skipped

    @property
    def kv_proj_params(self) -> int:
        """Parameters of the K and V projections, all layers (replicated when tp > num_kv_heads)."""
        return 2 * self.num_layers * self.hidden_size * self.num_kv_heads * self.head_dim

    @property
    def lm_head_params(self) -> int:
        """Parameters of the output projection (vocab x hidden), tied or not."""
        return self.vocab_size * self.hidden_size


def _layer_matmul_params(
    *,
    hidden_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    intermediate_size: int,
    gated_mlp: bool,
    moe: tuple[int, int, int, int] | None = None,
) -> int:
    """One layer's matrices. ``moe`` = (experts counted, num_experts, expert width, shared
    width) replaces the dense MLP by that many experts, the router (hidden x num_experts) and
    the shared expert with its one-output gate."""
    q_and_o = 2 * hidden_size * num_heads * head_dim
    k_and_v = 2 * hidden_size * num_kv_heads * head_dim
    mult = 3 if gated_mlp else 2
    if moe is None:
        return q_and_o + k_and_v + mult * hidden_size * intermediate_size
    experts, num_experts, width, shared = moe
    mlp = experts * mult * hidden_size * width + hidden_size * num_experts
    if shared:
        mlp += mult * hidden_size * shared + hidden_size  # shared expert and its sigmoid gate
    return q_and_o + k_and_v + mlp


def estimate_num_params(
    *,
    num_layers: int,
    hidden_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    intermediate_size: int,
    vocab_size: int,
    gated_mlp: bool = True,
    tie_word_embeddings: bool = False,
    num_experts: int = 0,
    moe_intermediate_size: int = 0,
    shared_expert_intermediate_size: int = 0,
) -> int:
    """Parameter count from the architecture: embeddings + layers + final norm + untied LM head.

    Biases and learned position embeddings are ignored (under 0.1% for the presets); each layer
    has two norm weight vectors of ``hidden_size``. With ``num_experts > 0`` each layer's MLP is
    that many experts of ``moe_intermediate_size``, a router (hidden x num_experts) and, where
    ``shared_expert_intermediate_size`` is given, a shared expert and its one-output gate.
    """
    moe = None
    if num_experts:
        moe = (num_experts, num_experts, moe_intermediate_size, shared_expert_intermediate_size)
    per_layer = (
        _layer_matmul_params(
            hidden_size=hidden_size,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            intermediate_size=intermediate_size,
            gated_mlp=gated_mlp,
            moe=moe,
        )
        + 2 * hidden_size
    )
    embeddings = vocab_size * hidden_size
    lm_head = 0 if tie_word_embeddings else vocab_size * hidden_size
    return embeddings + num_layers * per_layer + hidden_size + lm_head
