"""Build a model from a preset name or a local Hugging Face checkpoint folder.

A checkpoint folder holds config.json and safetensors weights: one `model.safetensors`, or shards
listed in `model.safetensors.index.json`, or any `*.safetensors` files. Random presets are
initialised from a seed. The engine never imports transformers; safetensors is imported only
when a checkpoint is loaded.
"""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import torch

from engine.torch_engine.models.config import (
    PRESETS,
    LongInteger,
    ModelConfig,
    ModelConfigError,
    preset_config,
)
from engine.torch_engine.models.llama import LlamaForCausalLM

# checkpoint projection name -> (fused parameter name, shard index within the fused output)
_FUSED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """'float32' | 'float16' | 'bfloat16' (or a torch.dtype) -> torch.dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ModelConfigError(f"dtype={dtype!r} is not supported (one of {sorted(DTYPES)})")
    return DTYPES[dtype]


_MAX_JSON_BYTES = 64 << 20  # config.json is a few kB, a shard index a few hundred kB
_MAX_INT_CHARS = 30  # longer integer literals fit no field; int() refuses past 4,300 digits


def _read_json(path: Path) -> Any:
    """A checkpoint's JSON file, any problem a one-line ModelConfigError naming it.

    Only regular files are read (a FIFO would block, a device never end), at most
    _MAX_JSON_BYTES of them.
    """
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            raise ModelConfigError(f"{path}: not a regular file")
        with path.open("rb") as file:
            data = file.read(_MAX_JSON_BYTES + 1)
    except OSError as err:
        raise ModelConfigError(f"{path}: {err.strerror or err}") from None
    if len(data) > _MAX_JSON_BYTES:
        raise ModelConfigError(f"{path}: larger than {_MAX_JSON_BYTES >> 20} MiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ModelConfigError(f"{path}: not UTF-8 text (byte {err.start})") from None
    try:
        try:
            return json.loads(text)
        except ValueError as err:
            if isinstance(err, json.JSONDecodeError):
                raise
            # Python's int-string limit: keep such integers for the field's check to name
            return json.loads(text, parse_int=_int_or_long)
    except json.JSONDecodeError as err:
        raise ModelConfigError(
            f"{path}:{err.lineno}: malformed JSON: {err.msg} at column {err.colno}"
        ) from None
    except RecursionError:
        raise ModelConfigError(f"{path}: malformed JSON: nested too deeply") from None


def _int_or_long(literal: str) -> int | LongInteger:
    return LongInteger(literal) if len(literal) > _MAX_INT_CHARS else int(literal)


def load_config(model: str | Path) -> ModelConfig:
    """The ModelConfig of a preset name or of a checkpoint folder's config.json.

    Raises ModelConfigError, its message ``FOLDER/config.json: field must be ...``.
    """
    if isinstance(model, str) and model in PRESETS:
        return preset_config(model)
    path = Path(model) / "config.json"
    try:
        found = path.is_file()
    except (OSError, ValueError):  # a name too long, a NUL character
        found = False
    if not found:
        raise ModelConfigError(
            f"model={str(model)!r} is neither a preset {sorted(PRESETS)} "
            "nor a folder with config.json"
        )
    hf = _read_json(path)
    try:
        return ModelConfig.from_hf_config(hf)
    except ModelConfigError as err:
        raise ModelConfigError(f"{path}: {err}") from None


def build_model(
    config: ModelConfig,
    *,
    device: torch.device | str = "cpu",
    dtype: str | torch.dtype = "float32",
    seed: int = 0,
) -> LlamaForCausalLM:
    """An eval-mode model with seeded random weights, allocated directly on `device`."""
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to(resolve_dtype(dtype)).to_empty(device=device)
    model.model.rotary_emb.reset()
    model.init_random(seed)
    return model.eval()


def load_model(
    model: str | Path,
    *,
    device: torch.device | str = "cpu",
    dtype: str | torch.dtype = "float32",
    seed: int = 0,
) -> LlamaForCausalLM:
    """A preset with random weights (seeded) or a checkpoint folder's weights, on `device`."""
    config = load_config(model)
    built = build_model(config, device=device, dtype=dtype, seed=seed)
    if not (isinstance(model, str) and model in PRESETS):
        load_weights(built, Path(model))
    return built


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        listing = _read_json(index)
        weight_map = listing.get("weight_map") if isinstance(listing, dict) else None
        if (
            not isinstance(weight_map, dict)
            or not weight_map
            or not all(type(name) is str for name in weight_map.values())
        ):
            raise ModelConfigError(
                f"{index}: weight_map must be an object from tensor names to shard file names"
            )
        return [_shard_path(index, name) for name in sorted(set(weight_map.values()))]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelConfigError(f"no *.safetensors weights in {folder}")
    return files


def _shard_path(index: Path, name: str) -> Path:
    """A weight_map entry as a file of the checkpoint folder; refuses paths leading out of it.

    The test is on the name, not on the resolved file: Hugging Face's cache links each shard
    to a blob outside the folder, which is fine, but ``../x`` or ``/etc/x`` is not.
    """
    parts = PurePosixPath(name).parts
    if not name or "\0" in name or PurePosixPath(name).is_absolute() or ".." in parts:
        raise ModelConfigError(
            f"{index}: weight_map entry {name!r} is not a file name inside the checkpoint folder"
        )
    path = index.parent / name
    if not path.is_file():
        raise ModelConfigError(f"{index}: weight_map names {name!r}, which is not a file")
    return path


def _iter_tensors(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import SafetensorError, safe_open

    for path in _weight_files(folder):
        try:
            if not stat.S_ISREG(path.stat().st_mode):
                raise ModelConfigError(f"{path}: not a regular file")
            with safe_open(str(path), framework="pt", device="cpu") as handle:
                for name in handle.keys():  # noqa: SIM118 (safe_open is not a dict)
                    yield name, handle.get_tensor(name)
        except (SafetensorError, OSError) as err:
            raise ModelConfigError(f"{path}: not a readable safetensors file: {err}") from None


@torch.no_grad()
def load_weights(model: LlamaForCausalLM, folder: Path) -> None:
    """Copy a checkpoint's tensors into `model`, cast to its dtype and device; all must exist."""
    params = dict(model.named_parameters())
    missing = {(name, shard) for name in params for shard in _shards(name)}
    tied = model.lm_head is None
    for name, tensor in _iter_tensors(folder):
        if name.endswith("rotary_emb.inv_freq") or (tied and name == "lm_head.weight"):
            continue
        target, shard = _target(name)
        if target not in params:
            raise ModelConfigError(f"checkpoint tensor {name!r} has no place in the model")
        param = params[target]
        rows = param.shape[0] if shard is None else _shard_rows(model, target, shard)
        start = 0 if shard is None else sum(_shard_rows(model, target, i) for i in range(shard))
        if tuple(tensor.shape) != (rows, *param.shape[1:]):
            raise ModelConfigError(
                f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, "
                f"expected {(rows, *param.shape[1:])}"
            )
        param[start : start + rows].copy_(tensor)
        missing.discard((target, shard))
    if missing:
        raise ModelConfigError(f"checkpoint {folder} lacks {sorted(n for n, _ in missing)[:5]}")


def _target(name: str) -> tuple[str, int | None]:
    """Checkpoint tensor name -> (model parameter name, fused shard index or None)."""
    parts = name.split(".")
    if len(parts) >= 2 and parts[-2] in _FUSED:
        fused, shard = _FUSED[parts[-2]]
        return ".".join([*parts[:-2], fused, parts[-1]]), shard
    return name, None


def _shards(name: str) -> tuple[int | None, ...]:
    if ".qkv_proj." in name:
        return (0, 1, 2)
    if ".gate_up_proj." in name:
        return (0, 1)
    return (None,)


def _shard_rows(model: LlamaForCausalLM, target: str, shard: int) -> int:
    config = model.config
    if ".gate_up_proj." in target:
        return config.intermediate_size
    heads = config.num_attention_heads if shard == 0 else config.num_key_value_heads
    return heads * config.head_dim
