"""Executing exchanges: a plan bound to buffers and communicators, run once or started again and again.

Typed stages (``hxmpi/comm/exchange.py`` drives them)::

  ``HierPlan``  the hierarchical plan of one count pattern on one rank: copy lists and phase vectors
                (bytes), copied out of the planner so that it can be cached and bound again;
  ``FlatRun`` / ``HierRun``  a plan bound to buffers and communicators only, with ``start()``
                (local copies, nonblocking phase 1) and ``wait()`` (the rest);
  ``ExchangeStats``  what a run moved, read by ``HierComm.last_stats``.

``HierRun`` is the hierarchical exchange of ``hxmpi/comm/plan.py``: pack, phase 1 on every lane this rank
serves, then the node phase:

  shm  phase 1 receives into a node-shared window (``NodeWindow``); a node barrier; each rank copies
       its blocks straight from the window to its receive buffer; a second barrier frees the window
       for the next call (so one window serves every call, with no double buffering);
  mpi  phase 1 receives into a private buffer; repack by destination local rank; an Alltoallv on the
       node; unpack.

A run is bound to its buffers' addresses: ``Scratch`` and ``NodeWindow`` count their regrowths in
``generation`` so that a cached run can tell it must be bound again.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
from mpi4py import MPI

from ._call import Program
from ._packing import copy_blocks
from .msgspec import Side
from .plan import NODE_PHASES
from .transfer import Transfer

__all__ = ["NodeWindow", "Scratch", "ExchangeStats", "FlatRun", "HierPlan", "HierRun"]

MODE_SHM = NODE_PHASES["shm"]


class NodeWindow:
    """A byte buffer shared by the ranks of one node (``MPI_Win_allocate_shared``), grown on demand.

    ``ensure`` is collective on ``intra`` and must be called with the same size on every node rank
    (sizes come from the agreed node counts, so they are). ``generation`` counts regrowths.
    """

    def __init__(self, intra: MPI.Intracomm):
        self.intra = intra
        self.win: Optional[MPI.Win] = None
        self.view = np.empty(0, dtype=np.uint8)
        self.generation = 0
        #: a persistent node barrier (MPI-4 ``Barrier_init``; None where the library has none): a
        #: compiled run's window barrier, between memory fences (collective, as construction is)
        try:
            self.barrier_request: Optional[MPI.Prequest] = intra.Barrier_init()
        except (NotImplementedError, AttributeError):
            self.barrier_request = None

    def ensure(self, nbytes: int) -> np.ndarray:
        """The window as a uint8 array of at least ``nbytes`` (collective only when it grows)."""
        if self.win is None or self.view.shape[0] < nbytes:
            self._release()
            self.win = MPI.Win.Allocate_shared(max(nbytes, 1) if self.intra.rank == 0 else 0, 1,
                                               comm=self.intra)
            buf, _ = self.win.Shared_query(0)
            self.view = np.frombuffer(buf, dtype=np.uint8)
            self.generation += 1
            # Passive-target epoch for the window's lifetime: Sync() then orders memory between ranks.
            self.win.Lock_all(MPI.MODE_NOCHECK)
        return self.view

    def barrier(self) -> None:
        """Node barrier that also makes every rank's window writes visible to the others."""
        self.win.Sync()
        self.intra.Barrier()
        self.win.Sync()

    def free(self) -> None:
        """Release the window and the barrier (collective on the node)."""
        self._release()
        if self.barrier_request is not None:
            self.barrier_request.Free()
            self.barrier_request = None

    def _release(self) -> None:
        if self.win is not None:
            self.view = np.empty(0, dtype=np.uint8)
            self.win.Unlock_all()
            self.win.Free()
            self.win = None


class Scratch:
    """Named private byte buffers, grown only when a call needs more; ``generation`` counts regrowths."""

    def __init__(self):
        self.buffers: dict[str, np.ndarray] = {}
        self.generation = 0

    def get(self, name: str, nbytes: int) -> np.ndarray:
        """The buffer ``name`` with at least ``nbytes`` bytes."""
        buf = self.buffers.get(name)
        if buf is None or buf.shape[0] < nbytes:
            self.buffers.pop(name, None)  # drop the old one before allocating the new one
            buf = self.buffers[name] = np.empty(max(nbytes, 1), dtype=np.uint8)
            self.generation += 1
        return buf

    @property
    def nbytes(self) -> int:
        """Bytes held."""
        return sum(b.nbytes for b in self.buffers.values())


class ExchangeStats:
    """What one run moves on this rank (bytes): its algorithm, per-peer sends, copies.

    ``flat_counts``: bytes to each world rank (flat); ``node_bytes``: phase-1 bytes to each node and
    ``node_sends``: phase-2 bytes to each local rank, None with shm (hier); ``copied``: kernel copies;
    ``radix``: the Bruck radix of "bruck" and "hier_bruck" runs (0 for the others).
    """
    __slots__ = ("algorithm", "flat_counts", "node_bytes", "node_sends", "copied", "radix")

    def __init__(self, algorithm: str, flat_counts: Optional[np.ndarray] = None,
                 node_bytes: Optional[np.ndarray] = None, node_sends: Optional[np.ndarray] = None,
                 copied: int = 0):
        self.algorithm, self.flat_counts, self.node_bytes = algorithm, flat_counts, node_bytes
        self.node_sends, self.copied = node_sends, copied
        self.radix = 0


class _Phase:
    """One Transfer, started nonblocking each time or bound once as an MPI persistent collective."""

    def __init__(self, transfer: Transfer, persistent: bool):
        self.transfer = transfer
        self.request = transfer.init() if persistent else None  # None: no persistent collectives

    def start(self) -> MPI.Request:
        if self.request is None:
            return self.transfer.start()
        self.request.Start()
        return self.request

    def free(self) -> None:
        if self.request is not None and self.request != MPI.REQUEST_NULL:
            self.request.Free()
        self.request = None
        self.transfer.free()


class FlatRun:
    """One all-to-all of the caller's buffers (bytes). ``exchange`` is ``Transfer`` (Alltoallv; with
    ``uniform``, equal blocks run as MPI_Alltoall) or any class of its interface (``hxmpi.comm.bruck.Bruck``,
    ``Pairwise``, e.g. through functools.partial)."""

    def __init__(self, comm: MPI.Intracomm, s: Side, r: Side, big: bool, persistent: bool,
                 uniform: bool = False, exchange: Optional[Callable] = None, name: str = "flat"):
        self.phase = _Phase(exchange(comm, s, r, big) if exchange is not None else Transfer(comm, s, r, big, uniform),
                            persistent)
        self.stats = ExchangeStats(name, flat_counts=s.counts)
        self._finish: Optional[Callable] = None  # what ``wait`` calls: the started part's end
        self._program: Optional[Program] = None

    def start(self) -> None:
        """Start the exchange (its compiled program's first part where it has one)."""
        program = self.program()
        if program is not None:
            program.start()
            self._finish = program.wait
        else:
            self._finish = self.phase.start().Wait

    def wait(self) -> None:
        """Complete what ``start`` started."""
        self._finish()

    def run(self) -> None:
        """Start and wait: one blocking call (a persistent run starts its request)."""
        if self.phase.request is None:
            self.phase.transfer.run()
        else:
            self.phase.request.Start()
            self.phase.request.Wait()

    def program(self) -> Optional[Program]:
        """This run compiled (``_call.Program``, built once): Start + Wait of its persistent request,
        or the learned rounds of a log-round exchange; None where there is neither (yet)."""
        if self._program is None:
            if self.phase.request is not None:
                self._program = Program([("mpi", [self.phase.request])])
            else:
                self._program = self.phase.transfer.program()
        return self._program

    def free(self) -> None:
        if self._program is not None:
            self._program.free()
            self._program = None
        self.phase.free()


def _view_list(src, dst, length, n=None) -> tuple:
    """A (src, dst, length) copy list of the planner's arrays (the first ``n`` entries)."""
    if n is None:
        return src, dst, length
    return src[:n], dst[:n], length[:n]


class HierPlan:
    """The hierarchical plan of one count pattern on one rank (bytes), independent of buffers.

    Built from ``planner.plan(mode, ...)`` (``hxmpi/comm/plan.py``); ``rc_node`` is what every rank of this
    node receives from every source, (node size, world size) bytes. The plan first refers to the
    planner's arrays, which its next ``plan`` overwrites: ``detach()`` copies them, for a plan that
    outlives the call (a cached or persistent one). A plan used once never pays for the copies.
    """

    _ARRAYS = ("own", "out", "self_copy", "pack", "rep", "unp", "node_bytes", "send_displs", "lane_rc",
               "lane_rd", "p2")

    def __init__(self, planner, mode: int, s: Side, r: Side, rc_node: Optional[np.ndarray], me: int,
                 planned: Optional[tuple] = None):
        pl = planner
        # ``planned``: what ``planner.plan`` returned for these sides just now (a miss the compiled
        # path ran), whose arrays the planner still holds: not planned again.
        base, pack_bytes, buf_bytes, p2_bytes, nrep, copied = planned if planned is not None else pl.plan(
            mode, s.counts, s.displs, r.counts, r.displs, rc_node)
        self.mode, self.base, self.copied = mode, int(base), int(copied)
        self.buf_bytes = int(buf_bytes)
        self.a_bytes = int(max(pack_bytes if base < 0 else 0, p2_bytes))
        self.self_copy = (s.displs[me:me + 1], r.displs[me:me + 1], s.counts[me:me + 1])
        self.pack = _view_list(pl.pack_src, pl.pack_dst, pl.pack_len) if base < 0 else None
        self.own = _view_list(pl.own_src, pl.own_dst, pl.own_len)
        self.out = _view_list(pl.out_src, pl.out_dst, pl.out_len)
        self.rep = self.unp = None
        if mode != MODE_SHM:
            self.rep = _view_list(pl.rep_src, pl.rep_dst, pl.rep_len, nrep)
            self.unp = _view_list(pl.unp_src, pl.unp_dst, pl.unp_len)
        self.node_bytes = pl.node_bytes
        # The planner's displacements are relative to the pack buffer, or to the send buffer at ``base``.
        self.send_displs = pl.node_displs + (base if base >= 0 else 0)
        self.lane_rc, self.lane_rd = pl.p1_rc, pl.p1_rd
        self.native = int(pl.local)
        self.p2 = (pl.p2_sc, pl.p2_sd, pl.p2_rc, pl.p2_rd)
        self.zeros = np.zeros(int(pl.num_nodes), dtype=np.int64)
        self.detached = False

    def detach(self) -> "HierPlan":
        """Own copies of every array (of the planner's, and of the sides' counts): returns self."""
        if not self.detached:
            for name in self._ARRAYS:
                value = getattr(self, name)
                if value is not None:
                    setattr(self, name, tuple(np.array(a) for a in value) if type(value) is tuple else np.array(value))
            self.detached = True
        return self

    @property
    def nbytes(self) -> int:
        """Bytes of the plan's own arrays."""
        arrays = [*self.own, *self.out, *self.self_copy, self.node_bytes, self.send_displs, self.lane_rc,
                  self.lane_rd, *self.p2, *(self.pack or ()), *(self.rep or ()), *(self.unp or ())]
        return sum(a.nbytes for a in arrays)

    def stats(self, name: str = "hier") -> ExchangeStats:
        """What a run of this plan moves, under the algorithm ``name``."""
        return ExchangeStats(name, node_bytes=self.node_bytes,
                             node_sends=None if self.mode == MODE_SHM else self.p2[0], copied=self.copied)


def _nothing() -> None:
    """What ``wait`` calls after a start that finished the run."""


class HierRun:
    """A ``HierPlan`` bound to the caller's buffers, the lane and node communicators, and scratch.

    ``lanes``: (lane, communicator) for every lane this rank serves; ``a`` the pack/phase-2 scratch
    and ``buf`` the phase-1 buffer (a private buffer, or the node window's view with shm).
    ``lane_exchange``: the lane phase's class (``Transfer``: one Ialltoallv per lane;
    ``Bruck``/``Pairwise`` run their rounds lane after lane, in ascending lane order, which cannot
    deadlock). ``once``: the compiled one-shot runner (``_call.HierOnce``) of these lanes, which a
    one-shot run off the large-count path runs whole, its steps those of ``_describe``.
    """

    def __init__(self, plan: HierPlan, s: Side, r: Side, big: bool, lanes, intra: MPI.Intracomm,
                 a: np.ndarray, buf: np.ndarray, window: Optional[NodeWindow], persistent: bool,
                 lane_exchange: Callable = Transfer, name: str = "hier", once=None):
        self.plan, self.s, self.r, self.a, self.buf, self.window = plan, s, r, a, buf, window
        self.stats = plan.stats(name)
        self._once = once if not persistent and not big else None
        self.lanes, self.node = [], None
        self._program: Optional[Program] = None
        if self._once is not None:
            return
        send = a if plan.base < 0 else s.view
        for li, (lane, comm) in enumerate(lanes):
            native = lane == plan.native
            out = Side(send, plan.node_bytes, plan.send_displs) if native else Side(send, plan.zeros, plan.zeros)
            self.lanes.append(_Phase(lane_exchange(comm, out, Side(buf, plan.lane_rc[li], plan.lane_rd[li]), big),
                                     persistent))
        if plan.mode != MODE_SHM:
            sc, sd, rc, rd = plan.p2
            self.node = _Phase(Transfer(intra, Side(a, sc, sd), Side(buf, rc, rd), big), persistent)
        self._persistent = persistent
        self._steps = self._describe()
        # ``start`` walks the steps before the first "mpi" step and starts that one's phases
        self._first = next(i for i, step in enumerate(self._steps) if step[0] == "mpi")
        self._requests: list = []
        self._finish: Optional[Callable] = None  # what ``wait`` calls: the started part's end

    def _describe(self) -> list:
        """The run as steps, in order: what ``start``/``wait`` walk and ``program`` compiles (built
        once, at bind).

        ``("copy", src, src_off, dst, dst_off, length)``; ``("mpi", phases)``: start every phase,
        then wait for all; ``("barrier",)``: the node window's barrier (shm)."""
        p, s, r, a, buf = self.plan, self.s.view, self.r.view, self.a, self.buf
        steps = [("copy", s, *p.pack[:1], a, *p.pack[1:])] if p.pack is not None else []
        steps.append(("copy", s, p.self_copy[0], r, p.self_copy[1], p.self_copy[2]))
        if p.mode == MODE_SHM:
            return steps + [("copy", s, p.own[0], buf, p.own[1], p.own[2]),
                            # Always the nonblocking form: a rank serving two lanes must start both, and
                            # MPI never matches a blocking collective with a nonblocking one.
                            ("mpi", self.lanes),
                            ("barrier",),  # every rank's own blocks and phase-1 segments are in place
                            ("copy", buf, p.out[0], r, p.out[1], p.out[2]),
                            ("barrier",)]  # nobody reads the window any more: the next call may write it
        return steps + [("mpi", self.lanes),
                        ("copy", buf, p.rep[0], a, p.rep[1], p.rep[2]),
                        ("copy", s, p.own[0], a, p.own[1], p.own[2]),
                        ("copy", buf, p.out[0], r, p.out[1], p.out[2]),
                        ("mpi", [self.node]),
                        ("copy", buf, p.unp[0], r, p.unp[1], p.unp[2])]

    def _walk(self, steps: list) -> None:
        for step in steps:
            if step[0] == "copy":
                copy_blocks(step[1], step[2], step[3], step[4], step[5])
            elif step[0] == "mpi":
                MPI.Request.Waitall([phase.start() for phase in step[1]])
            else:
                self.window.barrier()

    def start(self) -> None:
        """Local copies that need no peer, then phase 1 on every served lane (nonblocking); the
        compiled program's first part where the run has one (``program``); a compiled one-shot run
        runs whole here."""
        if self._once is not None:
            self.run()
            self._finish = _nothing
            return
        program = self.program()
        if program is not None:
            program.start()
            self._finish = program.wait
            return
        self._walk(self._steps[:self._first])
        self._requests = [phase.start() for phase in self._steps[self._first][1]]
        self._finish = self._walk_rest

    def wait(self) -> None:
        """Finish phase 1, then the node phase."""
        self._finish()

    def _walk_rest(self) -> None:
        MPI.Request.Waitall(self._requests)
        self._requests = []
        self._walk(self._steps[self._first + 1:])

    def run(self) -> None:
        """Start and wait: one blocking call."""
        if self._once is not None:
            self._once.run(self.plan, self.s.view, self.r.view, self.a, self.buf)
            return
        self.start()
        self.wait()

    def program(self) -> Optional[Program]:
        """This run compiled (``_call.Program``, built once) from ``_describe``: persistent
        requests, learned Bruck lanes as their own programs, and the window barrier (a persistent
        barrier between memory fences); None where a phase has none of these (one-shot runs, a
        Bruck lane before its first run, a log-round lane on the large-count path)."""
        if self._program is None and self._persistent:
            steps = []
            for step in self._steps:
                if step[0] == "mpi":
                    phases = step[1]
                    if all(ph.request is not None for ph in phases):
                        steps.append(("mpi", [ph.request for ph in phases]))
                        continue
                    subs = [ph.transfer.program() for ph in phases]
                    if any(sub is None for sub in subs):
                        return None
                    steps += [("program", sub) for sub in subs]  # lane after lane, as ``start`` runs them
                elif step[0] == "barrier":
                    if self.window.barrier_request is None:
                        return None
                    steps.append(("barrier", self.window.barrier_request))
                else:
                    steps.append(step)
            self._program = Program(steps)
        return self._program

    def free(self) -> None:
        if self._program is not None:
            self._program.free()
            self._program = None
        for phase in self.lanes + ([self.node] if self.node else []):
            phase.free()
        self.lanes, self.node = [], None
