"""The hierarchical exchange's plan: who serves which lane, and every byte offset of a call.

Pure planning, no MPI: ``HierComm`` executes plans, and ``python -m hxmpi.sim`` replays the very
same plans in SimGrid (``hxmpi.sim.schedule.rank_schedule``), so the simulated messages are the
ones hxmpi sends.

Layout rules (see ``docs/method.md``): node ids are renumbered by lowest rank; local rank l of node m
is the native member of lane l; on a node with fewer than l+1 ranks lane l is served by local rank
``l % G_m``, so a rank serves the lanes {l, l+G_m, l+2 G_m, ...} below the largest node size. Source
s (node m, local rank l_s) sends its blocks for node n, in one segment, on lane l_s; on node n the
segment is received by local rank ``l_s % G_n``, its "server". The compiled pass in
``csrc/_plan.pyx`` turns counts into copy lists and phase vectors.

The lane phase (and the whole flat exchange) can also run as pairwise rounds or as radix-k
Bruck rounds (``hxmpi.comm.bruck``); ``bruck_rounds`` gives their slots from the rank count alone,
so the simulator (``hxmpi.sim.schedule.bruck_messages``) replays the very rounds
``hxmpi.comm.bruck.Bruck`` sends.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np

from ._plan import MODE_MPI, MODE_SHM, HierPlanner

__all__ = ["exclusive_cumsum", "dense_node_ids", "Layout", "check_radix", "bruck_rounds"]

#: The node phase's implementations: shared memory ("shm") or message passing ("mpi").
NODE_PHASES = {"shm": MODE_SHM, "mpi": MODE_MPI}


def exclusive_cumsum(x: np.ndarray) -> np.ndarray:
    """Displacements of consecutive blocks of sizes ``x``: 0, x[0], x[0]+x[1], ... (int64)."""
    out = np.zeros(x.shape[0], dtype=np.int64)
    np.cumsum(x[:-1], out=out[1:])
    return out


def dense_node_ids(ids) -> np.ndarray:
    """Node ids renumbered 0..N-1 in order of each node's lowest rank (int64 array, one per rank)."""
    _, first, inverse = np.unique(np.asarray(ids), return_index=True, return_inverse=True)
    order = np.argsort(first)
    remap = np.empty_like(order)
    remap[order] = np.arange(order.size)
    return remap[inverse.reshape(-1)].astype(np.int64)


class Layout:
    """Static node layout of a world of ranks (no MPI): node map, members, lanes and their servers."""

    def __init__(self, node_of: Sequence[int]):
        self.node_of = dense_node_ids(node_of)
        self.size = int(self.node_of.shape[0])
        self.num_nodes = int(self.node_of.max()) + 1 if self.size else 0
        self.members = [np.flatnonzero(self.node_of == n).astype(np.int64) for n in range(self.num_nodes)]
        self.node_sizes = tuple(int(m.size) for m in self.members)
        self.max_node_size = max(self.node_sizes)
        self.local_of = np.empty(self.size, dtype=np.int64)
        for m in self.members:
            self.local_of[m] = np.arange(m.size)
        self.dest_order = np.concatenate(self.members)
        self.node_start = np.concatenate([[0], np.cumsum(self.node_sizes)]).astype(np.int64)
        self.planner = lru_cache(maxsize=None)(self._planner)

    @property
    def hier_possible(self) -> bool:
        """Whether the two phases differ from flat: more than one node and a node of two ranks or more."""
        return self.num_nodes > 1 and self.max_node_size > 1

    def served_lanes(self, rank: int) -> list[int]:
        """Lanes ``rank`` serves, ascending: its own (its local rank) and stand-ins on small nodes."""
        g = self.node_sizes[self.node_of[rank]]
        return list(range(int(self.local_of[rank]), self.max_node_size, g))

    def lane_server(self, lane: int, node: int) -> int:
        """World rank of ``node`` that is the member of ``lane``."""
        return int(self.members[node][lane % self.node_sizes[node]])

    def _planner(self, rank: int) -> HierPlanner:
        node, local = int(self.node_of[rank]), int(self.local_of[rank])
        g, gmax, sizes = self.node_sizes[node], self.max_node_size, self.node_sizes
        srv, ptr = [], [0]
        for j in range(g):  # sources whose segment local rank j receives, in (lane, node) order
            for lane in range(j, gmax, g):
                srv.extend(int(m[lane]) for m in self.members if m.size > lane)
            ptr.append(len(srv))
        lane_src = [[int(self.members[m][lane]) if sizes[m] > lane and m != node else -1
                     for m in range(self.num_nodes)] for lane in self.served_lanes(rank)]
        return HierPlanner(rank, node, local, self.members[node], self.dest_order, self.node_start,
                           np.asarray(srv, dtype=np.int64), np.asarray(ptr, dtype=np.int64),
                           np.asarray(lane_src, dtype=np.int64).reshape(len(lane_src), self.num_nodes))


#: hxmpi's algorithms: flat Alltoallv, flat radix-k Bruck, and hier with linear (Ialltoallv),
#: pairwise or Bruck lanes.
ALGORITHMS = ("flat", "bruck", "hier", "hier_pairwise", "hier_bruck")
#: What a call may ask for: an algorithm, or "auto" (the cost model picks). A name's index in this
#: tuple is the code the agreement carries.
ALGORITHM_CHOICES = (*ALGORITHMS, "auto")
#: Bytes of a Bruck header entry (one int64 length per slot, first run only).
HEADER_BYTES = 8


def check_radix(radix, size: int) -> int:
    """The radix to use on ``size`` ranks (values above ``size`` act as ``size``); ValueError if < 2."""
    if isinstance(radix, bool) or not isinstance(radix, (int, np.integer)) or radix < 2:
        raise ValueError(f"radix must be an integer >= 2, got {radix!r}")
    return int(min(radix, max(size, 2)))


def bruck_rounds(size: int, radix: int) -> tuple[tuple[tuple[int, np.ndarray], ...], ...]:
    """Per round, the (distance, slot indices) of each non-empty digit value on ``size`` ranks.

    Slot i (the block for rank +i) moves in round x, by z * radix**x, when its base-radix digit x is z.
    Computed once per (size, radix): every ``Bruck`` of a one-shot miss builds from it. The slot
    arrays are read-only, as they are shared.
    """
    return _bruck_rounds(size, check_radix(radix, size))


@lru_cache(maxsize=64)
def _bruck_rounds(size: int, radix: int) -> tuple:
    idx = np.arange(size, dtype=np.int64)
    rounds, dist = [], 1
    while dist < size:
        digit = (idx // dist) % radix
        group = []
        for z in range(1, radix):
            if z * dist < size:
                slots = np.flatnonzero(digit == z).astype(np.int64)
                slots.flags.writeable = False
                group.append((z * dist, slots))
        rounds.append(tuple(group))
        dist *= radix
    return tuple(rounds)
