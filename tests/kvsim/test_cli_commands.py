"""kvsim.cli loads each command from its module on first lookup (COMMAND_MODULES): the table
must name every command each module registers, and every command must answer."""

from __future__ import annotations

import pkgutil

import typer
from typer.testing import CliRunner

import kvsim.commands
from kvsim.cli import COMMAND_MODULES, app, command_group

# modules of kvsim.commands that register nothing (capacity: kvsim capacity's printing; the
# command is kvsim sweep's, registered by sweep; gen_sessions: kvsim gen's session options;
# fleet_plot: kvsim plot / report of a fleet's folder; tiers: kvsim cache-curve --tiers;
# run_folder_args: what the picture commands share)
HELPERS = {
    "console", "options", "summary", "capacity", "gen_sessions", "fleet_plot", "tiers",
    "run_folder_args",
}  # fmt: skip


def test_the_table_names_exactly_the_commands_each_module_registers() -> None:
    modules = {m.name for m in pkgutil.iter_modules(kvsim.commands.__path__)} - HELPERS
    assert set(COMMAND_MODULES.values()) == modules
    for module in modules:
        registered = set(command_group(module).commands)
        assert registered == {c for c, m in COMMAND_MODULES.items() if m == module}, module


def test_help_lists_every_command_once_in_the_table_order() -> None:
    group = typer.main.get_command(app)
    assert group.list_commands(None) == list(COMMAND_MODULES)  # type: ignore[attr-defined]
    out = CliRunner().invoke(app, ["--help"], terminal_width=200).stdout
    positions = [out.find(f" {name} ") for name in COMMAND_MODULES]
    assert all(p > 0 for p in positions), out
    assert positions == sorted(positions)


def test_every_command_answers_help_and_an_unknown_one_is_one_line() -> None:
    for name in COMMAND_MODULES:
        result = CliRunner().invoke(app, [name, "--help"])
        assert result.exit_code == 0, (name, result.output)
        assert f"kvsim {name}" in result.stdout
    unknown = CliRunner().invoke(app, ["no-such-command"])
    assert unknown.exit_code == 2
    assert unknown.stderr.strip().splitlines() == [
        "error: No such command 'no-such-command' (see kvsim -h)"
    ]
