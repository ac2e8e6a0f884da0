"""Importing kvsim never switches matplotlib's backend (a notebook's inline backend would stop
showing figures); the `kvsim` command selects the headless one for itself."""

from __future__ import annotations

import os
import subprocess
import sys

# Every kvsim module that imports matplotlib.
PLOTTING_MODULES = (
    "kvsim",
    "kvsim.plots",
    "kvsim.plots.animation",
    "kvsim.sweep.plots",
    "kvsim.sweep.report",
    "kvsim.outputs.report",
    "kvsim.outputs.curve_folder",
)


def test_no_import_changes_the_backend() -> None:
    # "svg" stands for a notebook's inline backend: any backend but Agg that runs headless.
    script = (
        "import matplotlib; matplotlib.use('svg'); import importlib\n"
        f"for name in {PLOTTING_MODULES!r}:\n"
        "    importlib.import_module(name)\n"
        "    assert matplotlib.get_backend() == 'svg', (name, matplotlib.get_backend())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_cli_draws_headless() -> None:
    script = (
        "import os, sys\n"
        "from kvsim.cli import main\n"
        "sys.argv = ['kvsim', '--version']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(os.environ['MPLBACKEND'])\n"
    )
    env = {**os.environ, "MPLBACKEND": "tkagg"}  # a display backend the user may have chosen
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "Agg"
