"""Settings for the whole test run, applied before any test module imports kvsim."""

from __future__ import annotations

import os

# kvsim's rich consoles (kvsim/commands/console.py) are made at import, and a Console made while
# COLUMNS is set keeps that width for good; the CLI tests then could not widen it with
# CliRunner(env={"COLUMNS": "200"}). pytest-xdist's workers start with COLUMNS=80 and LINES=24 in
# their environment (so does a shell that exports them), so drop both before kvsim is imported.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)

# Under pytest-xdist the workers (one per core) run tests side by side, and torch's default
# of one thread per core would put two busy threads on each core; a torch thread that loses
# its core stalls every barrier (kvsim/sim/engine_timing.py), and the engine tests' tiny models
# then ran several times slower. One torch thread per worker (set before torch is imported).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
