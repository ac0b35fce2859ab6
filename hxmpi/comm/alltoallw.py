"""Alltoallw: mpi4py's most general all-to-all spec, moved as bytes by ``HierComm``'s byte path.

A side is ``[buf, counts, displs, datatypes]``, ``[buf, (counts, displs), datatypes]`` or
``[buf, datatypes]`` (one item of each type at displacement 0): for peer i, ``counts[i]`` items of
``datatypes[i]`` starting ``displs[i]`` BYTES into ``buf``, as mpi4py and MPI take them. The send
spec may be ``MPI.IN_PLACE`` (the data to send is what the receive side describes).

Each side is turned into bytes once per layout (``TypedSide``, kept in a small cache keyed by the
buffer's size, the counts, the displacements and the datatypes): a datatype's byte runs come from
``datatypes.TypeCache`` (flattened once per datatype), and a side is either

  direct   every peer's items are one run of bytes (basic and contiguous types): the byte
           exchange reads (writes) the caller's buffer itself, with no copy; or
  packed   the runs of every peer, in peer and type-map order, are gathered into a contiguous
           buffer before the exchange (send) or scattered from one after it (receive), each a
           compiled copy (``_call.Program``: GIL released, nothing per block in Python).

A call becomes a ``TypedCall`` (``csrc/_call.pyx``): the ``Alltoallv`` byte specs, the packing
buffers and the two copies, made once. It is kept, with what recognises its specs (data buffers
and datatypes by object, counts and displacements by value), so a repeated call with unchanged
specs is recognised in compiled code and passes the very same byte specs again: the inner
``Alltoallv`` is then a hit of the compiled path (``CallTable``), its persistent run bound, and
nothing is parsed or laid out. A spec that changed in any part is parsed afresh.

Where a side is packed, the persistent run the plan cache binds for good to a kept call's byte
specs is composed with the type maps (``compose``, ``composed``; ``HierComm._bind`` asks): its
copies read the caller's send buffer and write the caller's receive buffer along the runs, so a
hit of that run neither gathers before nor scatters after; only blocks an exchange sends or
receives itself are packed (scattered) by a copy step of the run's own. Every other run (a first
call, a plan run on the packed bytes) moves the packed bytes, with the call's own copies around it.

The bytes travel as an ``Alltoallv`` of ``MPI.BYTE`` through ``HierComm.Alltoallv``: the same
agreement (bytes each pair sends and expects), the same plan cache, every algorithm. Bytes of the
receive buffer outside its type maps are never written, as with MPI. Nothing here communicates:
problems are returned, for the caller to agree on.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
from mpi4py import MPI

from ..errors import ExchangeTypeError
from ._call import Program, TypedCall
from .datatypes import TypeCache
from .msgspec import Problem, Side, _host_bytes, int_vector
from ._plan import HEADER_SIZE, ROW_SIZE, Buffer, Copied, HeaderWord, RowWord, StepKind, StepProgram

__all__ = ["TypedSide", "TypedSides", "compose", "composed"]

_EMPTY = np.empty(0, dtype=np.uint8)
_NO_RUNS = np.empty(0, dtype=np.int64)


class TypedSide:
    """One side of an Alltoallw as bytes.

    ``counts``/``displs``: int64 bytes per peer, displacements into the caller's buffer (direct) or
    into the packed scratch (packed); ``runs``: (caller offsets, packed offsets, lengths) of every
    run in peer and type-map order, None when direct; ``total``: bytes of all blocks.
    """
    __slots__ = ("counts", "displs", "runs", "total")

    def __init__(self, counts: np.ndarray, displs: np.ndarray, runs: Optional[tuple]):
        self.counts, self.displs, self.runs = counts, displs, runs
        self.total = int(counts.sum())

    @property
    def direct(self) -> bool:
        """The exchange moves the caller's buffer itself (no packing)."""
        return self.runs is None


def _layout(types: TypeCache, nbytes: int, counts: np.ndarray, displs: np.ndarray, datatypes,
            name: str, writable: bool) -> tuple[Optional[TypedSide], Optional[Problem]]:
    """The ``TypedSide`` of ``counts[i]`` items of ``datatypes[i]`` at byte ``displs[i]`` of a
    buffer of ``nbytes``, every block checked to lie inside it; receive runs must not overlap."""
    size = counts.shape[0]
    byte_counts = np.zeros(size, dtype=np.int64)
    starts = np.zeros(size, dtype=np.int64)
    per_peer, direct = [], True
    for i in range(size):
        runs, problem = types.runs(datatypes[i])
        if problem:
            return None, Problem(f"{name} datatypes[{i}]: {problem}", problem.error)
        count, displ = int(counts[i]), int(displs[i])
        if count < 0:
            return None, Problem(f"{name} counts[{i}] = {count} is negative")
        if count == 0 or runs.size == 0:
            per_peer.append((_NO_RUNS, _NO_RUNS))
            continue
        if count * runs.size >= 1 << 62:
            return None, Problem(f"{name} block for rank {i} exceeds 2**62 bytes")
        low, high = runs.span(count)
        if displ + low < 0 or displ + high > nbytes:
            return None, Problem(
                f"{name} block for rank {i} ({count} x {runs.size} B items at byte {displ}) spans bytes "
                f"[{displ + low}, {displ + high}), outside the buffer's {nbytes} B")
        offsets, lengths = runs.repeated(count, displ)
        per_peer.append((offsets, lengths))
        byte_counts[i] = count * runs.size
        starts[i] = offsets[0]
        direct = direct and offsets.shape[0] == 1
    if direct:
        return TypedSide(byte_counts, starts, None), None
    user = np.concatenate([o for o, _ in per_peer])
    lengths = np.concatenate([n for _, n in per_peer])
    packed = np.cumsum(lengths) - lengths
    if writable:
        order = np.argsort(user, kind="stable")
        ends = user[order] + lengths[order]
        clash = np.flatnonzero(user[order][1:] < ends[:-1])
        if clash.size:
            at = int(user[order][clash[0] + 1])
            return None, Problem(f"{name} datatypes overlap: byte {at} of the receive buffer is written twice")
    return TypedSide(byte_counts, np.cumsum(byte_counts) - byte_counts, (user, packed, lengths)), None


def _unpack_spec(spec, size: int, name: str):
    """(buffer, counts, displs, datatypes, problem) of an Alltoallw spec, by mpi4py's rules."""
    if not isinstance(spec, (list, tuple)):
        return None, None, None, None, Problem(
            f"{name}: an Alltoallw spec is a list or tuple [buf, counts, displs, datatypes], got "
            f"{type(spec).__name__}", ExchangeTypeError)
    counts = displs = None
    if len(spec) == 2:
        buf, datatypes = spec
    elif len(spec) == 3:
        buf, pair, datatypes = spec
        try:
            counts, displs = pair
        except (TypeError, ValueError):
            return None, None, None, None, Problem(f"{name}: the middle item must be (counts, displs)")
    elif len(spec) == 4:
        buf, counts, displs, datatypes = spec
    else:
        return None, None, None, None, Problem(
            f"{name}: spec has {len(spec)} items, expected 2 to 4: [buf, counts, displs, datatypes]")
    try:
        n = len(datatypes)
    except TypeError:
        return None, None, None, None, Problem(
            f"{name}: datatypes must be a sequence of MPI.Datatype, one per rank, got "
            f"{type(datatypes).__name__}", ExchangeTypeError)
    if n != size:
        return None, None, None, None, Problem(f"{name}: datatypes has {n} entries, expected {size}: one per rank")
    if counts is None:
        c, d = np.ones(size, dtype=np.int64), np.zeros(size, dtype=np.int64)
    else:
        c, problem = int_vector(counts, size, f"{name} counts")
        if problem is None:
            d, problem = int_vector(displs, size, f"{name} displs")
        if problem:
            return None, None, None, None, problem
    return buf, c, d, datatypes, None


class TypedSides:
    """What ``HierComm.Alltoallw`` keeps between calls: the datatypes' runs, the layouts of recent
    sides, and recent calls as bytes (``TypedCall``, each with its packing buffers)."""

    LAYOUTS = 64  # sides kept; a program moving through more layouts lays them out again
    CALLS = 16  # calls kept; the oldest goes first

    def __init__(self, size: int):
        self.size = size
        self.types = TypeCache()
        self._layouts: dict[tuple, tuple] = {}
        #: recent calls (``TypedCall``), oldest first: ``_call.find_typed`` looks a call's specs up in them
        self.calls: list[TypedCall] = []

    def parse(self, spec, writable: bool, name: str):
        """(uint8 view of the buffer, ``TypedSide``, problem) of one Alltoallw spec."""
        buf, counts, displs, datatypes, problem = _unpack_spec(spec, self.size, name)
        if problem:
            return None, None, problem
        if buf is None or buf is MPI.BOTTOM:
            view = _EMPTY
        else:
            view, _, _, problem = _host_bytes(buf, writable)
            if problem:
                return None, None, Problem(f"{name}: {problem}", problem.error)
        try:
            key = (view.shape[0], writable, counts.tobytes(), displs.tobytes(),
                   tuple(map(id, datatypes)), tuple(t.handle for t in datatypes))
        except AttributeError:  # not every entry is a datatype: laid out (and refused) below
            key = None
        kept = self._layouts.get(key) if key is not None else None
        if kept is not None:
            return view, kept[0], None
        side, problem = _layout(self.types, view.shape[0], counts, displs, datatypes, name, writable)
        if problem is None and view.shape[0] == 0 and side.total and (buf is None or buf is MPI.BOTTOM):
            problem = Problem(f"{name}: a None/MPI.BOTTOM buffer takes zero counts only; absolute "
                              f"addresses are not supported")
        if problem:
            return None, None, problem
        if key is not None:
            if len(self._layouts) >= self.LAYOUTS:
                self._layouts.pop(next(iter(self._layouts)))
            self._layouts[key] = (side, list(datatypes))  # the datatypes kept alive: their ids stay theirs
        return view, side, None

    def prepare(self, sendbuf, recvbuf, algorithm, validate) -> tuple[Optional[TypedCall], Optional[Problem]]:
        """(the call as bytes, None) or (None, what is wrong with a spec); the call is kept in
        ``calls`` where its specs can be recognised (``TypedCall.recognise``)."""
        rview, r, problem = self.parse(recvbuf, True, "recv")
        in_place = sendbuf is MPI.IN_PLACE
        sview, s = rview, r
        if problem is None and not in_place:
            sview, s, problem = self.parse(sendbuf, False, "send")
        if problem:
            return None, problem
        send, pack = _send_side(sview, s, in_place)
        recv, unpack = _recv_side(rview, r)
        call = TypedCall(send, recv, pack, unpack)
        call.user = (sendbuf, recvbuf)
        if pack is not None and not in_place or unpack is not None:  # what ``composed`` reads
            call.parts = (sview, None if in_place else s.runs, rview, r.runs)
        if call.recognise(sendbuf, recvbuf, algorithm, validate):
            send, recv = call.leaves  # a call on the same buffers replaces the one kept for them
            kept = [c for c in self.calls if c.leaves[0] is not send or c.leaves[1] is not recv]
            self.calls = kept[len(kept) - self.CALLS + 1:] + [call]
        return call, None

    def clear(self) -> None:
        """Forget calls, layouts and datatypes."""
        self.calls = []
        self._layouts.clear()
        self.types.clear()


def composed(call: TypedCall, prog: StepProgram, s: Side, r: Side) -> tuple:
    """(program, send side, receive side) of a run of ``prog`` that moves ``call`` straight from
    and to the caller's buffers (``compose``), ``s`` and ``r`` being its byte sides (the sides of
    ``call.send_spec`` and ``call.recv_spec``), one of them packed (``call.parts``)."""
    sview, send_runs, rview, recv_runs = call.parts
    user_s = s if send_runs is None else Side(sview, s.counts, s.displs)
    user_r = r if recv_runs is None else Side(rview, r.counts, r.displs)
    return compose(prog, send_runs, recv_runs), user_s, user_r


def _send_side(view: np.ndarray, side: TypedSide, in_place: bool) -> tuple[list, Optional[Program]]:
    """(the ``Alltoallv`` send spec, the copy that fills it or None): the caller's buffer itself
    (direct, not in place), else a buffer of its own the blocks are packed into before each run
    (in place: copied out before the receive overwrites them)."""
    if side.direct and not in_place:
        return [view, (side.counts, side.displs), MPI.BYTE], None
    out = np.empty(max(side.total, 1), dtype=np.uint8)
    if side.direct:
        packed = np.cumsum(side.counts) - side.counts
        return [out, (side.counts, packed), MPI.BYTE], Program([("copy", view, side.displs, out, packed, side.counts)])
    user, packed, lengths = side.runs
    return [out, (side.counts, side.displs), MPI.BYTE], Program([("copy", view, user, out, packed, lengths)])


def _recv_side(view: np.ndarray, side: TypedSide) -> tuple[list, Optional[Program]]:
    """(the ``Alltoallv`` receive spec, the copy that scatters it or None): the caller's buffer
    itself (direct), else a buffer of its own, scattered along the type maps after each run."""
    if side.direct:
        return [view, (side.counts, side.displs), MPI.BYTE], None
    into = np.empty(max(side.total, 1), dtype=np.uint8)
    user, packed, lengths = side.runs
    return [into, (side.counts, side.displs), MPI.BYTE], Program([("copy", into, packed, view, user, lengths)])



def _through(off: np.ndarray, length: np.ndarray, runs: tuple) -> tuple:
    """Blocks of ``length`` bytes at offsets ``off`` of a packed side, cut where its runs end:
    (block index, offset in the block, offset in the caller's buffer, bytes) of every piece, in
    order (empty blocks have none)."""
    user, packed, lengths = runs
    keep = np.flatnonzero(length > 0)
    off, length = off[keep], length[keep]
    ends = packed + lengths
    first = np.searchsorted(ends, off, side="right")
    k = np.searchsorted(packed, off + length, side="left") - first
    block = np.repeat(np.arange(keep.shape[0]), k)
    run = first[block] + np.arange(int(k.sum()), dtype=np.int64) - np.repeat(np.cumsum(k) - k, k)
    start = np.maximum(off[block], packed[run])
    stop = np.minimum(off[block] + length[block], ends[run])
    return keep[block], start - off[block], user[run] + start - packed[run], stop - start


def compose(prog: StepProgram, send_runs: Optional[tuple], recv_runs: Optional[tuple]) -> StepProgram:
    """``prog``, written for packed sides, rewritten for the caller's buffers themselves: a copy
    that reads the packed send side reads the caller's send buffer along ``send_runs``, one that
    writes the packed receive side writes the caller's receive buffer along ``recv_runs``
    (``TypedSide.runs``; None: that side is direct, left as it is). An exchange that reads (writes)
    a packed side itself does so in scratch (in the private stage, or in scratch too where the
    stage is the node's shared window) beyond the program's own, the
    blocks it moves packed by a first copy step (scattered by a last one). So each byte is copied as often as in a
    contiguous call whose exchanges cannot read the caller's buffer in place: once more than a
    contiguous call's where they can (a send buffer already grouped by node, flat)."""
    w = prog.words
    vectors = (RowWord.V0, RowWord.V1, RowWord.V2, RowWord.V3)
    rows, pool = [], []  # rows name pool vectors by their index until the pool's place is known
    ends = [int(w[HeaderWord.SCRATCH_BYTES]), int(w[HeaderWord.STAGE_BYTES])]  # scratch and stage in use
    copied, regions, first, last = 0, {}, [], []
    # Where a packed receive side lands: the private stage, or the scratch where the stage is the
    # node's shared window (a lane that receives into the receive buffer itself, ``_direct``).
    lands, landing = (0, Buffer.BUF_SCRATCH) if prog.stage_shared else (1, Buffer.BUF_STAGE)

    def step(kind, what, src, dst, vecs, row=None) -> None:
        row = np.zeros(ROW_SIZE, np.int64) if row is None else row
        row[[RowWord.KIND, RowWord.WHAT, RowWord.SRC, RowWord.DST]] = kind, what, src, dst
        row[RowWord.N] = vecs[0].shape[0] if vecs else 0
        for key, vec in zip(vectors, vecs):
            row[key] = len(pool)
            pool.append(np.ascontiguousarray(vec, dtype=np.int64))
        rows.append((row, len(vecs)))

    for i in range(int(w[HeaderWord.ROWS])):
        row = w[HEADER_SIZE + i * ROW_SIZE:HEADER_SIZE + (i + 1) * ROW_SIZE].copy()
        n, kind = int(row[RowWord.N]), int(row[RowWord.KIND])
        what, src, dst = int(row[RowWord.WHAT]), int(row[RowWord.SRC]), int(row[RowWord.DST])
        if kind == StepKind.STEP_BARRIER:
            step(kind, what, src, dst, [], row)
            continue
        v = [w[int(row[k]):int(row[k]) + n] for k in vectors[:3 if kind == StepKind.STEP_COPY else 4]]
        if kind == StepKind.STEP_COPY:
            so, do, ln = v
            if src == Buffer.BUF_SEND and send_runs is not None:
                b, within, so, ln = _through(so, ln, send_runs)
                do = do[b] + within
            if dst == Buffer.BUF_RECV and recv_runs is not None:
                b, within, do, ln = _through(do, ln, recv_runs)
                so = so[b] + within
            copied += int(ln.sum())
            step(kind, what, src, dst, [so, do, ln])
            continue
        for side, runs in ((0, send_runs), (1, recv_runs)):
            if runs is None or (dst != Buffer.BUF_RECV if side else src != Buffer.BUF_SEND):
                continue
            if side not in regions:  # the packed side's place: sent from scratch, received in the
                # private stage or beyond the sent side in scratch, so that MPI is never given
                # overlapping bytes for both
                at_end = lands if side else 0
                regions[side] = ends[at_end]
                ends[at_end] += int(runs[2].sum())
            # the blocks it sends (receives) packed there first (scattered last)
            b, within, user, ln = _through(v[1 + 2 * side], v[2 * side], runs)
            at = v[1 + 2 * side][b] + within + regions[side]
            copied += int(ln.sum())
            if side:
                last.append((Copied.COPY_UNPACK, landing, Buffer.BUF_RECV, [at, user, ln]))
                dst, v[3] = landing, v[3] + regions[1]
            else:
                first.append((Copied.COPY_PACK, Buffer.BUF_SEND, Buffer.BUF_SCRATCH, [user, at, ln]))
                src, v[1] = Buffer.BUF_SCRATCH, v[1] + regions[0]
        step(kind, what, src, dst, v, row)
    body = rows
    rows = []
    for what, src, dst, vecs in first:
        step(StepKind.STEP_COPY, what, src, dst, vecs)
    rows += body
    for what, src, dst, vecs in last:
        step(StepKind.STEP_COPY, what, src, dst, vecs)
    base = HEADER_SIZE + len(rows) * ROW_SIZE
    starts = base + np.concatenate([[0], np.cumsum([p.shape[0] for p in pool])]).astype(np.int64)
    for row, nvec in rows:
        for key in vectors[:nvec]:
            row[key] = starts[row[key]]
    header = w[:HEADER_SIZE].copy()
    header[HeaderWord.ROWS], header[HeaderWord.POOL], header[HeaderWord.WORDS] = len(rows), base, starts[-1]
    header[HeaderWord.SCRATCH_BYTES], header[HeaderWord.STAGE_BYTES], header[HeaderWord.COPIED] = *ends, copied
    return StepProgram(np.concatenate([header] + [row for row, _ in rows] + pool))
