"""Coefficient files: round trip, and every bad key or value refused by file and key path."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from kvsim.costmodel import CostModelError
from kvsim.costmodel.coefficients import load_coefficients, save_coefficients, to_json_dict
from tests.costmodel.test_fit import KNOWN


def _write(tmp_path: Path, data: dict[str, object]) -> Path:
    path = tmp_path / "co.json"
    path.write_text(json.dumps(data))
    return path


def test_round_trip(tmp_path: Path) -> None:
    save_coefficients(KNOWN, tmp_path / "co.json")
    assert load_coefficients(tmp_path / "co.json") == KNOWN
    text = (tmp_path / "co.json").read_text()
    assert '"format": "kvsim-step-coefficients"' in text and '"version": 1' in text


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(version=2), "version 2 is not 'kvsim-step-coefficients' version 1"),
        (
            lambda d: d["linear"]["gemm"].update(bw_efficiency=120.0),
            "linear.gemm.bw_efficiency: an efficiency must be in (0, 100]",
        ),
        (lambda d: d["linear"]["gemm"].pop("latency_s"), "linear.gemm: missing key 'latency_s'"),
        (lambda d: d["linear"]["add"].update(latency=1.0), "linear.add: unknown key 'latency'"),
        (lambda d: d["attention"]["decode"].update(latency_s=-1.0), "attention.decode.latency_s"),
        (lambda d: d["linear"].pop("mlp_act"), "linear: missing key 'mlp_act'"),
        (
            lambda d: d["allreduce"]["by_num_workers"].update({"1": []}),
            "allreduce.by_num_workers.1",
        ),
        (lambda d: d["linear"]["gemm"].update(m_tile_tokens=1.5), "linear.gemm.m_tile_tokens"),
    ],
)
def test_bad_file_is_refused_by_key(tmp_path: Path, edit, message: str) -> None:  # type: ignore[no-untyped-def]
    data = copy.deepcopy(to_json_dict(KNOWN))
    edit(data)
    path = _write(tmp_path, data)
    with pytest.raises(CostModelError) as info:
        load_coefficients(path)
    assert str(path) in str(info.value) and message in str(info.value), str(info.value)
