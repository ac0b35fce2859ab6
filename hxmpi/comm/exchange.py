"""HierComm: the public face of hxmpi's all-to-all, a drop-in for mpi4py's communicator.

The calls (``Alltoallv``, ``Alltoall``, ``Alltoallw``; their nonblocking ``I...`` and persistent
``..._init`` forms; the numpy ``alltoallv``) take mpi4py's buffer specs and give what
``comm.Alltoallv`` gives, byte for byte, moving the bytes flat, hierarchically (lanes, then the
node phase; ``docs/method.md``) or in log rounds, whichever the call asks for or "auto" picks.

What runs a call lives beside this module, one job a module: ``settings`` (the constructor's
settings, checked and agreed), ``engine`` (a one-shot call's stages over its call context:
lookup, agreement, conclusion, plan, run), ``persistent`` (planned-once requests, and the
``..._init`` calls that make them),
``nonblocking`` (requests and their progress; ``progress_thread``, its thread mode),
``alltoallw`` (datatype specs as bytes), ``rows`` (the numpy ``alltoallv``) and ``derived`` (the
communicators a HierComm makes). Every other attribute of a communicator falls
through to ``comm``. Bad input raises ``ExchangeError`` on every rank.
"""
from __future__ import annotations

import inspect
from functools import partial
from typing import Optional

import numpy as np
from mpi4py import MPI

from ..errors import guarded, one_rank_error, route_error
from ._call import DONE, NOT_FOUND, find_typed
from .alltoallw import TypedSides
from .derived import CartDeriving, Deriving, is_cartesian
from .engine import Call, Engine
from .msgspec import Side, count_arrays, parse_alltoall, parse_alltoallv
from .nonblocking import HierRequest, Requests
from .persistent import ExchangeRequest, Persisting
from .progress_thread import Progress
from .plan import Layout
from .plancache import DEFAULT_BYTES, DEFAULT_ENTRIES
from .rows import Rows
from .settings import agree_settings, check, pricing
from .topology import Topology

__all__ = ["HierComm", "CartHierComm", "ExchangeRequest", "HierRequest"]

class HierComm(Deriving, Persisting, Rows):
    """All-to-all over MPI ranks grouped into nodes: flat, hierarchical or in log rounds.

    A drop-in for mpi4py's communicator. ``Alltoallv``, ``Alltoall`` and ``Alltoallw`` (blocking),
    their nonblocking ``Ialltoall...`` and persistent ``..._init`` forms, and the numpy
    ``alltoallv`` take mpi4py's buffer specs and give what ``comm.Alltoallv`` gives, byte for byte,
    moving the bytes flat (one ``MPI_Alltoallv``), hierarchically (lanes, then nodes) or in log
    rounds (Bruck), as the call asks or "auto" picks. Every other public attribute of an
    ``MPI.Intracomm`` (``Get_rank``, ``Allreduce``, ``Barrier``, ``Sendrecv``, ...) falls through to
    ``comm`` (a duplicate of the communicator given), so a HierComm stands in wherever a client
    passes a communicator. Over a Cartesian communicator the HierComm is a ``CartHierComm``.
    Collective over ``comm``: every rank constructs it, with the same settings.

    Parameters
    ----------
    comm : MPI.Intracomm or hxmpi.HierComm, default MPI.COMM_WORLD
        The ranks to exchange among; the HierComm works on a duplicate of it.
    ranks_per_node : int, optional
        Virtual nodes of k consecutive ranks (the last may be smaller). Default: env
        ``HXMPI_RANKS_PER_NODE``, else the shared-memory domains (the real nodes).
    node_of : sequence of int, optional
        A node id per rank, any layout (``[0, 0, 1, 1, 0]``); ids are renumbered 0, 1, ... in
        order of each node's lowest rank. Not with ``ranks_per_node``.
    algorithm : str, default "auto"
        "auto" (the cost model picks, per call), "flat" (one ``MPI_Alltoallv``), "hier" (lanes,
        then the node phase), "hier_pairwise", "bruck", "hier_bruck" or "hier_leaders"
        (multi-leader: ``leaders`` ranks of each node carry its traffic to other nodes, through
        the node's shared window, so it needs the "shm" node phase). Every call may override it.
        The hierarchical ones run flat on a layout without a hierarchy (one node, or nodes of one
        rank). "auto" asks the cost model (``costmodel.auto_pick``) which algorithm and Bruck
        radix is fastest for each call's agreed count pattern, each path priced with hxmpi's
        measured CPU per call (``overhead``).
    topology : hxmpi.Topology, optional
        An existing ``Topology`` to reuse instead of building one; the HierComm then works on its
        communicator (``comm``, ``ranks_per_node`` and ``node_of`` are not read), and ``free``
        frees it.
    tuning : str, optional
        A calibration file (``benchmarks/calibrate.py``) that the cost model of "auto" reads. Default:
        env ``HXMPI_TUNING``, else built-in defaults. Every rank must read the same file.
    node_phase : {"auto", "shm", "mpi"}, optional
        How the hierarchical path's node phase moves data: "auto" is shared memory wherever every
        node's ranks share memory. Default: env ``HXMPI_NODE_PHASE``, else "auto".
    cache_entries : int, default 16
        Entries of the agreed plan cache of one-shot calls; 0 turns the cache off.
    cache_bytes : int, default 268435456
        Bytes per rank of plans and buffers the plan cache keeps alive.
    radix : int, default 2
        Bruck radix (>= 2) of an explicit "bruck" or "hier_bruck"; "auto" picks its own.
    overhead : str, optional
        A CPU-per-path file (``bench_overhead.py --json``) that "auto" prices hxmpi's own CPU
        with. Default: env ``HXMPI_OVERHEAD``, else the file packaged with hxmpi (the simulator's
        prices). Every rank must read the same file.
    progress : {"request", "thread"}, default "request"
        How nonblocking calls move: "request" inside any request's ``Test``/``Wait``, as state
        machines over MPI's own nonblocking calls (no thread, any MPI thread level); "thread" on
        a progress thread, which needs ``MPI_THREAD_MULTIPLE`` and pays where the thread has a
        spare core (``hxmpi/comm/nonblocking.py``). The same on every rank.
    leaders : int, default 2
        Leaders per node (>= 1) of an explicit "hier_leaders"; above the smallest node's size it
        acts as that size; "auto" picks the count itself. The same on every rank.
    chunks : int, default 1
        Chunks (1 to 8) of an explicit "hier"'s pipelined node phase: the lanes move each node's
        blocks in that many chunks, each on the wire while the node copies the one before it out
        of the shared window (1: no pipeline; the "mpi" node phase never pipelines); "auto" picks
        the count itself. The same on every rank.

    Raises
    ------
    hxmpi.ExchangeError
        On every rank: a bad setting on any rank (``algorithm``, ``cache_entries``,
        ``cache_bytes``, ``radix``, ``leaders``, ``chunks``, ``progress``, ``node_phase``), a setting that
        differs between ranks, a tuning or CPU-per-path file that cannot be read (the message
        names the file), or ``node_phase="shm"`` where a node's ranks do not all share memory.
    hxmpi.TopologyError
        On every rank: a bad node layout (``ranks_per_node``, ``node_of``) or one that differs
        between ranks.

    Attributes
    ----------
    comm : MPI.Intracomm
        The duplicate communicator the HierComm works on.
    topology : hxmpi.Topology
        The nodes and their communicators (intra-node, lanes).
    algorithm : str
        The default algorithm of calls, as given.
    radix : int
        The Bruck radix of an explicit "bruck" or "hier_bruck".
    leaders : int
        The leaders per node of an explicit "hier_leaders".
    chunks : int
        The chunks of an explicit "hier"'s pipelined node phase.
    node_phase : str
        "shm" or "mpi", as agreed: how the hierarchical path's node phase moves data.
    progress : str
        How nonblocking calls move: "request" or "thread".
    cost_model : hxmpi.comm.costmodel.CostModel
        What "auto" prices with (``predict``, ``choose``, ``crossover``); the same on every rank.
    cpu_times : hxmpi.comm.costmodel.CpuTimes
        hxmpi's CPU per path that "auto" adds to the cost model's prices.
    plan_cache : hxmpi.comm.plancache.PlanCache
        The agreed plan cache of one-shot calls.
    layout : hxmpi.comm.plan.Layout
        The static node layout the planners use (members, lanes).

    See Also
    --------
    CartHierComm : a HierComm over a Cartesian communicator.
    HierRequest : what the nonblocking calls return.

    Notes
    -----
    Results equal ``comm.Alltoallv``'s byte for byte. Bad input raises ``ExchangeError`` on every
    rank, before any data moves. An error that one rank alone meets inside a call (an MPI error, a
    fault in a copy) cannot reach the other ranks, which would wait for it forever: it ends the
    job (``MPI_Abort``, ``errors.abort_job``), naming the rank and the cause, as MPI's
    ``MPI_ERRORS_ARE_FATAL`` does, unless the user chose ``MPI.ERRORS_RETURN`` for ``comm``: then
    it is raised on that rank (``errors.returns_errors``). ``Free`` is ``free``. The communicators made from a HierComm
    (``Dup``, ``Split``, ``Split_type``, ``Create_cart``, ``Create_group``, ``Create``) are
    HierComms too, with its settings and nodes.

    Examples
    --------
    >>> flat = hxmpi.HierComm(MPI.COMM_WORLD, ranks_per_node=2, algorithm="flat")
    >>> flat.Alltoallv([sbuf, scounts, MPI.DOUBLE], [rbuf, rcounts, MPI.DOUBLE])
    >>> flat.last_stats["algorithm"], np.array_equal(rbuf, expected)
    ('flat', True)
    >>> flat.Get_size() == MPI.COMM_WORLD.Get_size()  # falls through to flat.comm
    True
    >>> flat.free()

    A bad setting raises on every rank alike:

    >>> try:
    ...     hxmpi.HierComm(MPI.COMM_WORLD, algorithm="fastest")
    ... except hxmpi.ExchangeError:
    ...     print("refused")
    refused
    """

    def __new__(cls, *args, **kwargs):
        """A ``CartHierComm`` where the communicator is Cartesian (as mpi4py's ``Dup`` of a
        ``Cartcomm`` is one), so its ``Sub`` stays hierarchical."""
        if cls is HierComm:
            given = _INIT.bind_partial(None, *args, **kwargs).arguments  # a bad call raises as __init__ would
            topology = given.get("topology")
            comm = topology.comm if topology is not None else given.get("comm", MPI.COMM_WORLD)
            if is_cartesian(comm.comm if isinstance(comm, HierComm) else comm):
                cls = CartHierComm
        return super().__new__(cls)

    @guarded
    def __init__(self, comm: MPI.Intracomm = MPI.COMM_WORLD, ranks_per_node: Optional[int] = None,
                 node_of=None, algorithm: str = "auto", topology: Optional[Topology] = None,
                 tuning: Optional[str] = None, node_phase: Optional[str] = None,
                 cache_entries: int = DEFAULT_ENTRIES, cache_bytes: int = DEFAULT_BYTES, radix: int = 2,
                 overhead: Optional[str] = None, progress: str = "request", leaders: int = 2, chunks: int = 1):
        # A bad setting is agreed below, with the node phase: a rank raising here alone would leave
        # the others waiting in Topology's collectives.
        bad = check(algorithm, cache_entries, cache_bytes, radix, leaders, progress, chunks)
        #: how nonblocking calls move: "request" (inside Test/Wait) or "thread" (``nonblocking.py``)
        self.progress = progress
        #: the cost model behind "auto" and hxmpi's CPU per path it prices with (the same on every rank)
        self.cost_model, self.cpu_times, problem = pricing(tuning, overhead)
        self.radix = radix
        #: the leaders per node of an explicit "hier_leaders"
        self.leaders = leaders
        #: the chunks of an explicit "hier"'s pipelined node phase (1: none)
        self.chunks = chunks
        self.algorithm = algorithm
        self.topology = topology if topology is not None else Topology(comm, ranks_per_node, node_of)
        self.comm = self.topology.comm
        #: the static node layout (``plan.Layout``): members, lanes, planners
        self.layout = Layout(self.topology.node_of)
        #: "shm" or "mpi": how the hierarchical path's node phase moves data.
        self.node_phase, key = agree_settings(self.topology, self.layout.hier_possible, node_phase, bad or problem,
                                              radix, leaders, self.cost_model, self.cpu_times, progress, chunks)
        engine_args = (algorithm, radix, leaders, chunks, self.cost_model, self.cpu_times, cache_entries, cache_bytes)
        self._engine = Engine(self.topology, self.layout, self.node_phase, key, *engine_args)
        #: the agreed plan cache of one-shot calls (``hxmpi/comm/plancache.py``).
        self.plan_cache = self._engine.plan_cache
        self._count_send = np.empty(self.comm.size, dtype=np.int64)  # alltoallv's count exchange, reused
        self._count_recv = np.empty(self.comm.size, dtype=np.int64)
        self._count_request: Optional[ExchangeRequest] = None
        self._typed: Optional[TypedSides] = None  # Alltoallw's layouts and kept calls, made on first use
        self._progress: Optional[Progress] = None  # the nonblocking calls' thread, made on first use
        # Request mode's queue and engine, made here (collective), so that a nonblocking call stays
        # local: its agreements, gathers and data move on duplicates of this HierComm's
        # communicators, with the node phase by message passing (a window's barriers would need
        # every rank of the node inside the library at once).
        self._requests: Optional[Requests] = None
        if progress == "request":
            twin = self.topology.duplicate()
            deferred = (self.topology.intra.Dup(), self.comm.Dup())  # the gathers' and the agreements'
            self._requests = Requests(Engine(twin, self.layout, "mpi", key, *engine_args, deferred=deferred),
                                      partial(one_rank_error, comm=self.comm))
        # Request mode's hit lane (``_call.HitLane``: routes its own errors, as a guard would)
        self._lane = self._requests.lane if self._requests is not None else None
        #: what a HierComm with this one's layout and settings is built from (the progress thread's)
        self._settings = dict(node_of=list(self.topology.node_of), algorithm=algorithm, tuning=tuning,
                              node_phase=self.node_phase, cache_entries=cache_entries, cache_bytes=cache_bytes,
                              radix=radix, overhead=overhead, progress=progress, leaders=leaders, chunks=chunks)

    # ------------------------------------------------------------------ public API
    def Alltoallv(self, sendbuf, recvbuf, algorithm: Optional[str] = None, validate: bool = True) -> None:
        """All to All Scatter/Gather Vector: blocks of any size, counts and displacements in elements.

        Rank i's block for rank j goes to rank j's block for rank i; the result equals
        ``comm.Alltoallv``'s byte for byte. Collective over the HierComm's ranks.

        Parameters
        ----------
        sendbuf : list or MPI.IN_PLACE
            mpi4py's ``Alltoallv`` spec: ``[buf, counts]``, ``[buf, counts, datatype]``,
            ``[buf, counts, displs, datatype]`` or ``[buf, (counts, displs), datatype]``. Counts and
            displacements in elements of the datatype: one per rank, one int for all, or None; the
            datatype an ``MPI.Datatype`` (predefined or contiguous), a typecode ("d") or None (from the
            buffer). ``MPI.IN_PLACE``: the data to send is what the receive buffer holds.
        recvbuf : list
            The same forms, for what this rank receives.
        algorithm : str, optional
            This call's algorithm (one of ``HierComm``'s); None: the HierComm's own.
        validate : bool, default True
            False skips only the pairwise byte check (that each pair agrees on the bytes it sends and
            expects); every other check stays.

        Raises
        ------
        hxmpi.ExchangeError
            On every rank, before any data moves, for bad input on any rank: counts, displacements,
            buffers, datatypes, or bytes that differ between sender and receiver.
        hxmpi.ExchangeTypeError
            On every rank: a spec item of the wrong kind (not a buffer, non-integer counts).
        hxmpi.ExchangeKeyError
            On every rank: a typecode that names no MPI datatype.

        See Also
        --------
        Alltoall : equal blocks.
        Alltoallw : displacements in bytes, a datatype per peer.
        Ialltoallv : the nonblocking form.
        Alltoallv_init : the persistent form.

        Examples
        --------
        >>> hc.Alltoallv([sbuf, scounts, MPI.DOUBLE], [rbuf, rcounts, MPI.DOUBLE])
        >>> np.array_equal(rbuf, expected)
        True
        >>> sdispls = np.arange(size) * (rank + 1)  # the same layout, displacements given
        >>> hc.Alltoallv([sbuf, scounts, sdispls, MPI.DOUBLE], [rbuf, (rcounts, None), "d"], algorithm="flat")

        Bad input raises on every rank, before any data moves:

        >>> try:
        ...     hc.Alltoallv([sbuf, scounts + 1, MPI.DOUBLE], [rbuf, rcounts, MPI.DOUBLE])
        ... except hxmpi.ExchangeError as exc:
        ...     print("past the buffer" in str(exc))
        True
        """
        # Errors routed here, not by a guard's wrapper frame: this is the hot path (a hit runs
        # from here to its return in compiled code).
        try:
            # A compiled hit goes from here to its return in compiled code: no call context is made.
            calls = self._engine.calls
            done = calls.call(sendbuf, recvbuf, algorithm, validate, False, self.algorithm)
            if done == NOT_FOUND:  # nothing communicated yet: lists the compiled reader does not take (of
                # numpy integers, say) are read again as int64 arrays
                s, r = count_arrays(sendbuf), count_arrays(recvbuf)
                if s is not None or r is not None:
                    sendbuf, recvbuf = sendbuf if s is None else s, recvbuf if r is None else r
                    done = calls.call(sendbuf, recvbuf, algorithm, validate, False, self.algorithm)
            if done != DONE:
                self._engine.general(Call(algorithm, validate), parse_alltoallv, sendbuf, recvbuf, done)
        except BaseException as exc:  # noqa: BLE001 - errors.route_error decides
            route_error(exc, "HierComm.Alltoallv", self.comm)

    def Alltoall(self, sendbuf, recvbuf, algorithm: Optional[str] = None, validate: bool = True) -> None:
        """All to All Scatter/Gather: equal blocks of ``len(buf) / size`` elements (or a given count).

        Collective over the HierComm's ranks; the result equals ``comm.Alltoall``'s byte for byte. Flat
        runs as ``MPI_Alltoall``, so the MPI library's own algorithms for it apply.

        Parameters
        ----------
        sendbuf : buffer, list or MPI.IN_PLACE
            mpi4py's ``Alltoall`` spec: ``buf``, ``[buf, datatype]``, ``[buf, count]``,
            ``[buf, count, datatype]`` or ``[buf, (count, displ), datatype]`` (elements per rank; a
            datatype as for ``Alltoallv``). ``MPI.IN_PLACE``: the data to send is what the receive
            buffer holds.
        recvbuf : buffer or list
            The same forms, for what this rank receives.
        algorithm : str, optional
            This call's algorithm (one of ``HierComm``'s); None: the HierComm's own.
        validate : bool, default True
            False skips only the pairwise byte check.

        Raises
        ------
        hxmpi.ExchangeError
            On every rank, before any data moves, for bad input on any rank (as ``Alltoallv``).
        hxmpi.ExchangeTypeError
            On every rank: a spec item of the wrong kind.
        hxmpi.ExchangeKeyError
            On every rank: a typecode that names no MPI datatype.

        Examples
        --------
        >>> a = np.arange(2 * size, dtype="i") + 100 * rank  # two ints for each rank
        >>> b = np.empty_like(a)
        >>> hc.Alltoall(a, b)
        >>> b[::2].tolist() == [100 * src + 2 * rank for src in range(size)]
        True
        >>> hc.Alltoall([a, MPI.INT], [b, MPI.INT], algorithm="flat")  # runs MPI_Alltoall
        """
        # Errors routed here, not by a guard's wrapper frame: this is the hot path (a hit runs
        # from here to its return in compiled code).
        try:
            done = self._engine.calls.call(sendbuf, recvbuf, algorithm, validate, True, self.algorithm)
            if done != DONE:
                self._engine.general(Call(algorithm, validate, uniform=True), parse_alltoall, sendbuf, recvbuf, done)
        except BaseException as exc:  # noqa: BLE001 - errors.route_error decides
            route_error(exc, "HierComm.Alltoall", self.comm)

    def Alltoallw(self, sendbuf, recvbuf, algorithm: Optional[str] = None, validate: bool = True) -> None:
        """All to All Scatter/Gather General: a datatype per peer, basic or derived, displacements in bytes.

        Packs what is not contiguous, moves the bytes as ``Alltoallv`` does (every algorithm), unpacks
        (``hxmpi/comm/alltoallw.py``); receive-buffer bytes outside the receive type maps stay
        untouched, as with MPI. Collective over the HierComm's ranks.

        Parameters
        ----------
        sendbuf : list or MPI.IN_PLACE
            mpi4py's ``Alltoallw`` spec: ``[buf, counts, displs, datatypes]``,
            ``[buf, (counts, displs), datatypes]`` or ``[buf, datatypes]`` (one item of each type at
            displacement 0): for peer i, ``counts[i]`` items of ``datatypes[i]`` (committed) starting
            ``displs[i]`` bytes into ``buf``. ``MPI.IN_PLACE``: the data to send is what the receive
            side describes.
        recvbuf : list
            The same forms, for what this rank receives.
        algorithm : str, optional
            This call's algorithm (one of ``HierComm``'s); None: the HierComm's own.
        validate : bool, default True
            False skips only the pairwise byte check.

        Raises
        ------
        hxmpi.ExchangeError
            On every rank, before any data moves, for bad input on any rank: counts, displacements,
            datatypes (one per peer, committed), buffers, bytes that differ between sender and receiver.
        hxmpi.ExchangeTypeError
            On every rank: a spec item of the wrong kind.

        Examples
        --------
        >>> wsend = np.full(size, float(rank))  # one double for each rank
        >>> wrecv = np.zeros(2 * size)          # received into every other slot
        >>> hc.Alltoallw([wsend, [1] * size, [8 * i for i in range(size)], [MPI.DOUBLE] * size],
        ...              [wrecv, [1] * size, [16 * i for i in range(size)], [MPI.DOUBLE] * size])
        >>> wrecv[::2].tolist() == [float(src) for src in range(size)]
        True
        >>> not wrecv[1::2].any()  # bytes outside the receive type maps stay untouched
        True
        """
        # Errors routed here, not by a guard's wrapper frame: this is the hot path (a hit runs
        # from here to its return in compiled code).
        try:
            typed, engine, call = self._typed, self._engine, Call(algorithm, validate)
            if typed is None:
                typed = self._typed = TypedSides(self.comm.size)
            kept = find_typed(typed.calls, sendbuf, recvbuf, algorithm, validate)  # a kept call's specs
            if kept is None:
                kept, problem = typed.prepare(sendbuf, recvbuf, algorithm, validate)
                if problem:  # agreed like any call's problem: raises on every rank, before data moves
                    nothing = Side(None, None, None)
                    engine.one_shot(call, nothing, nothing, problem, False)
            # ``Alltoallv`` of byte specs of the common form, its Python frame skipped: a kept call's
            # specs are the objects the compiled path recognised last time. Where a side is packed,
            # the run bound for good to them is composed with the type maps (``alltoallw.composed``):
            # it reads and writes the caller's buffers itself, so that side is neither packed before
            # it nor scattered after (a hit); any other run moves the packed bytes.
            send, recv, parts = kept.send_spec, kept.recv_spec, kept.parts
            later = parts is not None and parts[1] is not None and engine.calls.ready(send, recv, algorithm, validate)
            if kept.pack is not None and not later:
                kept.pack.run()
            call.typed = kept
            done = engine.calls.call(send, recv, algorithm, validate, False, self.algorithm)
            if done != DONE:
                if later and kept.pack is not None:  # agreed, nothing moved yet: the general path may run a
                    kept.pack.run()                   # plan on the packed bytes
                engine.general(call, parse_alltoallv, send, recv, done)
            if kept.unpack is not None and (parts is None or engine.calls.state != "hit"):
                kept.unpack.run()
        except BaseException as exc:  # noqa: BLE001 - errors.route_error decides
            route_error(exc, "HierComm.Alltoallw", self.comm)

    def Ialltoallv(self, sendbuf, recvbuf, algorithm: Optional[str] = None, validate: bool = True) -> HierRequest:
        """Nonblocking ``Alltoallv``: returns a request at once; the data moves inside its ``Test``/``Wait``.

        In request mode (``progress="request"``, the default) the call is local: it parses the spec,
        queues the request and returns without waiting for any other rank, as MPI's nonblocking
        collectives do. The request then moves at every ``Test``/``Wait`` of any hxmpi request of the
        process, and needs no particular MPI thread level; with ``progress="thread"`` a progress thread
        runs it (``hxmpi/comm/nonblocking.py``). Every rank makes its nonblocking calls on a HierComm in
        the same order. The buffers, and the specs' counts, displacements and datatypes, must stay
        untouched until the request completes.

        Parameters
        ----------
        sendbuf, recvbuf : list
            ``Alltoallv``'s specs (``MPI.IN_PLACE`` as ``sendbuf`` too).
        algorithm : str, optional
            This call's algorithm; None: the HierComm's own. "hier_leaders" is refused in request mode
            (its nonblocking calls move the node phase by message passing).
        validate : bool, default True
            False skips only the pairwise byte check.

        Returns
        -------
        HierRequest
            The request. A bad spec, a mismatch between ranks, or a receive buffer that an earlier
            request of this HierComm still receives into, is raised by its ``Wait``/``Test``, on every
            rank (``ExchangeError`` or a subclass); the call itself never raises for bad input.

        Raises
        ------
        hxmpi.HxmpiError
            With ``progress="thread"`` where MPI runs below ``MPI_THREAD_MULTIPLE``: on every rank, at
            the first nonblocking call (which sets the thread up, collectively).

        Examples
        --------
        >>> req = hc.Ialltoallv([sbuf, scounts, MPI.DOUBLE], [rbuf, rcounts, MPI.DOUBLE])
        >>> while not req.Test():  # compute in slices, moving the exchange between them
        ...     work = sum(range(1000))
        >>> np.array_equal(rbuf, expected)
        True

        Errors come from ``Wait`` (or ``Test``), on every rank:

        >>> bad = hc.Ialltoallv([sbuf, scounts + 1, MPI.DOUBLE], [rbuf, rcounts, MPI.DOUBLE])
        >>> try:
        ...     bad.Wait()
        ... except hxmpi.ExchangeError:
        ...     print("raised by Wait")
        raised by Wait
        """
        if self._lane is not None:  # a repeated call on bound, compiled buffers: begun at once, compiled
            hit = self._lane.call(sendbuf, recvbuf, algorithm, validate, False)
            if hit is not None:
                return hit
        return self._nonblocking("Alltoallv", sendbuf, recvbuf, algorithm, validate)

    def Ialltoall(self, sendbuf, recvbuf, algorithm: Optional[str] = None, validate: bool = True) -> HierRequest:
        """Nonblocking ``Alltoall`` (equal blocks); local in request mode, as ``Ialltoallv``.

        Parameters
        ----------
        sendbuf, recvbuf : buffer or list
            ``Alltoall``'s specs.
        algorithm : str, optional
            This call's algorithm; None: the HierComm's own.
        validate : bool, default True
            False skips only the pairwise byte check.

        Returns
        -------
        HierRequest
            The request; errors of the call (bad input, on every rank) are raised by its
            ``Wait``/``Test``.

        Raises
        ------
        hxmpi.HxmpiError
            With ``progress="thread"`` where MPI runs below ``MPI_THREAD_MULTIPLE`` (as ``Ialltoallv``).

        Examples
        --------
        >>> a = np.arange(2 * size, dtype="i") + 100 * rank
        >>> b = np.empty_like(a)
        >>> req = hc.Ialltoall(a, b)
        >>> req.Wait()
        True
        >>> b[1::2].tolist() == [100 * src + 2 * rank + 1 for src in range(size)]
        True
        """
        if self._lane is not None:  # a repeated call on bound, compiled buffers: begun at once, compiled
            hit = self._lane.call(sendbuf, recvbuf, algorithm, validate, True)
            if hit is not None:
                return hit
        return self._nonblocking("Alltoall", sendbuf, recvbuf, algorithm, validate)

    def Ialltoallw(self, sendbuf, recvbuf, algorithm: Optional[str] = None, validate: bool = True) -> HierRequest:
        """Nonblocking ``Alltoallw`` (a datatype per peer); local in request mode, as ``Ialltoallv``.

        The received bytes are scattered into the receive buffer as the request completes.

        Parameters
        ----------
        sendbuf, recvbuf : list
            ``Alltoallw``'s specs (displacements in bytes).
        algorithm : str, optional
            This call's algorithm; None: the HierComm's own.
        validate : bool, default True
            False skips only the pairwise byte check.

        Returns
        -------
        HierRequest
            The request; errors of the call (bad input, on every rank) are raised by its
            ``Wait``/``Test``.

        Raises
        ------
        hxmpi.HxmpiError
            With ``progress="thread"`` where MPI runs below ``MPI_THREAD_MULTIPLE`` (as ``Ialltoallv``).

        Examples
        --------
        >>> wsend, wrecv = np.full(size, float(rank)), np.zeros(size)
        >>> displs = [8 * i for i in range(size)]
        >>> req = hc.Ialltoallw([wsend, [1] * size, displs, [MPI.DOUBLE] * size],
        ...                     [wrecv, [1] * size, displs, [MPI.DOUBLE] * size])
        >>> req.Wait(), wrecv.tolist() == [float(src) for src in range(size)]
        (True, True)
        """
        return self._nonblocking("Alltoallw", sendbuf, recvbuf, algorithm, validate)

    @guarded
    def _nonblocking(self, method: str, sendbuf, recvbuf, algorithm, validate) -> HierRequest:
        """A nonblocking call of ``method``: parsed here and queued (request mode: local, nothing
        waits for another rank; a bad spec is this request's error, raised by its Wait/Test on
        every rank) or handed to the progress thread."""
        if self.progress == "thread":
            # The first call sets the thread up, collectively: every rank makes it alike.
            if self._progress is None:
                self._progress = Progress(lambda: HierComm(self.comm, **self._settings))
            return self._progress.submit(method, sendbuf, recvbuf, algorithm, validate)
        return self._requests.call(method, sendbuf, recvbuf, algorithm, validate)

    def __getattr__(self, name: str):
        """A public attribute of ``comm`` that HierComm lacks (called only when lookup fails)."""
        comm = self.__dict__.get("comm")
        if name.startswith("_") or comm is None or not hasattr(comm, name):
            raise AttributeError(f"'HierComm' object has no attribute {name!r}"
                                 + ("" if name.startswith("_") else " (nor has its MPI communicator)"))
        return getattr(comm, name)

    def _derived(self, comm: MPI.Intracomm, node_of: list) -> "HierComm":
        """A HierComm like this one over a duplicate of ``comm``, its ranks on nodes ``node_of``
        (``derived.Deriving``)."""
        return HierComm(comm, **{**self._settings, "node_of": node_of})

    @property
    def scratch_bytes(self) -> int:
        """Scratch memory of one-shot calls on this rank, in bytes.

        Private buffers, the compiled runner's Bruck send buffers and arenas, plus this rank's share of
        the node window.

        Returns
        -------
        int
            Bytes.

        Raises
        ------
        MPI.Exception
            After ``free()`` (the communicators it reads are freed).

        Examples
        --------
        >>> hc.Alltoallv([sbuf, scounts, MPI.DOUBLE], [rbuf, rcounts, MPI.DOUBLE])
        >>> hc.scratch_bytes >= 0
        True
        """
        return self._engine.scratch_bytes

    @property
    def last_stats(self) -> dict:
        """Messages and bytes of the last call on this rank: per phase, across node boundaries, copied.

        The last blocking call's, or the last completed ``Wait`` of a persistent request of this
        HierComm (nonblocking calls do not set it); ``{}`` before any.

        Returns
        -------
        dict
            ``algorithm``: what ran, the pick of "auto" included (with ``radix`` for the Bruck ones,
            ``leaders`` for multi-leader); ``plan_cache``: "hit" (a cached persistent run),
            "hit-rebound" (a cached plan on new buffers), "miss" (planned anew), "off" (cache off) or
            "request" (a persistent request); ``inter_node`` (messages and bytes across node boundaries)
            and ``copy_bytes`` (bytes copied); ``copies_per_byte`` (``copy_bytes`` per byte
            delivered to this rank's receive buffer: 0.0 flat, about 2.0 where every byte is packed
            and copied out of the node window); ``flat`` (messages and bytes) for the flat path;
            ``inter``, ``intra`` and ``node_phase`` for the hierarchical ones, with ``chunks`` for a
            pipelined node phase.

        Raises
        ------
        MPI.Exception
            After ``free()``, once a call was made (the communicator it reads is freed).

        Examples
        --------
        >>> for _ in range(2):
        ...     hc.Alltoallv([sbuf, scounts, MPI.DOUBLE], [rbuf, rcounts, MPI.DOUBLE], algorithm="flat")
        >>> stats = hc.last_stats
        >>> stats["algorithm"], stats["plan_cache"], stats["flat"]["messages"] == size - 1
        ('flat', 'hit', True)
        """
        return self._engine.stats()

    @guarded
    def free(self) -> None:
        """Free cached runs, the node window, the progress thread and the Topology's communicators.

        Collective. The nonblocking calls still queued complete first. A freed HierComm cannot be used
        again, as a freed MPI communicator cannot: a call, or a second ``free``, ends the job.

        Raises
        ------
        MPI.Exception
            An MPI error of this rank's alone, where the user chose ``MPI.ERRORS_RETURN`` (else the job
            ends).

        Examples
        --------
        >>> other = hxmpi.HierComm(MPI.COMM_WORLD, ranks_per_node=2)
        >>> other.free()
        """
        if self._progress is not None:
            self._progress.close()
            self._progress = None
        if self._requests is not None:
            self._requests.close()
            self._requests.engine.free()
            self._requests.engine.topology.free()
            self._requests = self._lane = None
        if self._typed is not None:
            self._typed.clear()
        if self._count_request is not None:
            self._count_request.Free()
            self._count_request = None
        self._engine.free()
        self.topology.free()

    def Free(self) -> None:
        """``free``, under the name a communicator's is called.

        Raises
        ------
        MPI.Exception
            As ``free``.

        Examples
        --------
        >>> hxmpi.HierComm(MPI.COMM_WORLD).Free()
        """
        self.free()


class CartHierComm(CartDeriving, HierComm):
    """A HierComm over a Cartesian communicator: what ``HierComm.Create_cart`` returns.

    ``HierComm(cartcomm)`` makes one too (as mpi4py's ``Dup`` of a ``Cartcomm`` is one). Every
    ``HierComm`` method and attribute applies; mpi4py's ``Cartcomm`` calls (``Get_coords``,
    ``Get_cart_rank``, ``Shift``, ``Get_topo``, ``dims``, ``periods``, ``coords``, ``ndim``,
    ``topo``, the neighbour collectives) fall through to ``comm``; ``Sub`` returns a CartHierComm.

    Parameters
    ----------
    comm : MPI.Cartcomm or hxmpi.CartHierComm, default MPI.COMM_WORLD
        The Cartesian communicator (give one: the default is HierComm's, which is not).
    ranks_per_node, node_of, algorithm, topology, tuning, node_phase, cache_entries, cache_bytes, radix, overhead, progress, leaders, chunks
        As ``HierComm``'s.

    Raises
    ------
    hxmpi.ExchangeError, hxmpi.TopologyError
        As ``HierComm``'s constructor.

    Examples
    --------
    >>> grid = hc.Create_cart([size], periods=[True])
    >>> type(grid).__name__, grid.Get_coords(grid.Get_rank()) == [grid.Get_rank()]
    ('CartHierComm', True)
    >>> grid.Shift(0, 1) == ((rank - 1) % size, (rank + 1) % size)  # falls through to grid.comm
    True
    >>> grid.free()
    """


#: HierComm's constructor arguments, which ``HierComm.__new__`` reads the communicator from
_INIT = inspect.signature(HierComm.__init__)
