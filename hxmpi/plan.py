"""The hierarchical exchange's plan: who serves which lane, and every byte offset of a call.

Pure planning, no MPI: ``HierComm`` executes plans, and ``python -m hxmpi.simulate`` replays the very
same plans in SimGrid (``rank_schedule``), so the simulated messages are the ones hxmpi sends.

Layout rules (see ``docs/method.md``): node ids are renumbered by lowest rank; local rank l of node m
is the native member of lane l; on a node with fewer than l+1 ranks lane l is served by local rank
``l % G_m``, so a rank serves the lanes {l, l+G_m, l+2 G_m, ...} below the largest node size. Source
s (node m, local rank l_s) sends its blocks for node n, in one segment, on lane l_s; on node n the
segment is received by local rank ``l_s % G_n``, its "server". The compiled pass in
``csrc/_plan.pyx`` turns counts into copy lists and phase vectors.
"""
from __future__ import annotations

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
    """One all-to-all phase ("flat", "lane" or "node"): (peer world rank, bytes) pairs, non-empty only."""
    phase: str
    sends: tuple
    recvs: tuple


@dataclass(frozen=True)
class NodeBarrier:
    """Every rank of the node synchronises (the shared-memory node phase)."""


Step = Union[Copy, Exchange, NodeBarrier]


def _pairs(peers, nbytes) -> tuple:
    return tuple((int(p), int(b)) for p, b in zip(peers, nbytes) if b > 0)


def rank_schedule(layout: Layout, counts: np.ndarray, rank: int, algorithm: str = "hier",
                  node_phase: str = "shm") -> list[Step]:
    """What ``rank`` does in one exchange, in order: its copies, messages and node barriers.

    ``counts[src, dst]``: bytes src sends to dst (a (P, P) int64 array); blocks packed in rank order.
    ``algorithm``: "flat" or "hier" (degenerate layouts always run flat, as HierComm does).
    """
    counts = np.ascontiguousarray(counts, dtype=np.int64)
    p = layout.size
    if counts.shape != (p, p):
        raise ValueError(f"counts has shape {counts.shape}, expected ({p}, {p})")
    sc, rc = counts[rank], np.ascontiguousarray(counts[:, rank])
    others = np.arange(p) != rank
    selfcopy = [Copy(int(sc[rank]), "self")] if sc[rank] else []
    if algorithm == "flat" or not layout.hier_possible:
        return [Exchange("flat", _pairs(np.flatnonzero(others), sc[others]),
                         _pairs(np.flatnonzero(others), rc[others]))] + selfcopy
    if algorithm != "hier":
        raise ValueError(f"algorithm must be 'flat' or 'hier', got {algorithm!r}")
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
    steps: list[Step] = [Copy(int(pack_bytes), "pack")] if send_base < 0 and pack_bytes else []
    own = int(pl.own_len.sum())
    if mode == MODE_SHM:
        steps += ([Copy(own, "own")] if own else []) + selfcopy
        steps += [Exchange("lane", sends, recvs), NodeBarrier(), Copy(int(pl.out_len.sum()), "out"),
                  NodeBarrier()]
        return [s for s in steps if not isinstance(s, Copy) or s.nbytes]
    repack = own + int(pl.rep_len[:nrep].sum())
    steps += [Exchange("lane", sends, recvs), Copy(repack, "repack"),
              Copy(int(pl.out_len.sum()) + int(sc[rank]), "out"),
              Exchange("node", _pairs(members, pl.p2_sc), _pairs(members, pl.p2_rc)),
              Copy(int(pl.unp_len.sum()), "unpack")]
    return [s for s in steps if not isinstance(s, Copy) or s.nbytes]
