"""Hostile HF model configs, GPU spec files and cost-model coefficient files through
``kvsim run --model / --gpu / --coefficients`` (the rule every case keeps: hostile_harness.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hostile_harness import (  # noqa: F401  (one_click_command: an autouse fixture)
    HUGE_INT,
    OSC8,
    QUICK,
    Case,
    check,
    one_click_command,
    run_cases,
)

# --- HF model configs, GPU specs, coefficients -------------------------------------------------

LLAMA = {
    "model_type": "llama", "num_hidden_layers": 4, "hidden_size": 256,
    "num_attention_heads": 8, "num_key_value_heads": 4, "intermediate_size": 688,
    "vocab_size": 1000, "max_position_embeddings": 4096, "torch_dtype": "float16",
}  # fmt: skip
GPU = {
    "name": "mygpu", "memory_bytes": 80e9, "peak_flops": 312e12, "memory_bandwidth": 2.0e12,
}  # fmt: skip


def spec_cases(flag: str, good: dict[str, Any], file: str, every: int = 1) -> list[Case]:
    """Each field set to each bad value (every ``every``-th of these), then whole-file faults."""
    cases = []
    mutations: list[tuple[str, Any]] = []
    for key in good:
        for value in (0, -1, None, "32", 1.5, True, [], {}, 10**400, float("nan"), "x" * 500):
            mutations.append((key, value))
    for i, (key, value) in enumerate(mutations):
        if i % every:
            continue
        data = {**good, key: value}
        text = json.dumps(data, allow_nan=True).replace(json.dumps(10**400), "1" + "0" * 400)
        cases.append(
            Case(
                f"{flag}-{key}-{i}",
                lambda f: ["run", flag, file, *QUICK, "--out", "o"],
                names=(file,),
                setup=lambda f, text=text: (f / file).write_text(text),
            )
        )
    for key, text in {
        "list": "[1]",
        "deep": "{" + '"a":{' * 50_000 + "}" * 50_001,
        "huge-int": "{" + f'"{next(iter(good))}": {HUGE_INT}' + "}",
        "not-json": "nope",
        "unknown-key": json.dumps({**good, "bogus_key": 1}),
    }.items():
        cases.append(
            Case(
                f"{flag}-{key}",
                lambda f: ["run", flag, file, *QUICK, "--out", "o"],
                names=(file,),
                setup=lambda f, text=text: (f / file).write_text(text),
                must_fail=key != "unknown-key" or flag != "--model",
            )
        )
    return cases


def test_hf_model_configs(tmp_path: Path) -> None:
    # every third field-and-value pair (each bad value still meets three of the nine fields):
    # a model config kvsim accepts makes a whole run (0.6 s), and a dozen of them are accepted
    run_cases(spec_cases("--model", LLAMA, "config.json", every=3), tmp_path)


@pytest.mark.slow
def test_hf_model_configs_every_case(tmp_path: Path) -> None:
    run_cases(spec_cases("--model", LLAMA, "config.json"), tmp_path)


def test_gpu_specs(tmp_path: Path) -> None:
    run_cases(spec_cases("--gpu", GPU, "gpu.json"), tmp_path)


def test_coefficient_files(tmp_path: Path) -> None:
    cases = []
    for i, text in enumerate(
        ["[]", "{", '{"bogus": 1}', '{"compute_efficiency": -1}', '{"compute_efficiency": "1"}',
         '{"compute_efficiency": NaN}', '{"memory_efficiency": 2}', "[" * 50_000, ""]
    ):  # fmt: skip
        cases.append(
            Case(
                f"coefficients-{i}",
                lambda f: ["run", "--coefficients", "k.json", *QUICK, "--out", "o"],
                names=("k.json",),
                setup=lambda f, text=text: (f / "k.json").write_text(text),
                must_fail=True,
            )
        )
    run_cases(cases, tmp_path)
