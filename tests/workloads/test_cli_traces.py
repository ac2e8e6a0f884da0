"""kvsim gen / import / info through typer's CliRunner: exit codes, messages, files written."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.commands.traces import ImportFormat
from workloads import IMPORTERS, load_trace

runner = CliRunner()
Write = Callable[[str, str], Path]


def run(*args: str | Path) -> tuple[int, str]:
    result = runner.invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


def test_import_formats_match_the_registry() -> None:
    assert [f.value for f in ImportFormat] == list(IMPORTERS)


def test_gen_writes_the_same_bytes_for_the_same_seed(tmp_path: Path) -> None:
    args = [
        "--rate",
        "5",
        "--num-requests",
        "50",
        "--prompt",
        "uniform:10:20",
        "--output",
        "fixed:3",
    ]
    first, second = tmp_path / "1" / "t.jsonl", tmp_path / "2" / "t.jsonl"
    first.parent.mkdir()
    second.parent.mkdir()
    assert run("gen", "-o", first, *args, "--seed", "4")[0] == 0
    code, output = run("gen", "-o", second, *args, "--seed", "4")
    assert code == 0 and "wrote 50 requests" in output
    assert first.read_bytes() == second.read_bytes()
    trace = load_trace(first)
    assert trace.name == "t" and {r.output_tokens for r in trace.requests} == {3}


def test_gen_gamma_over_a_duration_to_csv(tmp_path: Path) -> None:
    out = tmp_path / "g.csv"
    spec = ["--prompt", "lognormal:500:0.5:2000", "--output", "64"]
    code, _ = run("gen", "-o", out, "--arrival", "gamma", "--cv", "2", "--rate", "10",
                  "--duration", "30", *spec)  # fmt: skip
    assert code == 0
    assert all(r.arrival_time_s < 30 for r in load_trace(out).requests)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rate", "5", "--num-requests", "5", "--prompt", "uniform:5"], "bad length SPEC"),
        (["--rate", "5"], "give exactly one of --duration and --num-requests"),
        (["--num-requests", "5"], "--rate is required"),
        (["--rate", "-1", "--num-requests", "5"], "rate must be a positive number"),
        (["--rate", "1", "--cv", "3", "--num-requests", "5"], "use gamma"),
        (["--rate", "1", "--num-requests", "5", "--prompt", "trace:nowhere"], "no such file"),
    ],
)
def test_gen_bad_input_exits_2_and_writes_nothing(
    tmp_path: Path, args: list[str], message: str
) -> None:
    code, output = run("gen", "-o", tmp_path / "x.jsonl", *args)
    assert code == 2
    assert message in output and output.count("error:") == 1
    assert list(tmp_path.iterdir()) == []


def test_gen_rejects_unknown_extension(tmp_path: Path) -> None:
    code, output = run("gen", "-o", tmp_path / "x.txt", "--rate", "1", "--num-requests", "1")
    assert code == 2 and "unsupported file extension" in output


AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n" \
        "2023-11-16 18:15:50.9951690,396,0\n2023-11-16 18:17:50.0,10,10\n"  # fmt: skip


def test_import_azure_reports_drops_and_writes_the_trace(write: Write, tmp_path: Path) -> None:
    out = tmp_path / "conv.jsonl"
    code, output = run("import", "azure", write("azure.csv", AZURE), "-o", out)
    assert code == 0
    assert "imported 2 requests from 3 rows" in output
    assert "dropped 1: 1 with 0 generated tokens" in output
    trace = load_trace(out)
    assert trace.name == "conv" and [r.request_id for r in trace.requests] == ["0", "2"]


def test_import_limit_and_max_duration(write: Write, tmp_path: Path) -> None:
    source = write("azure.csv", AZURE.replace(",0\n", ",5\n"))
    assert run("import", "azure", source, "-o", tmp_path / "a.csv", "--max-duration", "60")[0] == 0
    assert len(load_trace(tmp_path / "a.csv")) == 2
    assert run("import", "azure", source, "-o", tmp_path / "b.json", "--limit", "1")[0] == 0
    assert len(load_trace(tmp_path / "b.json")) == 1


def test_import_lengths_needs_a_rate(write: Write, tmp_path: Path) -> None:
    source = write("l.csv", "num_prefill_tokens,num_decode_tokens\n5,6\n7,8\n")
    out = tmp_path / "l.jsonl"
    code, output = run("import", "lengths", source, "-o", out)
    assert code == 2 and "needs --rate" in output and not out.exists()
    code, _ = run("import", "lengths", source, "-o", out, "--rate", "2", "--arrival", "gamma",
                  "--cv", "4", "--seed", "1")  # fmt: skip
    assert code == 0 and len(load_trace(out)) == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["azure", "{src}", "--rate", "3"], "--rate applies only to the lengths format"),
        (["azure", "{dir}/missing.csv"], "missing.csv: No such file or directory"),
        (["mooncake", "{src}"], "malformed JSON"),
        (["burstgpt", "{src}"], "missing column Timestamp"),
    ],
)
def test_import_bad_input_exits_2(
    write: Write, tmp_path: Path, args: list[str], message: str
) -> None:
    source = write("azure.csv", AZURE)
    out = tmp_path / "out.jsonl"
    filled = [a.format(src=source, dir=tmp_path) for a in args]
    code, output = run("import", *filled, "-o", out)
    assert code == 2 and message in output
    assert not out.exists()


def test_import_unknown_format_is_a_usage_error(write: Write, tmp_path: Path) -> None:
    code, _ = run("import", "parquet", write("azure.csv", AZURE), "-o", tmp_path / "o.jsonl")
    assert code == 2


def test_info_table_and_json(write: Write, tmp_path: Path) -> None:
    code, output = run("info")
    assert code == 0 and "azure_llm_2023_conv_first_2min" in output and "456" in output
    code, output = run("info", "mooncake_fast25_conversation_first_1000", "--json")
    stats = json.loads(output)
    assert code == 0 and stats["num_requests"] == 1000 and stats["hash_block_size"] == 512


def test_info_bad_trace_is_one_red_line(write: Write) -> None:
    bad = write(
        "bad.jsonl",
        '{"request_id": "a", "arrival_time_s": 0, "prompt_tokens": 0, "output_tokens": 1}\n',
    )
    code, output = run("info", bad)
    assert code == 2
    assert output.strip().endswith("bad.jsonl:1: prompt_tokens must be a positive integer, got 0")
    code, output = run("info", "no_such_trace")
    assert code == 2 and "no shipped trace of that name" in output
