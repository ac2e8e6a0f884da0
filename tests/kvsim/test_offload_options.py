"""KV offload options (issue 29, docs/offload.md "Options"): --kv-offloading-size and its
policy, block size and link; refused at the boundary; a sweep axis; off, they change nothing
in config.json; sized into CPU chunks as vLLM's CPUOffloadingSpec does."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from kvsim.cli import app
from kvsim.config import RunConfig, offload_plan, option_specs
from kvsim.costmodel import CostModelError, resolve_model
from kvsim.costmodel.modelspec import ModelSpec
from kvsim.costmodel.offload import (
    GB,
    GPU_HOST_LINKS,
    LINK_PRESETS,
    OffloadLink,
    plan_offload,
    resolve_link,
)
from kvsim.sweep.spec import SweepError, make_spec, parse_param

TRACE = "azure_llm_2023_conv_first_2min"
QUICK = ("--until", "0.5", "--no-plots")
OFFLOAD_FIELDS = [n for n in option_specs() if n.startswith("kv_offload")]
DOCS = Path(__file__).parents[2] / "docs" / "offload.md"


def kvsim(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


def test_without_offload_config_json_has_no_offload_keys(tmp_path: Path) -> None:
    """A run without offload writes the config.json it wrote before the options existed;
    --kv-offloading-size 0 is the same run, byte for byte."""
    assert len(OFFLOAD_FIELDS) == 8
    absent, zero = tmp_path / "absent", tmp_path / "zero"
    assert kvsim("run", TRACE, *QUICK, "--out", absent).exit_code == 0
    result = kvsim("run", TRACE, *QUICK, "--kv-offloading-size", "0", "--out", zero)
    assert result.exit_code == 0, result.output
    options = json.loads((absent / "config.json").read_text())["options"]
    assert not [k for k in options if "offload" in k]
    for name in ("config.json", "requests.parquet", "steps.parquet", "events.parquet"):
        assert (absent / name).read_bytes() == (zero / name).read_bytes(), name
    summaries = [json.loads((f / "summary.json").read_text()) for f in (absent, zero)]
    for summary in summaries:  # what the machine's speed changes
        for key in ("wall_time_s", "sim_requests_per_wall_s", "sim_steps_per_wall_s"):
            del summary[key]
    assert summaries[0] == summaries[1]


def test_given_offload_options_reach_config_json_and_a_rerun(tmp_path: Path) -> None:
    first = tmp_path / "first"
    result = kvsim(
        "run", TRACE, *QUICK, "--out", first, "--kv-offloading-size", "64",
        "--kv-offload-policy", "arc", "--kv-offload-block-size", "32",
        "--kv-offload-link", "nvme-gen4", "--kv-offload-read-gbps", "3.5",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    options = json.loads((first / "config.json").read_text())["options"]
    assert {k: v for k, v in options.items() if "offload" in k} == {
        "kv_offloading_size": 64.0,
        "kv_offload_policy": "arc",
        "kv_offload_block_size": 32,
        "kv_offload_link": "nvme-gen4",
        "kv_offload_read_gbps": 3.5,
    }
    assert RunConfig.from_dict(options).to_dict() == options


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--kv-offloading-size", "-1"], "kv_offloading_size must be in [0, "),
        (["--kv-offloading-size", "8", "--kv-offload-block-size", "24"],
         "--kv-offload-block-size 24 must be a multiple of --block-size 16"),
        (["--kv-offload-policy", "fifo"], "kv_offload_policy must be one of lru, arc"),
        (["--kv-offload-link", "pcie9"], "kv_offload_link must be one of pcie4-host"),
        (["--kv-offload-write-gbps", "0"], "kv_offload_write_gbps must be a finite number > 0"),
        (["--kv-offload-latency-us", "-5"], "kv_offload_latency_us must be in [0, "),
        (["--kv-offloading-size", "8", "--scheduler", "classic"],
         "KV offload (--kv-offloading-size above 0) runs with the v1 scheduler"),
    ],
)  # fmt: skip
def test_bad_offload_options_are_one_line_exit_2(
    args: list[str], fragment: str, tmp_path: Path
) -> None:
    result = kvsim("run", TRACE, *QUICK, *args, "--out", tmp_path / "r")
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], lines
    assert not (tmp_path / "r").exists()


def test_kv_offloading_size_is_a_sweep_axis() -> None:
    axis = parse_param("kv_offloading_size=0,64,256")
    assert axis == ("kv_offloading_size", (0.0, 64.0, 256.0))
    spec = make_spec(RunConfig(trace=TRACE), [axis, parse_param("kv-offload-policy=lru,arc")])
    points = spec.points()
    assert [(p.config.kv_offloading_size, p.config.kv_offload_policy) for p in points] == [
        (size, policy) for size in (0.0, 64.0, 256.0) for policy in ("lru", "arc")
    ]
    assert [p.config.offloads() for p in points] == [False, False, True, True, True, True]
    bad = make_spec(RunConfig(trace=TRACE), [parse_param("kv_offloading_size=0,-1")])
    with pytest.raises(SweepError, match="kv_offloading_size must be in"):
        bad.points()
    with pytest.raises(SweepError, match="is not a number"):
        parse_param("kv_offloading_size=64GiB")


# --- sizing, as vLLM's CPUOffloadingSpec (vllm/v1/kv_offload/cpu/spec.py) --------------------


def test_llama_3_1_8b_chunks_on_h100() -> None:
    # 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 128 KiB a token, 2 MiB a block
    config = RunConfig(trace=TRACE, model="llama-3.1-8b", gpu="h100-sxm", kv_offloading_size=64)
    plan = offload_plan(config, resolve_model(config.model), "h100-sxm")
    assert plan is not None
    assert (plan.num_chunks, plan.blocks_per_chunk) == (64 * 1024 // 2, 1)
    assert plan.chunk_bytes == plan.gpu_block_transfer_bytes == 2 * 1024 * 1024
    assert plan.link == OffloadLink("pcie5-host", 50 * GB, 50 * GB, 5e-6)
    assert offload_plan(config.replace(kv_offloading_size=0.0), resolve_model("llama-3.1-8b"),
                        "h100-sxm") is None  # fmt: skip


def test_chunks_round_up_to_a_page_and_span_tensor_parallel_ranks() -> None:
    # 2 x 3 layers x 2 KV heads x 80 x 2 bytes = 1,920 bytes a token, 30,720 a 16-token block
    model = ModelSpec(name="odd", num_layers=3, hidden_size=320, num_heads=4, num_kv_heads=2,
                      head_dim=80, intermediate_size=640, vocab_size=1000, dtype_bytes=2,
                      num_params=10**6, max_model_len=4096)  # fmt: skip
    link = resolve_link(None, "h100-sxm")
    one = plan_offload(model, tp=1, gpu_block_size=16, size_gib=1.0, link=link)
    assert one.chunk_bytes == 32_768  # 30,720 rounded up to 8 pages of 4 KiB
    assert one.num_chunks == (1 << 30) // 32_768  # 32,768; unaligned it would be 34,952
    # tp=2: each GPU holds one KV head (half the bytes, its own link); a chunk has both
    two = plan_offload(model, tp=2, gpu_block_size=16, size_gib=1.0, link=link)
    assert (two.gpu_block_transfer_bytes, two.chunk_bytes) == (15_360, 32_768)
    # offloaded blocks of 48 tokens: three GPU blocks a chunk, 92,160 -> 94,208 bytes
    big = plan_offload(model, tp=1, gpu_block_size=16, size_gib=1.0, offload_block_size=48,
                       link=link)  # fmt: skip
    assert (big.blocks_per_chunk, big.chunk_bytes) == (3, 94_208)
    assert big.num_chunks == (1 << 30) // 94_208
    with pytest.raises(CostModelError, match="holds no chunk"):
        plan_offload(model, tp=1, gpu_block_size=16, size_gib=1e-6, link=link)


def test_the_link_defaults_to_the_gpus_host_link_and_takes_overrides() -> None:
    assert resolve_link(None, "a100-80gb").preset == "pcie4-host"
    assert resolve_link(None, "h200").preset == "pcie5-host"
    assert resolve_link(None, "my-gpu-from-a-spec-file").preset == "pcie5-host"
    link = resolve_link("nvme-gen4", "h100-sxm", write_gbps=2.0, latency_us=20.0)
    assert link == OffloadLink("nvme-gen4", 7 * GB, 2 * GB, 20e-6)
    assert set(GPU_HOST_LINKS.values()) <= set(LINK_PRESETS)


def test_docs_list_every_preset_with_its_numbers() -> None:
    """docs/offload.md's preset table says what the code uses."""
    text = DOCS.read_text(encoding="utf-8")
    for preset in LINK_PRESETS.values():
        row = next((line for line in text.splitlines() if line.startswith(f"| `{preset.name}`")),
                   None)  # fmt: skip
        assert row is not None, preset.name
        cells = [c.strip() for c in row.strip("|").split("|")]
        numbers = [float(re.sub(r"[^0-9.]", "", c)) for c in cells[2:5]]
        wanted = [preset.read_bytes_per_s / GB, preset.write_bytes_per_s / GB,
                  preset.latency_s * 1e6]  # fmt: skip
        assert numbers == pytest.approx(wanted), preset.name
