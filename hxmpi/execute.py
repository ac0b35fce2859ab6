"""Executing exchanges: a plan bound to buffers, run once or started again and again (persistent).

``FlatRun`` is one MPI Alltoallv (or Alltoallw for large counts). ``HierRun`` is the hierarchical
exchange of ``hxmpi/plan.py``: pack, phase 1 on every lane this rank serves, then the node phase:

  shm  phase 1 receives into a node-shared window (``NodeWindow``); a node barrier; each rank copies
       its blocks straight from the window to its receive buffer; a second barrier frees the window
       for the next call (so one window serves every call, with no double buffering);
  mpi  phase 1 receives into a private buffer; repack by destination local rank; an Alltoallv on the
       node; unpack.

Every run has ``start()`` (local copies, nonblocking phase 1) and ``wait()`` (the rest), so a
persistent request can overlap the transfer with the caller's work. A one-shot run uses scratch
buffers cached by its ``HierComm``; a persistent one owns its buffers, window and MPI requests.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
from mpi4py import MPI

from ._packing import copy_blocks
from .msgspec import Side
from .plan import NODE_PHASES
from .transfer import Transfer

MODE_SHM = NODE_PHASES["shm"]


class NodeWindow:
    """A byte buffer shared by the ranks of one node (``MPI_Win_allocate_shared``), grown on demand.

    ``ensure`` is collective on ``intra`` and must be called with the same size on every node rank
    (sizes come from the agreed node counts, so they are).
    """

    def __init__(self, intra: MPI.Intracomm):
        self.intra = intra
        self.win: Optional[MPI.Win] = None
        self.view = np.empty(0, dtype=np.uint8)

    def ensure(self, nbytes: int) -> np.ndarray:
        """The window as a uint8 array of at least ``nbytes`` (collective only when it grows)."""
        if self.win is None or self.view.shape[0] < nbytes:
            self.free()
            self.win = MPI.Win.Allocate_shared(max(nbytes, 1) if self.intra.rank == 0 else 0, 1,
                                               comm=self.intra)
            buf, _ = self.win.Shared_query(0)
            self.view = np.frombuffer(buf, dtype=np.uint8)
            # Passive-target epoch for the window's lifetime: Sync() then orders memory between ranks.
            self.win.Lock_all(MPI.MODE_NOCHECK)
        return self.view

    def barrier(self) -> None:
        """Node barrier that also makes every rank's window writes visible to the others."""
        self.win.Sync()
        self.intra.Barrier()
        self.win.Sync()

    def free(self) -> None:
        """Release the window (collective on the node)."""
        if self.win is not None:
            self.view = np.empty(0, dtype=np.uint8)
            self.win.Unlock_all()
            self.win.Free()
            self.win = None


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
        self.transfer.free()


class FlatRun:
    """One all-to-all of the caller's buffers (bytes): ``exchange`` is ``Transfer`` (Alltoallv) or
    any class of its interface (``hxmpi.bruck.Bruck``, ``Pairwise``, e.g. through functools.partial)."""

    def __init__(self, comm: MPI.Intracomm, s: Side, r: Side, big: bool, persistent: bool,
                 exchange: Callable = Transfer):
        self.phase = _Phase(exchange(comm, s.view, s.counts, s.displs, r.view, r.counts, r.displs, big),
                            persistent)
        self.stats = ("flat", s.counts)
        self._request: Optional[MPI.Request] = None

    def start(self) -> None:
        self._request = self.phase.start()

    def wait(self) -> None:
        self._request.Wait()

    def run(self) -> None:
        """Start and wait: one blocking call."""
        self.phase.transfer.run()

    def free(self) -> None:
        self.phase.free()


class HierRun:
    """The hierarchical exchange of one count pattern, bound to the caller's buffers.

    ``scratch(name, nbytes)`` gives private scratch buffers and ``window`` the node window; a
    persistent run passes its own, a one-shot run its HierComm's cached ones. ``rc_node``: (node
    size, world size) bytes every node rank receives from every source. ``lane_exchange``: the
    lane phase's class (``Transfer``: one Ialltoallv per lane; ``Bruck``/``Pairwise`` run their
    rounds lane after lane, in ascending lane order, which cannot deadlock).
    """

    def __init__(self, hc, s: Side, r: Side, big: bool, rc_node: np.ndarray, persistent: bool,
                 scratch: Callable[[str, int], np.ndarray], window: Optional[NodeWindow],
                 lane_exchange: Callable = Transfer):
        pl, self.mode = hc._planner, hc._mode
        base, pack_bytes, buf_bytes, p2_bytes, nrep, copied = pl.plan(
            self.mode, s.counts, s.displs, r.counts, r.displs, rc_node)
        keep = np.array if persistent else (lambda a: a)  # the planner's arrays serve the next plan too
        self.s, self.r, self.window = s, r, window
        me = hc.comm.rank
        self.self_copy = (s.displs[me:me + 1], r.displs[me:me + 1], s.counts[me:me + 1])
        self.pack = None if base >= 0 else (keep(pl.pack_src), keep(pl.pack_dst), keep(pl.pack_len))
        self.own = (keep(pl.own_src), keep(pl.own_dst), keep(pl.own_len))
        self.out = (keep(pl.out_src), keep(pl.out_dst), keep(pl.out_len))
        a = scratch("a", max(pack_bytes if base < 0 else 0, p2_bytes))
        if self.mode == MODE_SHM:
            buf = window.ensure(int(buf_bytes))
        else:
            buf = scratch("b", int(buf_bytes))
            self.rep = (keep(pl.rep_src[:nrep]), keep(pl.rep_dst[:nrep]), keep(pl.rep_len[:nrep]))
            self.unp = (keep(pl.unp_src), keep(pl.unp_dst), keep(pl.unp_len))
        self.a, self.buf = a, buf
        send, sdispls = (a, pl.node_displs) if base < 0 else (s.view, pl.node_displs + base)
        node_bytes = pl.node_bytes.copy()
        zeros = np.zeros(pl.num_nodes, dtype=np.int64)
        self.lanes = []
        for li, (lane, comm) in enumerate(hc.topology.served_lanes):
            native = lane == pl.local
            self.lanes.append(_Phase(lane_exchange(comm, send, node_bytes if native else zeros,
                                              sdispls if native else zeros, buf, pl.p1_rc[li],
                                              pl.p1_rd[li], big), persistent))
        self.node = None
        if self.mode != MODE_SHM:
            self.node = _Phase(Transfer(hc.topology.intra, a, pl.p2_sc, pl.p2_sd, buf, pl.p2_rc,
                                        pl.p2_rd, big), persistent)
        self.stats = ("hier", node_bytes, None if self.mode == MODE_SHM else pl.p2_sc.copy(), copied)
        self._requests: list = []

    def start(self) -> None:
        """Local copies that need no peer, then phase 1 on every served lane (nonblocking)."""
        s, r = self.s, self.r
        if self.pack is not None:
            copy_blocks(s.view, self.pack[0], self.a, self.pack[1], self.pack[2])
        copy_blocks(s.view, self.self_copy[0], r.view, self.self_copy[1], self.self_copy[2])
        if self.mode == MODE_SHM:
            copy_blocks(s.view, self.own[0], self.buf, self.own[1], self.own[2])
        # Always the nonblocking form: a rank serving two lanes must start both, and MPI never
        # matches a blocking collective with a nonblocking one on the same communicator.
        self._requests = [lane.start() for lane in self.lanes]

    def wait(self) -> None:
        """Finish phase 1, then the node phase."""
        MPI.Request.Waitall(self._requests)
        self._requests = []
        r, buf = self.r, self.buf
        if self.mode == MODE_SHM:
            self.window.barrier()   # every rank's own blocks and phase-1 segments are in place
            copy_blocks(buf, self.out[0], r.view, self.out[1], self.out[2])
            self.window.barrier()   # nobody reads the window any more: the next call may write it
            return
        copy_blocks(buf, self.rep[0], self.a, self.rep[1], self.rep[2])
        copy_blocks(self.s.view, self.own[0], self.a, self.own[1], self.own[2])
        copy_blocks(buf, self.out[0], r.view, self.out[1], self.out[2])
        self.node.start().Wait()
        copy_blocks(buf, self.unp[0], r.view, self.unp[1], self.unp[2])

    def run(self) -> None:
        """Start and wait: one blocking call; a one-shot run frees its transfers' datatypes."""
        try:
            self.start()
            self.wait()
        finally:
            self.free()

    def free(self) -> None:
        for phase in self.lanes + ([self.node] if self.node else []):
            phase.free()
        self.lanes, self.node = [], None
