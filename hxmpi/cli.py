"""How hxmpi's programs end when something goes wrong on one rank.

The rule for the whole code base: a failure on one rank, at any phase, either goes through an
agreement (every rank raises the same error, ``errors.agree``) or aborts the MPI job after
printing it. A rank must never exit alone while the others block in a collective: Open MPI's
``MPI_Finalize`` then waits for them too, and the job hangs until a batch system kills it.

- ``run_main`` wraps a program's ``main``: an uncaught exception prints the rank and traceback
  and aborts the job (``MPI_Abort``). Every ``python -m hxmpi.*`` program and every benchmark
  ends through it; a user's own script gets the same from ``mpirun python -m mpi4py script.py``.
- ``settle_failure`` is for a set-up error that may or may not have happened on every rank
  (a deterministic bad flag does; a corrupt file on one node does not): the failing ranks meet
  in a nonblocking barrier on a communicator kept for this purpose; if every rank arrives within
  ``timeout`` seconds the error is the same everywhere and the program can exit cleanly,
  otherwise it aborts the job.
"""
from __future__ import annotations

import os
import shlex
import sys
import time
import traceback
from typing import Callable, NoReturn, Optional

from .launcher import LAUNCH_ENV, RANK_VARS

__all__ = ["world_rank", "abort_job", "report", "run_main", "settle_failure", "command_line"]

SETTLE_TIMEOUT_S = 5.0  # how long failing ranks wait for the others before aborting


def _mpi():
    """mpi4py.MPI if this process has initialised MPI (never initialises it), else None."""
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is None or not MPI.Is_initialized() or MPI.Is_finalized():
        return None
    return MPI


def world_rank() -> Optional[int]:
    """This process's rank in COMM_WORLD (from MPI or the launcher's environment), or None."""
    MPI = _mpi()
    if MPI is not None:
        return MPI.COMM_WORLD.Get_rank()
    for var in RANK_VARS:  # Open MPI, PMIx (srun --mpi=pmix), Hydra and PMI-2
        if var in os.environ:
            return int(os.environ[var])
    return None


#: Seconds a rank waits between writing its failure and MPI_Abort. The launcher forwards each
#: rank's stderr through a daemon (Hydra's proxy, Open MPI's prted) that MPI_Abort's kill can
#: reach before it has read the pipe: the user then sees no message at all (seen under MPICH).
FLUSH_BEFORE_ABORT_S = 0.5


def abort_job(code: int = 1) -> NoReturn:
    """End the whole MPI job (every rank) with ``code``; a plain exit outside an MPI job.

    A rank that fails before it has started MPI starts it to abort: a plain exit would leave the
    ranks that did start waiting for it (Open MPI's launcher then does not end the job)."""
    sys.stdout.flush()
    sys.stderr.flush()
    MPI = _mpi()
    if MPI is None and world_rank() is not None and "mpi4py.MPI" not in sys.modules:
        from mpi4py import MPI
    if MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.Get_size() > 1:
        time.sleep(FLUSH_BEFORE_ABORT_S)
        MPI.COMM_WORLD.Abort(code)
    sys.exit(code)


def report(prog: str, exc: BaseException, with_traceback: bool = True) -> None:
    """Print ``exc`` on stderr as ``prog: rank R failed: Type: message`` (and its traceback)."""
    rank = world_rank()
    where = f"rank {rank} " if rank is not None else ""
    text = f"{prog}: {where}failed: {type(exc).__name__}: {exc}\n"
    if with_traceback:
        text += "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    sys.stderr.write(text)
    sys.stderr.flush()


def run_main(main: Callable[..., Optional[int]], prog: str) -> NoReturn:
    """``sys.exit(main())``, except that an uncaught exception on any rank aborts the MPI job."""
    try:
        code = main()
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - Ctrl-C included: the other ranks must not be left waiting
        report(prog, exc)
        abort_job(130 if isinstance(exc, KeyboardInterrupt) else 1)
    sys.exit(code)


def settle_failure(errcomm, timeout: float = SETTLE_TIMEOUT_S) -> bool:
    """Called by a rank whose set-up failed: True if every rank of ``errcomm`` failed too (they all
    called this within ``timeout`` seconds), so the error is agreed and a clean exit is safe; False
    if some rank did not come (it is blocked elsewhere or running on): the caller must abort.

    ``errcomm`` is a communicator duplicated before set-up and used for nothing else.
    """
    if errcomm.Get_size() == 1:
        return True
    request = errcomm.Ibarrier()
    deadline = time.monotonic() + timeout
    while not request.Test():
        if time.monotonic() > deadline:
            return False  # the request stays pending: the caller aborts the job
        time.sleep(0.01)
    return True


def command_line(script: str, world_size: Optional[int] = None) -> str:
    """This program's command line, for a result file to record: ``python script`` (a path from
    the repository's root, or ``-m MODULE`` for a module run with ``python -m``) and this
    process's arguments, after ``mpirun -np world_size`` when given, or after the wrapper that
    launched the job when one says so (``launcher.LAUNCH_ENV``: the emulated cluster's ``run``).
    Launcher options (``--oversubscribe``, ``--bind-to``) are not visible to the program and are
    not recorded."""
    launch = ["mpirun", "-np", str(world_size)] if world_size is not None else []
    if world_size is not None and os.environ.get(LAUNCH_ENV):
        launch = shlex.split(os.environ[LAUNCH_ENV])
    program = script.split(" ", 1) if script.startswith("-m ") else [script]
    return shlex.join([*launch, "python", *program, *sys.argv[1:]])
