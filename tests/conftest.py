"""Settings for the whole test run, applied before any test module imports kvsim."""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

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


def pytest_configure(config: object) -> None:
    """The default run draws the same hypothesis examples every time (derandomize): its time
    is then the same from run to run (a randomly drawn heavy case once took 45 s of a 3-minute
    run) and a failure repeats. The slow set (``-m slow``, which .ci/run runs too) draws fresh
    examples each run, so the properties keep exploring."""
    from hypothesis import settings

    markexpr = getattr(getattr(config, "option", None), "markexpr", "") or ""
    exploring = "slow" in markexpr and "not slow" not in markexpr
    settings.register_profile("kvsim-default", derandomize=True)
    settings.register_profile("kvsim-slow", derandomize=False)
    settings.load_profile("kvsim-slow" if exploring else "kvsim-default")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    """After a test's fixtures are torn down (its monkeypatched environment restored),
    engine.compiled's cached answer must agree with the environment: a test that forced the
    pure-Python path (KVSIM_PURE_PYTHON=1) and left the cached "pure" answer behind made every
    later CLI test in that worker print the pure-Python notice (two stderr lines where one is
    expected). Such a test errors here, and the cache is cleared for the next."""
    yield
    import engine.compiled

    if os.environ.get(engine.compiled.PURE_PYTHON_ENV) == "1":
        return
    if engine.compiled._load.cache_info().currsize == 0:
        return
    reason = engine.compiled.unavailable_reason()
    if reason is not None and reason.startswith(engine.compiled.PURE_PYTHON_ENV):
        engine.compiled.cache_clear()
        raise AssertionError(
            f"{item.nodeid} left engine.compiled's cached pure-Python answer behind once "
            "KVSIM_PURE_PYTHON was restored: call engine.compiled.cache_clear() after the run"
        )
