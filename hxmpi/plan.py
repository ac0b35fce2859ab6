"""The hierarchical exchange's plan: who serves which lane, and every byte offset of a call.

Pure planning, no MPI: ``HierComm`` executes plans, and ``python -m hxmpi.simulate`` replays the very
same plans in SimGrid (``rank_schedule``), so the simulated messages are the ones hxmpi sends.

Layout rules (see ``docs/method.md``): node ids are renumbered by lowest rank; local rank l of node m
is the native member of lane l; on a node with fewer than l+1 ranks lane l is served by local rank
``l % G_m``, so a rank serves the lanes {l, l+G_m, l+2 G_m, ...} below the largest node size. Source
s (node m, local rank l_s) sends its blocks for node n, in one segment, on lane l_s; on node n the
segment is received by local rank ``l_s % G_n``, its "server". The compiled pass in
``csrc/_plan.pyx`` turns counts into copy lists and phase vectors.

The lane phase (and the whole flat exchange) can also run as pairwise rounds or as radix-k
Bruck rounds (``hxmpi.bruck``); ``bruck_rounds`` and ``bruck_messages`` give their messages from
the counts alone, so the simulator replays the very rounds ``hxmpi.bruck.Bruck`` sends.
"""
from __future__ import annotations

import functools

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence, Union

import numpy as np

from ._plan import MODE_MPI, MODE_SHM, HierPlanner

NODE_PHASES = {"shm": MODE_SHM, "mpi": MODE_MPI}


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


@dataclass(frozen=True)
class Copy:
    """A local memcpy of ``nbytes`` (``what``: pack, own, self, out, repack, unpack)."""
    nbytes: int
    what: str


@dataclass(frozen=True)
class Exchange:
    """One all-to-all phase ("flat", "lane", "node") or one Bruck round ("round"): (peer world rank,
    bytes) pairs, non-empty only except in rounds (a Bruck round sends its message even when empty).

    ``schedule``: how the messages are posted: "" as Open MPI runs the phase (``simulate``
    decides), "linear" (all at once, one wait) or "pairwise" (rounds over ``members``, the world
    ranks of the communicator in its rank order)."""
    phase: str
    sends: tuple
    recvs: tuple
    schedule: str = ""
    members: tuple = ()


@dataclass(frozen=True)
class Collective:
    """An agreement collective: "allreduce" (world, ``nbytes`` in all), "alltoall" (world,
    ``nbytes`` per peer) or "allgather" (the rank's node, ``nbytes`` from each rank)."""
    kind: str
    nbytes: int


@dataclass(frozen=True)
class NodeBarrier:
    """Every rank of the node synchronises (the shared-memory node phase)."""


Step = Union[Copy, Exchange, NodeBarrier, Collective]
#: Algorithms ``rank_schedule`` plans: flat Alltoallv, flat Bruck, hier with linear (Ialltoallv),
#: pairwise or Bruck lanes.
ALGORITHMS = ("flat", "bruck", "hier", "hier_pairwise", "hier_bruck")
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


@functools.lru_cache(maxsize=64)
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


def bruck_messages(counts: np.ndarray, pos: int, radix: int, header: bool) -> list[list[tuple]]:
    """Per round, (to, from, bytes sent, bytes received) of position ``pos`` in a Bruck all-to-all.

    ``counts[i, j]``: bytes position i sends to j on the communicator. In round x, slot i of
    position q holds the block from q - (i mod radix**x) to that rank + i; ``header`` adds the
    lengths' header (first run of a ``Bruck`` object).
    """
    n = counts.shape[0]
    out, span = [], 1
    for group in bruck_rounds(n, radix):
        msgs = []
        for d, slots in group:
            low = slots % span
            src_s, src_r = (pos - low) % n, (pos - d - low) % n
            extra = HEADER_BYTES * slots.shape[0] if header else 0
            msgs.append(((pos + d) % n, (pos - d) % n, int(counts[src_s, (src_s + slots) % n].sum()) + extra,
                         int(counts[src_r, (src_r + slots) % n].sum()) + extra))
        out.append(msgs)
        span *= check_radix(radix, n)
    return out


def bruck_steps(counts: np.ndarray, members: Sequence[int], pos: int, radix: int, learned: bool) -> list[Step]:
    """Copies and rounds of one Bruck exchange at position ``pos`` of the communicator ``members``
    (world ranks): pack each round's message, send it, and copy every block out at the end.

    ``learned``: the lengths are known from an earlier run, so no header and no empty messages.
    """
    steps: list[Step] = []
    for msgs in bruck_messages(counts, pos, radix, not learned):
        keep = [m for m in msgs if not learned or m[2] or m[3]]
        steps += [Copy(sum(m[2] for m in keep), "pack"),
                  Exchange("round", tuple((int(members[m[0]]), m[2]) for m in keep if not learned or m[2]),
                           tuple((int(members[m[1]]), m[3]) for m in keep if not learned or m[3]), "linear")]
    steps.append(Copy(int(counts[:, pos].sum()), "unpack"))
    return [s for s in steps if not isinstance(s, Copy) or s.nbytes]


def _pairs(peers, nbytes) -> tuple:
    return tuple((int(p), int(b)) for p, b in zip(peers, nbytes) if b > 0)


def lane_counts(layout: Layout, counts: np.ndarray, lane: int) -> np.ndarray:
    """(N, N) bytes node m's member of ``lane`` sends node n's on the lane (0 on the diagonal and
    from nodes where a stand-in serves the lane): what the lane phase's communicator carries."""
    n = layout.num_nodes
    by_node = np.add.reduceat(counts[:, layout.dest_order], layout.node_start[:-1], axis=1)
    out = np.zeros((n, n), dtype=np.int64)
    for m in range(n):
        if layout.node_sizes[m] > lane:
            out[m] = by_node[int(layout.members[m][lane])]
    np.fill_diagonal(out, 0)
    return out


def _lane_steps(layout: Layout, counts: np.ndarray, rank: int, algorithm: str, sends: tuple, recvs: tuple,
                radix: int, learned: bool) -> list[Step]:
    """The lane phase: one linear Ialltoallv over every served lane, or each lane's rounds in turn."""
    if algorithm == "hier":
        return [Exchange("lane", sends, recvs)]
    steps: list[Step] = []
    node = int(layout.node_of[rank])
    for lane in layout.served_lanes(rank):
        members = tuple(layout.lane_server(lane, m) for m in range(layout.num_nodes))
        lc = lane_counts(layout, counts, lane)
        if algorithm == "hier_pairwise":
            steps.append(Exchange("lane", _pairs(members, lc[node]), _pairs(members, lc[:, node]),
                                  "pairwise", members))
        else:
            steps += bruck_steps(lc, members, node, radix, learned)
    return steps


def rank_schedule(layout: Layout, counts: np.ndarray, rank: int, algorithm: str = "hier",
                  node_phase: str = "shm", radix: int = 2, learned: bool = True) -> list[Step]:
    """What ``rank`` does in one exchange, in order: its copies, messages and node barriers.

    ``counts[src, dst]``: bytes src sends to dst (a (P, P) int64 array); blocks packed in rank order.
    ``algorithm``: one of ``ALGORITHMS`` (degenerate layouts run hier's as flat, as HierComm does);
    ``radix`` for the Bruck ones; ``learned``: Bruck lengths known from an earlier run (a plan).
    """
    counts = np.ascontiguousarray(counts, dtype=np.int64)
    p = layout.size
    if counts.shape != (p, p):
        raise ValueError(f"counts has shape {counts.shape}, expected ({p}, {p})")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    sc, rc = counts[rank], np.ascontiguousarray(counts[:, rank])
    others = np.arange(p) != rank
    selfcopy = [Copy(int(sc[rank]), "self")] if sc[rank] else []
    if algorithm == "bruck":
        return bruck_steps(counts, tuple(range(p)), rank, radix, learned)
    if algorithm == "flat" or not layout.hier_possible:
        return [Exchange("flat", _pairs(np.flatnonzero(others), sc[others]),
                         _pairs(np.flatnonzero(others), rc[others]))] + selfcopy
    mode = NODE_PHASES[node_phase]
    pl = layout.planner(rank)
    node = int(layout.node_of[rank])
    members = layout.members[node]
    rc_node = np.ascontiguousarray(counts[:, members].T)
    sd = np.concatenate([[0], np.cumsum(sc)[:-1]]).astype(np.int64)
    rd = np.concatenate([[0], np.cumsum(rc)[:-1]]).astype(np.int64)
    send_base, pack_bytes, _, _, nrep, _ = pl.plan(mode, sc, sd, rc, rd, rc_node)
    lane = int(layout.local_of[rank])
    servers = [layout.lane_server(lane, m) for m in range(layout.num_nodes)]
    sends = _pairs(servers, pl.node_bytes)
    recvs = tuple(pair for li in range(pl.num_lanes) for pair in _pairs(pl.lane_src[li], pl.p1_rc[li]))
    lanes = _lane_steps(layout, counts, rank, algorithm, sends, recvs, radix, learned)
    steps: list[Step] = [Copy(int(pack_bytes), "pack")] if send_base < 0 and pack_bytes else []
    own = int(pl.own_len.sum())
    if mode == MODE_SHM:
        steps += ([Copy(own, "own")] if own else []) + selfcopy
        steps += lanes + [NodeBarrier(), Copy(int(pl.out_len.sum()), "out"), NodeBarrier()]
        return [s for s in steps if not isinstance(s, Copy) or s.nbytes]
    repack = own + int(pl.rep_len[:nrep].sum())
    steps += lanes + [Copy(repack, "repack"),
                      Copy(int(pl.out_len.sum()) + int(sc[rank]), "out"),
                      Exchange("node", _pairs(members, pl.p2_sc), _pairs(members, pl.p2_rc)),
                      Copy(int(pl.unp_len.sum()), "unpack")]
    return [s for s in steps if not isinstance(s, Copy) or s.nbytes]
