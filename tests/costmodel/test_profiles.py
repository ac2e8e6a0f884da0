"""Loading profiles: units, duplicates, and one-line errors naming file, line and column."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from kvsim.costmodel.layer_shapes import LINEAR_OPS
from kvsim.costmodel.profiles import ProfileError, load_profile_dir
from tests.costmodel.profile_factory import MODELS, compute_frame


def _write_compute(folder: Path, frame: pd.DataFrame, name: str = "gpu__ModelA__mlp.csv") -> Path:
    (folder / "compute").mkdir(parents=True, exist_ok=True)
    path = folder / "compute" / name
    frame.to_csv(path, index=False)
    return path


def _valid_compute() -> pd.DataFrame:
    frame = compute_frame(MODELS[0], tps=(1,)).head(5)
    for i, op in enumerate((*LINEAR_OPS, "emb")):
        frame[f"time_stats.{op}.median"] = 0.01 * (i + 1)
        frame[f"time_stats.{op}.max"] = 1.0  # other statistics are ignored
    return frame


def _one_line_error(folder: Path) -> str:
    with pytest.raises(ProfileError) as info:
        load_profile_dir(folder)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_times_are_seconds_and_duplicate_rows_are_merged_by_median(tmp_path: Path) -> None:
    frame = _valid_compute()
    dup = frame.iloc[[0, 0]].copy()
    dup["time_stats.add.median"] = [0.5, 0.7]
    _write_compute(tmp_path, pd.concat([frame, dup]))
    compute = load_profile_dir(tmp_path).compute
    assert len(compute) == 5
    first = compute[compute["num_tokens"] == frame["num_tokens"].iloc[0]]
    assert first["add"].item() == pytest.approx(0.5e-3)  # median of 0.009 ms (original), 0.5, 0.7
    assert compute["attn_pre_proj"].iloc[1] == pytest.approx(0.01e-3)
    assert set(compute["device"]) == {"gpu"} and set(compute["model"]) == {"ModelA"}
    assert (compute["head_dim"] == 128).all() and (compute["dtype_bytes"] == 2).all()


@pytest.mark.parametrize(
    "column", ["n_head", "num_tokens", "use_gated_mlp", "time_stats.mlp_act.median"]
)
def test_missing_column_names_file_and_column(tmp_path: Path, column: str) -> None:
    path = _write_compute(tmp_path, _valid_compute().drop(columns=column))
    message = _one_line_error(tmp_path)
    assert str(path) in message and repr(column) in message and "missing column" in message


@pytest.mark.parametrize(
    ("column", "value", "expected"),
    [
        ("time_stats.add.median", "abc", "positive time"),
        ("time_stats.add.median", "-0.01", "positive time"),
        ("time_stats.add.median", "", "positive time"),
        ("time_stats.add.median", "inf", "positive time"),
        ("num_tokens", "2.5", "positive integer"),
        ("num_tensor_parallel_workers", "3", "divisor of n_head"),
        ("use_gated_mlp", "maybe", "True or False"),
        ("n_embd", "4097", "same value on every row"),
    ],
)
def test_bad_value_names_file_line_and_column(
    tmp_path: Path, column: str, value: str, expected: str
) -> None:
    frame = _valid_compute().astype(str)
    frame.loc[2, column] = value
    path = _write_compute(tmp_path, frame)
    message = _one_line_error(tmp_path)
    assert message.startswith(f"{path}: line 4, column {column!r}:"), message
    assert expected in message


def test_bad_file_name_and_empty_folder(tmp_path: Path) -> None:
    _write_compute(tmp_path, _valid_compute(), name="no_model_mlp.csv")
    assert "DEVICE__MODEL__mlp.csv" in _one_line_error(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no profiles" in _one_line_error(empty)
    assert "not a folder" in _one_line_error(tmp_path / "missing")


def test_attention_rows_need_their_own_time_only(tmp_path: Path) -> None:
    frame = pd.DataFrame(
        {
            "n_embd": 8192, "n_q_head": 64, "n_kv_head": 8, "block_size": 16,
            "num_tensor_parallel_workers": 2, "batch_size": [1, 4],
            "prefill_chunk_size": [256, 0], "kv_cache_size": [0, 512], "is_prefill": [True, False],
            "time_stats.attn_prefill.median": [0.05, None],
            "time_stats.attn_decode.median": [None, 0.02],
        }
    )  # fmt: skip
    (tmp_path / "attention").mkdir()
    path = tmp_path / "attention" / "gpu__M__tp2__attention.csv"
    frame.to_csv(path, index=False)
    attention = load_profile_dir(tmp_path).attention
    assert attention["time_s"].tolist() == pytest.approx([2e-5, 5e-5])  # sorted: decode row first
    frame.loc[1, "time_stats.attn_decode.median"] = None
    frame.to_csv(path, index=False)
    message = _one_line_error(tmp_path)
    assert message.startswith(f"{path}: line 3, column 'time_stats.attn_decode.median'")


def test_allreduce_of_another_collective_is_refused(tmp_path: Path) -> None:
    (tmp_path / "network").mkdir()
    path = tmp_path / "network" / "sys_dgx__all_reduce.csv"
    pd.DataFrame(
        {
            "num_workers": [2],
            "devices_per_node": [2],
            "size": [2048],
            "collective": ["send_recv"],
            "time_stats.all_reduce.median": [0.01],
        }
    ).to_csv(path, index=False)
    assert (
        _one_line_error(tmp_path)
        == f"{path}: line 2, column 'collective': expected all_reduce, got 'send_recv'"
    )


def test_shipped_profiles_load(shipped_profiles: Path) -> None:
    profiles = load_profile_dir(shipped_profiles)
    assert profiles.devices == ["a100", "h100"]
    assert len(profiles.compute) == 7752 and len(profiles.attention) == 14318
