"""Error types and the collective error agreement every hxmpi collective uses.

An error found on one rank must surface on every rank: a rank that raised alone would leave the
others waiting in the next collective forever. So every error is either agreed (raised on every
rank alike; the raise site marks it, ``agreed_error``, and a program may catch it and go on) or this
rank's alone (``one_rank_error``: the job ends, as MPI's ``ERRORS_ARE_FATAL`` has it, unless the
communicator returns errors by the user's choice).
"""
from __future__ import annotations

from functools import wraps
from typing import TYPE_CHECKING, Optional

__all__ = ["HxmpiError", "TopologyError", "ExchangeError", "SettingError", "NonFiniteLoss",
           "ExchangeTypeError", "ExchangeKeyError", "CpuFileError", "PlanStateError", "agree", "raise_gathered", "gathered_error", "agreed_error",
           "abort_job", "one_rank_error", "returns_errors", "guarded"]

if TYPE_CHECKING:  # importing this module does not start MPI
    from mpi4py import MPI


class HxmpiError(Exception):
    """Base class of every error hxmpi raises on purpose."""


class TopologyError(HxmpiError, ValueError):
    """Bad node layout (node_of, ranks_per_node) or derived communicator's argument: raised on every rank."""


class ExchangeError(HxmpiError, ValueError):
    """Bad all-to-all input (counts, displacements, buffers): raised on every rank, before data moves."""


class SettingError(HxmpiError, ValueError):
    """A run setting with a bad value (or a bad combination), raised on every rank.

    ``setting`` names the setting (a ``hxmpi.train.run_config.TrainConfig`` field), never a command-line flag: the
    CLI maps it to its flag when it prints the error.
    """

    def __init__(self, setting: str, detail: str):
        super().__init__(f"{setting} {detail}")
        self.setting, self.detail = setting, detail


class CpuFileError(HxmpiError, ValueError):
    """A CPU-per-path file (``bench_overhead.py --json`` output) that is missing or malformed; the
    message names the file and the problem."""


class PlanStateError(HxmpiError, RuntimeError):
    """A request used out of order or as MPI forbids: a persistent one started twice, waited for
    without a start or used after ``Free``; a nonblocking one cancelled."""


class NonFiniteLoss(HxmpiError, ArithmeticError):
    """The training loss became NaN or infinite (raised on every rank, after an agreement)."""


class ExchangeTypeError(ExchangeError, TypeError):
    """A spec item of the wrong kind (not a buffer, non-integer counts): mpi4py raises TypeError here."""


class ExchangeKeyError(ExchangeError, KeyError):
    """A typecode string that names no MPI datatype: mpi4py raises KeyError here."""

    __str__ = Exception.__str__  # the message as written, not KeyError's repr of it


def agree(comm: MPI.Comm, problem: Optional[str], error: type = HxmpiError) -> None:
    """Raise ``error`` on every rank of ``comm`` if any rank passes a non-empty ``problem``.

    Costs one int Allreduce when all is well; the messages are gathered only on failure, so the
    raised text names every failing rank and its reason.
    """
    from mpi4py import MPI
    flag = comm.allreduce(1 if problem else 0, op=MPI.MAX)
    if flag:
        raise_gathered(comm, problem, error)


def raise_gathered(comm: MPI.Comm, problem: Optional[str], error: type = HxmpiError) -> None:
    """Gather every rank's ``problem`` and raise ``error`` naming them (collective; call on all ranks).

    A problem may carry a subclass of ``error`` in its ``error`` attribute (``msgspec.Problem``); the
    first failing rank's choice is raised, so every rank raises the same type.
    """
    raise gathered_error(comm.allgather(problem), error)


def gathered_error(problems: list, error: type = HxmpiError) -> HxmpiError:
    """The error naming every rank's problem (``problems``: one per rank, None where it has none),
    of the first failing rank's type (a problem's ``error`` attribute, a subclass of ``error``),
    marked agreed: what ``raise_gathered`` raises on every rank."""
    lines = [f"rank {r}: {p}" for r, p in enumerate(problems) if p]
    shown = lines[:8] + ([f"... and {len(lines) - 8} more ranks"] if len(lines) > 8 else [])
    kind = next((getattr(p, "error", error) for p in problems if p), error)
    return agreed_error((kind if isinstance(kind, type) and issubclass(kind, error) else error)("; ".join(shown)))


def agreed_error(error: BaseException) -> BaseException:
    """Mark ``error`` as raised on every rank alike (returned): a caller may catch it and go on,
    and no guard ends the job for it (``guarded``). Only a raise site that every rank reaches
    with the same error marks it."""
    error.agreed = True
    return error


def abort_job(error: BaseException, where: str) -> None:
    """End the whole job for an error that one rank alone met inside a collective (never returns).

    The other ranks cannot learn of it and would wait for this one forever, so, as MPI's
    ``ERRORS_ARE_FATAL`` does, this rank prints the cause, naming itself and ``where`` it was
    (with the traceback), and calls ``MPI_Abort`` on ``COMM_WORLD``. Errors raised on every rank
    alike (``agreed``) never come here: a program may catch those.
    """
    import os
    import sys
    import time
    import traceback

    from mpi4py import MPI
    rank = MPI.COMM_WORLD.rank if MPI.Is_initialized() and not MPI.Is_finalized() else -1
    lines = traceback.format_exception(type(error), error, error.__traceback__)
    print(f"hxmpi: rank {rank}: {type(error).__name__}: {error}\n  in {where}, on this rank alone: the other ranks "
          f"cannot learn of it and would wait forever, so the job is aborted (MPI_Abort)\n" + "".join(lines),
          file=sys.stderr, flush=True)
    # MPICH's launcher forwards a rank's output asynchronously and stops forwarding when the job
    # is aborted: a moment first lets the message above reach the user.
    time.sleep(0.5)
    MPI.COMM_WORLD.Abort(1)
    os._exit(1)  # an MPI_Abort that returned (seen with MPICH): this rank must not go on


def returns_errors(comm: MPI.Comm) -> bool:
    """Whether the user asked ``comm`` to return errors rather than end the job: its error handler
    is ``MPI.ERRORS_RETURN`` and mpi4py did not install it (mpi4py installs it on the predefined
    communicators, and so on their duplicates, under its default ``mpi4py.rc.errors =
    "exception"``; that default does not count as the user's choice)."""
    import mpi4py
    from mpi4py import MPI
    if mpi4py.rc.errors == "exception":
        return False
    handler = comm.Get_errhandler()
    try:
        return handler == MPI.ERRORS_RETURN
    finally:
        handler.Free()


def one_rank_error(error: BaseException, where: str, comm: Optional[MPI.Comm] = None) -> None:
    """What becomes of an error this rank alone met inside a collective (``where``), which the
    other ranks cannot learn of: the job ends (``abort_job``), as MPI's ``ERRORS_ARE_FATAL`` has
    it, unless ``comm``'s error handler returns errors by the user's choice (``returns_errors``):
    then it is raised again, on this rank, as MPI's ``ERRORS_RETURN`` has it. ``KeyboardInterrupt``
    and ``SystemExit`` are raised again too: they stop this rank, they are not a fault."""
    if isinstance(error, (KeyboardInterrupt, SystemExit)) or (comm is not None and returns_errors(comm)):
        raise error
    abort_job(error, where)


def guarded(method=None, *, owner: Optional[str] = None):
    """Guard a public collective method of an object with a ``comm`` (``@guarded``, or
    ``@guarded(owner="HierComm")`` to name its class so in messages): an error raised on this rank
    alone (not ``agreed``: every bad spec is agreed, and raised on every rank alike) goes to
    ``one_rank_error`` (the job ends) instead of leaving the other ranks waiting for this one
    forever."""
    if method is None:
        return lambda m: guarded(m, owner=owner)
    where = f"{owner}.{method.__name__}" if owner else method.__qualname__

    @wraps(method)
    def guard(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except BaseException as exc:
            # A request used out of order is refused before it communicates: it leaves no rank waiting.
            if getattr(exc, "agreed", False) or isinstance(exc, PlanStateError):
                raise
            one_rank_error(exc, where, self.__dict__.get("comm"))
    return guard
