"""Coefficient files: round trip, and every bad key or value refused by file and key path."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from kvsim.costmodel import CostModelError
from kvsim.costmodel.coefficients import load_coefficients, save_coefficients, to_json_dict
from kvsim.costmodel.systems import SHIPPED_SYSTEMS, profile_systems
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
        (
            lambda d: d["allreduce"].update(system="b200_nvl"),
            "allreduce.system 'b200_nvl' is unknown (known: a100_dgx",
        ),
        (
            lambda d: d["allreduce"].update(system="none"),
            "allreduce.system 'none' means no all-reduce fit, but allreduce.by_num_workers "
            "fits [2, 4] workers",
        ),
        (
            lambda d: d["allreduce"].update(by_num_workers={}),
            "allreduce.by_num_workers is empty but allreduce.system is 'synth_dgx'",
        ),
    ],
)
def test_bad_file_is_refused_by_key(tmp_path: Path, edit, message: str) -> None:  # type: ignore[no-untyped-def]
    data = copy.deepcopy(to_json_dict(KNOWN))
    edit(data)
    path = _write(tmp_path, data)
    with pytest.raises(CostModelError) as info:
        load_coefficients(path)
    assert str(path) in str(info.value) and message in str(info.value), str(info.value)


def test_an_allreduce_system_is_shipped_or_named_by_its_profiles(tmp_path: Path) -> None:
    """A user's own system is accepted where provenance lists its network profile; a shipped
    system always; 'none' where the file has no all-reduce fit."""
    data = copy.deepcopy(to_json_dict(KNOWN))
    data["allreduce"]["system"] = "h100_pairwise_nvlink"
    assert load_coefficients(_write(tmp_path, data)).allreduce.system == "h100_pairwise_nvlink"
    data["allreduce"] = {"system": "none", "by_num_workers": {}}
    assert load_coefficients(_write(tmp_path, data)).allreduce.by_num_workers == {}
    assert load_coefficients(_write(tmp_path, to_json_dict(KNOWN))).allreduce.system == "synth_dgx"


def test_the_shipped_systems_are_the_shipped_network_profiles() -> None:
    network = Path(__file__).resolve().parents[2] / "profiles" / "vidur" / "network"
    assert profile_systems(p.name for p in network.iterdir()) == SHIPPED_SYSTEMS
