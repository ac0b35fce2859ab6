"""Persistent all-to-alls (``HierComm.Alltoallv_init``, ``Alltoall_init``): agreed and planned once.

``make_request`` agrees and plans one call on an ``Engine`` (``engine.py``) and binds its run, for
good, to the caller's buffers, a scratch and a node window of its own (a request may be started
while one-shot calls run); ``ExchangeRequest`` is what the caller gets: each ``Start``/``Wait``
moves what the bound buffers hold at ``Start``, with nothing agreed or planned again.
"""
from __future__ import annotations

from functools import partial
from typing import Optional

from mpi4py import MPI

from ..errors import guarded, route_error
from ._call import CallTable, Persisted
from .engine import Call, Engine
from .msgspec import parse_alltoall, parse_alltoallv
from .plancache import CacheEntry
from .runs import NodeWindow, Run, Scratch

__all__ = ["ExchangeRequest", "make_request", "Persisting"]


def make_request(engine: Engine, parse, uniform: bool, sendbuf, recvbuf, algorithm) -> "ExchangeRequest":
    """Agree and plan one persistent call (collective; ``parse``: ``msgspec.parse_alltoallv`` or
    ``parse_alltoall``, ``uniform`` for the latter); its request, whose completed ``Wait`` sets the
    engine's ``calls.stats`` (the owning HierComm's ``last_stats``)."""
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
    return ExchangeRequest(run, engine.calls, engine.comm, (r.view, s.view) if sendbuf is MPI.IN_PLACE else None,
                           window)


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

    def __init__(self, run: Run, calls: CallTable, comm: MPI.Intracomm, in_place: Optional[tuple] = None,
                 window: Optional[NodeWindow] = None):
        self._run = run
        self.comm = comm  # whose error handler an error of this rank's alone follows (``errors.guarded``)
        # Start and Wait run compiled (``_call.Persisted``): state checks, the in-place copy
        # ((receive view, send copy) for MPI.IN_PLACE) and the run's program, no Python between.
        self._hot = Persisted(run, calls, in_place, partial(route_error, comm=comm))
        # The instance's Start and Wait are the compiled ones themselves (the methods below, which
        # call them, document them): no Python frame between a loop's Start and MPI_Start.
        self.Start, self.Wait = self._hot.start, self._hot.wait
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
        self._hot.start()

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
        self._hot.wait()

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
        if self._hot.active:
            self.Wait()
        self._hot.free()
        self._run.free()
        if self._window is not None:
            self._window.free()
            self._window = None
        self._run = None

    def __enter__(self) -> "ExchangeRequest":
        return self

    def __exit__(self, *exc) -> None:
        self.Free()


class Persisting:
    """The persistent calls of a HierComm (``Alltoallv_init``, ``Alltoall_init``). A class using it
    has its engine (``_engine``)."""

    @guarded(owner="HierComm")
    def Alltoallv_init(self, sendbuf, recvbuf, algorithm: Optional[str] = None) -> ExchangeRequest:
        """Persistent All to All Scatter/Gather Vector (MPI-4 style): validated, agreed and planned once.

        Each ``Start()``/``Wait()`` of the returned request moves what the same buffers hold then (with
        ``MPI.IN_PLACE``, what the receive buffer holds at ``Start``), with nothing agreed or planned
        again. Collective over the HierComm's ranks.

        Parameters
        ----------
        sendbuf, recvbuf : list
            ``Alltoallv``'s specs (``MPI.IN_PLACE`` as ``sendbuf`` too), bound to the request for good.
        algorithm : str, optional
            The request's algorithm; None: the HierComm's own ("auto" picks once, here).

        Returns
        -------
        ExchangeRequest
            The persistent request: ``Start``, ``Wait``, ``Free``; a context manager that frees it.

        Raises
        ------
        hxmpi.ExchangeError
            On every rank, for bad input on any rank, as ``Alltoallv`` (also ``ExchangeTypeError``,
            ``ExchangeKeyError``).

        Examples
        --------
        >>> send, recv = sbuf.copy(), np.empty_like(rbuf)
        >>> req = hc.Alltoallv_init([send, scounts, MPI.DOUBLE], [recv, rcounts, MPI.DOUBLE])
        >>> for step in range(3):
        ...     send[:] = rank + step  # new contents, the same buffer
        ...     req.Start()
        ...     req.Wait()
        >>> np.array_equal(recv, expected + 2)
        True
        >>> req.Free()
        """
        return make_request(self._engine, parse_alltoallv, False, sendbuf, recvbuf, algorithm)

    @guarded(owner="HierComm")
    def Alltoall_init(self, sendbuf, recvbuf, algorithm: Optional[str] = None) -> ExchangeRequest:
        """Persistent All to All Scatter/Gather (equal blocks): validated, agreed and planned once.

        As ``Alltoallv_init``, with ``Alltoall``'s specs. Collective over the HierComm's ranks.

        Parameters
        ----------
        sendbuf, recvbuf : buffer or list
            ``Alltoall``'s specs (``MPI.IN_PLACE`` as ``sendbuf`` too), bound to the request for good.
        algorithm : str, optional
            The request's algorithm; None: the HierComm's own.

        Returns
        -------
        ExchangeRequest
            The persistent request.

        Raises
        ------
        hxmpi.ExchangeError
            On every rank, for bad input on any rank, as ``Alltoall``.

        Examples
        --------
        >>> a = np.full(size, rank, dtype="i")
        >>> b = np.empty_like(a)
        >>> with hc.Alltoall_init(a, b) as req:  # freed on leaving the block
        ...     req.Start()
        ...     req.Wait()
        >>> b.tolist() == list(range(size))
        True
        """
        return make_request(self._engine, parse_alltoall, True, sendbuf, recvbuf, algorithm)
