"""The simulator's message schedules: what one rank does in one call, step by step.

``rank_schedule`` turns a (P, P) count matrix into a rank's copies, messages and node barriers by
making the rank's step program with the very planners ``HierComm`` runs (``hxmpi.comm.plan``:
``Layout.rank_program`` and its compiled planner) and reading its steps (``program_schedule``): a
copy step is a copy of its bytes, an exchange step the messages to and from each peer (mapped from
its communicator's ranks to world ranks), its block to itself a copy made first (as MPI's and
hxmpi's all-to-alls make it), Bruck rounds expanded by ``bruck_rounds``. So the messages
``python -m hxmpi.sim`` replays are the ones hxmpi sends, in the order it sends them. Pure: no MPI.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np

from ..comm.plan import (
    HEADER_BYTES,
    BarrierStep,
    CopyStep,
    Layout,
    StepProgram,
    WaitStep,
    bruck_rounds,
    check_radix,
    program_steps,
)

__all__ = ["Copy", "Exchange", "Collective", "NodeBarrier", "Wait", "Step", "bruck_messages", "bruck_steps",
           "lane_counts", "program_schedule", "rank_schedule"]


@dataclass(frozen=True)
class Copy:
    """A local memcpy of ``nbytes`` (``what``: pack, own, self, out, repack, unpack)."""
    nbytes: int
    what: str


@dataclass(frozen=True)
class Exchange:
    """One all-to-all phase ("flat", "lane", "node") or one Bruck round ("round"): (peer world rank,
    bytes) pairs, non-empty only except in rounds (a Bruck round sends its message even when empty).

    ``schedule``: how the messages are posted: "" as Open MPI runs a blocking call of the phase
    (``actions.phase_algorithm`` decides), "linear" (all at once, one wait: hxmpi's nonblocking phases) or
    "pairwise" (rounds over ``members``, the world ranks of the communicator in its rank order);
    ``in_flight``: left in flight while the steps up to the next ``Wait`` run (linear only)."""
    phase: str
    sends: tuple
    recvs: tuple
    schedule: str = ""
    members: tuple = ()
    in_flight: bool = False


@dataclass(frozen=True)
class Collective:
    """An agreement collective: "allreduce" (world, ``nbytes`` in all), "alltoall" (world,
    ``nbytes`` per peer) or "allgather" (the rank's node, ``nbytes`` from each rank)."""
    kind: str
    nbytes: int


@dataclass(frozen=True)
class NodeBarrier:
    """Every rank of the node synchronises (the shared-memory node phase)."""


@dataclass(frozen=True)
class Wait:
    """Wait for the messages left in flight (``Exchange.in_flight``)."""


Step = Union[Copy, Exchange, NodeBarrier, Collective, Wait]


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


def _comm_counts(layout: Layout, counts: np.ndarray, rank: int, comm) -> np.ndarray:
    """What every member of the communicator sends every other on it (bytes): the rounds of a
    Bruck exchange carry others' blocks too."""
    if comm == "world":
        return counts
    if comm == "node":
        members = layout.comm_members(rank, comm)
        return counts[np.ix_(members, members)]
    return lane_counts(layout, counts, comm)


def program_schedule(prog: StepProgram, layout: Layout, rank: int, counts: np.ndarray,
                     learned: bool = True) -> list[Step]:
    """The simulator's steps of ``rank``'s program ``prog``: copies of their bytes (empty ones
    left out), node barriers, and each exchange's messages between world ranks (linear ones posted
    together merged into one; pairwise ones each in turn, the rounds of one lane after another's),
    its block to itself a copy first. ``counts`` (P x P bytes) only
    feeds Bruck rounds, which carry others' blocks; ``learned``: their lengths are known (no
    headers, no empty messages)."""
    steps: list[Step] = []
    group: list = []
    for st in program_steps(prog):
        if isinstance(st, CopyStep):
            steps.append(Copy(st.nbytes, st.what))
            continue
        if isinstance(st, BarrierStep):
            steps.append(NodeBarrier())
            continue
        if isinstance(st, WaitStep):
            steps.append(Wait())
            continue
        members = tuple(int(r) for r in layout.comm_members(rank, st.comm))
        pos = members.index(rank)
        if st.rounds == "bruck":
            steps += bruck_steps(_comm_counts(layout, counts, rank, st.comm), members, pos, st.radix, learned)
            continue
        if st.send_counts[pos]:
            steps.append(Copy(int(st.send_counts[pos]), "self"))
        others = np.arange(len(members)) != pos
        peers = np.asarray(members)[others]
        group.append((st, members, _pairs(peers, st.send_counts[others]), _pairs(peers, st.recv_counts[others])))
        if st.with_next and st.rounds != "pairwise":
            continue  # linear exchanges are posted together; pairwise ones run in turn, as the runner runs them
        phase = "flat" if st.comm == "world" else "node" if st.comm == "node" else "lane"
        if st.rounds == "pairwise":
            schedule = "pairwise"
        else:
            schedule = "" if st.blocking and len(group) == 1 else "linear"
        steps.append(Exchange(phase, sum((g[2] for g in group), ()), sum((g[3] for g in group), ()), schedule,
                              members if len(group) == 1 else (), st.in_flight))
        group = []
    return [s for s in steps if not isinstance(s, Copy) or s.nbytes]


def rank_schedule(layout: Layout, counts: np.ndarray, rank: int, algorithm: str = "hier",
                  node_phase: str = "shm", radix: Optional[int] = None, learned: bool = True) -> list[Step]:
    """What ``rank`` does in one exchange, in order: its copies, messages and node barriers.

    ``counts[src, dst]``: bytes src sends to dst (a (P, P) int64 array); blocks packed in rank order.
    ``algorithm``: one of ``ALGORITHMS`` (degenerate layouts run hier's as flat, as HierComm does);
    ``radix``: the algorithm's setting (``plan.Algorithm.setting``: the Bruck radix, multi-leader's
    leaders per node, the pipelined node phase's chunks; None: its default); ``learned``: Bruck lengths known from an earlier run (a plan).
    """
    counts = np.ascontiguousarray(counts, dtype=np.int64)
    p = layout.size
    if counts.shape != (p, p):
        raise ValueError(f"counts has shape {counts.shape}, expected ({p}, {p})")
    prog = layout.rank_program(rank, algorithm, counts, node_phase, radix)
    return program_schedule(prog, layout, rank, counts, learned)
