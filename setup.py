"""Build the compiled kernels in csrc/ into the exchange engine, beside their owners
(hxmpi.comm._packing: copies; hxmpi.comm._plan: the hier planner; hxmpi.comm._agree: the agreement's
fingerprint and pattern keys; hxmpi.comm._call: the one-shot call's compiled paths, runs and
Bruck first runs) and the optimizer's fused update (hxmpi.train._sgd).

Metadata lives in pyproject.toml."""
import os

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

# HXMPI_DEBUG=1 turns bounds checking back on for a debug build.
_debug = os.environ.get("HXMPI_DEBUG", "0") == "1"

_flags = ["-O3"] if not _debug else ["-O0", "-g"]
# The kernels read numpy arrays' flags and data pointers through numpy's C API (every call's path).
extensions = [Extension(f"hxmpi.comm.{name}", [f"csrc/{name}.pyx"], extra_compile_args=_flags,
                        include_dirs=[numpy.get_include()],
                        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")])
              for name in ("_packing", "_plan", "_agree", "_call")]
# The optimizer's fused update must round each operation as numpy does (bit-equal to the numpy
# form), so no contraction of a * b + c into one fused multiply-add.
extensions.append(Extension("hxmpi.train._sgd", ["csrc/_sgd.pyx"], extra_compile_args=_flags + ["-ffp-contract=off"]))

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
