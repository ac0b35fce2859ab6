"""Build the compiled kernels in csrc/ as hxmpi._packing (metadata lives in pyproject.toml)."""
import os

from Cython.Build import cythonize
from setuptools import Extension, setup

# HXMPI_DEBUG=1 turns bounds checking back on for a debug build.
_debug = os.environ.get("HXMPI_DEBUG", "0") == "1"

extensions = [
    Extension(
        "hxmpi._packing",
        ["csrc/_packing.pyx"],
        extra_compile_args=["-O3"] if not _debug else ["-O0", "-g"],
    )
]

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
