"""`kvsim run --kv-offloading-size S --kv-offload-tier NAME:SIZE` (docs/offload.md, "Secondary
tiers"): a prefix that fell out of the GPU and the CPU tier comes back from the disk tier
(promoted into the CPU tier, then loaded), and the tier's figures reach summary.json,
steps.parquet, transfers.parquet and the terminal summary; bad specs are refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from test_offload_run import MODEL, kvsim, write_trace

from kvsim.outputs.report import offload_rows

# 4 chunks of 2 MiB: the CPU tier holds four 16-token blocks of llama-3.1-8b
CPU_GIB = str(4 * 2 / 1024)


def run(tmp_path: Path, name: str, *extra: str) -> Path:
    # r1 (unrelated, 4 blocks) evicts most of r0's blocks from the GPU (6 blocks) and its 3
    # chunks from the CPU tier (4 chunks); r2 extends r0's prompt
    trace = write_trace(tmp_path / "t.jsonl", [[1, 2, 3], [9, 8, 7, 6], [1, 2, 3, 4]])
    out = tmp_path / name
    result = kvsim(
        "run", trace, *MODEL, "--num-blocks", "6", "--kv-offloading-size", CPU_GIB,
        *extra, "--out", out, "--no-plots",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "disk tier" in result.output if extra else "disk tier" not in result.output
    return out


def test_a_prefix_the_cpu_tier_lost_comes_back_from_the_disk_tier(tmp_path: Path) -> None:
    cpu_only = run(tmp_path, "cpu")
    disk = run(tmp_path, "disk", "--kv-offload-tier", "disk:1GiB")
    hit = {}
    for out in (cpu_only, disk):
        requests = pq.read_table(out / "requests.parquet").to_pandas().set_index("request_id")
        r2 = requests.loc["r2"]
        hit[out.name] = r2["prefix_hit_tokens"] + r2["offload_hit_tokens"]
    assert hit["disk"] > hit["cpu"]
    offload = json.loads((disk / "summary.json").read_text())["offload"]
    (tier,) = offload["tiers"]
    assert tier["tier"] == "disk" and tier["capacity_chunks"] == 512  # 1 GiB / 2 MiB
    assert tier["chunks_promoted"] == tier["chunks_loaded"] == 2  # r0's 2 chunks past the GPU hit
    assert tier["hit_tokens"] == 16 * tier["chunks_loaded"]
    # every chunk the CPU tier stored is cascaded to the disk (r0's 3, r1's 4, r2's last)
    assert tier["writes"]["chunks"] == offload["stores"]["chunks"] == 8
    assert tier["writes"]["bytes"] == 8 * 2 * 2**20
    assert tier["reads"]["bytes"] == tier["chunks_promoted"] * 2 * 2**20
    # a promotion's time: 80 us + its bytes at 7 GB/s (NVMe gen4 preset), one at a time here
    transfers = pq.read_table(disk / "transfers.parquet").to_pandas()
    reads = transfers[(transfers["tier"].astype(str) == "disk") & (transfers["kind"] == "load")]
    assert len(reads) == tier["reads"]["jobs"] >= 1
    for _, row in reads.iterrows():
        assert row["transfer_s"] == pytest.approx(80e-6 + row["bytes"] / 7e9, rel=1e-9)
    steps = pq.read_table(disk / "steps.parquet").to_pandas()
    assert steps["offload_disk_chunks"].max() == tier["chunks_peak"] == 8  # held or being written
    assert "offload_disk_chunks" not in pq.read_table(cpu_only / "steps.parquet").column_names
    assert "tiers" not in json.loads((cpu_only / "summary.json").read_text())["offload"]
    rows = dict(offload_rows(json.loads((disk / "summary.json").read_text())))
    assert rows["disk tier: tokens served / chunks promoted"] == "32 / 2"  # report.html
    options = json.loads((disk / "config.json").read_text())["options"]
    assert options["kv_offload_tier"] == "disk:1GiB"
    assert "kv_offload_tier" not in json.loads((cpu_only / "config.json").read_text())["options"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--kv-offload-tier", "disk"], "--kv-offload-tier 'disk': give a name and a size"),
        (["--kv-offload-tier", "tape:1TiB"], "unknown tier 'tape' without link numbers"),
        (["--kv-offload-tier", "disk:2XB"], "size '2XB' is not a number with a unit"),
        (["--kv-offload-tier", "disk:0"], "size must be > 0"),
        (["--kv-offload-tier", "x:1TiB:7:0:80"], "WRITE_GBPS must be > 0"),
        (["--kv-offload-tier", "disk:1TiB,disk:2TiB"], "tier name 'disk' is used twice"),
        (["--kv-offloading-size", "0", "--kv-offload-tier", "disk:1TiB"],
         "--kv-offload-tier needs --kv-offloading-size above 0"),
    ],
)  # fmt: skip
def test_a_bad_tier_spec_is_one_line_naming_the_option(
    tmp_path: Path, args: list[str], fragment: str
) -> None:
    extra = [] if "--kv-offloading-size" in args else ["--kv-offloading-size", "1"]
    result = kvsim("run", "azure_llm_2023_conv_first_2min", *extra, *args, "--out", tmp_path)
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and fragment in lines[0] and "--kv-offload-tier" in lines[0], lines
