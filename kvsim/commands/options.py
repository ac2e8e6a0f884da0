"""The run options of ``kvsim run`` and ``kvsim sweep``, derived from RunConfig's fields.

Each RunConfig field carries its help, unit and default once (``kvsim.config.option``); this
module turns them into Typer parameters, so a new field is a new CLI option without another
edit. ``python -m kvsim.commands.options docs/options.md`` rewrites the option table there.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from kvsim.config import RunConfig, option_specs
from kvsim.option_spec import OptionSpec

Command = Literal["run", "sweep"]
OPTIONS_PARAMETER = "options"  # the body's parameter that receives the given run options
CONTEXT_PARAMETER = "_kvsim_context"  # the click context Typer passes (by its annotation)
# Parameter sources that mean "not typed": by name, because Typer may bring its own click.
_NOT_GIVEN = ("DEFAULT", "DEFAULT_MAP")


def _offered(spec: OptionSpec, command: Command) -> bool:
    return spec.run if command == "run" else spec.sweep in ("option", "axis")


@functools.cache
def _field_types() -> dict[str, Any]:
    # Once, not per field: get_type_hints evaluates every annotation of RunConfig each call,
    # 0.15 s of `kvsim --help` under cProfile when it ran twice per option.
    return typing.get_type_hints(RunConfig)


def _value_type(name: str) -> Any:
    """The field's type without None: int, float, str or bool (Literal choices are str)."""
    kind = _field_types()[name]
    if typing.get_origin(kind) in (types.UnionType, typing.Union):
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    if typing.get_origin(kind) is Literal:
        return str
    return kind


def choices(name: str) -> tuple[str, ...]:
    """The values a Literal-typed field accepts (empty for any other type)."""
    kind = _field_types()[name]
    if typing.get_origin(kind) in (
        types.UnionType,
        typing.Union,
    ):  # an optional choice: its None means the default
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    return typing.get_args(kind) if typing.get_origin(kind) is Literal else ()


def default_text(name: str) -> str:
    """What the field's default is, in words (for docs/options.md)."""
    spec = option_specs()[name]
    if spec.default_text is not None:
        return spec.default_text
    default = _default(name)
    if isinstance(default, bool):
        return "on" if default else "off"
    return str(default)


def _default(name: str) -> Any:
    return _field_defaults()[name]


@functools.cache
def _field_defaults() -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(RunConfig)}


def _parameter(
    name: str, spec: OptionSpec, command: Command, defaults: dict[str, Any] | None = None
) -> inspect.Parameter:
    """The Typer parameter of the field ``name``; ``defaults`` replaces the field's own
    default where a command has another (validate-run's model)."""
    axis = command == "sweep" and spec.sweep == "axis"
    kind = str if axis else (Path if spec.path else _value_type(name))
    flag = spec.cli_flag(name)
    help_text = spec.sweep_help if axis and spec.sweep_help else spec.help
    if command == "sweep" and spec.sweep_help:
        help_text = spec.sweep_help
    # The field's own default is shown as [default: 16]; words say what None means. Whether the
    # user gave an option is read from click's parameter source, not from the value.
    default = None if axis else _default(name)
    shown: bool | str = default is not None if spec.default_text is None else spec.default_text
    if defaults and name in defaults:
        default, shown = defaults[name], True
    values = choices(name)
    if kind is bool:
        info = typer.Option(f"{flag}/--no-{flag[2:]}", help=help_text, show_default=shown)
    else:
        listed = "[" + "|".join(values) + "]"
        # Long choice lists stay in the help text: a wide metavar squeezes every option's name.
        if axis:
            metavar: str | None = f"{spec.unit or 'VALUE'},..."
        else:
            metavar = listed if values and len(listed) <= 14 else spec.unit or None
        info = typer.Option(flag, help=help_text, metavar=metavar, show_default=not axis and shown)
    return inspect.Parameter(
        name,
        inspect.Parameter.KEYWORD_ONLY,
        default=default,
        annotation=Annotated[kind | None, info],
    )


def run_option_parameters(
    command: Command, leave_out: tuple[str, ...] = (), defaults: dict[str, Any] | None = None
) -> list[inspect.Parameter]:
    """One Typer parameter per RunConfig field that ``command`` offers (less the fields in
    ``leave_out``), in field order; ``defaults`` as in ``_parameter``."""
    return [
        _parameter(name, spec, command, defaults)
        for name, spec in option_specs().items()
        if _offered(spec, command) and name not in leave_out
    ]


def with_run_options(
    command: Command, *, leave_out: tuple[str, ...] = (), defaults: dict[str, Any] | None = None
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command function the run options, inserted where its ``options`` parameter is;
    a command that decides some itself leaves them out (``leave_out``: field names), and one
    whose defaults differ from RunConfig's gives them (``defaults``: shown in its help).

    The command receives ``options``: the run options the user gave (not None), as RunConfig
    field values (paths as strings; a sweep axis as its comma-separated text).
    """

    def decorate(body: Callable[..., None]) -> Callable[..., None]:
        own = list(inspect.signature(body, eval_str=True).parameters.values())
        at = [p.name for p in own].index(OPTIONS_PARAMETER)
        generated = run_option_parameters(command, leave_out, defaults)
        names = {p.name for p in generated}
        paths = {n for n, s in option_specs().items() if s.path and n in names}

        @functools.wraps(body)
        def command_function(**kwargs: Any) -> None:
            # Typer passes its click context to the parameter annotated typer.Context; called
            # as a plain function there is none, and the values given are those not None.
            context = kwargs.pop(CONTEXT_PARAMETER, None)
            given = {}
            for name in names:
                value = kwargs.pop(name)
                if context is None:
                    user_gave = value is not None
                else:
                    source = context.get_parameter_source(name)
                    user_gave = source is not None and source.name not in _NOT_GIVEN
                if user_gave:
                    given[name] = str(value) if name in paths else value
            body(**kwargs, **{OPTIONS_PARAMETER: given})

        params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own]
        context_parameter = inspect.Parameter(
            CONTEXT_PARAMETER, inspect.Parameter.KEYWORD_ONLY, default=None,
            annotation=typer.Context,
        )  # fmt: skip
        command_function.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [context_parameter, *params[:at], *generated, *params[at + 1 :]]
        )
        command_function.__annotations__ = {}  # Typer reads the signature above
        return command_function

    return decorate


# --- docs/options.md --------------------------------------------------------------------------

TABLE_START, TABLE_END = "<!-- options-table:start -->", "<!-- options-table:end -->"
_SWEEP_USE = {"option": "yes", "axis": "axis (comma list)", "param": "`--param`", "no": "-"}


def options_table() -> str:
    """The markdown table of every run option (docs/options.md)."""
    rows = [
        "| option | config.json | unit | default | kvsim sweep | what it does |",
        "|---|---|---|---|---|---|",
    ]
    for name, spec in option_specs().items():
        if name == "trace":
            flag = "TRACE (argument)"
        elif spec.run:
            flag = f"`{spec.cli_flag(name)}`"
        else:
            flag = "(config.json only)"
        unit = ", ".join(choices(name)) or spec.unit.lower().replace("|", " or ")
        default = "required" if name == "trace" else default_text(name)
        cells = (flag, f"`{name}`", unit, default, _SWEEP_USE[spec.sweep], spec.help)
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


def rewrite_table(path: Path) -> bool:
    """Put the current table between the markers in ``path``; True if it changed."""
    text = path.read_text(encoding="utf-8")
    head, _, rest = text.partition(TABLE_START)
    _, _, tail = rest.partition(TABLE_END)
    new = f"{head}{TABLE_START}\n{options_table()}\n{TABLE_END}{tail}"
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


if __name__ == "__main__":
    changed = rewrite_table(Path(sys.argv[1]))
    sys.stdout.write(f"{sys.argv[1]}: {'rewritten' if changed else 'up to date'}\n")
