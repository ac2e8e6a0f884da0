"""GPUSpec presets and ``--gpu-spec file.json``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsim.costmodel import GPU_PRESETS, CostModelError, GPUSpec, load_gpu_spec, resolve_gpu

H100_LIKE = {
    "name": "my-gpu",
    "memory_bytes": 85_899_345_920,
    "hbm_bandwidth": 3.35e12,
    "peak_flops": 989e12,
    "interconnect_bandwidth": 450e9,
}


def _write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_presets_hold_datasheet_numbers() -> None:
    assert set(GPU_PRESETS) == {"a100-40gb", "a100-80gb", "h100-sxm", "h200", "l4", "l40s"}
    a100 = GPU_PRESETS["a100-80gb"]
    assert (a100.memory_bytes, a100.hbm_bandwidth, a100.peak_flops) == (80 << 30, 2.039e12, 312e12)
    # Dense, not the "with sparsity" figure the datasheets print first.
    assert GPU_PRESETS["h100-sxm"].peak_flops == 989e12
    assert GPU_PRESETS["h200"].hbm_bandwidth == 4.8e12
    assert (
        GPU_PRESETS["l4"].interconnect_bandwidth < GPU_PRESETS["a100-40gb"].interconnect_bandwidth
    )


def test_load_gpu_spec_round_trip(tmp_path: Path) -> None:
    spec = load_gpu_spec(_write(tmp_path, H100_LIKE))
    assert spec == GPUSpec(**H100_LIKE)  # type: ignore[arg-type]
    assert resolve_gpu(tmp_path / "gpu.json") == spec
    assert resolve_gpu("h200") is GPU_PRESETS["h200"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hbm_bandwith": 1e12}, "unknown key 'hbm_bandwith'"),
        ({"peak_flops": None}, "peak_flops must be a positive finite number, got None"),
        ({"peak_flops": -1}, "peak_flops must be a positive finite number, got -1"),
        ({"memory_bytes": 8.5e10}, "memory_bytes must be a positive integer, got 85000000000.0"),
        ({"memory_bytes": True}, "memory_bytes must be a positive integer, got True"),
        ({"name": ""}, "name must be a non-empty string"),
    ],
)
def test_load_gpu_spec_rejects_bad_fields(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    path = _write(tmp_path, {**H100_LIKE, **change})
    with pytest.raises(CostModelError, match=message) as info:
        load_gpu_spec(path)
    assert str(info.value).startswith(str(path))


def test_load_gpu_spec_missing_field(tmp_path: Path) -> None:
    data = {k: v for k, v in H100_LIKE.items() if k != "interconnect_bandwidth"}
    with pytest.raises(CostModelError, match="missing key 'interconnect_bandwidth'"):
        load_gpu_spec(_write(tmp_path, data))


def test_load_gpu_spec_file_errors(tmp_path: Path) -> None:
    with pytest.raises(CostModelError, match="file not found"):
        load_gpu_spec(tmp_path / "nope.json")
    with pytest.raises(CostModelError, match="expected a JSON object"):
        load_gpu_spec(_write(tmp_path, [H100_LIKE]))
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x",\n "peak_flops": }', encoding="utf-8")
    with pytest.raises(CostModelError, match=r"bad\.json:2: invalid JSON"):
        load_gpu_spec(bad)


def test_resolve_gpu_unknown_name_lists_presets() -> None:
    with pytest.raises(CostModelError, match=r"unknown gpu 'b200'.*a100-80gb"):
        resolve_gpu("b200")


def test_gpu_spec_constructor_validates() -> None:
    with pytest.raises(CostModelError, match="hbm_bandwidth"):
        GPUSpec(**{**H100_LIKE, "hbm_bandwidth": float("inf")})  # type: ignore[arg-type]
