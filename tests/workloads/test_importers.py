"""Importers convert small fixture files of each public format; the shipped traces load."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from workloads import (
    DEFAULT_TRACE,
    IMPORTERS,
    ArrivalProcess,
    TraceFormatError,
    load_trace,
    shipped_trace_names,
    shipped_trace_path,
)
from workloads.importers import import_azure, import_burstgpt, import_lengths, import_mooncake

Write = Callable[[str, str], Path]


def test_registry_names() -> None:
    assert list(IMPORTERS) == ["azure", "mooncake", "lengths", "burstgpt"]


def test_azure_parses_7_digit_fractions_and_drops_empty_rows(write: Write) -> None:
    path = write(
        "AzureLLMInferenceTrace_conv.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
        "2023-11-16 18:15:51.0000000,0,5\n"
        "2023-11-16 18:16:01.1234567,10,0\n"
        "2023-11-17 00:00:00,7,8\n",
    )
    result = import_azure(path)
    trace = result.trace
    assert trace.name == "AzureLLMInferenceTrace_conv"
    assert [(r.request_id, r.arrival_time_s) for r in trace.requests] == [
        ("0", 0.0),
        ("1", 4.314579),
        ("4", 20653.31941),
    ]
    assert (trace.requests[1].prompt_tokens, trace.requests[1].output_tokens) == (396, 109)
    assert result.num_rows == 5
    assert result.dropped == {"0 context tokens": 1, "0 generated tokens": 1}
    assert result.num_dropped == 2


def test_azure_honours_zones_and_subtracts_the_earliest(write: Write) -> None:
    path = write(
        "a.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens,Extra\n"
        "2024-05-10 02:00:01.5+02:00,5,5,x\n"
        "2024-05-10T00:00:00Z,5,5,y\n",
    )
    times = [r.arrival_time_s for r in import_azure(path).trace.requests]
    assert times == [0.0, 1.5]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("yesterday,1,1", "a.csv:3: TIMESTAMP must look like 2023-11-16 18:15:46.6805900, got"),
        ("2023-11-16 18:15:47.0,-1,1", "a.csv:3: ContextTokens must be >= 0, got -1"),
        ("2023-11-16 18:15:47.0,1,2.5", "a.csv:3: GeneratedTokens must be a whole number"),
    ],
)
def test_azure_bad_rows(write: Write, row: str, message: str) -> None:
    path = write(
        "a.csv", f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.0,1,1\n{row}\n"
    )
    with pytest.raises(TraceFormatError) as info:
        import_azure(path)
    assert str(info.value).replace(f"{path.parent}/", "").startswith(message)


def test_azure_missing_column(write: Write) -> None:
    with pytest.raises(TraceFormatError, match=r"a\.csv:1: missing column GeneratedTokens"):
        import_azure(write("a.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.0,1\n"))


def test_mooncake_keeps_hash_ids_with_512_token_blocks(write: Write) -> None:
    path = write(
        "mc.jsonl",
        '{"timestamp": 0, "input_length": 1025, "output_length": 5, "hash_ids": [0, 1, 2]}\n'
        '{"timestamp": 3000, "input_length": 512, "output_length": 0, "hash_ids": [0]}\n'
        '{"timestamp": 1500, "input_length": 100, "output_length": 7, "hash_ids": [9], "x": 1}\n',
    )
    result = import_mooncake(path)
    assert result.trace.hash_block_size == 512
    assert [(r.request_id, r.arrival_time_s, r.hash_ids) for r in result.trace.requests] == [
        ("0", 0.0, (0, 1, 2)),
        ("2", 1.5, (9,)),
    ]
    assert result.dropped == {"0 output tokens": 1}


def test_mooncake_hash_ids_must_cover_the_prompt(write: Write) -> None:
    path = write(
        "mc.jsonl",
        '{"timestamp": 0, "input_length": 1025, "output_length": 5, "hash_ids": [0, 1]}\n',
    )
    with pytest.raises(TraceFormatError) as info:
        import_mooncake(path)
    assert info.value.line == 1
    assert info.value.field == "hash_ids"


def test_lengths_pairs_rows_with_seeded_arrivals(write: Write) -> None:
    path = write(
        "lens.csv",
        "num_prefill_tokens,num_decode_tokens,num_total_tokens\n74,918,992\n0,5,5\n290,905,1195\n8.0,2,10\n",
    )
    process = ArrivalProcess(rate_per_s=2.0)
    first = import_lengths(path, arrivals=process, seed=3)
    again = import_lengths(path, arrivals=process, seed=3)
    assert first.trace == again.trace
    assert [(r.request_id, r.prompt_tokens, r.output_tokens) for r in first.trace.requests] == [
        ("0", 74, 918),
        ("2", 290, 905),
        ("3", 8, 2),
    ]
    assert first.dropped == {"0 prefill tokens": 1}
    times = [r.arrival_time_s for r in first.trace.requests]
    drawn = process.times(np.random.default_rng(3), num_requests=3)
    assert times[0] == 0.0  # like every importer: the first kept request arrives at 0
    assert times == pytest.approx((drawn - drawn[0]).tolist(), abs=1e-9)
    assert len(import_lengths(path, arrivals=process, num_requests=2).trace) == 2
    with pytest.raises(ValueError, match="asked for 4 requests but the file has 3 usable rows"):
        import_lengths(path, arrivals=process, num_requests=4)


def test_burstgpt_drops_and_counts_failed_rows(write: Write) -> None:
    path = write(
        "BurstGPT_1.csv",
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n"
        "45,ChatGPT,1087,0,1087,Conversation log\n"
        "118,GPT-4,417,276,693,API log\n"
        "120,GPT-4,0,10,10,API log\n",
    )
    result = import_burstgpt(path)
    assert [(r.request_id, r.arrival_time_s) for r in result.trace.requests] == [
        ("0", 0.0),
        ("2", 113.0),
    ]
    assert result.dropped == {"failed (0 response tokens)": 1, "0 request tokens": 1}
    assert result.num_rows == 4


def test_shipped_traces_load_with_documented_counts() -> None:
    counts = {name: len(load_trace(shipped_trace_path(name))) for name in shipped_trace_names()}
    assert counts == {
        "azure_llm_2023_code": 8_819,
        "azure_llm_2023_conv": 19_366,
        "azure_llm_2023_conv_first_2min": 456,
        "mooncake_fast25_conversation": 12_031,
        "mooncake_fast25_conversation_first_1000": 1_000,
    }
    default = load_trace(DEFAULT_TRACE)
    assert default.requests[-1].arrival_time_s < 120
    mooncake = load_trace(shipped_trace_path("mooncake_fast25_conversation"))
    sample = load_trace(shipped_trace_path("mooncake_fast25_conversation_first_1000"))
    assert mooncake.hash_block_size == sample.hash_block_size == 512
    assert all(r.hash_ids for r in mooncake.requests)
    assert sample.requests == mooncake.requests[:1_000]  # the sample is the whole trace's head


def test_unknown_shipped_name_lists_the_names() -> None:
    with pytest.raises(ValueError, match="shipped: azure_llm_2023_code, "):
        shipped_trace_path("nope")
