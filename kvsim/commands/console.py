"""Console helpers for CLI commands (library code never prints)."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console

console = Console()
err_console = Console(stderr=True)

BAD_INPUT_EXIT_CODE = 2


def fail(message: str, code: int = BAD_INPUT_EXIT_CODE) -> NoReturn:
    """Print one red error line to stderr and exit with ``code``."""
    err_console.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True, markup=True)
    raise typer.Exit(code)
