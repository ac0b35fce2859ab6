"""Trace actions: the lines of SMPI's time-independent traces that messages become.

Each rank's trace is one action per line (``RANK VERB ...``, SimGrid's ``smpirun -replay`` format).
This module turns message phases into them: an exchange as its schedule (or Open MPI's rule for
the phase) posts it, a node's dissemination barrier, the waits for many requests, the coarse
replay of a linear world phase, and the node's NIC (a per-message byte surcharge). The simulator
(``trace``) and the reference schedules (``reference``) both write their traces with them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from ..comm.costmodel.collectives import alltoallv_algorithm, dissemination_distances
from ..comm.costmodel.params import Parameters
from ..comm.plan import Layout
from .schedule import Exchange

__all__ = ["PHASE_TAG", "TAG_STRIDE", "Nic", "P2P_VERBS", "nic_lines", "phase_algorithm", "exchange_actions",
           "WAITALL_MAX", "wait_lines", "dissemination", "barrier_actions", "Coarse", "even_hierarchy", "coarsenable",
           "coarse_actions"]

PHASE_TAG = {"flat": 0, "lane": 1, "node": 2, "barrier": 3, "round": 4, "agree": 5}
TAG_STRIDE = 100000  # tag = phase * TAG_STRIDE + n-th message to the same peer within the phase


@dataclass(frozen=True)
class Nic:
    """A node's network interface: ``msg_rate`` messages per second it sends (and, apart, receives)
    and ``bandwidth`` bytes per second each way. The platform makes each host's private link the
    NIC: its bandwidth is ``bandwidth`` (full duplex) and every inter-node point-to-point message
    carries ``surcharge`` extra bytes, so back-to-back tiny messages leave (and enter) a node at
    ``msg_rate`` however many of its ranks send them. ``send_share``: the part of a message's CPU
    (twice the model's ``msg_overhead``, the per-side mean) that its sender pays; the rest is the
    receiver's (0.5: split evenly, as replays without a NIC do)."""
    msg_rate: float
    bandwidth: float
    send_share: float = 0.5

    def overheads(self, msg_overhead: float) -> tuple[float, float]:
        """(sender's, receiver's) CPU seconds per message."""
        return 2 * msg_overhead * self.send_share, 2 * msg_overhead * (1 - self.send_share)

    @property
    def surcharge(self) -> int:
        """Bytes added to every inter-node message: its share of the link at ``msg_rate``."""
        return max(1, round(self.bandwidth / self.msg_rate))

    @classmethod
    def of_preset(cls, data: dict) -> Optional["Nic"]:
        """The NIC of a preset file's ``model`` (``nic_msg_rate``, ``nic_bandwidth``), None without one."""
        m = data.get("model", {})
        if m.get("nic_msg_rate") and m.get("nic_bandwidth"):
            return cls(float(m["nic_msg_rate"]), float(m["nic_bandwidth"]), float(m.get("nic_send_share", 0.5)))
        return None


#: Trace verbs of point-to-point messages: ``RANK VERB PEER TAG BYTES``.
P2P_VERBS = ("send", "recv", "isend", "irecv")


def nic_lines(lines: Sequence[str], layout: Layout, nic: Optional[Nic]) -> list[str]:
    """``lines`` (one rank's trace) with ``nic.surcharge`` bytes added to each message between two
    nodes, on both sides (a send and its receive agree); unchanged without a NIC. SMPI's own
    collective actions (the agreement's Allreduce) are left as they are."""
    if nic is None:
        return list(lines)
    node, extra, out = layout.node_of, nic.surcharge, []
    for ln in lines:
        parts = ln.split()
        if len(parts) == 5 and parts[1] in P2P_VERBS and node[int(parts[0])] != node[int(parts[2])]:
            parts[4] = str(int(parts[4]) + extra)
            ln = " ".join(parts)
        out.append(ln)
    return out


def _comm_of(phase: str, layout: Layout, rank: int) -> np.ndarray:
    """World ranks of the communicator a phase runs on, in its rank order: the node's, else the world's."""
    return layout.comm_members(rank, "node" if phase == "node" else "world")


def phase_algorithm(phase: str, layout: Layout, rank: int) -> str:
    """How Open MPI runs this phase: "pairwise" or "linear" (the lane phase is a nonblocking Ialltoallv)."""
    if phase in ("lane", "round"):
        return "linear"
    return alltoallv_algorithm(len(_comm_of(phase, layout, rank)))


class _Tags:
    """Tag of each message: phase * TAG_STRIDE + how many went to (or came from) that peer before in
    the phase, counted over the whole trace, so that lanes and rounds never cross-match."""

    def __init__(self):
        self.seen: dict = {}

    def lines(self, rank: int, verb: str, pairs, phase: str) -> dict:
        out: dict[int, list[str]] = {}
        for peer, nbytes in pairs:
            key = (verb, phase, peer)
            k = self.seen.get(key, 0)
            self.seen[key] = k + 1
            out.setdefault(peer, []).append(f"{rank} {verb} {peer} {PHASE_TAG[phase] * TAG_STRIDE + k} {nbytes}")
        return out


def exchange_actions(rank: int, step, layout: Layout, tags: Optional[_Tags] = None, wait: bool = True) -> list[str]:
    """Trace lines of one Exchange step, as its schedule (or Open MPI's rule for the phase) posts them;
    ``wait`` False (a linear phase left in flight): the posts alone, which ``wait_lines`` completes."""
    tags = tags or _Tags()
    sends = tags.lines(rank, "isend", step.sends, step.phase)
    recvs = tags.lines(rank, "irecv", step.recvs, step.phase)
    if not sends and not recvs:
        return []
    schedule = step.schedule or phase_algorithm(step.phase, layout, rank)
    if schedule == "linear":
        posted = [ln for v in recvs.values() for ln in v] + [ln for v in sends.values() for ln in v]
        return posted + (wait_lines(posted) if wait else [])
    members = list(step.members) if step.members else _comm_of(step.phase, layout, rank).tolist()
    pos, size, lines = members.index(rank), len(members), []
    for k in range(1, size):
        # Sends first: a round's receive never waits on a send that is posted after it.
        round_ = sends.get(members[(pos + k) % size], []) + recvs.get(members[(pos - k) % size], [])
        if round_:
            lines += round_ + [f"{rank} waitall"]
    return lines


#: Posted requests above which a linear phase waits for each one in turn instead of one waitall.
WAITALL_MAX = 8


def wait_lines(posted: Sequence[str], by_name: bool = False) -> list[str]:
    """Lines that wait for every request of ``posted`` (irecv/isend lines of one rank).

    Few requests: one ``waitall``. Many: a ``wait SRC DST TAG`` for each, which costs SMPI O(n)
    where its waitall, a loop of waitany over every pending request, costs O(n^2) per rank (1023
    peers at 1024 ranks). SMPI charges a small message's receive overhead when its wait finishes
    it, so the waits go in the order the messages are expected to arrive, as a waitall would take
    them: receives by size (the smallest arrive first; posting order among equals), then sends.
    ``by_name``: a ``wait`` for each whatever their number (other requests of the rank are pending:
    a ``waitall`` would wait for them too).
    """
    if len(posted) <= WAITALL_MAX and not by_name:
        return [f"{posted[0].split()[0]} waitall"] if posted else []
    parts = [ln.split() for ln in posted]
    order = sorted(range(len(parts)), key=lambda i: (parts[i][1] != "irecv", int(parts[i][4]), i))
    out = []
    for i in order:
        rank, verb, peer, tag, _ = parts[i]
        src, dst = (peer, rank) if verb == "irecv" else (rank, peer)
        out.append(f"{rank} wait {src} {dst} {tag}")
    return out


def dissemination(rank: int, layout: Layout, tag: int, nbytes, ahead: bool = True, alone: bool = False) -> list[str]:
    """A dissemination over the rank's node (``dissemination_distances``: ceil(log2 G) rounds): in
    round d, send to the rank d ahead and receive from the rank d behind (``ahead`` False: the
    other way round), ``nbytes(d, G)`` bytes each way, at tag ``tag`` + the round's index.
    ``alone``: wait for each round's two messages by name (messages left in flight beside it
    must not be waited for: SMPI's ``waitall`` waits for every request of the rank)."""
    members = layout.members[int(layout.node_of[rank])].tolist()
    pos, size, lines = members.index(rank), len(members), []
    way = 1 if ahead else -1
    for i, dist in enumerate(dissemination_distances(size)):
        n = nbytes(dist, size)
        posted = [f"{rank} isend {members[(pos + way * dist) % size]} {tag + i} {n}",
                  f"{rank} irecv {members[(pos - way * dist) % size]} {tag + i} {n}"]
        lines += posted + (wait_lines(posted, by_name=True) if alone else [f"{rank} waitall"])
    return lines


def barrier_actions(rank: int, layout: Layout, alone: bool = False) -> list[str]:
    """A dissemination barrier over the rank's node: ceil(log2 G) rounds of 1-byte messages
    (``alone``: as ``dissemination``'s)."""
    return dissemination(rank, layout, PHASE_TAG["barrier"] * TAG_STRIDE, lambda d, g: 1, alone=alone)


@dataclass(frozen=True)
class Coarse:
    """The coarse replay of linear world phases (``coarse_actions``): the CPU seconds per message
    at the sender and the receiver, and the NIC's surcharge bytes per message (0 without a NIC)."""
    o_send: float
    o_recv: float
    surcharge: int = 0

    @classmethod
    def of(cls, model: Parameters, nic: Optional[Nic] = None) -> "Coarse":
        """The coarse replay's costs on the platform of ``model`` and ``nic``."""
        o_send, o_recv = (nic or Nic(1.0, 1.0)).overheads(model.msg_overhead)
        return cls(o_send, o_recv, nic.surcharge if nic else 0)


def even_hierarchy(layout: Layout) -> bool:
    """Whether ``layout`` has a hierarchy (``Layout.hier_possible``: more than one node, one of two
    ranks or more) of nodes of one size (``Layout.is_regular``): what the coarse replay and HAN's
    alltoall need."""
    return layout.hier_possible and layout.is_regular


def coarsenable(step: Exchange, layout: Layout, rank: int) -> bool:
    """Whether ``coarse_actions`` replaces this step: a linear phase over the world on an
    ``even_hierarchy``."""
    return (step.phase == "flat" and (step.schedule or phase_algorithm(step.phase, layout, rank)) == "linear"
            and even_hierarchy(layout))


def coarse_actions(rank: int, step: Exchange, layout: Layout, counts: np.ndarray, coarse: Coarse,
                   tags: Optional[_Tags] = None) -> list[str]:
    """Trace lines of a linear world phase with one message per pair of nodes and local rank
    instead of one per pair of ranks: the G messages a rank sends to another node's ranks go as one
    to the rank of its own local index there, with the G - 1 saved messages' CPU (``coarse``'s
    sender and receiver costs, as sleeps) and NIC surcharges (bytes) kept; messages inside the node
    stay as they are. On nodes of equal size every rank then receives the bytes it would, from N - 1
    peers instead of P - G: SimGrid solves a network G times smaller (``coarsenable``)."""
    tags = tags or _Tags()
    node, me, local = layout.node_of, int(layout.node_of[rank]), int(layout.local_of[rank])
    mine = layout.members[me]
    sends = [(p, b, 0) for p, b in step.sends if node[p] == me]  # (peer, bytes, messages saved)
    recvs = [(p, b) for p, b in step.recvs if node[p] == me]
    saved_r = 0
    for m in range(layout.num_nodes):
        if m == me:
            continue
        peer = int(layout.members[m][local])
        out, inc = counts[rank, layout.members[m]], counts[peer, mine]
        k_out, k_in = int(np.count_nonzero(out)), int(np.count_nonzero(inc))
        if k_out:
            sends.append((peer, int(out.sum()) + (k_out - 1) * coarse.surcharge, k_out - 1))
        if k_in:
            recvs.append((peer, int(inc.sum()) + (k_in - 1) * coarse.surcharge))
            saved_r += k_in - 1
    # Posted as the full phase posts them: every receive, then the sends in peer order, each
    # coarse send in the middle of the CPU of the sends it stands for (the full phase's bytes to
    # that node leave spread over that time, on average at its middle).
    posted = [ln for v in tags.lines(rank, "irecv", recvs, step.phase).values() for ln in v]
    lines = list(posted)
    for peer, nbytes, saved in sorted(sends):
        before = saved // 2
        if before and coarse.o_send:
            lines.append(f"{rank} sleep {before * coarse.o_send:.12g}")
        line = tags.lines(rank, "isend", [(peer, nbytes)], step.phase)[peer][0]
        lines.append(line)
        posted.append(line)
        if saved - before and coarse.o_send:
            lines.append(f"{rank} sleep {(saved - before) * coarse.o_send:.12g}")
    lines += wait_lines(posted)
    return lines + ([f"{rank} sleep {saved_r * coarse.o_recv:.12g}"] if saved_r and coarse.o_recv else [])

