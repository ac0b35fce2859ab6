"""The call path behind a HierComm: one call as stages over an explicit call context.

A ``HierComm`` (``exchange.py``) is the public face; its ``Engine`` owns what the calls share
(the agreement, the plan cache, scratch, the node window, the compiled call table and runner)
and runs one call in stages. What one call decides on the way, and hands back, travels in its
``Call``, never in fields of the engine or the communicator, so a second call made meanwhile (a
callback, another thread) cannot see it::

  parse     the caller's specs -> typed sides (``msgspec``), or this rank's problem   local
  lookup    this rank's plan-cache entry for the pattern (``plancache``)               local
  agree     one Allreduce of the call's record (``agreement``)                         collective
  conclude  evict where some rank is over budget; a hit every rank shares, or a miss
            and its algorithm (``costmodel.auto_pick`` for "auto"), from agreed numbers only
  plan      a hierarchical miss: the node's counts (one node Allgather), the program   node
  bind, run the program bound to the buffers (``runs.Run``), run (or handed over)
  keep      a miss's pattern cached; the specs remembered by the compiled path

A call whose specs the compiled path (``csrc/_call.pyx``, ``CallTable``) recognises, or a miss of
the common spec form it runs, goes from entry to return in compiled code; Python takes over
(``general``) where its verdict is not a clean hit.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
from mpi4py import MPI

from ..errors import ExchangeError, agreed_error
from . import transfer
from ._agree import buffer_id, pattern_key
from ._call import AGREED, KEEP, CallTable, Runner, Saved
from .agreement import Agreed, Agreement
from .alltoallw import composed
from .bruck import TAG as BRUCK_TAG
from .costmodel import KIB_CAP, CostModel, CpuTimes, auto_pick, pattern_class
from .msgspec import PREDEFINED, Side
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
    chunks_run,
    program,
)
from .plancache import CacheEntry, PlanCache
from .runs import ExchangeStats, NodeWindow, Run, Scratch
from .topology import Topology

__all__ = ["Call", "Engine", "ALGO_CODE"]

#: Each algorithm's code in a call's agreement: its index in ``plan.ALGORITHM_CHOICES``.
ALGO_CODE = {name: i for i, name in enumerate(ALGORITHM_CHOICES)}


class Call:
    """One call's state, from its entry to its return: what the caller asked, what this rank
    parsed, and what the call hands back. Made per call (on the Python path only: a compiled hit
    makes none) and passed explicitly to every stage.

    ``algorithm``, ``validate``, ``uniform`` (an ``Alltoall``'s equal blocks): as the caller
    passed them; ``kind``, ``kind_text``: the row kind of ``alltoallv`` (0, ""); ``typed``: the
    ``Alltoallw`` call (``_call.TypedCall``) whose bytes this call moves, whose persistent run may
    be composed with its type maps; ``defer``: bind the run and hand it over in ``run`` instead
    of running it (a nonblocking request runs it).
    """
    __slots__ = ("algorithm", "validate", "uniform", "kind", "kind_text", "typed", "defer", "run")

    def __init__(self, algorithm: Optional[str], validate, uniform: bool = False, kind: int = 0,
                 kind_text: str = "", typed=None, defer: bool = False):
        self.algorithm, self.validate, self.uniform = algorithm, validate, uniform
        self.kind, self.kind_text, self.typed, self.defer = kind, kind_text, typed, defer
        self.run: Optional[Run] = None


class Engine:
    """The exchange state of one HierComm and the stages of its calls (see the module docstring).

    ``topology``: the nodes and their communicators; ``layout``: their static layout (``plan.Layout``
    of ``topology.node_of``); ``node_phase``: "shm" or "mpi" (agreed);
    ``key``: the agreement's hash keys (agreed); ``algorithm``: the communicator's default;
    ``radix``, ``leaders``, ``chunks``: an explicit Bruck radix, multi-leader count and pipelined
    node phase's chunks (``plan.Algorithm.setting``); ``cost_model``,
    ``cpu_times``: what "auto" prices with; ``cache_entries``, ``cache_bytes``: the plan cache's
    bounds; ``deferred``: a nonblocking calls' engine's (gather, agreement) communicators, or None
    (``topology`` is then a duplicate of its HierComm's, its data's alone; its runs are handed
    over, never run here; no compiled call path).
    """

    def __init__(self, topology: Topology, layout: Layout, node_phase: str, key: tuple, algorithm: str, radix: int,
                 leaders: int, chunks: int, cost_model: CostModel, cpu_times: CpuTimes, cache_entries: int,
                 cache_bytes: int, deferred: Optional[tuple] = None):
        t = self.topology = topology
        self.comm, self.deferred = t.comm, deferred is not None
        # Only the shared-memory node phase pipelines (its window holds every chunk); the stats
        # say how many chunks run (``chunks_run``).
        self.algorithm, self.radix, self.leaders = algorithm, radix, leaders
        self.layout = layout
        self.chunks = chunks_run(chunks, layout.node_sizes) if node_phase == "shm" else 1
        self.cost_model, self.cpu_times, self.node_phase = cost_model, cpu_times, node_phase
        self.hier_possible = self.layout.hier_possible
        self.planner = self.layout.planner(t.rank) if self.hier_possible else None
        self.mode = NODE_PHASES[node_phase]
        self.window = NodeWindow(t.intra) if node_phase == "shm" else None
        #: each exchange's communicator by its code in a step program (``plan.ExchangeStep.comm``)
        self.comms = {"world": self.comm, "node": t.intra, **dict(t.served_lanes)}
        #: where a hierarchical miss gathers its node's counts, and where calls agree: a nonblocking
        #: calls' engine has duplicates of its own (``deferred``), as its collectives, started as
        #: requests move, must never interleave with each other or with the data's (on ``topology``'s)
        self.gather_comm, agree_comm = deferred if deferred is not None else (t.intra, self.comm)
        # One-shot runs are compiled (None where the MPI's handles cannot be passed from compiled
        # code: their steps are walked in Python then).
        try:
            self.runner: Optional[Runner] = None if self.deferred else Runner(
                self.comm, t.intra, t.served_lanes, MPI.BYTE, BRUCK_TAG, bruck_rounds)
        except NotImplementedError:
            self.runner = None
        self.scratch = Scratch()
        self.agreement = Agreement(agree_comm, key)
        #: the agreed plan cache of one-shot calls (``plancache``)
        self.plan_cache = PlanCache(cache_entries, cache_bytes)
        # The compiled call path (``csrc/_call.pyx``); it also counts agreed calls (``tick``, the
        # same on every rank) and misses since the last hit, and holds the last call's stats.
        self.calls = CallTable(self.agreement, self.plan_cache, self.scratch, self.window, self.comm.size)
        self.plan_cache.on_drop = self.calls.forget
        self.choices: dict[tuple, tuple[Algorithm, int]] = {}  # auto's picks by pattern class (``pick``)
        if not self.deferred:  # a deferred call's run is handed over, never run here
            self._compiled_paths(key)
        self.node_of = np.asarray(t.node_of, dtype=np.int64)
        self.members = self.layout.members[t.node]

    def _compiled_paths(self, key: tuple) -> None:
        """Let the compiled call path run misses too: flat ones, hierarchical ones (where the
        layout has a hierarchy and the runner is there) and flat Bruck ones."""
        size = self.comm.size
        flat = frozenset(a.code for a in ALGORITHM.values() if self.layout.runs(a) is ALGORITHM["flat"])
        self.calls.miss_path(self.choices, ALGO_CODE, ALGO_CODE["auto"], flat, PREDEFINED, MPI.Datatype,
                             transfer, self.comm.rank, key, KIB_CAP, self.comm, MPI.BYTE,
                             ExchangeStats("flat", flat_counts=np.zeros(size, dtype=np.int64)))
        if self.runner is None:
            return
        if self.hier_possible:
            hier = {a.code: a for a in ALGORITHM.values() if a.hierarchical}
            planners = {"lanes": self.planner}
            if self.mode == MODE_SHM:  # multi-leader meets in the node window (else refused in ``resolve``)
                planners["leaders"] = _LeaderPlanners(self.layout, self.topology.rank)
            self.calls.hier_path(hier, self.radix, self.runner, planners, self.mode, self.mode == MODE_SHM,
                                 _stats_of, MPI.INT64_T, check_leaders(self.leaders, self.layout.max_leaders),
                                 self.chunks)
        self.calls.bruck_path(frozenset((ALGO_CODE["bruck"],)), self.radix,
                              lambda radix: self.runner.bruck_once(COMM_WORLD, radix),
                              ExchangeStats("bruck", flat_counts=np.zeros(size, dtype=np.int64)))

    # ------------------------------------------------------------------ a call, stage by stage
    def code(self, algorithm: Optional[str]) -> int:
        """The agreement's code of ``algorithm`` (None: this communicator's), -1 for a bad name."""
        return ALGO_CODE.get(algorithm if algorithm is not None else self.algorithm, -1)

    def general(self, call: Call, parse, sendbuf, recvbuf, done: int) -> None:
        """A call that the compiled path (``CallTable.call``) did not finish (``done``: what it
        returned). A miss it ran whose pattern the cache keeps is kept here; one it agreed, a
        recognised call that is not a clean hit or a miss it does not run, is concluded here; any
        other is parsed and agreed."""
        slot, flags, entry = self.calls.take_pending() if done == AGREED else (None, None, None)
        if slot is not None:
            s, r, entry = slot.s, slot.r, slot.entry
            agreed = self.agreement.conclude(flags, None, 2 * self.code(call.algorithm) + call.uniform,
                                             bool(call.validate), "", s.counts, r.counts, slot.no)
            self.conclude(call, agreed, s, r, entry, entry.key, entry.settings, True, (sendbuf, recvbuf))
            return
        if done == KEEP:
            self.keep_miss(call)
            return
        s, r, problem = parse(sendbuf, recvbuf, self.comm.size)  # the same sides the compiled path read
        self.one_shot(call, s, r, problem, sendbuf is not MPI.IN_PLACE, specs=(sendbuf, recvbuf),
                      agreed_as=None if flags is None else (flags, entry))

    def one_shot(self, call: Call, s: Side, r: Side, problem, cacheable: bool, specs=None,
                 agreed_as: Optional[tuple] = None) -> None:
        """Look the pattern up, agree, then run the cached plan or plan a new one (``conclude``).

        ``specs``: the (send, receive) specs the sides were parsed from, which the compiled path
        learns to recognise once the pattern is seen again (None: nothing to recognise);
        ``agreed_as``: (verdict bits, the cache entry this rank agreed with or None) of the
        agreement the compiled path already made for this call."""
        if agreed_as is not None:  # no second lookup: the entry is the one this rank agreed with
            flags, entry = agreed_as
            findable = problem is None and cacheable and self.plan_cache.max_entries
            key = pattern_key((s.counts, s.displs, r.counts, r.displs)) if findable else None
            settings = self.settings(call)
            agreed = self.agreement.conclude(flags, problem, 2 * settings[0] + call.uniform, bool(call.validate),
                                             call.kind_text, s.counts, r.counts,
                                             entry.slot if entry is not None else 0)
        else:
            entry, key, settings = found = self.lookup(call, s, r, problem, cacheable)
            agreed = self.agree(call, s, r, problem, found)
        self.conclude(call, agreed, s, r, entry, key, settings, cacheable, specs)

    def settings(self, call: Call) -> tuple:
        """What a call's cache entry is made for besides its pattern: (algorithm code, validate,
        row kind, uniform)."""
        return (self.code(call.algorithm), bool(call.validate), call.kind, call.uniform)

    def lookup(self, call: Call, s: Side, r: Side, problem, cacheable: bool) -> tuple:
        """(this rank's cache entry for the call's pattern, or None; its key; the call's settings).
        Local."""
        settings = self.settings(call)
        if problem is None and cacheable and self.plan_cache.max_entries:
            return self.plan_cache.lookup((s.counts, s.displs, r.counts, r.displs), settings) + (settings,)
        return None, None, settings

    def fill(self, call: Call, s: Side, r: Side, problem, found: tuple) -> Optional[str]:
        """Write this rank's agreement record of the call (``found``: ``lookup``'s); the call's
        problem on this rank, a bad algorithm name included (what a diagnosis names). Local."""
        entry, _, settings = found
        code = settings[0]
        if problem is None and code < 0:
            problem = f"algorithm must be one of {ALGORITHM_CHOICES}, got {call.algorithm!r}"
        same = entry is not None and entry.bound == self.identity(s, r)
        big = not problem and transfer.needs_big(max(s.view.shape[0], r.view.shape[0]), s.total, self.comm.size)
        # The call's kind goes with the algorithm: an Alltoall never matches an Alltoallv.
        self.agreement.fill(problem, 2 * code + call.uniform, call.validate, call.kind,
                            entry.slot if entry is not None else 0, same, self.plan_cache.over_budget, big,
                            None if problem else s.counts, None if problem else r.counts, bool(call.validate))
        return problem

    def agree(self, call: Call, s: Side, r: Side, problem, found: tuple) -> Agreed:
        """The call's agreement, blocking (``found``: ``lookup``'s): what every rank agreed on, or
        the same ``ExchangeError`` on every rank."""
        problem = self.fill(call, s, r, problem, found)
        self.agreement.exchange()
        entry, _, settings = found
        return self.agreement.conclude(self.agreement.verdict(), problem, 2 * settings[0] + call.uniform,
                                       bool(call.validate), call.kind_text, None if problem else s.counts,
                                       None if problem else r.counts, entry.slot if entry is not None else 0)

    def conclude(self, call: Call, agreed: Agreed, s: Side, r: Side, entry: Optional[CacheEntry], key,
                 settings: tuple, cacheable: bool, specs) -> None:
        """The rest of an agreed one-shot call: ``settle`` it, then plan (the node's counts gathered,
        blocking) and run a miss (``run_miss``)."""
        fresh = self.settle(call, agreed, s, r, entry, key, settings, cacheable, specs)
        if fresh is not None:
            if fresh.algorithm.hierarchical:
                fresh.plan = self.hier_plan(s, r, fresh.algorithm, fresh.radix)
            self.run_miss(call, fresh, s, r)

    def settle(self, call: Call, agreed: Agreed, s: Side, r: Side, entry: Optional[CacheEntry], key,
               settings: tuple, cacheable: bool, specs) -> Optional[CacheEntry]:
        """An agreed call's decision, from agreed numbers only: evict where some rank is over budget,
        then run the entry every rank hit (None), or return a new entry for a miss, its algorithm
        resolved, to plan (a hierarchical one) and run (``run_miss``)."""
        cache, calls = self.plan_cache, self.calls
        calls.tick += 1
        # Over budget somewhere: every rank drops its least recently used entry, or, when the entry
        # of this call is the only one, that entry after the call.
        drop_after = agreed.over_budget and not cache.evict_one(keep=agreed.slot)
        if agreed.slot:
            calls.touch(entry)
            calls.misses = 0
            try:
                self.run_entry(call, entry, s, r, agreed.same_buffers)
            finally:
                if drop_after:
                    cache.drop(entry.slot)
            if specs is not None and not drop_after:
                self.remember(call, entry, s, r, specs)
            return None
        algo, radix = self.resolve(settings[0], agreed, settings[3])
        return CacheEntry(0, (s.counts, s.displs, r.counts, r.displs) if cacheable else None, settings, algo,
                          agreed.big, key=key or 0, radix=radix)

    def run_miss(self, call: Call, fresh: CacheEntry, s: Side, r: Side) -> None:
        """Run an agreed miss's new entry (planned, if hierarchical) and cache it where the cache
        keeps its pattern."""
        if fresh.plan is not None and self.deferred:  # it runs after the planner's next plan
            fresh.plan = fresh.plan.detach()
        self.calls.state = "miss" if self.plan_cache.max_entries else "off"
        self.run_once(call, fresh, s, r)
        if self.calls.count_miss() and self.plan_cache.max_entries:  # on every rank at this agreed miss
            self.keep(fresh, s, r)

    def keep_miss(self, call: Call) -> None:
        """Cache the pattern of a miss the compiled path ran and kept (``KEEP``), from the sides it
        read and, for a hierarchical run, the program it ran: nothing is parsed or planned again."""
        send, recv, planned = self.calls.kept
        parts = tuple(self.calls.parsed.reshape(4, self.comm.size).copy())  # the next miss overwrites them
        s = Side(send.reshape(-1).view(np.uint8), parts[0], parts[1])
        r = Side(recv.reshape(-1).view(np.uint8), parts[2], parts[3])
        settings = (self.code(call.algorithm), bool(call.validate), 0, call.uniform)
        agreed = Agreed(self.calls.last_flags, 0, self.agreement.sums)
        algo, radix = self.resolve(settings[0], agreed, call.uniform)
        fresh = CacheEntry(0, parts, settings, algo, agreed.big, key=pattern_key(parts), radix=radix)
        if algo.hierarchical:
            fresh.plan = planned
        self.keep(fresh, s, r)

    def keep(self, fresh: CacheEntry, s: Side, r: Side) -> None:
        """Cache the entry of an agreed miss that ran on these sides (collective by construction)."""
        if fresh.plan is not None:
            fresh.plan = fresh.plan.detach()  # it outlives the planner's next plan
        fresh.bound = self.identity(s, r)
        self.plan_cache.insert(fresh, self.calls.tick)

    def remember(self, call: Call, entry: CacheEntry, s: Side, r: Side, specs: tuple) -> None:
        """Let the compiled path recognise these specs as ``entry``'s from the next call on, with the
        persistent run bound to their buffers if there is one (after a hit, once the pattern is
        seen again: a new pattern every call does not pay for it)."""
        memo = _spec_memo(*specs)
        if memo is None:
            return
        run = entry.run if entry.run is not None and entry.bound == self.identity(s, r) else None
        self.calls.remember(entry.slot, memo, entry, s, r, call.algorithm, entry.settings[1], entry.settings[3], run,
                            run.program() if run is not None else None)

    def run_entry(self, call: Call, entry: CacheEntry, s: Side, r: Side, same_buffers: bool) -> None:
        """Run a cached entry that every rank hit: its persistent run when every rank's buffers are
        the ones it is bound to (bound on the second such call), else its plan on these buffers."""
        cache = self.plan_cache
        if same_buffers:
            if entry.run is None:  # the same buffers twice in a row everywhere: bind for good
                entry.run = self.bind(entry, s, r, True, typed=call.typed)
                cache.pin(entry, s.view.nbytes + r.view.nbytes)
                entry.bound = self.identity(s, r)
            self.calls.state = "hit"
            self.execute(call, entry.run)
            return
        if entry.run is not None:
            self.calls.forget(entry.slot)  # its bound run is freed
            entry.run.free()
            entry.run = None
            cache.pin(entry, 0)
        self.calls.state = "hit-rebound"
        self.run_once(call, entry, s, r)
        entry.bound = self.identity(s, r)

    def resolve(self, code: int, agreed: Agreed, uniform: bool, mode: str = "oneshot") -> tuple[Algorithm, int]:
        """(algorithm, radix) a call runs, from agreed numbers only: "auto" asks the cost model
        (``pick``); the hierarchical ones run flat where the layout has no hierarchy."""
        name = ALGORITHM_CHOICES[code]
        if name == "auto":
            return self.pick(agreed, uniform, mode)
        algo = self.layout.runs(name)
        if algo.chunked:
            return algo, self.chunks
        if not algo.led:
            return algo, self.radix
        if self.mode != MODE_SHM:  # agreed: every rank has this HierComm's node phase
            raise agreed_error(ExchangeError(f"algorithm {name!r} needs the shared-memory node phase (node_phase='shm'), "
                                       f"and this HierComm's is {self.node_phase!r}"
                                       + (" (nonblocking calls run with 'mpi')" if self.deferred else "")))
        return algo, check_leaders(self.leaders, self.layout.max_leaders)

    def pick(self, agreed: Agreed, uniform: bool, mode: str) -> tuple[Algorithm, int]:
        """The cost model's pick for the agreed pattern (``costmodel.auto_pick``), memoised by
        pattern class: one decision per class, however many patterns of it come."""
        pat = agreed.pattern(self.comm.size, uniform)
        key = (mode,) + pattern_class(pat)
        pick = self.choices.get(key)
        if pick is None:
            if len(self.choices) > 4096:
                self.choices.clear()
            t = self.topology
            name, radix = auto_pick(self.cost_model, mode, t.num_nodes, t.max_node_size, pat, self.node_phase,
                                    self.hier_possible, self.cpu_times, self.layout.node_sizes)
            pick = self.choices[key] = (ALGORITHM[name], radix)
        return pick

    def identity(self, s: Side, r: Side) -> tuple:
        """What a bound run depends on: the caller's buffers and the scratch it was bound to."""
        return buffer_id(s.view, r.view) + (self.scratch.generation, self.window.generation if self.window else 0)

    def hier_plan(self, s: Side, r: Side, algorithm: Algorithm, radix: int) -> StepProgram:
        """The hierarchical program (the planner's own: ``detach`` for one that lasts), the node's
        counts gathered (blocking, collective on the node)."""
        mine, node_counts = self.node_counts(s, r, algorithm)
        # INT64_T, as a miss the compiled path runs gathers them (``CallTable._run_hier``).
        self.gather_comm.Allgather([mine, MPI.INT64_T], [node_counts, MPI.INT64_T])
        return self.plan_with(s, r, algorithm, radix, node_counts)

    def node_counts(self, s: Side, r: Side, algorithm: Algorithm) -> tuple[np.ndarray, np.ndarray]:
        """(what this rank gives, where the node's go): what ``algorithm``'s planner needs of the
        node, to be gathered over ``gather_comm`` (int64): every node rank's receive counts (node
        size x world size), and for multi-leader its send counts before them (x 2 world size)."""
        mine = np.concatenate([s.counts, r.counts]) if algorithm.led else r.counts
        return mine, np.empty((len(self.members), mine.shape[0]), dtype=np.int64)

    def plan_with(self, s: Side, r: Side, algorithm: Algorithm, radix: int, node_counts: np.ndarray) -> StepProgram:
        """The hierarchical program of this call from the node's gathered counts (``node_counts``)."""
        planner = self.layout.planner_for(self.comm.rank, algorithm, radix) if algorithm.led else self.planner
        return program(algorithm, (s.counts, s.displs, r.counts, r.displs), planner, self.mode, node_counts, radix)

    def bind(self, entry: CacheEntry, s: Side, r: Side, persistent: bool, scratch: Optional[Scratch] = None,
             window: Optional[NodeWindow] = None, typed=None) -> Run:
        """A run of ``entry``'s program on these buffers (one-shot scratch unless others are given):
        its hierarchical program, or a flat one made here. ``typed``: the ``Alltoallw`` call whose
        bytes a run bound for good moves, composed with its type maps (``alltoallw.composed``)."""
        algo = entry.algorithm
        prog = entry.plan if algo.hierarchical else program(
            algo, (s.counts, s.displs, r.counts, r.displs), radix=entry.radix, uniform=entry.settings[3])
        native = None
        if persistent and typed is not None:  # an Alltoallw's run bound for good: on the caller's buffers
            native = self._native_alltoallw(algo, entry.big, typed)
            if native is None and typed.parts is not None:
                prog, s, r = composed(typed, prog, s, r)
        return Run(prog, algo, entry.radix, s, r, entry.big, self.comms, scratch or self.scratch,
                   window or self.window, persistent, runner=self.runner, native=native)

    def _native_alltoallw(self, algo: Algorithm, big: bool, typed) -> Optional[MPI.Prequest]:
        """MPI's own persistent ``Alltoallw_init`` on an Alltoallw call's own specs, where its run
        is flat (one exchange on the world: MPI's call moves the caller's datatypes with nothing
        packed around it), or None (a hierarchical or log-round run, the large-count path, or an
        MPI without it: the run is composed with the type maps instead). Decided from agreed
        numbers only (the algorithm, the large-count path), so every rank makes the same
        collective ``Alltoallw_init`` or none."""
        if algo is not ALGORITHM["flat"] or big:
            return None
        try:
            return self.comm.Alltoallw_init(*typed.user)
        except (NotImplementedError, AttributeError):
            return None

    def run_once(self, call: Call, entry: CacheEntry, s: Side, r: Side) -> None:
        """Run ``entry``'s program on these buffers once: a one-shot run, or, deferred, a persistent
        run of its own (on the byte buffers: not composed with an Alltoallw's type maps, whose call
        scatters after), freed once its request completed."""
        if call.defer:
            run = self.bind(entry, s, r, persistent=True)
            self.execute(call, run)
            run.free_when_done()
            return
        run = self.bind(entry, s, r, persistent=False)
        try:
            self.execute(call, run)
        finally:
            run.free()

    def execute(self, call: Call, run: Run) -> None:
        """Run ``run``, or hand it over in ``call.run`` where the call defers: it then belongs to
        the call's request until it completes (``Run.hold``; the request releases it)."""
        if call.defer:
            run.hold()
            call.run = run
        else:
            run.run()
        self.calls.stats = run.stats

    # ------------------------------------------------------------------ the rest
    def stats(self) -> dict:
        """``HierComm.last_stats``: messages and bytes of the last call (see there)."""
        st = self.calls.stats
        if st is None:
            return {}
        t, me = self.topology, self.comm.rank
        picked = {ALGORITHM[st.algorithm].setting_name: st.radix} if st.radix else {}
        if st.flat_counts is not None:
            counts = st.flat_counts
            live = counts > 0
            live[me] = False
            remote = live & (self.node_of != self.node_of[me])
            return {"algorithm": st.algorithm, **picked, "plan_cache": self.calls.state,
                    "flat": {"messages": int(live.sum()), "bytes": int(counts[live].sum())},
                    "inter_node": {"messages": int(remote.sum()), "bytes": int(counts[remote].sum())},
                    "copy_bytes": 0, "copies_per_byte": 0.0}
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
        delivered = st.delivered
        return {"algorithm": st.algorithm, **picked, "plan_cache": self.calls.state, "node_phase": self.node_phase,
                "inter": inter, "intra": intra, "inter_node": dict(inter), "copy_bytes": int(st.copied),
                "copies_per_byte": round(st.copied / delivered, 3) if delivered else 0.0}

    @property
    def scratch_bytes(self) -> int:
        """Scratch memory of one-shot calls on this rank: private buffers, the compiled runner's
        Bruck send buffers and arenas, plus its share of the window (bytes)."""
        window = self.window.view.shape[0] // self.topology.intra.size if self.window else 0
        runner = self.runner.scratch_bytes if self.runner is not None else 0
        return self.scratch.nbytes + runner + window

    def free(self) -> None:
        """Free cached runs, the node window and the data's own communicators (collective)."""
        self.calls.clear()
        self.plan_cache.clear()
        self.agreement.free()
        if self.window is not None:
            self.window.free()
        if self.deferred:
            self.gather_comm.Free()
            self.agreement.comm.Free()


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
