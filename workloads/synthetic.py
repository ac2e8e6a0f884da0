"""Seeded synthetic traces: an arrival process plus prompt/output length SPECs.

Random numbers are drawn in a fixed order (arrival gaps, then prompt lengths, then output
lengths) from one ``numpy.random.Generator``, so the same seed gives the same trace and, through
:func:`workloads.formats.save_trace`, a byte-identical file.
"""

from __future__ import annotations

import numpy as np

from workloads.arrivals import ArrivalProcess, as_rng
from workloads.errors import WorkloadError
from workloads.lengths import (
    LengthKind,
    LengthSpec,
    parse_length_spec,
    sample_lengths,
    trace_lengths,
)
from workloads.request import Request, Trace


def sample_prompt_output(
    prompt: LengthSpec, output: LengthSpec, count: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and output lengths; resampled as pairs when both SPECs name the same trace."""
    same_trace = (
        prompt.kind is LengthKind.TRACE
        and output.kind is LengthKind.TRACE
        and prompt.source == output.source
    )
    if same_trace:
        assert prompt.source is not None
        prompts, outputs = trace_lengths(prompt.source)
        rows = rng.integers(0, len(prompts), count)
        return prompts[rows], outputs[rows]
    return (
        sample_lengths(prompt, count, rng, column="prompt"),
        sample_lengths(output, count, rng, column="output"),
    )


def generate_trace(
    *,
    arrivals: ArrivalProcess,
    prompt: LengthSpec | str,
    output: LengthSpec | str,
    num_requests: int | None = None,
    duration_s: float | None = None,
    seed: int | np.random.Generator = 0,
    name: str = "synthetic",
) -> Trace:
    """A synthetic trace of ``num_requests`` requests, or of all arrivals before ``duration_s``.

    Request ids are "0", "1", ... in arrival order. Raises SpecError for bad parameters (a
    negative seed, a count past MAX_GENERATED_REQUESTS, lengths past MAX_TOKENS, arrivals past
    MAX_TIME_S) and WorkloadError when no request arrives within ``duration_s``.
    """
    rng = as_rng(seed)
    prompt_spec = parse_length_spec(prompt) if isinstance(prompt, str) else prompt
    output_spec = parse_length_spec(output) if isinstance(output, str) else output
    times = arrivals.times(rng, num_requests=num_requests, duration_s=duration_s)
    if len(times) == 0:
        raise WorkloadError(
            f"no request arrives within {duration_s} s at {arrivals.rate_per_s} requests/s"
        )
    prompts, outputs = sample_prompt_output(prompt_spec, output_spec, len(times), rng)
    requests = [
        Request(request_id=str(index), arrival_time_s=t, prompt_tokens=p, output_tokens=o)
        for index, (t, p, o) in enumerate(
            zip(times.tolist(), prompts.tolist(), outputs.tolist(), strict=True)
        )
    ]
    return Trace(name=name, hash_block_size=None, requests=requests)
