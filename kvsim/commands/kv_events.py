"""``kvsim export-kv-events``: a v1 run's prefix-cache history in vLLM's KV-event schema."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvsim.commands.console import Command, fail, say
from kvsim.errors import KvsimError


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
        num_batches, num_events = write_kv_events(run, out, force=force)
    except (KvsimError, ValueError) as exc:
        fail(str(exc))
    except OSError as exc:
        from kvsim.commands.run import os_error_message

        fail(os_error_message(exc))
    say("wrote ", out, f" ({num_events:,} KV events in {num_batches:,} batches)")


def register(app: typer.Typer) -> None:
    app.command("export-kv-events", cls=Command)(export_kv_events_command)
