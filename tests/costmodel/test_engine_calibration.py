"""Engine mode as a second source of truth, end to end: kvsim profile --mode engine, kvsim
calibrate of the "cpu" device, kvsim validate-run on a trace the profile never saw.

Accuracy is not asserted here (it depends on how quiet the machine is; the acceptance figure
is benchmarks/bench_validate_run.py's); the files, their layout and the refusal of a noisy
profile are."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner, Result

from kvsim.cli import app
from kvsim.costmodel import load_coefficients
from kvsim.costmodel.profiles import load_profile_dir
from tests.costmodel.profile_factory import write_compute
from tests.costmodel.test_fit import GPU, KNOWN


def kvsim(*args: object) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args], terminal_width=200)


def test_calibrate_refuses_a_noisy_engine_profile_unless_told(tmp_path: Path) -> None:
    write_compute(tmp_path, KNOWN, GPU, "a100")
    meta = {"format": "kvsim-profile", "noise": {"spread_median": 0.3, "peak_drift": {}}}
    (tmp_path / "profile.json").write_text(json.dumps(meta))
    result = kvsim("calibrate", tmp_path, "--gpu", "a100-80gb", "-o", tmp_path / "co.json")
    assert result.exit_code == 2
    assert "spread 30%" in result.stderr and "--noisy-ok" in result.stderr
    assert not (tmp_path / "co.json").exists()
    ok = kvsim("calibrate", tmp_path, "--gpu", "a100-80gb", "-o", tmp_path / "co.json",
               "--noisy-ok")  # fmt: skip
    assert ok.exit_code == 0, ok.output
    (tmp_path / "profile.json").write_text(json.dumps({"format": "other"}))
    bad = kvsim("calibrate", tmp_path, "--gpu", "a100-80gb", "-o", tmp_path / "x.json")
    assert bad.exit_code == 2 and "profile.json: format must be 'kvsim-profile'" in bad.stderr


@pytest.mark.slow
def test_profile_calibrate_validate_run(tmp_path: Path) -> None:
    profile = tmp_path / "profile"
    result = kvsim("profile", "--mode", "engine", "--model", "tiny-llama", "--quick",
                   "--repeats", "3", "-o", profile)  # fmt: skip
    assert result.exit_code == 0, result.output
    meta = json.loads((profile / "profile.json").read_text())
    assert meta["threads"] == 1 and meta["kind"] == "engine" and "peak_drift" in meta["noise"]
    profiles = load_profile_dir(profile)
    assert set(profiles.attention["block_size"]) == {16, 32}
    assert profiles.steps["num_decode_seqs"].gt(0).any() and len(profiles.compute) == 9
    coefficients = tmp_path / "cpu.json"
    fitted = kvsim("calibrate", profile, "--gpu", profile / "device.json", "-o", coefficients,
                   "--noisy-ok")  # fmt: skip
    assert fitted.exit_code == 0, fitted.output
    co = load_coefficients(coefficients)
    assert co.gpu == "cpu" and co.num_sms == 1
    assert co.provenance["overheads"].kind == "fitted"
    assert co.provenance["allreduce"].kind == "absent"
    trace = tmp_path / "held_out.jsonl"
    lengths = ["--prompt", "uniform:16:200", "--output", "uniform:2:24", "--seed", "3"]
    generated = kvsim("gen", "-o", trace, "--rate", "50", "--num-requests", "12", *lengths)
    assert generated.exit_code == 0, generated.output
    out = tmp_path / "validation"
    compared = kvsim("validate-run", trace, "--model", "tiny-llama", "--coefficients",
                     coefficients, "--gpu", profile / "device.json", "--num-blocks", "256",
                     "--out", out)  # fmt: skip
    assert compared.exit_code == 0, compared.output
    assert "step time MAPE" in compared.stdout
    summary = json.loads((out / "comparison.json").read_text())
    assert summary["num_steps"]["engine"] > 10
    assert set(summary["relative_error"]) >= {"throughput_output_tokens_per_s", "ttft_s.mean"}
    steps = pd.read_csv(out / "steps.csv")
    assert (steps["measured_s"] > 0).all() and (steps["predicted_s"] > 0).all()
    again = kvsim("validate-run", trace, "--model", "tiny-llama", "--coefficients", coefficients,
                  "--gpu", profile / "device.json", "--out", out)  # fmt: skip
    assert again.exit_code == 2 and "--force replaces it" in again.stderr
    assert {p.name for p in out.iterdir()} == {
        "steps.csv", "comparison.json", "step_times.png", "step_timeline.png",
        "kvsim-manifest.json",
    }  # fmt: skip
