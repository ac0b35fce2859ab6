"""HierComm: Alltoall/Alltoallv, flat or hierarchical (lanes, then nodes), byte-exact with MPI_Alltoallv.

The hierarchical algorithm (``docs/method.md``; planner in ``hxmpi/comm/plan.py``, execution in
``hxmpi/comm/runs.py``)::

  pack     gather this rank's blocks for other nodes, by destination node        (Cython copy_blocks)
  phase 1  Alltoallv on every lane this rank serves: one segment per node (inter-node)
  node     shared memory: phase 1 lands in a node window; each rank copies its blocks out of it.
           message passing (fallback, env HXMPI_NODE_PHASE=mpi): repack, Alltoallv on the node, unpack.

A one-shot call goes through typed stages: parse the specs (``msgspec``), look the count pattern up
in the agreed plan cache (``plancache``), agree (``agreement``: one Allreduce of 16 uint64 that also
fingerprints every pair of counts and carries the sums "auto" prices), then run the cached plan,
or plan (the hierarchical path learns its node's receive counts from the node) and bind a run
(``runs``). A call whose specs a cached pattern's slot recognises runs whole in compiled code
(``csrc/_call.pyx``: recognise, agree, run the bound run as a compiled ``Program``); Python takes
over only where the verdict is not a clean hit. A persistent request
(``Alltoallv_init``) agrees and plans once; each ``Start`` then only copies and communicates.

All counts and displacements are int64 bytes. Bad input raises ``ExchangeError`` on every rank.
"""
from __future__ import annotations

import inspect
import os
import secrets
import zlib
from functools import partial, wraps
from typing import Optional

import numpy as np
from mpi4py import MPI

from ..errors import CpuFileError, ExchangeError, PlanStateError, TopologyError, abort_job, agree
from . import transfer
from ._agree import buffer_id, pattern_key
from ._call import AGREED, DONE, KEEP, NOT_FOUND, CallTable, Runner, Saved, find_typed
from .agreement import Agreed, Agreement
from .alltoallw import TypedSides, composed
from .bruck import TAG as BRUCK_TAG
from .costmodel import ENV_TUNING, KIB_CAP, CostModel, CpuTimes, auto_pick, pattern_class
from .derived import (
    cart_args,
    derived_node_of,
    dup_problem,
    group_problem,
    is_cartesian,
    split_problem,
    split_type_args,
    sub_args,
)
from .msgspec import PREDEFINED, Side, count_arrays, int_vector, parse_alltoall, parse_alltoallv
from .nonblocking import PROGRESS_MODES, HierRequest, Progress, Requests
from .plan import (
    ALGORITHM,
    ALGORITHM_CHOICES,
    COMM_WORLD,
    MODE_SHM,
    NODE_PHASES,
    Algorithm,
    Layout,
    StepProgram,
    bruck_rounds,
    check_leaders,
    exclusive_cumsum,
    program,
)
from .plancache import DEFAULT_BYTES, DEFAULT_ENTRIES, CacheEntry, PlanCache
from .runs import ExchangeStats, NodeWindow, Run, Scratch
from .topology import Topology

__all__ = ["PlanStateError", "HierComm", "CartHierComm", "ExchangeRequest", "HierRequest"]

ENV_NODE_PHASE = "HXMPI_NODE_PHASE"
_ALGO_CODE = {name: i for i, name in enumerate(ALGORITHM_CHOICES)}
_KIND_BITS = 20  # row kinds are agreed as a 20-bit code: its square summed over ranks fits in 64 bits


def _collective(method):
    """Guard a collective call: an error raised on this rank alone (not ``agreed``: every bad spec
    is agreed, and raised on every rank alike) ends the job (``errors.abort_job``) instead of
    leaving the other ranks waiting for this one forever."""
    where = f"HierComm.{method.__name__}"

    @wraps(method)
    def guarded(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except BaseException as exc:
            if getattr(exc, "agreed", False):
                raise
            abort_job(exc, where)
    return guarded


class HierComm:
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

    def __init__(self, comm: MPI.Intracomm = MPI.COMM_WORLD, ranks_per_node: Optional[int] = None,
                 node_of=None, algorithm: str = "auto", topology: Optional[Topology] = None,
                 tuning: Optional[str] = None, node_phase: Optional[str] = None,
                 cache_entries: int = DEFAULT_ENTRIES, cache_bytes: int = DEFAULT_BYTES, radix: int = 2,
                 overhead: Optional[str] = None, progress: str = "request", leaders: int = 2):
        # A bad name is agreed below, with the node phase: a rank raising here alone would leave
        # the others waiting in Topology's collectives.
        bad = None if algorithm in ALGORITHM_CHOICES else f"algorithm must be one of {ALGORITHM_CHOICES}, got {algorithm!r}"
        if bad is None and (type(cache_entries) is not int or cache_entries < 0
                            or type(cache_bytes) is not int or cache_bytes < 0):
            bad = f"cache_entries and cache_bytes must be integers >= 0, got {cache_entries!r}, {cache_bytes!r}"
        if bad is None and (type(radix) is not int or radix < 2):
            bad = f"radix must be an integer >= 2, got {radix!r}"
        if bad is None and (type(leaders) is not int or leaders < 1):
            bad = f"leaders must be an integer >= 1, got {leaders!r}"
        if bad is None and progress not in PROGRESS_MODES:
            bad = f"progress must be one of {PROGRESS_MODES}, got {progress!r}"
        #: how nonblocking calls move: "request" (inside Test/Wait) or "thread" (``nonblocking.py``)
        self.progress = progress
        #: the cost model behind "auto" and hxmpi's CPU per path it prices with (the same on every rank)
        self.cost_model, self.cpu_times, problem = _pricing(tuning, overhead)
        bad = bad or problem
        self.radix = radix
        #: the leaders per node of an explicit "hier_leaders"
        self.leaders = leaders
        self.algorithm = algorithm
        self.topology = topology if topology is not None else Topology(comm, ranks_per_node, node_of)
        self.comm = self.topology.comm
        t = self.topology
        self.layout = Layout(t.node_of)
        self._hier_possible = self.layout.hier_possible
        self._planner = self.layout.planner(t.rank) if self._hier_possible else None
        #: "shm" or "mpi": how the hierarchical path's node phase moves data.
        self.node_phase, key = self._agree_settings(node_phase, bad)
        self._mode = NODE_PHASES[self.node_phase]
        self._window = NodeWindow(t.intra) if self.node_phase == "shm" else None
        #: each exchange's communicator by its code in a step program (``plan.ExchangeStep.comm``)
        self._comms = {"world": self.comm, "node": t.intra, **dict(t.served_lanes)}
        if self._deferred:  # the data's own duplicates: its collectives never interleave with the agreement's
            self._comms = {code: comm.Dup() for code, comm in self._comms.items()}
        # One-shot runs are compiled (None where the MPI's handles cannot be passed from compiled
        # code: their steps are walked in Python then).
        try:
            self._runner: Optional[Runner] = None if self._deferred else Runner(
                self.comm, t.intra, t.served_lanes, MPI.BYTE, BRUCK_TAG, bruck_rounds)
        except NotImplementedError:
            self._runner = None
        self._scratch = Scratch()
        self._agreement = Agreement(self.comm, key)
        #: the agreed plan cache of one-shot calls (``hxmpi/comm/plancache.py``).
        self.plan_cache = PlanCache(cache_entries, cache_bytes)
        # The compiled hit path (``csrc/_call.pyx``); it also counts agreed calls (``tick``, the same
        # on every rank) and misses since the last hit, and holds the last call's stats and state.
        self._calls = CallTable(self._agreement, self.plan_cache, self._scratch, self._window, self.comm.size)
        self._calls.deferred = self._deferred
        self.plan_cache.on_drop = self._calls.forget
        self._choices: dict[tuple, tuple[Algorithm, int]] = {}  # auto's picks by pattern class (_pick)
        # Misses of the common spec form that run flat are parsed, agreed and run compiled too.
        hier = {a.code: a for a in ALGORITHM.values() if a.hierarchical}
        flat = frozenset(a.code for a in ALGORITHM.values() if self.layout.runs(a) is ALGORITHM["flat"])
        if not self._deferred:  # a deferred call's run is handed over, never run here
            self._calls.miss_path(self._choices, _ALGO_CODE, _ALGO_CODE["auto"], flat, PREDEFINED, MPI.Datatype,
                                  transfer, self.comm.rank, key, KIB_CAP, self.comm, MPI.BYTE,
                                  ExchangeStats("flat", flat_counts=np.zeros(self.comm.size, dtype=np.int64)))
        if self._runner is not None and self._hier_possible:  # and hierarchical ones too
            planners = {"lanes": self._planner}
            if self._mode == MODE_SHM:  # multi-leader meets in the node window (else it is refused in Python)
                planners["leaders"] = _LeaderPlanners(self.layout, t.rank)
            self._calls.hier_path(hier, radix, self._runner, planners, self._mode, self._mode == MODE_SHM,
                                  _stats_of, MPI.INT64_T, check_leaders(leaders, self.layout.max_leaders))
        size = self.comm.size
        if self._runner is not None:  # and flat Bruck ones, whose first runs the runner keeps
            self._calls.bruck_path(frozenset((_ALGO_CODE["bruck"],)), radix,
                                   partial(self._runner.bruck_once, COMM_WORLD),
                                   ExchangeStats("bruck", flat_counts=np.zeros(size, dtype=np.int64)))
        self._node_of = np.asarray(t.node_of, dtype=np.int64)
        self._members = self.layout.members[t.node]
        self._count_send = np.empty(size, dtype=np.int64)  # alltoallv's count exchange, reused
        self._count_recv = np.empty(size, dtype=np.int64)
        self._count_request: Optional[ExchangeRequest] = None
        self._typed: Optional[TypedSides] = None  # Alltoallw's layouts and kept calls, made on first use
        self._composing = None  # the Alltoallw call (``TypedCall``) under way, whose bound run ``_bind`` composes
        self._progress: Optional[Progress] = None  # the nonblocking calls' thread, made on first use
        self._requests: Optional[Requests] = None  # the nonblocking calls' queue (request mode), likewise
        # A deferred call's hand-over (``_defer``): its run, what completes it, where it receives,
        # and why its receive buffer may not be used (a request in flight still receives there).
        self._ready = self._after = self._ready_recv = self._busy = None
        #: what a HierComm with this one's layout and settings is built from (the progress thread's)
        self._settings = dict(node_of=list(t.node_of), algorithm=algorithm, tuning=tuning,
                              node_phase=self.node_phase, cache_entries=cache_entries, cache_bytes=cache_bytes,
                              radix=radix, overhead=overhead, progress=progress, leaders=leaders)

    def _agree_settings(self, requested: Optional[str], problem: Optional[str]) -> tuple[str, tuple]:
        """Agree on the constructor's settings; return the node phase every rank uses ("shm" only
        where every node's ranks share memory) and the fingerprint key (rank 0's draw).
        ``problem``: this rank's bad setting, if any."""
        requested = requested if requested is not None else os.environ.get(ENV_NODE_PHASE, "auto")
        if problem is None and requested not in ("auto", *NODE_PHASES):
            problem = f"node_phase must be 'auto', 'shm' or 'mpi', got {requested!r}"
        shared = True
        if self._hier_possible:  # can the node's ranks map one window? (not if a node spans hosts)
            probe = self.topology.intra.Split_type(MPI.COMM_TYPE_SHARED)
            shared = probe.size == self.topology.intra.size
            probe.Free()
        key = (secrets.randbits(64), secrets.randbits(64))
        pricing = (tuple(self.cost_model.vector().tolist()), tuple(self.cpu_times.seconds.values()))
        views = self.comm.allgather((requested, shared, problem, key, (self.radix, self.leaders), pricing,
                                     self.progress))
        if problem is None and len({v[0] for v in views}) > 1:
            problem = f"node_phase {requested!r} differs between ranks"
        if problem is None and len({v[6] for v in views}) > 1:
            problem = f"progress {self.progress!r} differs between ranks"
        if problem is None and len({v[4] for v in views}) > 1:
            problem = f"radix {self.radix!r} or leaders {self.leaders!r} differs between ranks"
        if problem is None and len({v[5] for v in views}) > 1:  # "auto" would pick differently
            problem = (f"the cost model or CPU per path differs between ranks (tuning and overhead files; "
                       f"this rank's CPU from {self.cpu_times.source})")
        agree(self.comm, problem, ExchangeError)
        everywhere = all(v[1] for v in views)
        if requested == "shm" and not everywhere:
            raise ExchangeError("node_phase='shm', but the ranks of a node do not all share memory")
        return ("shm" if requested != "mpi" and everywhere else "mpi"), views[0][3]

    # ------------------------------------------------------------------ public API
    @_collective
    def Alltoallv(self, sendbuf, recvbuf, algorithm: Optional[str] = None, validate: bool = True) -> None:
        """All to All Scatter/Gather Vector, with mpi4py buffer specs (counts and displs in elements)."""
        done = self._calls.call(sendbuf, recvbuf, algorithm, validate, False, self.algorithm)
        if done == NOT_FOUND:  # nothing communicated yet: lists the compiled reader does not take (of numpy
            # integers, say) are read again as int64 arrays
            s, r = count_arrays(sendbuf), count_arrays(recvbuf)
            if s is not None or r is not None:
                sendbuf, recvbuf = sendbuf if s is None else s, recvbuf if r is None else r
                done = self._calls.call(sendbuf, recvbuf, algorithm, validate, False, self.algorithm)
        if done != DONE:
            self._general(parse_alltoallv, sendbuf, recvbuf, algorithm, validate, False, done)

    @_collective
    def Alltoall(self, sendbuf, recvbuf, algorithm: Optional[str] = None, validate: bool = True) -> None:
        """All to All Scatter/Gather: equal blocks of ``len(buf) / size`` elements (or a given count).

        Flat runs as ``MPI_Alltoall``, so the MPI library's own algorithms for it apply."""
        done = self._calls.call(sendbuf, recvbuf, algorithm, validate, True, self.algorithm)
        if done != DONE:
            self._general(parse_alltoall, sendbuf, recvbuf, algorithm, validate, True, done)

    @_collective
    def Alltoallw(self, sendbuf, recvbuf, algorithm: Optional[str] = None, validate: bool = True) -> None:
        """All to All Scatter/Gather General, with mpi4py's spec ``[buf, counts, displs, datatypes]``:
        displacements in bytes, one basic or derived datatype per peer (``hxmpi/comm/alltoallw.py``).

        Packs what is not contiguous, moves bytes as ``Alltoallv`` does (every algorithm), unpacks;
        receive-buffer bytes outside the receive type maps stay untouched."""
        typed = self._typed
        if typed is None:
            typed = self._typed = TypedSides(self.comm.size)
        call = find_typed(typed.calls, sendbuf, recvbuf, algorithm, validate)  # the specs of a kept call
        if call is None:
            call, problem = typed.prepare(sendbuf, recvbuf, algorithm, validate)
            if problem:  # agreed like any call's problem: raises on every rank, before data moves
                nothing = Side(None, None, None)
                self._one_shot(nothing, nothing, problem, algorithm, validate, False, False)
        # ``Alltoallv`` of byte specs of the common form, its Python frame skipped: a kept call's
        # specs are the objects the compiled path recognised last time. Where a side is packed,
        # the run bound for good to them is composed with the type maps (``alltoallw.composed``):
        # it reads and writes the caller's buffers itself, so that side is neither packed before
        # it nor scattered after (a hit); any other run moves the packed bytes.
        send, recv, parts = call.send_spec, call.recv_spec, call.parts
        later = parts is not None and parts[1] is not None and self._calls.ready(send, recv, algorithm, validate)
        # A request in flight still reading this call's packed bytes (the same buffers) keeps them:
        # the call is refused at its agreement (the receive buffer is in use), nothing is packed.
        may_pack = call.pack is not None and not (self._busy is not None and self._busy(call.recv_spec[0]))
        if may_pack and not later:
            call.pack.run()
        self._composing = call if parts is not None else None
        try:
            done = self._calls.call(send, recv, algorithm, validate, False, self.algorithm)
            if done != DONE:
                if later and may_pack:  # agreed, nothing moved yet: the general path may run a plan on the packed bytes
                    call.pack.run()
                self._general(parse_alltoallv, send, recv, algorithm, validate, False, done)
        finally:
            self._composing = None
        if call.unpack is not None and (parts is None or self._calls.state != "hit"):
            if self._deferred:  # scattered once the request's run completed
                self._after = call.unpack.run
            else:
                call.unpack.run()

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

    def _nonblocking(self, method: str, sendbuf, recvbuf, algorithm, validate) -> HierRequest:
        # The first call sets its way of progress up, collectively: every rank makes it alike.
        if self.progress == "thread":
            if self._progress is None:
                self._progress = Progress(lambda: HierComm(self.comm, **self._settings))
            return self._progress.submit(method, sendbuf, recvbuf, algorithm, validate)
        if self._requests is None:
            # The node phase by message passing: a window's barriers would need every rank of the
            # node inside the library at once.
            self._requests = Requests(_Deferred(self.comm, **{**self._settings, "node_phase": "mpi"}))
        return self._requests.submit(method, sendbuf, recvbuf, algorithm, validate)

    _deferred = False  # a ``_Deferred``: calls hand their bound runs over instead of running them

    def _defer(self, method: str, sendbuf, recvbuf, algorithm, validate, busy) -> tuple:
        """Agree and plan one call of ``method`` (collective) without running it: (its run, bound
        and persistent; what completes it after the run, or None; the receive buffer's bytes).
        ``busy(recv)``: why this call may not receive there, or None (an agreed problem); None
        where no request is in flight, and then a recognised call is a compiled hit."""
        self._busy = busy
        self._calls.paused = busy is not None
        try:
            getattr(self, method)(sendbuf, recvbuf, algorithm=algorithm, validate=validate)
            run = self._ready if self._ready is not None else self._calls.handed
            return run, self._after, self._ready_recv if self._ready_recv is not None else run.r.view
        finally:
            self._ready = self._after = self._ready_recv = self._busy = self._calls.handed = None

    def __getattr__(self, name: str):
        """A public attribute of ``comm`` that HierComm lacks (called only when lookup fails)."""
        comm = self.__dict__.get("comm")
        if name.startswith("_") or comm is None or not hasattr(comm, name):
            raise AttributeError(f"'HierComm' object has no attribute {name!r}"
                                 + ("" if name.startswith("_") else " (nor has its MPI communicator)"))
        return getattr(comm, name)

    # ------------------------------------------------------------------ derived communicators
    @_collective
    def Dup(self, info: Optional[MPI.Info] = None) -> "HierComm":
        """A HierComm over a duplicate of ``comm`` (``info``: its hints), with this one's settings
        and nodes (``_derive``). Collective."""
        return self._derive(dup_problem(info), lambda comm: comm.Dup(info))

    def Dup_with_info(self, info: MPI.Info) -> "HierComm":
        """``Dup`` with hints."""
        return self.Dup(info)

    def Clone(self) -> "HierComm":
        """``Dup``, under mpi4py's other name for it."""
        return self.Dup()

    @_collective
    def Split(self, color: int = 0, key: int = 0):
        """A HierComm over the ranks that pass this ``color``, ordered by ``key`` then by rank (as
        ``MPI_Comm_split``); ``MPI.COMM_NULL`` on ranks passing ``MPI.UNDEFINED``. Settings and
        nodes inherited (``_derive``). Collective."""
        return self._derive(split_problem(color, key), lambda comm: comm.Split(color, key))

    @_collective
    def Split_type(self, split_type: int, key: int = 0, info: MPI.Info = MPI.INFO_NULL):
        """A HierComm over the ranks this one's ``split_type`` (``MPI.COMM_TYPE_SHARED``, ...)
        groups with this rank, ordered by ``key``; ``MPI.COMM_NULL`` for ``MPI.UNDEFINED``. Its
        nodes are still this one's, virtual ones included (``_derive``). Collective."""
        shared, problem = split_type_args(split_type, key, info)
        return self._derive(problem, lambda comm: comm.Split_type(split_type, key, info), "split_type", shared)

    @_collective
    def Create_cart(self, dims, periods=None, reorder: bool = False):
        """A ``CartHierComm`` over a grid of ``dims`` ranks per dimension (``periods``: which
        wrap around; ``reorder``: MPI may renumber), as ``MPI_Cart_create``; ``MPI.COMM_NULL`` on
        ranks outside the grid. Settings and nodes inherited (``_derive``). Collective."""
        args, problem = cart_args(dims, periods, reorder, self.comm.size)
        return self._derive(problem, lambda comm: comm.Create_cart(*args), "dims, periods and reorder", args)

    @_collective
    def Create_group(self, group: MPI.Group, tag: int = 0):
        """A HierComm over ``group``'s processes (a subgroup of ``comm``'s), as
        ``MPI_Comm_create_group``: collective over the group alone, so a bad argument raises
        ``TopologyError`` on each rank that passes it, with no communication; ``MPI.COMM_NULL``
        on a rank outside the group. Settings and nodes inherited (``_derive``)."""
        problem = group_problem(group, tag, self.comm)
        if problem:
            raise TopologyError(problem)
        return self._derive(None, lambda comm: comm.Create_group(group, tag), collective=False)

    @_collective
    def Create(self, group: MPI.Group):
        """A HierComm over ``group``'s processes (a subgroup of ``comm``'s; ranks may pass
        disjoint groups), as ``MPI_Comm_create``: collective over ``comm``; ``MPI.COMM_NULL`` on a
        rank outside its group. Settings and nodes inherited (``_derive``)."""
        return self._derive(group_problem(group, 0, self.comm), lambda comm: comm.Create(group))

    def _derive(self, problem: Optional[str], make, what: Optional[str] = None, shared=None,
                collective: bool = True):
        """A HierComm over ``make(comm)`` (the new communicator it duplicates is freed here), with
        this one's settings and each rank on the node its process has here; what ``make`` gives
        where it makes none (``MPI.COMM_NULL``).

        ``collective``: first agree over ``comm`` on ``problem`` (this rank's bad argument) and,
        where ``what`` names them, on ``shared``, the arguments every rank passing one (not None)
        must pass alike: a ``TopologyError`` on every rank, before the MPI call."""
        if collective:
            if what is not None:
                views = self.comm.allgather(shared)
                first = next((r for r, v in enumerate(views) if v is not None), None)
                if problem is None and shared is not None and shared != views[first]:
                    problem = f"{what} {shared!r} differ from rank {first}'s {views[first]!r}"
            agree(self.comm, problem, TopologyError)
        new = make(self.comm)
        if new == MPI.COMM_NULL:
            return new
        try:
            return HierComm(new, **{**self._settings, "node_of": derived_node_of(self.topology.node_of, self.comm,
                                                                                  new)})
        finally:
            new.Free()

    def _general(self, parse, sendbuf, recvbuf, algorithm, validate, uniform: bool, done: int) -> None:
        """A call that the compiled path (``csrc/_call.pyx``) did not finish (``done``: what it
        returned). A miss it ran whose pattern the cache keeps is kept here; one it agreed, a
        recognised call that is not a clean hit or a miss it does not run, is concluded here; any
        other is parsed and agreed."""
        slot, flags, entry = self._calls.take_pending() if done == AGREED else (None, None, None)
        if slot is not None:
            s, r, entry = slot.s, slot.r, slot.entry
            agreed = self._agreement.conclude(flags, None, 2 * self._code(algorithm) + uniform, bool(validate), "",
                                              s.counts, r.counts, slot.no)
            self._conclude(agreed, s, r, entry, entry.key, entry.settings, True, (sendbuf, recvbuf), algorithm)
            return
        if done == KEEP:
            self._keep_miss(algorithm, validate, uniform)
            return
        s, r, problem = parse(sendbuf, recvbuf, self.comm.size)  # the same sides the compiled path read
        if self._busy is not None and problem is None:
            problem = self._busy(r.view)
        self._one_shot(s, r, problem, algorithm, validate, uniform, sendbuf is not MPI.IN_PLACE,
                       specs=(sendbuf, recvbuf), agreed_as=None if flags is None else (flags, entry))

    @_collective
    def Alltoallv_init(self, sendbuf, recvbuf, algorithm: Optional[str] = None) -> "ExchangeRequest":
        """Persistent All to All Scatter/Gather Vector (MPI-4 style): validate, agree and plan once.

        Each ``Start()``/``Wait()`` of the returned request moves what the same buffers hold then
        (with ``MPI.IN_PLACE``, what the receive buffer holds at ``Start``).
        """
        return self._init(parse_alltoallv, False, sendbuf, recvbuf, algorithm)

    @_collective
    def Alltoall_init(self, sendbuf, recvbuf, algorithm: Optional[str] = None) -> "ExchangeRequest":
        """Persistent All to All Scatter/Gather (equal blocks); see ``Alltoallv_init``."""
        return self._init(parse_alltoall, True, sendbuf, recvbuf, algorithm)

    @_collective
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
        self._one_shot(s, r, problem, algorithm, validate, False, True, kind, kind_text)
        return out, rcounts

    @property
    def scratch_bytes(self) -> int:
        """Scratch memory of one-shot calls on this rank: private buffers, the compiled runner's
        Bruck send buffers and arenas, plus its share of the window (bytes)."""
        window = self._window.view.shape[0] // self.topology.intra.size if self._window else 0
        runner = self._runner.scratch_bytes if self._runner is not None else 0
        return self._scratch.nbytes + runner + window

    # ------------------------------------------------------------------ core
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

    def _code(self, algorithm) -> int:
        return _ALGO_CODE.get(algorithm if algorithm is not None else self.algorithm, -1)

    def _agree_call(self, s: Side, r: Side, problem, code: int, algorithm, validate, slot: int, same: bool,
                    kind: int, kind_text: str, uniform: bool) -> Agreed:
        """The call's agreement (``same``: this rank's cached run is bound to these buffers)."""
        if problem is None and code < 0:
            problem = f"algorithm must be one of {ALGORITHM_CHOICES}, got {algorithm!r}"
        big = not problem and transfer.needs_big(max(s.view.shape[0], r.view.shape[0]), s.total, self.comm.size)
        # The call's kind goes with the algorithm: an Alltoall never matches an Alltoallv.
        return self._agreement.agree(problem, 2 * code + uniform, validate, kind, slot, same,
                                     self.plan_cache.over_budget, big,
                                     None if problem else s.counts, None if problem else r.counts,
                                     bool(validate), kind_text)

    def _one_shot(self, s: Side, r: Side, problem, algorithm, validate, uniform: bool, cacheable: bool,
                  kind: int = 0, kind_text: str = "", specs=None, agreed_as: Optional[tuple] = None) -> None:
        """Look the pattern up, agree, then run the cached plan or plan a new one (``_conclude``).

        ``specs``: the (send, receive) specs the sides were parsed from, which the compiled path
        learns to recognise once the pattern is seen again (None: nothing to recognise);
        ``agreed_as``: (verdict bits, the cache entry this rank agreed with or None) of the
        agreement the compiled path already made for this call."""
        cache = self.plan_cache
        entry = key = None
        settings = (self._code(algorithm), bool(validate), kind, uniform)
        parts = (s.counts, s.displs, r.counts, r.displs)
        findable = problem is None and cacheable and cache.max_entries
        if agreed_as is not None:  # no second lookup: the entry is the one this rank agreed with
            flags, entry = agreed_as
            key = pattern_key(parts) if findable else None
            agreed = self._agreement.conclude(flags, problem, 2 * settings[0] + uniform, bool(validate), kind_text,
                                              s.counts, r.counts, entry.slot if entry is not None else 0)
            self._conclude(agreed, s, r, entry, key, settings, cacheable, specs, algorithm)
            return
        if findable:
            entry, key = cache.lookup(parts, settings)
        same = entry is not None and entry.bound == self._identity(s, r)
        agreed = self._agree_call(s, r, problem, settings[0], algorithm, validate, entry.slot if entry else 0,
                                  same, kind, kind_text, uniform)
        self._conclude(agreed, s, r, entry, key, settings, cacheable, specs, algorithm)

    def _conclude(self, agreed: Agreed, s: Side, r: Side, entry: Optional[CacheEntry], key, settings: tuple,
                  cacheable: bool, specs, algorithm) -> None:
        """The rest of an agreed one-shot call: evict where some rank is over budget, then run the
        entry every rank hit, or plan and run a new one (cached for next time)."""
        cache, calls = self.plan_cache, self._calls
        calls.tick += 1
        # Over budget somewhere: every rank drops its least recently used entry, or, when the entry
        # of this call is the only one, that entry after the call.
        drop_after = agreed.over_budget and not cache.evict_one(keep=agreed.slot)
        if agreed.slot:
            calls.touch(entry)
            calls.misses = 0
            try:
                self._run_entry(entry, s, r, agreed.same_buffers)
            finally:
                if drop_after:
                    cache.drop(entry.slot)
            if specs is not None and not drop_after:
                self._remember(entry, s, r, specs, algorithm)
            return
        algo, radix = self._resolve(settings[0], agreed, settings[3])
        fresh = CacheEntry(0, (s.counts, s.displs, r.counts, r.displs) if cacheable else None, settings, algo,
                           agreed.big, key=key or 0, radix=radix)
        if algo.hierarchical:
            fresh.plan = self._hier_plan(s, r, algo, radix)
            if self._deferred:  # it runs after the planner's next plan
                fresh.plan = fresh.plan.detach()
        calls.state = "miss" if cache.max_entries else "off"
        self._run_once(fresh, s, r)
        if calls.count_miss() and cache.max_entries:  # on every rank at this agreed miss, findable or not
            self._keep(fresh, s, r)

    def _keep_miss(self, algorithm, validate, uniform: bool) -> None:
        """Cache the pattern of a miss the compiled path ran and kept (``KEEP``), from the sides it
        read and, for a hierarchical run, the program it ran: nothing is parsed or planned again."""
        send, recv, planned = self._calls.kept
        parts = tuple(self._calls.parsed.reshape(4, self.comm.size).copy())  # the next miss overwrites them
        s = Side(send.reshape(-1).view(np.uint8), parts[0], parts[1])
        r = Side(recv.reshape(-1).view(np.uint8), parts[2], parts[3])
        settings = (self._code(algorithm), bool(validate), 0, uniform)
        agreed = Agreed(self._calls.last_flags, 0, self._agreement.sums)
        algo, radix = self._resolve(settings[0], agreed, uniform)
        fresh = CacheEntry(0, parts, settings, algo, agreed.big, key=pattern_key(parts), radix=radix)
        if algo.hierarchical:
            fresh.plan = planned
        self._keep(fresh, s, r)

    def _keep(self, fresh: CacheEntry, s: Side, r: Side) -> None:
        """Cache the entry of an agreed miss that ran on these sides (collective by construction)."""
        if fresh.plan is not None:
            fresh.plan = fresh.plan.detach()  # it outlives the planner's next plan
        fresh.bound = self._identity(s, r)
        self.plan_cache.insert(fresh, self._calls.tick)

    def _remember(self, entry: CacheEntry, s: Side, r: Side, specs: tuple, algorithm) -> None:
        """Let the compiled path recognise these specs as ``entry``'s from the next call on, with the
        persistent run bound to their buffers if there is one (after a hit, once the pattern is
        seen again: a new pattern every call does not pay for it)."""
        memo = _spec_memo(*specs)
        if memo is None:
            return
        run = entry.run if entry.run is not None and entry.bound == self._identity(s, r) else None
        self._calls.remember(entry.slot, memo, entry, s, r, algorithm, entry.settings[1], entry.settings[3], run,
                             run.program() if run is not None else None)

    def _run_entry(self, entry: CacheEntry, s: Side, r: Side, same_buffers: bool) -> None:
        """Run a cached entry that every rank hit: its persistent run when every rank's buffers are
        the ones it is bound to (bound on the second such call), else its plan on these buffers."""
        cache = self.plan_cache
        if same_buffers:
            if entry.run is None:  # the same buffers twice in a row everywhere: bind for good
                entry.run = self._bind(entry, s, r, persistent=True)
                cache.pin(entry, s.view.nbytes + r.view.nbytes)
                entry.bound = self._identity(s, r)
            self._calls.state = "hit"
            self._execute(entry.run)
            return
        if entry.run is not None:
            self._calls.forget(entry.slot)  # its bound run is freed
            entry.run.free()
            entry.run = None
            cache.pin(entry, 0)
        self._calls.state = "hit-rebound"
        self._run_once(entry, s, r)
        entry.bound = self._identity(s, r)

    def _resolve(self, code: int, agreed: Agreed, uniform: bool, mode: str = "oneshot") -> tuple[Algorithm, int]:
        """(algorithm, radix) a call runs, from agreed numbers only: "auto" asks the cost model
        (``_pick``); the hierarchical ones run flat where the layout has no hierarchy."""
        name = ALGORITHM_CHOICES[code]
        if name == "auto":
            return self._pick(agreed, uniform, mode)
        algo = self.layout.runs(name)
        if not algo.led:
            return algo, self.radix
        if self._mode != MODE_SHM:  # agreed: every rank has this HierComm's node phase
            raise ExchangeError(f"algorithm {name!r} needs the shared-memory node phase (node_phase='shm'), "
                                f"and this HierComm's is {self.node_phase!r}"
                                + (" (nonblocking calls run with 'mpi')" if self._deferred else ""))
        return algo, check_leaders(self.leaders, self.layout.max_leaders)

    def _pick(self, agreed: Agreed, uniform: bool, mode: str) -> tuple[Algorithm, int]:
        """The cost model's pick for the agreed pattern (``costmodel.auto_pick``), memoised by
        pattern class: one decision per class, however many patterns of it come."""
        pat = agreed.pattern(self.comm.size, uniform)
        key = (mode,) + pattern_class(pat)
        pick = self._choices.get(key)
        if pick is None:
            if len(self._choices) > 4096:
                self._choices.clear()
            t = self.topology
            name, radix = auto_pick(self.cost_model, mode, t.num_nodes, t.max_node_size, pat, self.node_phase,
                                    self._hier_possible, self.cpu_times, self.layout.node_sizes)
            pick = self._choices[key] = (ALGORITHM[name], radix)
        return pick

    def _identity(self, s: Side, r: Side) -> tuple:
        """What a bound run depends on: the caller's buffers and the scratch it was bound to."""
        return buffer_id(s.view, r.view) + (self._scratch.generation,
                                            self._window.generation if self._window else 0)

    def _hier_plan(self, s: Side, r: Side, algorithm: Algorithm, radix: int) -> StepProgram:
        """The hierarchical program (the planner's own: ``detach`` for one that lasts); the node's
        receive counts (and for multi-leader its send counts before them) come from the node."""
        if algorithm.led:
            mine = np.concatenate([s.counts, r.counts])
            planner = self.layout.planner_for(self.comm.rank, algorithm, radix)
        else:
            mine, planner = r.counts, self._planner
        node_counts = np.empty((len(self._members), mine.shape[0]), dtype=np.int64)
        # INT64_T, as a miss the compiled path runs gathers them (``CallTable._run_hier``).
        self.topology.intra.Allgather([mine, MPI.INT64_T], [node_counts, MPI.INT64_T])
        return program(algorithm, (s.counts, s.displs, r.counts, r.displs), planner, self._mode, node_counts,
                       radix)

    def _bind(self, entry: CacheEntry, s: Side, r: Side, persistent: bool, scratch: Optional[Scratch] = None,
              window: Optional[NodeWindow] = None) -> Run:
        """A run of ``entry``'s program on these buffers (one-shot scratch unless others are given):
        its hierarchical program, or a flat one made here."""
        algo = entry.algorithm
        prog = entry.plan if algo.hierarchical else program(
            algo, (s.counts, s.displs, r.counts, r.displs), radix=entry.radix, uniform=entry.settings[3])
        typed = self._composing
        if persistent and typed is not None:  # an Alltoallw's run bound for good: on the caller's buffers
            prog, s, r = composed(typed, prog, s, r)
        run = Run(prog, algo, entry.radix, s, r, entry.big, self._comms, scratch or self._scratch,
                  window or self._window, persistent, runner=self._runner)
        if persistent and typed is not None:
            # The byte buffers it stands for stay alive: its entry knows the binding by their addresses.
            run.stands_for = (typed.send_spec, typed.recv_spec)
        return run

    def _run_once(self, entry: CacheEntry, s: Side, r: Side) -> None:
        if self._deferred:  # its own persistent run, freed once its request completed; on the
            # byte buffers (not composed with an Alltoallw's type maps: the call scatters them after)
            composing, self._composing = self._composing, None
            try:
                run = self._bind(entry, s, r, persistent=True)
            finally:
                self._composing = composing
            self._execute(run)
            run.free_when_done()
            return
        run = self._bind(entry, s, r, persistent=False)
        try:
            self._execute(run)
        finally:
            run.free()

    def _execute(self, run) -> None:
        if self._deferred:
            self._ready = run
        else:
            run.run()
        self._calls.stats = run.stats

    def _init(self, parse, uniform: bool, sendbuf, recvbuf, algorithm) -> "ExchangeRequest":
        s, r, problem = parse(sendbuf, recvbuf, self.comm.size)
        code = self._code(algorithm)
        agreed = self._agree_call(s, r, problem, code, algorithm, True, 0, False, 0, "", uniform)
        algo, radix = self._resolve(code, agreed, uniform, "plan")
        entry = CacheEntry(0, None, (code, True, 0, uniform), algo, agreed.big, radix=radix)
        window = None
        if algo.hierarchical:
            entry.plan = self._hier_plan(s, r, algo, radix).detach()
            window = NodeWindow(self.topology.intra) if self._window else None
        # A request owns its scratch and window: it may be started while one-shot calls run.
        run = self._bind(entry, s, r, True, Scratch(), window)
        # In place, the send side is a copy of the receive blocks: refreshed at every Start.
        return ExchangeRequest(run, self._request_done, (r.view, s.view) if sendbuf is MPI.IN_PLACE else None,
                               window)

    def _request_done(self, stats: ExchangeStats) -> None:
        """A persistent request of this communicator completed: its stats are ``last_stats``'s."""
        self._calls.stats, self._calls.state = stats, "request"

    @property
    def last_stats(self) -> dict:
        """Messages and bytes of the last call: per phase, across node boundaries, and copied (bytes);
        ``algorithm`` (with ``radix`` for the Bruck ones, ``leaders`` for multi-leader) is what ran, "auto"'s pick included; ``plan_cache``: "hit" (a cached persistent run), "hit-rebound" (a cached plan on new
        buffers), "miss" (planned anew), "off" (cache off), "request" (a persistent request)."""
        st = self._calls.stats
        if st is None:
            return {}
        t, me = self.topology, self.comm.rank
        picked = {("leaders" if ALGORITHM[st.algorithm].led else "radix"): st.radix} if st.radix else {}
        if st.flat_counts is not None:
            counts = st.flat_counts
            live = counts > 0
            live[me] = False
            remote = live & (self._node_of != self._node_of[me])
            return {"algorithm": st.algorithm, **picked, "plan_cache": self._calls.state,
                    "flat": {"messages": int(live.sum()), "bytes": int(counts[live].sum())},
                    "inter_node": {"messages": int(remote.sum()), "bytes": int(counts[remote].sum())},
                    "copy_bytes": 0}
        own = st.node_bytes  # None on a multi-leader rank that leads nothing
        own = np.zeros(t.num_nodes, dtype=np.int64) if own is None else own.copy()
        own[t.node] = 0
        inter = {"messages": int(np.count_nonzero(own)), "bytes": int(own.sum())}
        if st.node_sends is None:
            intra = {"messages": 0, "bytes": 0}
        else:
            p2_out = st.node_sends.copy()
            p2_out[t.local_rank] = 0
            intra = {"messages": int(np.count_nonzero(p2_out)), "bytes": int(p2_out.sum())}
        return {"algorithm": st.algorithm, **picked, "plan_cache": self._calls.state, "node_phase": self.node_phase,
                "inter": inter, "intra": intra, "inter_node": dict(inter), "copy_bytes": int(st.copied)}

    def free(self) -> None:
        """Free cached runs, the node window and the Topology's communicators (collective); the
        nonblocking calls still queued complete first."""
        if self._progress is not None:
            self._progress.close()
            self._progress = None
        if self._requests is not None:
            self._requests.close()
            self._requests.hc.free()
            self._requests = None
        if self._typed is not None:
            self._typed.clear()
        if self._count_request is not None:
            self._count_request.Free()
            self._count_request = None
        self._calls.clear()
        self.plan_cache.clear()
        self._agreement.free()
        if self._window is not None:
            self._window.free()
        if self._deferred:
            for comm in self._comms.values():
                comm.Free()
        self.topology.free()

    def Free(self) -> None:
        """``free``, under the name a communicator's is called."""
        self.free()


class _Deferred(HierComm):
    """The HierComm a request-mode ``HierComm``'s nonblocking calls are agreed and planned on: its
    calls bind their runs (persistent, on data communicators of its own) and hand them over
    (``_defer``) for a request to run; no compiled call path."""
    _deferred = True


class CartHierComm(HierComm):
    """A HierComm over a Cartesian communicator (``HierComm.Create_cart``): mpi4py's ``Cartcomm``
    calls (``Get_coords``, ``Get_cart_rank``, ``Shift``, ``Get_topo``, ``dims``, ``periods``,
    ``coords``, ``ndim``, ``topo``, the neighbour collectives) fall through to ``comm``; ``Sub``
    returns a CartHierComm."""

    @_collective
    def Sub(self, remain_dims) -> "CartHierComm":
        """The sub-grid of this rank's ranks that differ only along the dimensions ``remain_dims``
        keeps (as ``MPI_Cart_sub``), with this one's settings and nodes. Collective."""
        kept, problem = sub_args(remain_dims, self.comm.Get_dim())
        return self._derive(problem, lambda comm: comm.Sub(kept), "remain_dims", kept)


#: HierComm's constructor arguments, which ``HierComm.__new__`` reads the communicator from
_INIT = inspect.signature(HierComm.__init__)


class _LeaderPlanners(dict):
    """A rank's multi-leader planners by leaders per node, made on first use (``CallTable.hier_path``)."""

    def __init__(self, layout: Layout, rank: int):
        super().__init__()
        self.layout, self.rank = layout, rank

    def __missing__(self, leaders: int):
        planner = self[leaders] = self.layout.planner_for(self.rank, ALGORITHM["hier_leaders"], leaders)
        return planner


def _stats_of(algorithm: Algorithm, radix: int, prog: StepProgram) -> ExchangeStats:
    """The stats of a hierarchical run (``CallTable.hier_path``)."""
    return ExchangeStats.of(algorithm, radix, program=prog)


def _pricing(tuning: Optional[str], overhead: Optional[str]) -> tuple[CostModel, CpuTimes, Optional[str]]:
    """(cost model, CPU per path, problem) for "auto". A file that cannot be read is this rank's
    problem, agreed by the constructor (a rank raising alone would leave the others waiting); the
    defaults stand in until then."""
    problem = None
    try:
        model = CostModel.from_env_or_default(tuning)
    except (OSError, ValueError, TypeError) as exc:
        path = tuning or os.environ.get(ENV_TUNING)
        problem = str(exc) if path in str(exc) else f"tuning file {path}: {exc}"
        model = CostModel()
    try:
        cpu = CpuTimes.from_env_or_default(overhead)
    except CpuFileError as exc:
        problem = problem or str(exc)
        cpu = CpuTimes.fixed(model)
    return model, cpu, problem


_SIMPLE_LEAVES = (int, str, type(None), MPI.Datatype)


def _spec_memo(sendbuf, recvbuf) -> Optional[tuple]:
    """(send, receive): what ``_call.CallTable`` needs to recognise these specs in a later call, a
    copy of their lists and tuples with count and displacement arrays held by content
    (``_call.Saved``); None where a leaf could change unseen. Only ndarray data buffers, and counts,
    displacements and datatypes that are ints, strings, datatypes or contiguous ndarrays."""
    if sendbuf is MPI.IN_PLACE:
        return None

    def copy(spec):
        items = spec if type(spec) in (list, tuple) else [spec]
        if type(items[0]) is not np.ndarray:
            raise TypeError
        out = [items[0]]
        for item in items[1:]:
            inner = item if type(item) in (list, tuple) else None
            leaves = []
            for leaf in (inner if inner is not None else (item,)):
                if type(leaf) is np.ndarray:
                    leaf = Saved(leaf)  # TypeError if not contiguous
                elif type(leaf) not in _SIMPLE_LEAVES:
                    raise TypeError
                leaves.append(leaf)
            out.append(type(inner)(leaves) if inner is not None else leaves[0])
        return type(spec)(out) if type(spec) in (list, tuple) else spec

    try:
        return copy(sendbuf), copy(recvbuf)
    except (TypeError, IndexError):
        return None


class ExchangeRequest:
    """A persistent all-to-all (as mpi4py's ``Prequest``): ``Start()``, ``Wait()``, ``Free()``.

    Agreed, validated and planned once by ``HierComm.Alltoallv_init``; each Start/Wait moves what
    the bound buffers hold at Start. Collective: every rank starts, waits and frees its requests in
    the same order. Usable as a context manager (frees on exit).
    """

    def __init__(self, run, done, in_place: Optional[tuple] = None, window: Optional[NodeWindow] = None):
        self._run, self._done, self._active = run, done, False
        self._in_place = in_place  # (receive view, send copy) for MPI.IN_PLACE
        self._window = window  # the node window this request owns (freed with it), if any

    @property
    def algorithm(self) -> str:
        """The algorithm this request runs (one of ``plan.ALGORITHMS``)."""
        return self._run.stats.algorithm

    def Start(self) -> None:
        """Start one exchange of the bound buffers' current contents."""
        if self._run is None:
            raise PlanStateError("this persistent exchange was freed; create a new one with Alltoallv_init")
        if self._active:
            raise PlanStateError("Start() called twice without Wait(); call Wait() first")
        if self._in_place is not None:
            recv, send = self._in_place
            send[:] = recv[:send.shape[0]]
        self._run.start()
        self._active = True

    def Wait(self) -> None:
        """Complete the exchange started by ``Start()``."""
        if self._run is None:
            raise PlanStateError("this persistent exchange was freed; create a new one with Alltoallv_init")
        if not self._active:
            raise PlanStateError("Wait() without Start(); call Start() first")
        self._active = False
        self._run.wait()
        self._done(self._run.stats)  # the owning HierComm's last_stats

    def Free(self) -> None:
        """Release the request's MPI requests, datatypes and buffers (waits for an active exchange first)."""
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
