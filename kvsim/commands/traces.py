"""Trace commands: ``kvsim gen``, ``kvsim import``, ``kvsim info`` (to be written)."""

import typer


def register(app: typer.Typer) -> None:
    """Add the trace commands to ``app``."""
