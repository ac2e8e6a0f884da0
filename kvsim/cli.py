"""The ``kvsim`` command line: thin commands that hand off to library functions.

Library code raises its own exceptions; only this edge turns them into one red line
and a non-zero exit code.
"""

from __future__ import annotations

import typer

from kvsim.commands import cache_curve, calibrate, plot, profile, run, sweep, traces

app = typer.Typer(
    name="kvsim",
    help="Simulate and visualize KV-cache scheduling in LLM serving.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

run.register(app)
traces.register(app)
sweep.register(app)
plot.register(app)
cache_curve.register(app)
calibrate.register(app)
profile.register(app)


def main() -> None:
    """Entry point for ``python -m kvsim``."""
    app()
