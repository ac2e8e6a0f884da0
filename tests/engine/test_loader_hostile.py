"""Hostile Hugging Face checkpoints: config.json fields given awkward JSON values, files that are
not JSON objects, shard indexes leading out of the folder, corrupt safetensors. Each load gives a
model or one ModelConfigError line naming the file (and the field); nothing else escapes."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.torch_engine.loader import build_model, load_config, load_model
from engine.torch_engine.models import ModelConfig, ModelConfigError

SMALL: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}
BIG = "1" * 5000
# JSON texts, each put into one config field in turn
VALUES = [
    "0", "-1", "null", "true", "false", "4.0", "3.5", '"32"', '""', "[]", "{}", "[1]", BIG,
    str(2**31), str(2**63), "1e400", "NaN", "Infinity", "-0.0", '"\\ud800"', "[" * 100_000,
    '{"rope_type": "llama3"}', '{"rope_theta": 0}', '{"factor": -1, "rope_type": "linear"}',
    '{"rope_type": null}',
]  # fmt: skip
FIELDS = [
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "model_type",
    "hidden_act", "attention_bias", "mlp_bias", "tie_word_embeddings", "initializer_range",
    "eos_token_id", "rope_theta", "rope_scaling", "rope_parameters",
]  # fmt: skip
_CASES = itertools.count()


@pytest.fixture(scope="module")
def _base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hostile_hf")


@pytest.fixture
def folder(_base: Path) -> Path:
    path = _base / f"ckpt{next(_CASES)}"
    path.mkdir()
    return path


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except ModelConfigError as err:
        return err
    except BaseException as err:  # the point: nothing else may escape
        raise AssertionError(f"{type(err).__name__} escaped: {err!r:.300}") from err


def _check(err: ModelConfigError, path: Path, field: str | None = None) -> None:
    message = str(err)
    assert "\n" not in message and message.isprintable(), ascii(message)
    assert len(message) <= 300 + len(str(path)), message[:200]
    assert message.startswith(str(path)), message
    if field is not None:
        assert field in message, message


def _config_text(field: str, value: str) -> str:
    items = {key: json.dumps(v) for key, v in SMALL.items()}
    items[field] = value
    return "{" + ", ".join(f'"{key}": {text}' for key, text in items.items()) + "}"


@pytest.mark.parametrize("field", FIELDS)
def test_config_field_values(folder: Path, field: str) -> None:
    path = folder / "config.json"
    failures = []
    for value in VALUES:  # one test per field: pytest's per-test cost would dominate
        path.write_text(_config_text(field, value), encoding="utf-8")
        try:
            result = _outcome(lambda: load_config(folder))
            if isinstance(result, ModelConfigError):
                # malformed JSON (deep nesting) names the file only; rope errors name rope keys
                names_field = not value.startswith(("[[", "{")) and not field.startswith("rope")
                _check(result, path, field if names_field else None)
            else:
                assert isinstance(result, ModelConfig)
                build_model(result)  # a config that loads must build
        except AssertionError as err:
            failures.append(f"{value[:30]}: {str(err)[:200]}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize(
    "text",
    [b"[1, 2]", b"null", b"7", b'"x"', b"", b"{", b"\xff\xfe", b"[" * 100_000, BIG.encode()],
    ids=lambda v: v[:12],
)
def test_config_that_is_no_object(folder: Path, text: bytes) -> None:
    path = folder / "config.json"
    path.write_bytes(text)
    result = _outcome(lambda: load_config(folder))
    assert isinstance(result, ModelConfigError), result
    _check(result, path)


def test_config_json_that_is_a_fifo_or_folder(tmp_path: Path) -> None:
    fifo_ckpt, dir_ckpt = tmp_path / "fifo", tmp_path / "dir"
    fifo_ckpt.mkdir()
    os.mkfifo(fifo_ckpt / "config.json")  # would block forever if opened for reading
    (dir_ckpt / "config.json").mkdir(parents=True)
    for ckpt in (fifo_ckpt, dir_ckpt, tmp_path / "missing", tmp_path / ("x" * 300)):
        result = _outcome(lambda ckpt=ckpt: load_config(ckpt))
        assert isinstance(result, ModelConfigError), result
        assert "neither a preset" in str(result) and "\n" not in str(result)


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A valid model.safetensors of the SMALL config (random weights)."""
    from safetensors.torch import save_file

    model = build_model(ModelConfig.from_hf_config(SMALL))
    tensors = {name: p.detach().clone() for name, p in model.named_parameters()}
    for fused, parts in (("qkv_proj", ("q_proj", "k_proj", "v_proj")),):
        for name in [n for n in tensors if f".{fused}." in n]:
            q, k, v = torch.split(tensors.pop(name), [32, 16, 16])
            for part, tensor in zip(parts, (q, k, v), strict=True):
                tensors[name.replace(fused, part)] = tensor.contiguous()
    for name in [n for n in tensors if ".gate_up_proj." in n]:
        gate, up = torch.chunk(tensors.pop(name), 2)
        tensors[name.replace("gate_up_proj", "gate_proj")] = gate.contiguous()
        tensors[name.replace("gate_up_proj", "up_proj")] = up.contiguous()
    path = tmp_path_factory.mktemp("weights") / "model.safetensors"
    save_file(tensors, path)
    return path.read_bytes()


def _checkpoint(folder: Path, files: dict[str, bytes]) -> Path:
    (folder / "config.json").write_text(json.dumps(SMALL))
    for name, content in files.items():
        (folder / name).write_bytes(content)
    return folder


def test_the_reference_checkpoint_loads(folder: Path, weights: bytes) -> None:
    load_model(_checkpoint(folder, {"model.safetensors": weights}))


def _corruptions(weights: bytes) -> list[bytes]:
    header = int.from_bytes(weights[:8], "little")
    return [
        b"",
        b"\x00" * 7,
        b"\xff" * 8,
        (10**12).to_bytes(8, "little") + b"{}",
        weights[: len(weights) // 2],
        weights[:-1],
        weights[:8] + b"[" * header,
        weights[:8] + b"{" + b" " * (header - 1) + weights[8 + header :],
        weights[:8] + weights[8 : 8 + header].replace(b"F32", b"I64") + weights[8 + header :],
        weights[:8] + weights[8 : 8 + header].replace(b'"shape":[', b'"shape":[7,') + b"x",
    ]


@pytest.mark.parametrize("case", range(10))
def test_corrupt_safetensors(folder: Path, weights: bytes, case: int) -> None:
    ckpt = _checkpoint(folder, {"model.safetensors": _corruptions(weights)[case]})
    result = _outcome(lambda: load_model(ckpt))
    assert isinstance(result, ModelConfigError), f"case {case} loaded"
    assert "\n" not in str(result) and str(ckpt) in str(result)


@pytest.mark.parametrize(
    "weight_map",
    [
        {"a": "../model.safetensors"}, {"a": "/etc/passwd"}, {"a": "sub/../../x.safetensors"},
        {"a": ""}, {"a": "nul\u0000.safetensors"}, {"a": 7}, {"a": None}, {"a": ["x"]}, {},
        [], "model.safetensors", {"a": "missing.safetensors"}, {"a": "."}, {"a": "sub"},
    ],
    ids=str,
)  # fmt: skip
def test_weight_map_entries(folder: Path, weights: bytes, weight_map: object) -> None:
    (folder / "sub").mkdir()
    index = json.dumps({"metadata": {}, "weight_map": weight_map}).encode()
    ckpt = _checkpoint(folder, {"model.safetensors.index.json": index})
    (folder.parent / "model.safetensors").write_bytes(weights)  # what "../" would reach
    result = _outcome(lambda: load_model(ckpt))
    assert isinstance(result, ModelConfigError), "a weight_map leading out of the folder loaded"
    _check(result, ckpt / "model.safetensors.index.json")
    (folder.parent / "model.safetensors").unlink()


def test_shards_may_be_symlinks_out_of_the_folder(tmp_path: Path, weights: bytes) -> None:
    # Hugging Face's cache: snapshots/<rev>/model.safetensors -> ../../blobs/<sha>
    blob = tmp_path / "blobs" / "sha"
    blob.parent.mkdir()
    blob.write_bytes(weights)
    ckpt = tmp_path / "snapshot"
    ckpt.mkdir()
    index = json.dumps({"weight_map": {"lm_head.weight": "model.safetensors"}}).encode()
    _checkpoint(ckpt, {"model.safetensors.index.json": index})
    (ckpt / "model.safetensors").symlink_to(blob)
    load_model(ckpt)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    changes=st.dictionaries(
        st.sampled_from(FIELDS),
        st.none()
        | st.booleans()
        | st.integers(-(2**40), 2**40)
        | st.floats()
        | st.text(max_size=6)
        | st.lists(st.integers(-5, 5), max_size=3),
        max_size=4,
    )
)
def test_fuzzed_configs(tmp_path_factory: pytest.TempPathFactory, changes: dict) -> None:
    folder = tmp_path_factory.getbasetemp() / "fuzz_hf"
    folder.mkdir(exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps({**SMALL, **changes}))
    result = _outcome(lambda: load_config(folder))
    if isinstance(result, ModelConfigError):
        _check(result, path)
    else:
        assert all(v > 0 for v in (result.hidden_size, result.num_attention_heads, result.head_dim))
