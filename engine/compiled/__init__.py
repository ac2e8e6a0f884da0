"""kvsim's compiled core: the loader of the optional C++ extension ``engine.compiled._core``.

The extension (C++ classes in csrc/, bound by _core.pyx) is built by the package's own build
(setup.py) where a C++ compiler exists; everywhere else kvsim runs its pure-Python path,
which stays complete. ``KVSIM_PURE_PYTHON=1`` forces the Python path. Nothing is imported
here until ``load()`` is called, so importing this package (or the CLI's ``--help``) never
loads the extension. Library code never prints: callers show ``unavailable_reason()``.
See docs/compiled.md.
"""

from __future__ import annotations

import functools
import importlib
import os
from types import ModuleType

PURE_PYTHON_ENV = "KVSIM_PURE_PYTHON"


@functools.lru_cache(maxsize=1)
def _load() -> tuple[ModuleType | None, str | None]:
    if os.environ.get(PURE_PYTHON_ENV) == "1":
        return None, f"{PURE_PYTHON_ENV}=1: using the pure-Python path"
    try:
        module = importlib.import_module("engine.compiled._core")
    except ImportError as exc:
        return None, (
            f"kvsim's compiled core is not built ({type(exc).__name__}: {exc}); "
            "using the pure-Python path"
        )
    return module, None


def load() -> ModuleType | None:
    """The extension module ``engine.compiled._core``, or None when it is not built or
    ``KVSIM_PURE_PYTHON=1``. The answer is cached for the process (``cache_clear()``
    forgets it, for tests that change the environment)."""
    return _load()[0]


def chosen(compiled: bool | None) -> ModuleType | None:
    """The core for a factory's ``compiled`` argument (make_cpu_tier, make_transfer_link):
    None = the core when ``load()`` has it, else None (the Python class); True = the core,
    RuntimeError when it is not loaded; False = None."""
    if compiled is False:
        return None
    core = load()
    if core is None and compiled:
        raise RuntimeError(f"the compiled core is not available: {unavailable_reason()}")
    return core


def unavailable_reason() -> str | None:
    """Why ``load()`` returns None, in one line; None when the compiled core is loaded."""
    return _load()[1]


def cache_clear() -> None:
    """Forget the cached answer: the next ``load()`` reads the environment again."""
    _load.cache_clear()
