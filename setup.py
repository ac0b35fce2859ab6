"""Build the compiled kernels in csrc/ (hxmpi._packing: copies; hxmpi._plan: the hier planner; hxmpi._bruck: Bruck rounds).

Metadata lives in pyproject.toml."""
import os

from Cython.Build import cythonize
from setuptools import Extension, setup

# HXMPI_DEBUG=1 turns bounds checking back on for a debug build.
_debug = os.environ.get("HXMPI_DEBUG", "0") == "1"

_flags = ["-O3"] if not _debug else ["-O0", "-g"]
extensions = [Extension(f"hxmpi.{name}", [f"csrc/{name}.pyx"], extra_compile_args=_flags)
              for name in ("_packing", "_plan", "_bruck")]

setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives={
            "language_level": 3,
            "boundscheck": _debug,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": _debug,
        },
    )
)
