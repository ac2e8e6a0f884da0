"""``kvsim export-kv-events``: a v1 run's prefix-cache history in vLLM's KV-event schema."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvsim.commands.console import Command, fail, print_notice, say
from kvsim.errors import KvsimError

# Bytes per CACHE or EVICT row of events.parquet in the JSON Lines export, about (the whole
# Azure conversation trace: 3.1 M such rows, 194 MB); a notice is printed past NOTICE_BYTES.
BYTES_PER_CACHE_ROW = 62
NOTICE_BYTES = 100e6


def size_text(num_bytes: float) -> str:
    """``907 MB``, ``12.4 kB``, ``1.2 GB``: a file size in decimal units."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.3g} {unit}"
    return f"{int(num_bytes)} B"


def export_kv_events_command(
    run_dir: Annotated[
        Path, typer.Argument(metavar="RUN_DIR", help="Run folder written by kvsim run.")
    ],
    out: Annotated[
        Path,
        typer.Option("--out", "-o", metavar="FILE", help="JSON Lines file to write."),
    ],
    force: Annotated[bool, typer.Option("--force", help="Replace FILE if kvsim wrote it.")] = False,
) -> None:
    """Export BlockStored / BlockRemoved / AllBlocksCleared events, one vLLM KVEventBatch per
    step (docs/formats.md), for KV-router tooling. Needs a --scheduler v1 run with prefix
    caching."""
    from kvsim.outputs.kv_events import write_kv_events
    from kvsim.outputs.run_folder import read_run

    try:
        run = read_run(run_dir)
        if run.events is not None:
            rows = int(run.events["kind"].isin(["CACHE", "EVICT"]).sum())
            if rows * BYTES_PER_CACHE_ROW > NOTICE_BYTES:
                print_notice(
                    f"{rows:,} cache and eviction rows to export: about "
                    f"{size_text(rows * BYTES_PER_CACHE_ROW)} of JSON Lines, a minute or more"
                )
        num_batches, num_events = write_kv_events(run, out, force=force)
    except (KvsimError, ValueError) as exc:
        fail(str(exc))
    except OSError as exc:
        from kvsim.commands.run import os_error_message

        fail(os_error_message(exc))
    size = size_text(out.stat().st_size)
    say("wrote ", out, f" ({size}: {num_events:,} KV events in {num_batches:,} batches)")


def register(app: typer.Typer) -> None:
    app.command("export-kv-events", cls=Command)(export_kv_events_command)
