"""HierComm: the public face of hxmpi's all-to-all, a drop-in for mpi4py's communicator.

The calls (``Alltoallv``, ``Alltoall``, ``Alltoallw``; their nonblocking ``I...`` and persistent
``..._init`` forms; the numpy ``alltoallv``) take mpi4py's buffer specs and give what
``comm.Alltoallv`` gives, byte for byte, moving the bytes flat, hierarchically (lanes, then the
node phase; ``docs/method.md``) or in log rounds, whichever the call asks for or "auto" picks.

What runs a call lives beside this module, one job a module: ``settings`` (the constructor's
settings, checked and agreed), ``engine`` (a one-shot call's stages over its call context:
lookup, agreement, conclusion, plan, run), ``persistent`` (planned-once requests),
``nonblocking`` (requests and their progress), ``alltoallw`` (datatype specs as bytes) and
``derived`` (the communicators a HierComm makes). Every other attribute of a communicator falls
through to ``comm``. Bad input raises ``ExchangeError`` on every rank.
"""
from __future__ import annotations

import inspect
import zlib
from functools import partial
from typing import Optional

import numpy as np
from mpi4py import MPI

from ..errors import guarded, one_rank_error
from ._call import DONE, NOT_FOUND, find_typed
from .alltoallw import TypedSides
from .derived import CartDeriving, Deriving, is_cartesian
from .engine import Call, Engine
from .msgspec import Side, count_arrays, int_vector, parse_alltoall, parse_alltoallv
from .nonblocking import HierRequest, Progress, Requests, StepRequest
from .persistent import ExchangeRequest, make_request
from .plan import Layout, exclusive_cumsum
from .plancache import DEFAULT_BYTES, DEFAULT_ENTRIES
from .runs import ExchangeStats
from .settings import agree_settings, check, pricing
from .topology import Topology

__all__ = ["HierComm", "CartHierComm", "ExchangeRequest", "HierRequest"]

_KIND_BITS = 20  # row kinds are agreed as a 20-bit code: its square summed over ranks fits in 64 bits


class HierComm(Deriving):
    """All-to-all over a Topology: flat (one MPI_Alltoallv) or hierarchical (lanes, then nodes).

    ``algorithm`` is "flat", "hier", "auto", "bruck", "hier_pairwise", "hier_bruck" or
    "hier_leaders" (per call overridable); "auto" asks the cost model, read from ``tuning`` (a calibration file) or env
    HXMPI_TUNING, else built-in defaults, which algorithm and Bruck radix is fastest for each
    call's agreed count pattern (``costmodel.auto_pick``), each path priced with hxmpi's measured
    CPU per call from ``overhead`` (a ``bench_overhead.py --json`` file) or env HXMPI_OVERHEAD,
    else the file packaged with hxmpi: the simulator's prices. Every rank must read the same files. ``radix`` (>= 2) is the Bruck radix of
    an explicit "bruck" or "hier_bruck"; ``leaders`` (>= 1; above the smallest node's size it acts
    as that) the leaders per node of an explicit "hier_leaders" (multi-leader: that many ranks of
    each node carry its traffic to other nodes, through the node's shared window, so it needs the
    "shm" node phase; "auto" picks the count itself).
    ``node_phase`` is "auto" (shared memory where every node's ranks share memory), "shm" or "mpi";
    env HXMPI_NODE_PHASE sets it when not given. ``cache_entries`` and ``cache_bytes`` bound the
    agreed plan cache of one-shot calls (entries; bytes per rank; 0 entries turns it off).
    Results equal ``comm.Alltoallv`` byte for byte. Bad input raises ``ExchangeError`` on every
    rank. Collective.

    Beside Alltoall/Alltoallv (blocking, persistent), ``Alltoallw`` takes datatype specs and
    ``Ialltoall``/``Ialltoallv``/``Ialltoallw`` return requests (``hxmpi/comm/nonblocking.py``):
    ``progress`` "request" (the default) moves them inside their ``Test``/``Wait`` as state
    machines over MPI's own nonblocking calls, "thread" on a progress thread (which needs
    ``MPI_THREAD_MULTIPLE`` and pays where the thread has a spare core). An error that one rank
    alone meets inside a call ends the job, naming the rank and the cause, rather than leaving the
    others waiting (``errors.abort_job``). Every other public attribute of an ``MPI.Intracomm`` (``Get_rank``, ``Allreduce``,
    ``Barrier``, ``Sendrecv``, ...) falls through to ``comm`` (a duplicate of the communicator
    given), so a HierComm stands in wherever a client passes a communicator; ``Free`` is ``free``.
    The communicators made from it (``Dup``, ``Split``, ``Split_type``, ``Create_cart``,
    ``Create_group``) are HierComms too, with its settings and nodes; over a Cartesian communicator
    the HierComm is a ``CartHierComm``.
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
        self._request_types: Optional[TypedSides] = None  # Ialltoallw's layouts and kept calls
        #: what a HierComm with this one's layout and settings is built from (the progress thread's)
        self._settings = dict(node_of=list(self.topology.node_of), algorithm=algorithm, tuning=tuning,
                              node_phase=self.node_phase, cache_entries=cache_entries, cache_bytes=cache_bytes,
                              radix=radix, overhead=overhead, progress=progress, leaders=leaders, chunks=chunks)

    # ------------------------------------------------------------------ public API
    @guarded
    def Alltoallv(self, sendbuf, recvbuf, algorithm: Optional[str] = None, validate: bool = True) -> None:
        """All to All Scatter/Gather Vector, with mpi4py buffer specs (counts and displs in elements)."""
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

    @guarded
    def Alltoall(self, sendbuf, recvbuf, algorithm: Optional[str] = None, validate: bool = True) -> None:
        """All to All Scatter/Gather: equal blocks of ``len(buf) / size`` elements (or a given count).

        Flat runs as ``MPI_Alltoall``, so the MPI library's own algorithms for it apply."""
        done = self._engine.calls.call(sendbuf, recvbuf, algorithm, validate, True, self.algorithm)
        if done != DONE:
            self._engine.general(Call(algorithm, validate, uniform=True), parse_alltoall, sendbuf, recvbuf, done)

    @guarded
    def Alltoallw(self, sendbuf, recvbuf, algorithm: Optional[str] = None, validate: bool = True) -> None:
        """All to All Scatter/Gather General, with mpi4py's spec ``[buf, counts, displs, datatypes]``:
        displacements in bytes, one basic or derived datatype per peer (``hxmpi/comm/alltoallw.py``).

        Packs what is not contiguous, moves bytes as ``Alltoallv`` does (every algorithm), unpacks;
        receive-buffer bytes outside the receive type maps stay untouched."""
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

    def Ialltoallv(self, sendbuf, recvbuf, algorithm: Optional[str] = None, validate: bool = True) -> HierRequest:
        """Nonblocking ``Alltoallv``: returns a request whose ``Test``/``Wait`` move the data (or a
        progress thread does, with ``progress="thread"``; ``hxmpi/comm/nonblocking.py``). The call
        agrees the spec with every rank; errors are raised by ``Wait``/``Test``, on every rank."""
        return self._nonblocking("Alltoallv", sendbuf, recvbuf, algorithm, validate)

    def Ialltoall(self, sendbuf, recvbuf, algorithm: Optional[str] = None, validate: bool = True) -> HierRequest:
        """Nonblocking ``Alltoall`` (see ``Ialltoallv``)."""
        return self._nonblocking("Alltoall", sendbuf, recvbuf, algorithm, validate)

    def Ialltoallw(self, sendbuf, recvbuf, algorithm: Optional[str] = None, validate: bool = True) -> HierRequest:
        """Nonblocking ``Alltoallw`` (see ``Ialltoallv``)."""
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
        call = Call(algorithm, validate, uniform=method == "Alltoall", defer=True)
        requests = self._requests
        if method != "Alltoallw":  # a repeated call on the same buffers may run as one compiled hit
            slot = requests.engine.calls.request_slot(sendbuf, recvbuf, algorithm, validate, call.uniform)
            if slot is not None:
                return requests.submit(StepRequest(requests, call, slot.s, slot.r, None, (sendbuf, recvbuf),
                                                   slot=slot))
        typed = None
        if method == "Alltoallw":
            if self._request_types is None:
                self._request_types = TypedSides(self.comm.size)
            typed = find_typed(self._request_types.calls, sendbuf, recvbuf, algorithm, validate)
            if typed is None:
                typed, problem = self._request_types.prepare(sendbuf, recvbuf, algorithm, validate)
                if problem:
                    nothing = Side(None, None, None)
                    return self._requests.submit(StepRequest(self._requests, call, nothing, nothing, problem, None))
            sendbuf, recvbuf = typed.send_spec, typed.recv_spec
        s, r, problem = (parse_alltoall if call.uniform else parse_alltoallv)(sendbuf, recvbuf, self.comm.size)
        specs = (sendbuf, recvbuf) if sendbuf is not MPI.IN_PLACE else None
        return self._requests.submit(StepRequest(self._requests, call, s, r, problem, specs, typed))

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

    @guarded
    def Alltoallv_init(self, sendbuf, recvbuf, algorithm: Optional[str] = None) -> ExchangeRequest:
        """Persistent All to All Scatter/Gather Vector (MPI-4 style): validate, agree and plan once.

        Each ``Start()``/``Wait()`` of the returned request moves what the same buffers hold then
        (with ``MPI.IN_PLACE``, what the receive buffer holds at ``Start``).
        """
        return make_request(self._engine, parse_alltoallv, False, sendbuf, recvbuf, algorithm, self._request_done)

    @guarded
    def Alltoall_init(self, sendbuf, recvbuf, algorithm: Optional[str] = None) -> ExchangeRequest:
        """Persistent All to All Scatter/Gather (equal blocks); see ``Alltoallv_init``."""
        return make_request(self._engine, parse_alltoall, True, sendbuf, recvbuf, algorithm, self._request_done)

    def _request_done(self, stats: ExchangeStats) -> None:
        """A persistent request of this communicator completed: its stats are ``last_stats``'s."""
        self._engine.calls.stats, self._engine.calls.state = stats, "request"

    @guarded
    def alltoallv(self, array, counts, algorithm: Optional[str] = None,
                  validate: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Send ``counts[d]`` consecutive rows of ``array`` (axis 0) to rank d; return (rows, recv counts).

        Rows arrive ordered by source rank. The receive counts are learned from their senders (one
        8-byte all-to-all), then the call is agreed as any other; every rank must pass the same
        dtype and row shape.
        """
        size = self.comm.size
        array = np.ascontiguousarray(array)
        c, problem = int_vector(counts, size, "counts")
        row_shape = array.shape[1:] if array.ndim else ()
        row_bytes = int(array.itemsize * int(np.prod(row_shape, dtype=np.int64)))
        if problem is None and array.ndim == 0:
            problem = "array must have at least one dimension (rows along axis 0)"
        if problem is None and int(c.sum()) != array.shape[0]:
            problem = f"counts sum to {int(c.sum())} rows but the array has {array.shape[0]}"
        kind_text = f"{array.dtype.str if array.dtype.names is None else array.dtype.descr} rows of shape {row_shape}"
        kind = 1 + zlib.crc32(f"{kind_text} {row_bytes}".encode()) % ((1 << _KIND_BITS) - 1)
        rcounts = self._exchange_counts(c if problem is None else None)
        if problem is None and (rcounts < 0).any():
            rcounts = np.zeros(size, dtype=np.int64)  # a sender has a problem: the agreement names it
        s = Side(np.frombuffer(array, np.uint8) if array.nbytes else np.empty(0, np.uint8),
                 c * row_bytes if problem is None else None,
                 exclusive_cumsum(c) * row_bytes if problem is None else None)
        out = np.empty((int(rcounts.sum()) if problem is None else 0,) + row_shape, dtype=array.dtype)
        r = Side(out.reshape(-1).view(np.uint8) if out.nbytes else np.empty(0, np.uint8),
                 rcounts * row_bytes, exclusive_cumsum(rcounts) * row_bytes)
        # The counts came from their senders; the fingerprint still checks the bytes (row sizes).
        self._engine.one_shot(Call(algorithm, validate, kind=kind, kind_text=kind_text), s, r, problem, True)
        return out, rcounts

    def _exchange_counts(self, counts: Optional[np.ndarray]) -> np.ndarray:
        """Every rank learns what each sender sends it (int64 per peer; -1 from a rank with a problem),
        by a persistent ``Alltoall`` of 8-byte blocks, its algorithm the cost model's pick."""
        send, recv = self._count_send, self._count_recv
        if counts is None:
            send.fill(-1)
        else:
            send[:] = counts
        if self._count_request is None:  # bound once, to the reused count buffers
            self._count_request = self.Alltoall_init(send, recv, algorithm="auto")
        self._count_request.Start()
        self._count_request.Wait()
        return recv.copy()

    @property
    def scratch_bytes(self) -> int:
        """Scratch memory of one-shot calls on this rank: private buffers, the compiled runner's
        Bruck send buffers and arenas, plus its share of the window (bytes)."""
        return self._engine.scratch_bytes

    @property
    def last_stats(self) -> dict:
        """Messages and bytes of the last call: per phase, across node boundaries, and copied (bytes);
        ``algorithm`` (with ``radix`` for the Bruck ones, ``leaders`` for multi-leader) is what ran, "auto"'s
        pick included; ``plan_cache``: "hit" (a cached persistent run), "hit-rebound" (a cached plan on new
        buffers), "miss" (planned anew), "off" (cache off), "request" (a persistent request)."""
        return self._engine.stats()

    @guarded
    def free(self) -> None:
        """Free cached runs, the node window and the Topology's communicators (collective); the
        nonblocking calls still queued complete first."""
        if self._progress is not None:
            self._progress.close()
            self._progress = None
        if self._requests is not None:
            self._requests.close()
            self._requests.engine.free()
            self._requests.engine.topology.free()
            self._requests = None
        if self._request_types is not None:
            self._request_types.clear()
        if self._typed is not None:
            self._typed.clear()
        if self._count_request is not None:
            self._count_request.Free()
            self._count_request = None
        self._engine.free()
        self.topology.free()

    def Free(self) -> None:
        """``free``, under the name a communicator's is called."""
        self.free()


class CartHierComm(CartDeriving, HierComm):
    """A HierComm over a Cartesian communicator (``HierComm.Create_cart``): mpi4py's ``Cartcomm``
    calls (``Get_coords``, ``Get_cart_rank``, ``Shift``, ``Get_topo``, ``dims``, ``periods``,
    ``coords``, ``ndim``, ``topo``, the neighbour collectives) fall through to ``comm``; ``Sub``
    returns a CartHierComm."""


#: HierComm's constructor arguments, which ``HierComm.__new__`` reads the communicator from
_INIT = inspect.signature(HierComm.__init__)
