"""Console helpers for CLI commands (library code never prints).

Messages are printed verbatim: a file name or request id such as ``[bold]`` or ``[/x]`` is text,
never Rich markup, and characters a terminal would act on (escape sequences, such as an OSC-8
link, and other control characters) or that cannot be encoded are shown escaped.
"""

from __future__ import annotations

import re
import shutil
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.text import Text
from typer.core import TyperCommand

# No markup, emoji codes or highlighting in anything printed as a string: user text stays text.
console = Console(markup=False, emoji=False, highlight=False)
err_console = Console(stderr=True, markup=False, emoji=False, highlight=False)

BAD_INPUT_EXIT_CODE = 2
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def plain(text: object) -> str:
    """``text`` safe to print: control characters and lone surrogates escaped."""
    s = str(text)
    s = _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), s)
    return s.encode("utf-8", "backslashreplace").decode("utf-8")


def print_error(message: str) -> None:
    """One red ``error:`` line on stderr; ``message`` printed as it is."""
    line = Text("error: ", style="red")
    line.append(plain(message).replace("\n", " "))
    err_console.print(line, highlight=False, soft_wrap=True)


def print_notice(message: str) -> None:
    """One ``notice:`` line on stderr (something the user may want to know; not a failure)."""
    line = Text("notice: ", style="yellow")
    line.append(plain(message).replace("\n", " "))
    err_console.print(line, highlight=False, soft_wrap=True)


def fail(message: str, code: int = BAD_INPUT_EXIT_CODE) -> NoReturn:
    """Print one red error line to stderr and exit with ``code``."""
    print_error(message)
    raise typer.Exit(code)


def say(*parts: object, style: str = "") -> None:
    """Print one line to stdout: ``parts`` verbatim (no markup), the whole line in ``style``."""
    console.print(
        Text(plain("".join(map(str, parts))), style=style), highlight=False, soft_wrap=True
    )


class FlagsWithoutType:
    """Mixin for Typer commands: a flag's help shows no ``<bool>`` type (it takes no value)."""

    def get_params(self, ctx: Any) -> list[Any]:
        params: list[Any] = super().get_params(ctx)  # type: ignore[misc]
        for param in params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
        return params


# The widest help a command prints (click's default is 80 columns whatever the terminal).
HELP_MAX_COLUMNS = 200


class Command(FlagsWithoutType, TyperCommand):
    """The class of every kvsim command (``app.command(name, cls=Command)``).

    Its help is click's plain layout, not Typer's Rich table: the table gives every option
    name, its ``--no-`` twin, its type and its help a column each, and below about 160
    columns cuts the names (``--gpu-memory-uti…``); click's puts a long name on a line of its
    own and wraps only the help text."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rich_markup_mode = None

    def format_help(self, ctx: Any, formatter: Any) -> None:
        # The terminal's width (COLUMNS where set), up to HELP_MAX_COLUMNS; click would stop
        # at 80, and at exactly 80 under its test runner.
        formatter.width = max(min(shutil.get_terminal_size().columns, HELP_MAX_COLUMNS) - 2, 50)
        super().format_help(ctx, formatter)
