"""Build a ModelSpec from a Hugging Face config.json, and resolve ``--model`` (preset or path).

Reads llama / mistral / qwen2 / opt style keys, and the experts of mixtral / qwen2_moe /
qwen3_moe configs. Only the config is read: no weights, no
tokenizer, no network. Every bad or missing key raises CostModelError naming file and key.
"""

from __future__ import annotations

from pathlib import Path

from kvsim.costmodel.model_presets import MODEL_PRESETS
from kvsim.costmodel.modelspec import ModelSpec, estimate_num_params
from kvsim.costmodel.specio import (
    CostModelError,
    path_exists,
    positive_int,
    read_json_object,
    shown,
)

# vLLM's dtype="auto" serves float32 checkpoints in 16-bit, and configs without a dtype are served
# in float16, so the serving width is 2 bytes for every common value.
_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 2, "float": 2, "half": 2}


def _required_int(config: dict[str, object], keys: tuple[str, ...], source: str) -> int:
    for key in keys:
        if key in config:
            return positive_int(config[key], f"key {key!r}", source)
    names = " or ".join(repr(k) for k in keys)
    raise CostModelError(f"{source}: missing key {names}")


def _dtype_bytes(config: dict[str, object], source: str) -> int:
    # transformers >= 4.56 writes "dtype"; older configs write "torch_dtype".
    for key in ("torch_dtype", "dtype"):
        value = config.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or value not in _DTYPE_BYTES:
            known = ", ".join(sorted(_DTYPE_BYTES))
            raise CostModelError(
                f"{source}: key {key!r} must be one of {known}, got {shown(value)}"
            )
        return _DTYPE_BYTES[value]
    return 2


# Encoder-only and encoder-decoder families: no KV cache of vLLM's decoder kind to simulate.
_NOT_DECODERS = frozenset({"bert", "roberta", "distilbert", "albert", "electra", "deberta",
                           "deberta-v2", "t5", "mt5", "bart", "mbart", "whisper", "marian",
                           "pegasus"})  # fmt: skip


def _check_rope_scaling(value: object, source: str) -> None:
    """``rope_scaling`` as transformers and vLLM read it: absent/null, or an object naming its
    ``rope_type`` (or legacy ``type``) with a positive finite ``factor`` where it has one."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise CostModelError(
            f"{source}: key 'rope_scaling' must be an object or null, got {shown(value)}"
        )
    kind = value.get("rope_type", value.get("type"))
    if not isinstance(kind, str) or not kind:
        raise CostModelError(
            f"{source}: key 'rope_scaling' must name its 'rope_type', got {shown(value)}"
        )
    factor = value.get("factor")
    if factor is not None and not (
        isinstance(factor, (int, float)) and not isinstance(factor, bool) and 0 < factor < 1e6
    ):
        raise CostModelError(
            f"{source}: key 'rope_scaling.factor' must be a positive number, got {shown(factor)}"
        )


# RoPE types whose max_position_embeddings is already the scaled context: vLLM 0.33
# (vllm/config/model.py, _get_and_verify_max_len) multiplies the others' by rope_scaling.factor.
_PRESCALED_ROPE = frozenset(
    {"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"}
)


def _context_len(config: dict[str, object], model_type: str, source: str) -> int:
    """The model's longest sequence as vLLM derives it (the limit ``--max-model-len`` may not
    pass without ``--allow-long-max-model-len``): ``model_max_length`` where given, else
    ``max_position_embeddings``, times rope_scaling's ``factor`` for the RoPE types that
    scale it (linear, dynamic, ...; not gemma3, whose context is already scaled)."""
    context = float(_required_int(config, ("max_position_embeddings",), source))
    if config.get("model_max_length") is not None:
        context = float(_required_int(config, ("model_max_length",), source))
    rope = config.get("rope_scaling")
    if isinstance(rope, dict) and "gemma3" not in model_type:
        kind = rope.get("rope_type", rope.get("type"))
        factor = rope.get("factor")
        if kind not in _PRESCALED_ROPE and isinstance(factor, (int, float)):
            context *= factor
    return max(1, int(context))


# MoE families kvsim models (every layer a mixture of experts, split over tp like a dense MLP),
# and the keys that make any other family a mixture of experts it does not model.
_MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe")
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def _moe_fields(config: dict[str, object], model_type: str, source: str) -> dict[str, int]:
    """The ModelSpec MoE fields of a Mixtral / Qwen2-MoE / Qwen3-MoE config (empty for a dense
    one); any other config naming experts is refused, as is a layout kvsim does not model."""
    if model_type not in _MOE_TYPES:
        for key in _EXPERT_KEYS:
            if config.get(key) not in (None, 0):
                raise CostModelError(
                    f"{source}: key {key!r}: mixture-of-experts model_type {model_type!r} is "
                    f"not modelled (kvsim models {', '.join(_MOE_TYPES)})"
                )
        return {}
    mixtral = model_type == "mixtral"
    experts = _required_int(config, ("num_local_experts",) if mixtral else ("num_experts",), source)
    top_k = _required_int(config, ("num_experts_per_tok",), source)
    if top_k > experts:
        raise CostModelError(
            f"{source}: key 'num_experts_per_tok' ({top_k}) must be at most the number of "
            f"experts ({experts})"
        )
    width_key = "intermediate_size" if mixtral else "moe_intermediate_size"
    shared = 0
    if model_type == "qwen2_moe":
        shared = _required_int(config, ("shared_expert_intermediate_size",), source)
    if not mixtral:
        # Qwen MoE configs can make some layers dense; kvsim prices every layer as MoE.
        step = config.get("decoder_sparse_step", 1)
        if step is not None and step != 1:
            raise CostModelError(
                f"{source}: key 'decoder_sparse_step' must be 1 (every layer MoE: kvsim models "
                f"no dense layers between MoE ones), got {shown(step)}"
            )
        dense = config.get("mlp_only_layers")
        if dense not in (None, []):
            raise CostModelError(
                f"{source}: key 'mlp_only_layers' must be empty (kvsim models no dense layers "
                f"in an MoE model), got {shown(dense)}"
            )
    return {
        "num_experts": experts,
        "num_experts_per_tok": top_k,
        "moe_intermediate_size": _required_int(config, (width_key,), source),
        "shared_expert_intermediate_size": shared,
    }


def model_spec_from_hf_config(
    path: str | Path, *, name: str | None = None, num_params: int | None = None
) -> ModelSpec:
    """Read ``path`` (a config.json, or a folder holding one) into a ModelSpec.

    ``num_params`` defaults to :func:`estimate_num_params` (embeddings + layers + LM head unless
    tied); ``max_model_len`` is the context vLLM derives (``_context_len``).
    """
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    source = str(path)
    config = read_json_object(path)

    model_type = config.get("model_type", "llama")
    if not isinstance(model_type, str) or model_type in _NOT_DECODERS:
        raise CostModelError(
            f"{source}: key 'model_type' must name a decoder-only model (llama, mistral, qwen2, "
            f"opt, ...), got {shown(model_type)}"
        )
    is_opt = model_type == "opt"
    _check_rope_scaling(config.get("rope_scaling"), source)
    num_layers = _required_int(config, ("num_hidden_layers",), source)
    hidden_size = _required_int(config, ("hidden_size",), source)
    num_heads = _required_int(config, ("num_attention_heads",), source)
    num_kv_heads = num_heads
    if config.get("num_key_value_heads") is not None:
        num_kv_heads = _required_int(config, ("num_key_value_heads",), source)
    # Several configs write "head_dim": null or omit it; both mean "derive it".
    if config.get("head_dim") is not None:
        head_dim = _required_int(config, ("head_dim",), source)
    elif hidden_size % num_heads != 0:
        raise CostModelError(
            f"{source}: key 'hidden_size' ({hidden_size}) is not a multiple of "
            f"'num_attention_heads' ({num_heads}) and no 'head_dim' is given"
        )
    else:
        head_dim = hidden_size // num_heads
    intermediate_size = _required_int(
        config, ("ffn_dim",) if is_opt else ("intermediate_size",), source
    )
    vocab_size = _required_int(config, ("vocab_size",), source)
    max_model_len = _context_len(config, model_type, source)
    # OPT ties its LM head to the embeddings (PretrainedConfig default); llama-likes do not.
    tie = config.get("tie_word_embeddings", is_opt)
    if not isinstance(tie, bool):
        raise CostModelError(
            f"{source}: key 'tie_word_embeddings' must be true or false, got {shown(tie)}"
        )
    if num_heads % num_kv_heads != 0:
        raise CostModelError(
            f"{source}: key 'num_key_value_heads' ({num_kv_heads}) must divide "
            f"'num_attention_heads' ({num_heads})"
        )

    moe = _moe_fields(config, model_type, source)
    if num_params is None:
        num_params = estimate_num_params(
            num_layers=num_layers,
            hidden_size=hidden_size,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            intermediate_size=intermediate_size,
            vocab_size=vocab_size,
            gated_mlp=not is_opt,
            tie_word_embeddings=tie,
            num_experts=moe.get("num_experts", 0),
            moe_intermediate_size=moe.get("moe_intermediate_size", 0),
            shared_expert_intermediate_size=moe.get("shared_expert_intermediate_size", 0),
        )
    if name is None:
        raw = config.get("_name_or_path")
        name = raw.rstrip("/").rsplit("/", 1)[-1] if isinstance(raw, str) and raw.strip("/") else ""
        name = name or path.resolve().parent.name or "model"
    return ModelSpec(
        name=name,
        num_layers=num_layers,
        hidden_size=hidden_size,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate_size,
        vocab_size=vocab_size,
        dtype_bytes=_dtype_bytes(config, source),
        num_params=num_params,
        max_model_len=max_model_len,
        gated_mlp=not is_opt,
        tie_word_embeddings=tie,
        **moe,
    )


def resolve_model(name_or_path: str | Path) -> ModelSpec:
    """A preset name (``llama-2-7b``) or a path to a config.json / a model folder holding one."""
    key = str(name_or_path)
    if key in MODEL_PRESETS:
        return MODEL_PRESETS[key]
    path = Path(name_or_path)
    if path_exists(path):
        return model_spec_from_hf_config(path)
    presets = ", ".join(MODEL_PRESETS)
    raise CostModelError(
        f"unknown model {shown(key)}: not a preset ({presets}) and no such config.json or folder"
    )
