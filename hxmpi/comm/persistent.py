"""Persistent all-to-alls (``HierComm.Alltoallv_init``, ``Alltoall_init``): agreed and planned once.

``make_request`` agrees and plans one call on an ``Engine`` (``engine.py``) and binds its run, for
good, to the caller's buffers, a scratch and a node window of its own (a request may be started
while one-shot calls run); ``ExchangeRequest`` is what the caller gets: each ``Start``/``Wait``
moves what the bound buffers hold at ``Start``, with nothing agreed or planned again.
"""
from __future__ import annotations

from typing import Callable, Optional

from mpi4py import MPI

from ..errors import PlanStateError, guarded
from .engine import Call, Engine
from .plancache import CacheEntry
from .runs import ExchangeStats, NodeWindow, Run, Scratch

__all__ = ["ExchangeRequest", "make_request"]


def make_request(engine: Engine, parse, uniform: bool, sendbuf, recvbuf, algorithm,
                 done: Callable[[ExchangeStats], None]) -> "ExchangeRequest":
    """Agree and plan one persistent call (collective; ``parse``: ``msgspec.parse_alltoallv`` or
    ``parse_alltoall``, ``uniform`` for the latter); its request. ``done(stats)``: called at each
    completed ``Wait`` (the owning HierComm's ``last_stats``)."""
    s, r, problem = parse(sendbuf, recvbuf, engine.comm.size)
    call = Call(algorithm, True, uniform)
    settings = engine.settings(call)
    agreed = engine.agree(call, s, r, problem, (None, None, settings))
    algo, radix = engine.resolve(settings[0], agreed, uniform, "plan")
    entry = CacheEntry(0, None, settings, algo, agreed.big, radix=radix)
    window = None
    if algo.hierarchical:
        entry.plan = engine.hier_plan(s, r, algo, radix).detach()
        window = NodeWindow(engine.topology.intra) if engine.window else None
    # A request owns its scratch and window: it may be started while one-shot calls run.
    run = engine.bind(entry, s, r, True, Scratch(), window)
    # In place, the send side is a copy of the receive blocks: refreshed at every Start.
    return ExchangeRequest(run, done, engine.comm, (r.view, s.view) if sendbuf is MPI.IN_PLACE else None, window)


class ExchangeRequest:
    """A persistent all-to-all (as mpi4py's ``Prequest``): ``Start()``, ``Wait()``, ``Free()``.

    Made, validated, agreed and planned once by ``HierComm.Alltoallv_init`` or ``Alltoall_init``,
    bound for good to the caller's buffers, with a scratch and a node window of its own (it may be
    started while one-shot calls run); each ``Start``/``Wait`` moves what the bound buffers hold at
    ``Start``, with nothing agreed or planned again. Collective: every rank starts, waits and frees
    its requests in the same order. Usable as a context manager (frees on exit).

    Raises
    ------
    PlanStateError
        A request used out of order: started twice without a ``Wait``, waited for without a
        ``Start``, or started or waited for after ``Free``.

    Attributes
    ----------
    comm : MPI.Intracomm
        The owning HierComm's communicator, whose error handler an error of this rank's alone
        follows.

    Examples
    --------
    >>> send, recv = sbuf.copy(), np.empty_like(rbuf)
    >>> with hc.Alltoallv_init([send, scounts, MPI.DOUBLE], [recv, rcounts, MPI.DOUBLE]) as req:
    ...     for step in range(2):
    ...         req.Start()
    ...         req.Wait()
    >>> np.array_equal(recv, expected)
    True
    """

    def __init__(self, run: Run, done: Callable[[ExchangeStats], None], comm: MPI.Intracomm,
                 in_place: Optional[tuple] = None, window: Optional[NodeWindow] = None):
        self._run, self._done, self._active = run, done, False
        self.comm = comm  # whose error handler an error of this rank's alone follows (``errors.guarded``)
        self._in_place = in_place  # (receive view, send copy) for MPI.IN_PLACE
        self._window = window  # the node window this request owns (freed with it), if any

    @property
    def algorithm(self) -> str:
        """The algorithm this request runs (one of ``plan.ALGORITHMS``): the pick of "auto", made once.

        Returns
        -------
        str
            "flat", "hier", "hier_pairwise", "bruck", "hier_bruck" or "hier_leaders".

        Raises
        ------
        AttributeError
            After ``Free`` (the request no longer holds a run).

        Examples
        --------
        >>> req = hc.Alltoallv_init([sbuf, scounts, MPI.DOUBLE], [rbuf, rcounts, MPI.DOUBLE], algorithm="flat")
        >>> req.algorithm
        'flat'
        >>> req.Free()
        """
        return self._run.stats.algorithm

    def _live(self) -> Run:
        if self._run is None:
            raise PlanStateError("this persistent exchange was freed; create a new one with Alltoallv_init")
        return self._run

    @guarded
    def Start(self) -> None:
        """Start one exchange of the bound buffers' current contents.

        With ``MPI.IN_PLACE`` as the send spec, what the receive buffer holds now is sent.

        Raises
        ------
        PlanStateError
            On this rank: ``Start()`` called twice without ``Wait()``, or after ``Free``. It is
            refused before anything is communicated.
        MPI.Exception
            An MPI error of this rank's alone, where the user chose ``MPI.ERRORS_RETURN``; otherwise it
            ends the job.

        Examples
        --------
        >>> req = hc.Alltoallv_init([sbuf, scounts, MPI.DOUBLE], [rbuf, rcounts, MPI.DOUBLE])
        >>> req.Start()
        >>> try:
        ...     req.Start()
        ... except PlanStateError:
        ...     print("Wait() first")
        Wait() first
        >>> req.Wait()
        >>> req.Free()
        """
        run = self._live()
        if self._active:
            raise PlanStateError("Start() called twice without Wait(); call Wait() first")
        if self._in_place is not None:
            recv, send = self._in_place
            send[:] = recv[:send.shape[0]]
        run.start()
        self._active = True

    @guarded
    def Wait(self) -> None:
        """Complete the exchange started by ``Start()``; the owning HierComm's ``last_stats`` are then its.

        Raises
        ------
        PlanStateError
            On this rank: ``Wait()`` without ``Start()``, or after ``Free``.
        MPI.Exception
            An MPI error of this rank's alone, where the user chose ``MPI.ERRORS_RETURN``; otherwise it
            ends the job.

        Examples
        --------
        >>> req = hc.Alltoallv_init([sbuf, scounts, MPI.DOUBLE], [rbuf, rcounts, MPI.DOUBLE])
        >>> req.Start()
        >>> req.Wait()
        >>> hc.last_stats["plan_cache"]
        'request'
        >>> req.Free()
        """
        run = self._live()
        if not self._active:
            raise PlanStateError("Wait() without Start(); call Start() first")
        self._active = False
        run.wait()
        self._done(run.stats)  # the owning HierComm's last_stats

    @guarded
    def Free(self) -> None:
        """Release the request's MPI requests, datatypes, buffers and window; an active exchange is waited for first.

        Freeing a freed request does nothing; any other use of it raises ``PlanStateError``.

        Raises
        ------
        MPI.Exception
            An MPI error of this rank's alone while completing an active exchange, where the user
            chose ``MPI.ERRORS_RETURN``; otherwise it ends the job.

        Examples
        --------
        >>> req = hc.Alltoall_init(sbuf[:size], rbuf[:size])
        >>> req.Start()
        >>> req.Free()  # waits for the exchange first
        >>> try:
        ...     req.Start()
        ... except PlanStateError:
        ...     print("freed")
        freed
        """
        if self._run is None:
            return
        if self._active:
            self.Wait()
        self._run.free()
        if self._window is not None:
            self._window.free()
            self._window = None
        self._run = None

    def __enter__(self) -> "ExchangeRequest":
        return self

    def __exit__(self, *exc) -> None:
        self.Free()
