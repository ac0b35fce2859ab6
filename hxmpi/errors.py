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
           "abort_job", "one_rank_error", "returns_errors", "guarded", "route_error"]

if TYPE_CHECKING:  # importing this module does not start MPI
    from mpi4py import MPI


class HxmpiError(Exception):
    """Base class of every error hxmpi raises on purpose: ``except hxmpi.HxmpiError`` catches them all.

    Raised as itself for a nonblocking call of a ``HierComm(progress="thread")`` where MPI runs below
    ``MPI_THREAD_MULTIPLE`` (on every rank). Where an error concerns input every rank must agree on,
    it is raised on every rank alike, so a program may catch it and go on, or exit cleanly; an error
    that one rank alone meets inside a collective ends the job instead (``MPI_Abort``), unless the
    user chose ``MPI.ERRORS_RETURN``.

    Examples
    --------
    >>> try:
    ...     hc.Alltoallv([sbuf, "many", MPI.DOUBLE], [rbuf, rcounts, MPI.DOUBLE])
    ... except hxmpi.HxmpiError as exc:
    ...     print(type(exc).__name__)
    ExchangeTypeError
    """


class TopologyError(HxmpiError, ValueError):
    """Bad node layout (``node_of``, ``ranks_per_node``) or derived communicator's argument: raised on every rank.

    Raised by ``Topology`` and ``HierComm`` for a layout that is bad or differs between ranks, and by
    the derived-communicator calls (``Dup``, ``Split``, ``Split_type``, ``Create_cart``, ``Sub``,
    ``Create``) for a bad argument on any rank, before the MPI call. ``Create_group``'s bad argument
    is the passing rank's alone: it ends the job, unless the user chose ``MPI.ERRORS_RETURN`` (then it
    is raised on that rank). Also a ``ValueError``.

    Examples
    --------
    >>> try:
    ...     hxmpi.HierComm(MPI.COMM_WORLD, ranks_per_node=0)
    ... except hxmpi.TopologyError as exc:
    ...     print("positive integer" in str(exc))
    True
    """


class ExchangeError(HxmpiError, ValueError):
    """Bad all-to-all input (counts, displacements, buffers): raised on every rank, before data moves.

    Also bad or differing ``HierComm`` settings (and unreadable tuning or CPU-per-path files),
    datatypes, and bytes that differ between sender and receiver. The message names every failing
    rank and its reason. A nonblocking call's is raised by its request's ``Wait``/``Test``. Also a
    ``ValueError``.

    Examples
    --------
    >>> try:
    ...     hc.Alltoallv([sbuf, scounts + 1, MPI.DOUBLE], [rbuf, rcounts, MPI.DOUBLE])
    ... except hxmpi.ExchangeError as exc:
    ...     print(str(exc).startswith("rank 0: send block"))
    True
    """


class SettingError(HxmpiError, ValueError):
    """A run setting with a bad value (or a bad combination), raised on every rank.

    ``setting`` names the setting (a ``hxmpi.train.run_config.TrainConfig`` field), never a
    command-line flag: the CLI maps it to its flag when it prints the error. Also a ``ValueError``.

    Parameters
    ----------
    setting : str
        The setting's name.
    detail : str
        What is wrong with it; the message is ``f"{setting} {detail}"``.

    Attributes
    ----------
    setting : str
        The setting's name.
    detail : str
        What is wrong with it.

    Examples
    --------
    >>> from hxmpi.errors import SettingError
    >>> from hxmpi.train.run_config import TrainConfig
    >>> try:
    ...     TrainConfig(momentum=2.0)
    ... except SettingError as exc:
    ...     print(exc.setting, "|", exc)
    momentum | momentum must lie in [0, 1), got 2.0
    """

    def __init__(self, setting: str, detail: str):
        super().__init__(f"{setting} {detail}")
        self.setting, self.detail = setting, detail


class CpuFileError(HxmpiError, ValueError):
    """A CPU-per-path file (``bench_overhead.py --json`` output) that is missing or malformed.

    The message names the file and the problem. Raised where such a file is read (the simulator's
    tools); ``HierComm(overhead=...)`` raises it as an ``ExchangeError`` on every rank instead. Also a
    ``ValueError``.

    Examples
    --------
    >>> from hxmpi.errors import CpuFileError
    >>> from hxmpi.comm.costmodel import CpuTimes
    >>> try:
    ...     CpuTimes.load("no-such-overhead.json")
    ... except CpuFileError as exc:
    ...     print(exc)
    CPU file no-such-overhead.json: cannot read it: No such file or directory
    """


class PlanStateError(HxmpiError, RuntimeError):
    """A request used out of order or as MPI forbids; raised on the rank that does so.

    A persistent request (``ExchangeRequest``) started twice, waited for without a start, or used
    after ``Free``; a nonblocking request (``HierRequest``) used after ``Free``, used by two threads
    at once, or cancelled. Refused before anything is communicated. Also a ``RuntimeError``.

    Examples
    --------
    >>> from hxmpi.errors import PlanStateError
    >>> req = hc.Alltoallv_init([sbuf, scounts, MPI.DOUBLE], [rbuf, rcounts, MPI.DOUBLE])
    >>> try:
    ...     req.Wait()
    ... except PlanStateError as exc:
    ...     print(exc)
    Wait() without Start(); call Start() first
    >>> req.Free()
    """


class NonFiniteLoss(HxmpiError, ArithmeticError):
    """The training loss became NaN or infinite (raised on every rank, after an agreement).

    Raised by the trainer at the end of the epoch in which it happened; the message names the epoch
    and step. Also an ``ArithmeticError``.

    Examples
    --------
    >>> from hxmpi.errors import NonFiniteLoss
    >>> from hxmpi.train.run_config import TrainConfig
    >>> from hxmpi.train.trainer import Trainer
    >>> with np.errstate(all="ignore"):
    ...     try:
    ...         Trainer(TrainConfig(epochs=1, lr=1e30, quiet=True), MPI.COMM_WORLD).run()
    ...     except NonFiniteLoss:
    ...         print("diverged: lower lr")
    diverged: lower lr
    """


class ExchangeTypeError(ExchangeError, TypeError):
    """A spec item of the wrong kind (not a buffer, non-integer counts): mpi4py raises TypeError here.

    Raised on every rank, before data moves, as an ``ExchangeError`` that is also a ``TypeError``
    (also for device memory hxmpi cannot read).

    Examples
    --------
    >>> try:
    ...     hc.Alltoallv([sbuf, "many", MPI.DOUBLE], [rbuf, rcounts, MPI.DOUBLE])
    ... except TypeError as exc:
    ...     print(isinstance(exc, hxmpi.ExchangeTypeError))
    True
    """


class ExchangeKeyError(ExchangeError, KeyError):
    """A typecode string that names no MPI datatype: mpi4py raises KeyError here.

    Raised on every rank, before data moves, as an ``ExchangeError`` that is also a ``KeyError``;
    its message is printed as written.

    Examples
    --------
    >>> try:
    ...     hc.Alltoallv([sbuf, scounts, "zz"], [rbuf, rcounts, MPI.DOUBLE])
    ... except hxmpi.ExchangeKeyError as exc:
    ...     print("typecode 'zz'" in str(exc))
    True
    """

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
            route_error(exc, where, self.__dict__.get("comm"))
    return guard


def route_error(error: BaseException, where: str, comm: Optional[MPI.Comm] = None) -> None:
    """What ``guarded`` does with an error raised in ``where``: an agreed one (raised on every
    rank alike) and a request used out of order (refused before it communicates: it leaves no
    rank waiting) are raised again; any other goes to ``one_rank_error``."""
    if getattr(error, "agreed", False) or isinstance(error, PlanStateError):
        raise error
    one_rank_error(error, where, comm)
