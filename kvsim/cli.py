"""The ``kvsim`` command line: thin commands that hand off to library functions.

Library code raises its own exceptions; only this edge turns them into one red line
and a non-zero exit code. ``main`` (the ``kvsim`` script and ``python -m kvsim``) also turns
Ctrl-C and SIGTERM into one line and exit code 130 or 143, after every temporary file is
removed.
"""

from __future__ import annotations

import gc
import importlib
import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any

import typer
from rich.text import Text
from typer.core import TyperGroup

from kvsim.commands.console import FlagsWithoutType, err_console, print_error
from kvsim.errors import Interrupted
from kvsim.sim.gc_passes import fewer_gc_passes

# Typer's click exceptions, wherever its click lives (Typer >= 0.29 carries its own copy).
_click_errors = sys.modules[typer.BadParameter.__module__]
_ClickException: type[Exception] = _click_errors.ClickException
_UsageError: type[Exception] = _click_errors.UsageError
_NoArgsIsHelp: type[Exception] = getattr(
    _click_errors, "NoArgsIsHelpError", type("_Never", (Exception,), {})
)


# The module of kvsim.commands that registers each command, in `kvsim --help` order. A
# command's module is imported when the command is looked up: `kvsim run` imports only
# kvsim.commands.run (the other seven cost 30-50 ms of its start); `kvsim --help` all of them.
COMMAND_MODULES = {
    "run": "run",
    "gen": "traces",
    "import": "traces",
    "info": "traces",
    "sweep": "sweep",
    "capacity": "sweep",
    "plot": "plot",
    "animate": "run_exports",
    "report": "run_exports",
    "export-trace": "run_exports",
    "cache-curve": "cache_curve",
    "export-kv-events": "kv_events",
    "calibrate": "calibrate",
    "validate": "calibrate",
    "profile": "profile",
    "validate-run": "profile",
    "validate-real": "validate_real",
}


def command_group(module: str) -> Any:
    """The click group of the commands ``kvsim.commands.<module>`` registers."""
    commands = typer.Typer()
    importlib.import_module(f"kvsim.commands.{module}").register(commands)
    return typer.main.get_group(commands)


class _OneLineErrors(FlagsWithoutType, TyperGroup):
    """Usage errors (a bad option value, a missing argument) as one red line and exit code 2,
    like every other bad input, instead of click's usage block. Commands are loaded from
    their module on first lookup (``COMMAND_MODULES``)."""

    def list_commands(self, ctx: Any) -> list[str]:
        return [
            *COMMAND_MODULES,
            *(n for n in super().list_commands(ctx) if n not in COMMAND_MODULES),
        ]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        module = COMMAND_MODULES.get(cmd_name)
        if module is not None and cmd_name not in self.commands:
            for name, command in command_group(module).commands.items():
                self.add_command(command, name)
        return super().get_command(ctx, cmd_name)

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            code = super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        except _NoArgsIsHelp as exc:
            if not standalone_mode:
                raise
            exc.show()  # type: ignore[attr-defined]
            sys.exit(0)
        except _ClickException as exc:
            if not standalone_mode:
                raise
            message = exc.format_message().rstrip(".")  # type: ignore[attr-defined]
            ctx = getattr(exc, "ctx", None)
            if isinstance(exc, _UsageError) and ctx is not None:
                message += f" (see {ctx.command_path} -h)"
            print_error(message)
            sys.exit(exc.exit_code)  # type: ignore[attr-defined]
        except typer.Abort:
            if not standalone_mode:
                raise
            print_error("aborted")
            sys.exit(1)
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    cls=_OneLineErrors,
    name="kvsim",
    help="Simulate and visualize KV-cache scheduling in LLM serving.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"kvsim {version('kvsim')}")
        except PackageNotFoundError:
            typer.echo("kvsim (not installed)")
        raise typer.Exit()


@app.callback()
def _options(
    show_version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Simulate and visualize KV-cache scheduling in LLM serving."""


def _interrupt(signum: int, frame: FrameType | None) -> None:
    # A second signal must not cut the cleanup the first one started.
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)
    raise Interrupted(signum)


def main() -> None:
    """Entry point of the ``kvsim`` script and ``python -m kvsim``."""
    # Commands only write picture files: matplotlib's headless backend, chosen here rather
    # than at kvsim.plots' import, which must leave a notebook's inline backend alone.
    os.environ["MPLBACKEND"] = "Agg"
    # numpy's OpenBLAS starts a worker thread per core that spins while idle; kvsim's numpy
    # work is elementwise or small dot products, which never use it. One thread (before
    # numpy's import; a user's own setting stands): the whole Azure conversation trace's
    # `kvsim run --no-plots`, 2 cores, 1.96 -> 1.81 s of CPU (medians of 6, interleaved).
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    _keep_freed_memory()
    inductor = _private_inductor_cache()
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, _interrupt)
    try:
        # A command is one short process that imports and allocates a lot: fewer collector
        # passes (a default-trace run: 30 -> 10 ms of them).
        with fewer_gc_passes():
            try:
                app()
            finally:
                # Everything dies with the process: without this the interpreter's shutdown
                # walks every object the command made in its garbage collections (0.2 s of a
                # 1.2 s `kvsim run --no-plots`, 8-round A/B), and so would the pass that the
                # collector's restored threshold triggers next (35 ms). Files are closed and
                # output swapped by now.
                gc.freeze()
    except Interrupted as stop:
        what = "interrupted" if stop.signum == signal.SIGINT else "terminated (SIGTERM)"
        err_console.print(Text(f"{what}; nothing written", style="yellow"), soft_wrap=True)
        sys.exit(128 + stop.signum)
    finally:
        if inductor is not None and os.path.isdir(inductor):
            import shutil

            shutil.rmtree(inductor, ignore_errors=True)


# mallopt's parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def _keep_freed_memory() -> None:
    """Let glibc's malloc reuse freed blocks of up to 32 MiB instead of returning them to the
    kernel at once (munmap, or trimming the heap's top) only to ask for fresh pages, which
    the kernel faults in and zeroes, moments later: a run allocates and frees arrays of the
    same sizes chunk after chunk (the events writer's exploded rows, numpy temporaries). The
    whole Azure conversation trace's `kvsim run --no-plots`, 2 cores: 97 k -> 70 k page
    faults, 1.90 -> 1.80 s of CPU (medians of 8, interleaved). A process's memory then stays
    at its peak until it exits, which a command does. Nothing happens where the C library
    has no mallopt (not glibc)."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, 32 << 20)  # glibc's largest
    mallopt(_M_TRIM_THRESHOLD, 1 << 30)


def _private_inductor_cache() -> str | None:
    """Importing torch makes ``$TMPDIR/torchinductor_$USER``, which outlives the process (a
    failed engine start too). kvsim compiles nothing with inductor: point its cache at a
    folder of this process that is never made, or removed at exit if something made it;
    None where the user chose one."""
    if "TORCHINDUCTOR_CACHE_DIR" in os.environ:
        return None
    tmp = os.environ.get("TMPDIR") or "/tmp"
    path = os.path.join(tmp, f".kvsim-inductor-{os.getpid()}")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    return path
