"""``kvsim cache-curve TRACE``: offline prefix-cache hit rate against cache capacity.

Hands off to kvsim.analysis.cache_curve (the curves) and kvsim.outputs.curve_folder (curve.csv,
curve.png); only this edge turns their exceptions into one red line and exit code 2.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from kvsim.commands.console import Command, console, fail, say
from kvsim.config import RunConfig, option_specs
from kvsim.errors import KvsimError
from workloads import WorkloadError

_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(RunConfig)}
_SPECS = option_specs()


def _run_option(name: str) -> Any:
    """The Typer option of a RunConfig field, with kvsim run's help and unit."""
    spec = _SPECS[name]
    return typer.Option(spec.cli_flag(name), help=spec.help, metavar=spec.unit)


_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def parse_capacities(text: str) -> list[float]:
    """``1e5,1e6,3e6,inf`` as capacities in tokens; a bad item is one clear message."""
    values = []
    for item in text.split(","):
        spelled = item.strip()
        # float() also takes 1_000, nan and "infinity"; a number past float range becomes inf
        value = float(spelled) if _NUMBER.fullmatch(spelled) else math.nan
        if spelled.lower() == "inf":
            value = math.inf
        elif math.isnan(value):
            fail(f"--capacity-tokens: {spelled!r} is not a number of tokens (or inf)")
        elif math.isinf(value):
            fail(f"--capacity-tokens: {spelled} is too large a number (write inf for unlimited)")
        if not value > 0:
            fail(f"--capacity-tokens: capacities must be > 0 tokens (or inf), got {item.strip()}")
        values.append(value)
    return values


def pool_capacity(trace: str, model: str, gpu: str, tp: int, block_size: int) -> tuple[int, str]:
    """The KV pool ``kvsim run TRACE --model --gpu --tp --block-size`` would plan from GPU
    memory (the same plan_num_blocks call as kvsim.runner.resolve_num_blocks, with RunConfig's
    values for the other memory options; the runner itself is not imported, it would cost the
    command a second of imports): tokens, and a label for it."""
    from kvsim.config import scheduling_limits
    from kvsim.costmodel import plan_num_blocks, resolve_gpu, resolve_model

    config = RunConfig(trace=trace, model=model, gpu=gpu, tp=tp, block_size=block_size)
    model_spec, gpu_spec = resolve_model(config.model), resolve_gpu(config.gpu)
    limits = scheduling_limits(config, gpu_spec, model_spec.max_model_len)
    plan = plan_num_blocks(
        model_spec,
        gpu_spec,
        config.block_size,
        gpu_memory_utilization=config.gpu_memory_utilization,
        tp=config.tp,
        max_num_batched_tokens=limits.max_num_batched_tokens,
        max_num_seqs=limits.max_num_seqs,
    )
    gpus = gpu_spec.name if tp == 1 else f"{tp} x {gpu_spec.name}"
    return plan.num_blocks * block_size, f"KV pool of {model_spec.name} on {gpus}"


def _percent(rate: float) -> str:
    return f"{100 * rate:.2f}%"


def _tokens(value: float) -> str:
    if math.isinf(value):
        return "unlimited"
    return f"{int(value):,}" if value.is_integer() and value < 1e15 else f"{value:.6g}"


def _table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="prefix-cache hit rate (share of prompt tokens)")
    for column in ("capacity (tokens)", "blocks", "LRU", "optimal"):
        table.add_column(column, justify="right")
    by_capacity: dict[float, dict[str, Any]] = {}
    for row in rows:
        by_capacity.setdefault(row["capacity_tokens"], {})[row["policy"]] = row
    for capacity, policies in by_capacity.items():
        blocks = policies["lru"]["capacity_blocks"]
        table.add_row(
            _tokens(capacity),
            _tokens(blocks),
            _percent(policies["lru"]["hit_rate"]),
            _percent(policies["optimal"]["hit_rate"]),
        )
    return table


def cache_curve_command(
    trace: Annotated[
        str,
        typer.Argument(metavar="TRACE", help="Trace file with hash_ids, or a shipped trace name"),
    ],
    block_size: Annotated[
        int | None,
        typer.Option(
            help="Tokens per KV block", metavar="TOKENS", show_default="the trace's hash_block_size"
        ),
    ] = None,
    capacity_tokens: Annotated[
        str | None,
        typer.Option(
            help="Cache capacities, comma-separated, inf for unlimited (e.g. 1e5,1e6,3e6,inf)",
            metavar="TOKENS,...",
            show_default="a log grid up to the working set",
        ),
    ] = None,
    model: Annotated[str, _run_option("model")] = _DEFAULTS["model"],
    gpu: Annotated[str, _run_option("gpu")] = _DEFAULTS["gpu"],
    tp: Annotated[int, _run_option("tp")] = _DEFAULTS["tp"],
    num_blocks: Annotated[int | None, _run_option("num_blocks")] = _DEFAULTS["num_blocks"],
    tiers: Annotated[
        str | None,
        typer.Option(
            help="Two tiers: GPU and CPU capacities, each a number of tokens, N blocks, a "
            "size in bytes (KiB, MiB, GiB, TiB, KB, ...) or inf, e.g. gpu:1e5,30000blocks,"
            "cpu:0,16GiB,64GiB: a GPU x CPU table of hit rates (vLLM's native offloading)",
            metavar="gpu:CAPS,cpu:CAPS",
            show_default="one tier",
        ),
    ] = None,
    kv_offloading_size: Annotated[
        float | None,
        typer.Option(
            help="With --tiers: mark a CPU tier of this size (vLLM's --kv-offloading-size) "
            "and print the hit rate it adds to the pool",
            metavar="GiB",
            show_default="none",
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Folder for curve.csv and curve.png (with --tiers: tiers.csv and tiers.png)",
            metavar="DIR",
            show_default="write nothing",
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace the --out folder if kvsim wrote it")
    ] = False,
) -> None:
    """Prefix-cache hit rate against cache capacity for a trace with hash_ids: LRU at every
    capacity (stack distances) and the optimal policy (Belady), the upper bound no eviction
    policy can beat. No simulation: vLLM's hit semantics on an idealised cache.

    The capacity of the --model/--gpu/--tp KV pool (planned as kvsim run does, or
    --num-blocks) is marked. With --tiers: a GPU tier of each capacity plus a CPU tier of each
    capacity, as vLLM's native KV offloading serves it (docs/metrics.md)."""
    if num_blocks is not None and num_blocks < 1:
        fail(f"--num-blocks: a KV pool has >= 1 blocks, got {num_blocks}")
    if tiers is not None:
        if capacity_tokens is not None:
            fail("--capacity-tokens and --tiers cannot be combined: --tiers gives the capacities")
        _run_tiers(trace, tiers, block_size, model, gpu, tp, num_blocks,
                   kv_offloading_size, out, force)  # fmt: skip
        return
    if kv_offloading_size is not None:
        fail("--kv-offloading-size marks a CPU tier: it needs --tiers gpu:CAPS,cpu:CAPS")
    capacities = None if capacity_tokens is None else parse_capacities(capacity_tokens)
    from kvsim.analysis.cache_curve import cache_curve
    from kvsim.outputs.curve_folder import check_out_folder, write_curve_folder
    from workloads import load_trace, resolve_trace

    try:
        if out is not None:
            check_out_folder(out, force=force)
        loaded = load_trace(resolve_trace(trace))
        curve = cache_curve(loaded, block_size, capacities)
        if num_blocks is None:
            pool_tokens, pool_label = pool_capacity(trace, model, gpu, tp, curve.block_size)
        else:
            pool_tokens, pool_label = num_blocks * curve.block_size, "GPU pool (--num-blocks)"
        at_pool = curve.hit_rates_at(pool_tokens)
        if out is not None:
            write_curve_folder(curve, out, pool_tokens=pool_tokens, pool_label=pool_label,
                               title=f"Prefix-cache hit rate: {loaded.name}, "
                               f"{curve.block_size}-token blocks", force=force)  # fmt: skip
    except (KvsimError, WorkloadError) as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"{exc.filename}: {exc.strerror}" if exc.filename else str(exc))
    console.print(_table(curve.rows))
    console.print(
        f"{loaded.name}: {len(loaded):,} requests, {curve.query_tokens:,} prompt tokens, "
        f"{curve.block_size}-token blocks; working set {curve.working_set_tokens:,} tokens",
        soft_wrap=True,
    )
    console.print(
        f"{pool_label}: {pool_tokens:,} tokens -> LRU {_percent(at_pool['lru'])}, "
        f"optimal {_percent(at_pool['optimal'])}",
        soft_wrap=True,
    )
    if out is not None:
        say("wrote ", out / "curve.csv", " and ", out / "curve.png")


def _run_tiers(
    trace: str,
    spec: str,
    block_size: int | None,
    model: str,
    gpu: str,
    tp: int,
    num_blocks: int | None,
    offload_gib: float | None,
    out: Path | None,
    force: bool,
) -> None:
    """kvsim.commands.tiers.run_tiers, its exceptions as one line and exit code 2."""
    from kvsim.commands.tiers import run_tiers

    try:
        run_tiers(trace=trace, spec=spec, block_size=block_size, model=model, tp=tp,
                  num_blocks=num_blocks, offload_gib=offload_gib, out=out, force=force,
                  plan_pool=lambda b: pool_capacity(trace, model, gpu, tp, b))  # fmt: skip
    except (KvsimError, WorkloadError) as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"{exc.filename}: {exc.strerror}" if exc.filename else str(exc))


def register(app: typer.Typer) -> None:
    """Add ``kvsim cache-curve`` to ``app``."""
    app.command("cache-curve", cls=Command)(cache_curve_command)
