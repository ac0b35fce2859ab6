"""Build ``calls`` (no MPI headers) and ``calls_libmpi`` (with ``mpicc`` from PATH) in place, for
``benchmarks/bench_mpi_call.py``. Needs Cython (``pip install cython``). A failed ``calls_libmpi``
build is reported and the benchmark then measures without it.

    python benchmarks/mpi_call/build.py
"""
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def build(module: str, env: dict) -> bool:
    """Compile ``module``.pyx next to this file; True when it built."""
    code = (
        "from setuptools import setup, Extension\n"
        "from Cython.Build import cythonize\n"
        "import mpi4py\n"
        f"setup(script_args=['build_ext', '--inplace', '-q'], ext_modules=cythonize("
        f"[Extension('{module}', ['{module}.pyx'], include_dirs=[mpi4py.get_include()])], quiet=True))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=HERE, env=env)
    return done.returncode == 0


def main() -> int:
    ok = build("calls", {**os.environ, "CFLAGS": os.environ.get("CFLAGS", "") + " -D_GNU_SOURCE"})
    if not ok:
        print("build.py: calls failed to build", file=sys.stderr)
        return 1
    if not build("calls_libmpi", {**os.environ, "CC": os.environ.get("MPICC", "mpicc")}):
        print("build.py: calls_libmpi did not build (needs mpicc and mpi.h); measuring without it",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
