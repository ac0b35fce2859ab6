"""Where a result came from: the ``provenance`` record every result file carries.

Every JSON that a benchmark or ``python -m hxmpi.sim`` writes holds one ``"provenance"`` object::

    {"command": "mpirun -np 4 python benchmarks/osu_alltoallv.py --json ...",
     "commit": "<40 hex digits>", "dirty": false, "date": "2026-12-05T08:00:00Z",
     "version": "0.2.0", "mpi": "Open MPI v5.0.8, ...", "cores": 2}

``commit`` is the git commit of the source tree hxmpi was imported from, ``"unknown"`` for an
installed wheel; ``dirty`` says the tree had uncommitted changes to tracked files (result files
under ``benchmarks/results/`` aside: a rerun rewrites its own). ``mpi`` is the
first line of the MPI library's version string, or what the caller names (the simulator names
SimGrid). Reading it never initialises MPI: a process that has not started MPI records what it
is told, or ``"none"``.
"""
from __future__ import annotations

import datetime
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

from . import __version__

__all__ = ["PROVENANCE_KEYS", "RESULTS_DIR", "provenance", "source_commit", "mpi_library"]

#: The keys of a provenance record, in the order written.
PROVENANCE_KEYS = ("command", "commit", "dirty", "date", "version", "mpi", "cores")

_ROOT = Path(__file__).resolve().parent.parent


#: Where the results live, relative to the repository: a rerun overwrites its own committed
#: result file, which says nothing about the code, so changes there do not make a tree dirty.
RESULTS_DIR = "benchmarks/results"


def source_commit(root: Path = _ROOT) -> tuple[str, bool]:
    """(commit, dirty) of the git tree at ``root``, by default the one hxmpi was imported from;
    ("unknown", False) outside one. ``dirty``: tracked files outside ``RESULTS_DIR`` have
    uncommitted changes."""
    if not (root / ".git").exists():
        return "unknown", False
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=30)
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--",
                                 ".", f":!{RESULTS_DIR}"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown", False
    if head.returncode != 0:
        return "unknown", False
    return head.stdout.strip(), bool(status.stdout.strip())


def mpi_library() -> str:
    """First line of the running MPI library's version, or "none" where this process has not
    initialised MPI (never initialises it)."""
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is None or not MPI.Is_initialized():
        return "none"
    return MPI.Get_library_version().replace("\x00", "").splitlines()[0].strip()  # Open MPI ends it with NUL


def provenance(command: str, mpi: Optional[str] = None) -> dict:
    """The provenance record of a result made now by ``command`` (``cli.command_line`` gives a
    program's own); ``mpi`` names the MPI library where it is not this process's (a simulator)."""
    commit, dirty = source_commit()
    date = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()
    return {"command": command, "commit": commit, "dirty": dirty, "date": date.replace("+00:00", "Z"),
            "version": __version__, "mpi": mpi if mpi is not None else mpi_library(),
            "cores": os.cpu_count() or 0}
