"""Log-round byte all-to-alls with the interface of ``hxmpi.comm.transfer.Transfer``: radix-k Bruck
for non-uniform blocks, and pairwise rounds.

``Bruck`` (after Bruck et al. 1997 and TuNA, arXiv 2411.02581): on P ranks, slot i of rank q
starts as q's block for rank (q + i) mod P. Round x (x = 0 .. ceil(log_k P) - 1) sends, for each
digit z = 1 .. k-1, every slot whose base-k digit x is z to rank q + z k^x and receives the same
slots from rank q - z k^x. After the last round slot i holds the block from rank q - i: a call
takes ceil(log_k P) rounds of at most k-1 messages instead of P-1 messages, and forwards each
byte once per non-zero digit of its distance. Forwarded blocks are of sizes only their source
knows, so the first run of an object sends each message with a header of its slots' lengths and
receives it with ``Mprobe`` (one message per peer and round, no separate size round). The lengths
do not change while the counts do not (the object copies them), so later runs of the same object
(persistent plans, cached one-shot plans) send bare data into known places, and skip the
messages they know are empty: they run as one compiled ``Program`` (``csrc/_call.pyx``) of copy
lists and persistent ``Send_init``/``Recv_init`` requests, with no Python per round. The rounds
come from ``hxmpi.comm.plan.bruck_rounds``, which the simulator replays too.

The first run is compiled whole (``_call.BruckOnce``, ``csrc/_bruck_once.pxi``): per round its
packing, ``MPI_Isend``, ``MPI_Mprobe`` and ``MPI_Imrecv``, header parsing, then the final copy,
with no Python per round or block. Scratch: a send buffer of one round and a receive
arena of every round's messages (at most the bytes received over all rounds, about
(k-1)/k * log_k P times the call's receive bytes); both are reused by later runs.

Large counts: with ``big`` (agreed alike on every rank) both classes run the plain
``Transfer`` (Alltoallw with chunked datatypes) instead, so counts past a C int still work.

``start()`` runs the whole exchange and returns ``MPI.REQUEST_NULL``: a multi-round exchange is
no single MPI request. A rank serving several lanes therefore runs them one after another; in
ascending lane order (``Layout.served_lanes``) that cannot deadlock. ``init()`` returns None (no
MPI persistent request), so a persistent plan calls ``start()`` at every Start.

Messages use point-to-point tag ``TAG`` on ``comm``; hxmpi's communicators are private
duplicates, so nothing else matches them.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ._call import BruckOnce, Program
from .msgspec import Side
from .plan import bruck_rounds, check_radix, exclusive_cumsum
from .transfer import Transfer

__all__ = ["Bruck", "Pairwise"]

TAG = 0x4878  # "Hx"
#: The tag of the slot lengths a request's first run exchanges before its data (``Bruck.headers``).
HEADER_TAG = TAG + 1


class _Rounds:
    """Shared run/start/free of the round-based exchanges; with ``big`` (agreed) they delegate to ``Transfer``.

    ``_program``: the exchange compiled (``_call.Program``), once there is one; ``_requests``: the
    persistent requests it starts, freed with it."""

    def __init__(self):
        self.fallback = None
        self._program = None
        self._requests: list = []

    def _fallback_init(self, comm, send: Side, recv: Side) -> None:
        self.comm = comm
        self.fallback = Transfer(comm, send, recv, True)

    def start(self) -> MPI.Request:
        """Run the exchange (blocking); returns ``MPI.REQUEST_NULL``, as no request stays open."""
        if self.fallback is not None:
            return self.fallback.start()
        self._exchange()
        return MPI.REQUEST_NULL

    def run(self) -> None:
        """One blocking exchange."""
        if self.fallback is not None:
            self.fallback.run()
        else:
            self._exchange()

    def init(self):
        """No MPI persistent request: the caller runs ``start()`` at every Start."""
        return None

    def program(self):
        """The exchange compiled (``_call.Program``), or None where it is not (yet)."""
        return self._program

    def free(self) -> None:
        """Drop the compiled exchange, its requests and the scratch buffers (and the fallback's datatypes)."""
        if self.fallback is not None:
            self.fallback.free()
        if self._program is not None:
            self._program.free()
            self._program = None
        for req in self._requests:
            req.Free()
        self._requests = []
        self._free_scratch()

    def _free_scratch(self) -> None:
        pass


class Bruck(_Rounds):
    """Radix-``radix`` Bruck byte all-to-all on ``comm`` of ``send`` to ``recv`` (each a ``Side``, in bytes)."""

    def __init__(self, comm, send: Side, recv: Side, big: bool = False, radix: int = 2):
        p = comm.size
        super().__init__()
        self.radix = check_radix(radix, p)
        self._header_state = None  # a ``headers`` program's requests and buffers, until ``learn``
        if big:
            self._fallback_init(comm, send, recv)
            return
        self.comm, self.sview, self.rview = comm, send.view, recv.view
        self.sides = tuple(np.ascontiguousarray(a, dtype=np.int64)
                           for a in (send.counts, send.displs, recv.counts, recv.displs))
        #: the compiled first run, which keeps what it learns (``_call.BruckOnce``)
        self.once = BruckOnce(comm, bruck_rounds(p, self.radix), TAG, MPI.BYTE)
        self.learned = False

    def program(self):
        """The learned exchange as a compiled ``Program`` (built at the first call after the first
        run), or None before it: each round's packing as copy lists, its messages as persistent
        ``Send_init``/``Recv_init`` requests, then the final copy."""
        if self.fallback is None and self.learned and self._program is None:
            self._program = self._compile()
        return self._program

    def _exchange(self) -> None:
        if self.learned:
            self.program().run()
            return
        self.once.run(self.sview, self.rview, *self.sides)
        self.learned = True

    def headers(self):
        """The rounds of the slots' lengths alone, as a compiled ``Program`` of fixed-size messages
        (tag ``HEADER_TAG``): what a nonblocking request runs, as a state machine, before its first
        data (where the blocking first run learns the lengths from ``Mprobe``, which waits); then
        ``learn``. None where there is nothing to learn (learned already, or the large-count path).

        Each round copies the current lengths of the slots each message carries into a send
        header, exchanges the headers, and writes the received ones (``once.learned``) back as
        those slots' lengths: every offset is fixed, so the program is copies and persistent
        ``Send_init``/``Recv_init`` requests."""
        if self.fallback is not None or self.learned:
            return None
        once, p, q = self.once, self.comm.size, self.comm.rank
        sc = self.sides[0]
        length = np.ascontiguousarray(sc[(q + np.arange(p)) % p], dtype=np.int64)  # slot i: the block for q + i
        start, rounds = once.slot_start, once.round_start
        out = np.zeros(max(int(start[-1]), 1), dtype=np.int64)  # every message's header, in message order
        lbytes, obytes, ibytes = length.view(np.uint8), out.view(np.uint8), once.learned.view(np.uint8)
        eight = np.full(max(int(start[-1]), 1), 8, dtype=np.int64)
        steps, requests = [], []
        for x in range(rounds.shape[0] - 1):
            first, last = int(start[rounds[x]]), int(start[rounds[x + 1]])
            slots = once.slots[first:last]
            at = 8 * np.arange(first, last, dtype=np.int64)
            if last > first:
                steps.append(("copy", lbytes, 8 * slots, obytes, at, eight[:last - first]))
            reqs = []
            for mi in range(int(rounds[x]), int(rounds[x + 1])):
                a, b = int(start[mi]), int(start[mi + 1])
                reqs.append(self.comm.Send_init([out[a:b], MPI.INT64_T], int(once.dest[mi]), HEADER_TAG))
                reqs.append(self.comm.Recv_init([once.learned[a:b], MPI.INT64_T], int(once.src[mi]), HEADER_TAG))
            steps.append(("mpi", reqs))
            requests += reqs
            if last > first:
                steps.append(("copy", ibytes, at, lbytes, 8 * slots, eight[:last - first]))
        self._header_state = (requests, length, out)  # what the program points into, kept alive
        return Program(steps)

    def learn(self) -> None:
        """After ``headers`` ran: lay the arena out from the learned lengths (each message's bytes
        in message order) so that ``program`` compiles the exchange."""
        once = self.once
        start = once.slot_start
        for mi in range(once.nbytes.shape[0]):
            once.nbytes[mi] = int(once.learned[start[mi]:start[mi + 1]].sum())
        once.base[:] = exclusive_cumsum(once.nbytes)
        once.arena = np.empty(max(int(once.nbytes.sum()), 1), dtype=np.uint8)
        for req in self._header_state[0]:
            req.Free()
        self._header_state = None
        self.learned = True

    def _compile(self):
        """Replay the learned rounds on the slots' places alone (no data) into a ``Program``.

        Slot places evolve as in the first run: after its round a slot lies in the arena, at its
        message's base plus the lengths before it. Each round packs from the send view and the
        arena into one send buffer, sized once for the largest round, to which the persistent
        sends are bound. Messages learned empty are neither sent nor received, on both sides."""
        once, p, q = self.once, self.comm.size, self.comm.rank
        sc, sd, rc, rd = self.sides
        dests = (q + np.arange(p)) % p
        source = (q - np.arange(p)) % p
        where, off, length = np.zeros(p, np.int8), sd[dests], sc[dests]
        start, rounds = once.slot_start, once.round_start
        plans, most = [], 0
        for x in range(rounds.shape[0] - 1):
            lists, messages, pos = {0: [], 1: []}, [], 0
            for mi in range(int(rounds[x]), int(rounds[x + 1])):
                slots, learned = once.slots[start[mi]:start[mi + 1]], once.learned[start[mi]:start[mi + 1]]
                base, nbytes = int(once.base[mi]), int(once.nbytes[mi])
                lens = length[slots]
                n = int(lens.sum())
                if n:
                    starts = pos + exclusive_cumsum(lens)
                    for kind in (0, 1):
                        pick = where[slots] == kind
                        lists[kind].append((off[slots][pick], starts[pick], lens[pick]))
                    messages.append(("send", pos, n, int(once.dest[mi])))
                    pos += n
                if nbytes:
                    messages.append(("recv", base, nbytes, int(once.src[mi])))
                where[slots] = 1
                off[slots] = base + exclusive_cumsum(learned)
                length[slots] = learned
            plans.append((lists, messages))
            most = max(most, pos)
        self.sendbuf = np.empty(max(most, 1), dtype=np.uint8)
        self.arena = once.arena
        comm, steps = self.comm, []
        for lists, messages in plans:
            steps += self._copies(lists, self.sendbuf)
            reqs = [comm.Send_init([self.sendbuf[at:at + n], MPI.BYTE], peer, TAG) if kind == "send" else
                    comm.Recv_init([self.arena[at:at + n], MPI.BYTE], peer, TAG) for kind, at, n, peer in messages]
            self._requests += reqs
            steps.append(("mpi", reqs))
        final = {0: [], 1: []}
        for kind in (0, 1):
            pick = where == kind
            final[kind].append((off[pick], rd[source[pick]], length[pick]))
        return Program(steps + self._copies(final, self.rview))

    def _copies(self, lists: dict, dst: np.ndarray) -> list:
        """Copy steps into ``dst`` from the send view (lists[0]) and the arena (lists[1])."""
        steps = []
        for kind, src in ((0, self.sview), (1, self.arena)):
            if lists[kind]:
                so, do, ln = (np.ascontiguousarray(np.concatenate(part), dtype=np.int64) for part in zip(*lists[kind]))
                if ln.shape[0]:
                    steps.append(("copy", src, so, dst, do, ln))
        return steps

    def _free_scratch(self) -> None:
        if self._header_state is not None:
            for req in self._header_state[0]:
                req.Free()
            self._header_state = None
        if self.fallback is None:
            self.once.sendbuf = self.once.arena = np.empty(0, dtype=np.uint8)
        self.sendbuf = self.arena = np.empty(0, dtype=np.uint8)
        self.learned = False


class Pairwise(_Rounds):
    """Pairwise byte all-to-all on ``comm``: P-1 rounds, send to rank+k and receive from rank-k, wait.

    One message per non-empty block, at most one in flight each way: no incast of a linear
    phase, one latency per round. ``radix`` is accepted (and ignored) so both classes build alike.
    Every run is one compiled ``Program``, built here: the block to itself, then each round's
    persistent ``Recv_init``/``Send_init`` (empty blocks are neither sent nor received).
    """

    def __init__(self, comm, send: Side, recv: Side, big: bool = False, radix: int = 2):
        super().__init__()
        if big:
            self._fallback_init(comm, send, recv)
            return
        self.comm = comm
        p, q = comm.size, comm.rank
        sview, rview = send.view, recv.view
        sc, sd = np.array(send.counts, dtype=np.int64), np.array(send.displs, dtype=np.int64)
        rc, rd = np.array(recv.counts, dtype=np.int64), np.array(recv.displs, dtype=np.int64)
        if sc[q] != rc[q]:
            raise ValueError(f"pairwise: rank {q} sends itself {int(sc[q])} B but expects {int(rc[q])} B")
        steps = [("copy", sview, sd[q:q + 1], rview, rd[q:q + 1], sc[q:q + 1])]
        for k in range(1, p):
            dst, src = (q + k) % p, (q - k) % p
            reqs = []
            if rc[src]:
                reqs.append(comm.Recv_init([rview[rd[src]:rd[src] + rc[src]], MPI.BYTE], src, TAG))
            if sc[dst]:
                reqs.append(comm.Send_init([sview[sd[dst]:sd[dst] + sc[dst]], MPI.BYTE], dst, TAG))
            self._requests += reqs
            steps.append(("mpi", reqs))
        self._program = Program(steps)

    def _exchange(self) -> None:
        self._program.run()
