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
           scratch before the exchange (send) or scattered from one after it (receive), each a
           single call of the compiled copy kernel (GIL released, nothing per block in Python).

The bytes then travel as an ``Alltoallv`` of ``MPI.BYTE`` through ``HierComm.Alltoallv``: the
same agreement (bytes each pair sends and expects), the same plan cache, every algorithm. Bytes
of the receive buffer outside its type maps are never written, as with MPI. Nothing here
communicates: problems are returned, for the caller to agree on.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
from mpi4py import MPI

from ..errors import ExchangeTypeError
from ._packing import copy_blocks
from .datatypes import TypeCache
from .msgspec import Problem, _host_bytes, int_vector
from .runs import Scratch

__all__ = ["TypedSide", "TypedSides"]

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
    sides, and the packing scratch (grown only when a call needs more)."""

    LAYOUTS = 64  # sides kept; a program moving through more layouts lays them out again

    def __init__(self, size: int):
        self.size = size
        self.types = TypeCache()
        self.scratch = Scratch()
        self._layouts: dict[tuple, tuple] = {}

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

    def send_bytes(self, view: np.ndarray, side: TypedSide, in_place: bool) -> tuple[np.ndarray, np.ndarray]:
        """(bytes, displacements) the exchange sends: the caller's buffer (direct, not in place),
        else the scratch the blocks are packed into."""
        if side.direct and not in_place:
            return view, side.displs
        out = self.scratch.get("send", side.total)[:side.total]
        if side.direct:  # in place: the blocks are copied out before the receive overwrites them
            packed = np.cumsum(side.counts) - side.counts
            copy_blocks(view, side.displs, out, packed, side.counts)
            return out, packed
        copy_blocks(view, side.runs[0], out, side.runs[1], side.runs[2])
        return out, side.displs

    def recv_bytes(self, view: np.ndarray, side: TypedSide) -> np.ndarray:
        """Where the exchange receives: the caller's buffer (direct) or the scratch ``unpack`` reads."""
        return view if side.direct else self.scratch.get("recv", side.total)[:side.total]

    def unpack(self, view: np.ndarray, side: TypedSide, received: np.ndarray) -> None:
        """Scatter the received bytes to the caller's buffer along the receive type maps."""
        if not side.direct:
            copy_blocks(received, side.runs[1], view, side.runs[0], side.runs[2])

    def clear(self) -> None:
        """Forget layouts, datatypes and scratch."""
        self._layouts.clear()
        self.types.clear()
        self.scratch = Scratch()

