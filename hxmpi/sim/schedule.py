"""The simulator's message schedules: what one rank does in one call, step by step.

``rank_schedule`` turns a (P, P) count matrix into a rank's copies, messages and node barriers,
from the very plans ``HierComm`` executes (``hxmpi.comm.plan``: ``Layout`` and its compiled
planner, ``bruck_rounds``), so the messages ``python -m hxmpi.sim`` replays are the ones hxmpi
sends. Pure: no MPI.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

import numpy as np

from ..comm._plan import MODE_SHM
from ..comm.plan import (
    ALGORITHMS,
    HEADER_BYTES,
    NODE_PHASES,
    Layout,
    bruck_rounds,
    check_radix,
    exclusive_cumsum,
)

__all__ = ["Copy", "Exchange", "Collective", "NodeBarrier", "Step", "bruck_messages", "bruck_steps",
           "lane_counts", "rank_schedule"]


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
    send_base, pack_bytes, _, _, nrep, _ = pl.plan(mode, sc, exclusive_cumsum(sc), rc, exclusive_cumsum(rc),
                                                   rc_node)
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
