"""Builds kvsim's compiled core (engine/compiled/_core.pyx, C++17 via Cython).

Everything else about the package is in pyproject.toml. The extension is optional: where it
cannot be built (no C++ compiler, or no Cython in a build without isolation) the install
still succeeds and kvsim runs its pure-Python path (docs/compiled.md).
"""

from glob import glob

from setuptools import Extension, setup

extensions = [
    Extension(
        "engine.compiled._core",
        sources=["engine/compiled/_core.pyx"],
        # the C++ lives in headers: an edit there must rebuild the extension too
        depends=sorted(glob("engine/compiled/csrc/*.hpp") + glob("engine/compiled/_*.pxi")),
        language="c++",
        # no fused multiply-adds: the step prices (csrc/step_prices.hpp) must round as
        # Python's float arithmetic does, operation by operation
        extra_compile_args=["-O2", "-std=c++17", "-ffp-contract=off"],
        optional=True,
    )
]

try:
    from Cython.Build import cythonize
except ImportError:  # only without build isolation (pyproject's build requires list it)
    print("Cython is not installed: kvsim's compiled core is not built; kvsim runs pure Python")
    ext_modules = []
else:
    ext_modules = cythonize(extensions, compiler_directives={"language_level": "3"})
    for ext in ext_modules:
        ext.optional = True  # cythonize's copies drop it: a failed compile must only warn

setup(ext_modules=ext_modules)
