"""The vllm-0.15 stack's front-end latency, fitted on the four Llama-2-7B TP1 runs and nowhere
else (docs/costmodel.md, "The client's clock"), and what the TTFT those runs measured is made
of in kvsim: the wait for the running step to end, the step that was already scheduled (async
scheduling), the request's own prefill step, and the residual the front end must explain.

    PYTHONPATH=. python benchmarks/fit_frontend_latency.py      # ~10-40 s (five stages)

Each workload of the shipped SPEC is replayed as ``kvsim validate-real`` replays it, with the
front end at 0; the residual (measured - predicted TTFT mean) of each served stage is set
beside its parts, and the constant that minimizes the squared relative TTFT errors is printed:
the one kvsim/costmodel/stacks.py ships, rounded to 0.1 ms (tests/kvsim/test_validate_real.py
holds them equal). The held-out runs (bench_heldout_real.py) play no part.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import numpy as np

from kvsim.analysis.table import is_label
from kvsim.costmodel.stacks import VLLM_0_15
from kvsim.outputs.real_spec import load_real_spec
from kvsim.outputs.validate_real import (
    STATUS_FINISHED,
    client_view,
    fit_frontend_latency_s,
    run_config,
    spec_coefficients,
    stage_results,
)
from kvsim.runner import run
from workloads import save_trace
from workloads.shared_prefix import shared_prefix_trace, stage_of

SPEC = "vllm-0.15.1_h100-sxm_llama-2-7b"


def main() -> None:
    spec = load_real_spec(SPEC)
    spec = dataclasses.replace(spec, deployment={**spec.deployment, "frontend_latency_s": 0.0})
    view = client_view(spec)
    measured, predicted = [], []
    print(
        f"{'stage':<22}{'measured':>9}{'kvsim':>8}{'wait':>7}{'ahead':>7}{'own':>7}"
        f"{'resid':>7}{'resid/step':>11}{'uncached':>9}   (ms; TTFT means, finished requests)"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for workload in spec.workloads:
            trace = Path(tmp) / f"{workload.recipe.name}.jsonl"
            save_trace(shared_prefix_trace(workload.recipe), trace)
            result = run(run_config(spec, trace, spec_coefficients(spec)), keep_events=False)
            table = result.requests_table
            stages = np.array([stage_of(str(i)) for i in table["request_id"]])
            finished = is_label(table, "status", STATUS_FINISHED)
            for stage in stage_results(workload, result, view):
                real = stage.measured.ttft_ms
                if stage.saturated or real is None:
                    continue
                mine = finished & (stages == stage.stage)
                step = 1e3 * float(table["prefill_time_s"][mine].mean())
                wait = 1e3 * float(table["queueing_delay_s"][mine].mean())
                busy = table["queueing_delay_s"][mine] > 0
                ahead = 1e3 * float(np.where(busy, table["prefill_time_s"][mine], 0.0).mean())
                uncached = float(
                    (table["prompt_tokens"][mine] - table["prefix_hit_tokens"][mine]).mean()
                )
                kvsim = stage.predicted["ttft_ms.mean"]
                measured.append(real)
                predicted.append(kvsim)
                name = f"{stage.workload} {stage.rate_per_s:g}/s"
                print(
                    f"{name:<22}{real:>9.1f}{kvsim:>8.2f}{wait:>7.2f}{ahead:>7.2f}{step:>7.2f}"
                    f"{real - kvsim:>7.2f}{(real - kvsim) / step:>11.2f}{uncached:>9.1f}"
                )
    fit = fit_frontend_latency_s(np.array(measured), np.array(predicted))
    print(f"\nfront end, least squares on relative TTFT error: {1e3 * fit:.2f} ms")
    print(f"shipped (stacks.py, {VLLM_0_15.name}): {1e3 * VLLM_0_15.frontend_latency_s:.2f} ms")


if __name__ == "__main__":
    main()
