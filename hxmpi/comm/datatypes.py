"""MPI datatypes as byte runs: what one item of a datatype moves, flattened once per datatype.

A datatype's type map lists (basic type, displacement) pairs; a message of ``count`` items moves
the bytes of those entries in type-map order, the map repeated ``count`` times at the type's extent.
hxmpi moves bytes, so all it needs of a datatype is its runs: (offset, length) pieces of memory,
contiguous in memory and consecutive in type-map order, with the type's size and extent
(``TypeRuns``). ``flatten`` builds them from MPI's own record of how the type was made
(``MPI_Type_get_envelope``/``_contents``), combiner by combiner, one numpy pass per level, so a
subarray of a large array costs its number of rows, never its number of elements. The few kinds
whose construction it does not re-derive (DARRAY, Fortran parameterised types, the predefined pair
types such as ``MPI.DOUBLE_INT``) are read by packing a probe through ``MPI_Pack``: a buffer whose
bytes spell their own offsets, packed once per byte of the offset.

``TypeCache`` keeps the runs of the datatypes a program passes, by Python object (checked against
the object's handle, so a freed type is never served), so each is flattened once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
from mpi4py import MPI

from .msgspec import PREDEFINED, Problem
from ..errors import ExchangeTypeError

__all__ = ["TypeRuns", "TypeCache", "describe", "flatten", "probe_runs"]

#: The largest true extent (bytes) a datatype read by the packing probe may span: the probe
#: allocates that much, plus 8 bytes of offsets per byte of the type's data.
PROBE_LIMIT = 1 << 28
_EMPTY = np.empty(0, dtype=np.int64)


@dataclass(frozen=True)
class TypeRuns:
    """The byte runs of one item of a datatype, in type-map order.

    ``offsets``/``lengths``: int64 byte offsets (from the address a message starts at) and lengths
    of the runs; ``size``: data bytes of one item (the lengths' sum); ``extent``: bytes from one
    item to the next; ``true_lb``/``true_ub``: the bytes one item's data spans, [true_lb, true_ub).
    """
    offsets: np.ndarray
    lengths: np.ndarray
    size: int
    extent: int
    true_lb: int
    true_ub: int

    @property
    def dense(self) -> bool:
        """Items of this type are back-to-back bytes: one run per item, as long as the extent."""
        return self.lengths.shape[0] == 1 and self.size == self.extent

    def repeated(self, count: int, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(offsets, lengths) of ``count`` items at byte ``start``, adjacent runs merged."""
        if count <= 0 or self.size == 0:
            return _EMPTY, _EMPTY
        if self.dense or count == 1 and self.lengths.shape[0] == 1:
            return (np.array([start + int(self.offsets[0])], dtype=np.int64),
                    np.array([count * self.size], dtype=np.int64))
        shifts = start + self.extent * np.arange(count, dtype=np.int64)
        return _merge((self.offsets[None, :] + shifts[:, None]).ravel(), np.tile(self.lengths, count))

    def span(self, count: int) -> tuple[int, int]:
        """The bytes ``count`` items starting at offset 0 may touch: [low, high)."""
        reach = (count - 1) * self.extent
        return self.true_lb + min(0, reach), self.true_ub + max(0, reach)


def _merge(offsets: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop empty runs and join each run to the next where it continues it in memory."""
    keep = lengths > 0
    if not keep.all():
        offsets, lengths = offsets[keep], lengths[keep]
    n = offsets.shape[0]
    if n < 2:
        return np.ascontiguousarray(offsets, dtype=np.int64), np.ascontiguousarray(lengths, dtype=np.int64)
    starts = np.ones(n, dtype=bool)
    starts[1:] = offsets[1:] != offsets[:-1] + lengths[:-1]
    first = np.flatnonzero(starts)
    return offsets[first].astype(np.int64), np.add.reduceat(lengths, first).astype(np.int64)


def _blocks(inner: TypeRuns, starts, counts) -> tuple[np.ndarray, np.ndarray]:
    """Runs of ``counts[i]`` consecutive items of ``inner`` at byte ``starts[i]``, for every i in order."""
    starts = np.asarray(starts, dtype=np.int64).reshape(-1)
    counts = np.asarray(counts, dtype=np.int64).reshape(-1)
    if counts.shape[0] == 1 and starts.shape[0] > 1:
        counts = np.full(starts.shape[0], counts[0], dtype=np.int64)
    if inner.size == 0 or not counts.any():
        return _EMPTY, _EMPTY
    if inner.dense:  # each block is one run
        return _merge(starts + int(inner.offsets[0]), counts * inner.size)
    # every item of every block, then the inner runs of each
    total = int(counts.sum())
    first = np.repeat(np.cumsum(counts) - counts, counts)
    items = np.repeat(starts, counts) + (np.arange(total, dtype=np.int64) - first) * inner.extent
    return _merge((inner.offsets[None, :] + items[:, None]).ravel(), np.tile(inner.lengths, total))


def _shifted(offsets: np.ndarray, lengths: np.ndarray, shifts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The runs repeated at each shift, in order."""
    return _merge((offsets[None, :] + shifts[:, None]).ravel(), np.tile(lengths, shifts.shape[0]))


def _subarray(inner: TypeRuns, sizes, subsizes, starts, order) -> tuple[np.ndarray, np.ndarray]:
    """Runs of a subarray of ``inner`` items, built from the fastest dimension out (each step merged)."""
    if order == MPI.ORDER_FORTRAN:  # the first index is the fastest in memory and in the type map
        sizes, subsizes, starts = sizes[::-1], subsizes[::-1], starts[::-1]
    if not all(subsizes):
        return _EMPTY, _EMPTY
    stride = inner.extent
    offsets, lengths = _blocks(inner, [starts[-1] * stride], [subsizes[-1]])
    for d in range(len(sizes) - 2, -1, -1):
        stride *= sizes[d + 1]
        offsets, lengths = _shifted(offsets, lengths,
                                    (starts[d] + np.arange(subsizes[d], dtype=np.int64)) * stride)
    return offsets, lengths


def _described(datatype: MPI.Datatype) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """(offsets, lengths) from how the type was made, or None for kinds left to the probe."""
    combiner = datatype.combiner
    if combiner == MPI.COMBINER_NAMED:
        if datatype.true_extent == datatype.size:
            return _merge(np.array([datatype.true_lb], np.int64), np.array([datatype.size], np.int64))
        return None  # a pair type (MPI.DOUBLE_INT, ...) with a gap inside
    if combiner not in _COMBINERS:
        return None
    base, _, params = datatype.decode()
    inner = [base] if "datatypes" not in params else params["datatypes"]
    try:
        runs = [flatten(t) for t in inner]
        return _COMBINERS[combiner](runs, params)
    finally:
        for t in inner:  # MPI hands out new handles for the derived inner types
            if not t.is_predefined:
                t.Free()


def _struct(runs, p):
    parts = [_blocks(r, [d], [n]) for r, d, n in zip(runs, p["displacements"], p["blocklengths"])]
    if not parts:
        return _EMPTY, _EMPTY
    return _merge(np.concatenate([o for o, _ in parts]), np.concatenate([n for _, n in parts]))


_COMBINERS = {
    MPI.COMBINER_DUP: lambda r, p: (r[0].offsets, r[0].lengths),
    MPI.COMBINER_RESIZED: lambda r, p: (r[0].offsets, r[0].lengths),
    MPI.COMBINER_CONTIGUOUS: lambda r, p: _blocks(r[0], [0], [p["count"]]),
    MPI.COMBINER_VECTOR: lambda r, p: _blocks(
        r[0], np.arange(p["count"], dtype=np.int64) * p["stride"] * r[0].extent, [p["blocklength"]]),
    MPI.COMBINER_HVECTOR: lambda r, p: _blocks(
        r[0], np.arange(p["count"], dtype=np.int64) * p["stride"], [p["blocklength"]]),
    MPI.COMBINER_INDEXED: lambda r, p: _blocks(
        r[0], np.asarray(p["displacements"], dtype=np.int64) * r[0].extent, p["blocklengths"]),
    MPI.COMBINER_HINDEXED: lambda r, p: _blocks(r[0], p["displacements"], p["blocklengths"]),
    MPI.COMBINER_INDEXED_BLOCK: lambda r, p: _blocks(
        r[0], np.asarray(p["displacements"], dtype=np.int64) * r[0].extent, [p["blocklength"]]),
    MPI.COMBINER_HINDEXED_BLOCK: lambda r, p: _blocks(r[0], p["displacements"], [p["blocklength"]]),
    MPI.COMBINER_STRUCT: _struct,
    MPI.COMBINER_SUBARRAY: lambda r, p: _subarray(r[0], p["sizes"], p["subsizes"], p["starts"], p["order"]),
}


def probe_runs(datatype: MPI.Datatype) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, lengths) of a committed datatype, read through ``MPI_Pack``: the bytes of a buffer
    spanning the type's true extent spell their own offset, one byte of it per pass.

    Exact for any type MPI can pack (the packed order is the type-map order); costs the true
    extent in memory and one pack per byte of the largest offset."""
    size, lb, span = datatype.size, datatype.true_lb, datatype.true_extent
    if size == 0:
        return _EMPTY, _EMPTY
    if span > PROBE_LIMIT:
        raise ValueError(f"its data spans {span} B, more than the {PROBE_LIMIT} B hxmpi reads such a type in")
    # A view of the type whose data starts at byte 0 and whose extent is its true extent: one item
    # is then exactly the probe buffer.
    moved = MPI.Datatype.Create_struct([1], [-lb], [datatype])
    probe = moved.Create_resized(0, span).Commit()
    moved.Free()
    try:
        source = np.empty(span, dtype=np.uint8)
        packed = np.empty(size, dtype=np.uint8)
        where = np.zeros(size, dtype=np.int64)
        position = np.arange(span, dtype=np.int64)
        for k in range(max(1, (int(span - 1).bit_length() + 7) // 8)):
            source[:] = (position >> (8 * k)) & 0xFF
            end = probe.Pack(source, packed, 0, MPI.COMM_SELF)
            if end != size:
                raise ValueError(f"MPI packed {end} B of a {size} B datatype")
            where |= packed.astype(np.int64) << (8 * k)
    finally:
        probe.Free()
    return _merge(where + lb, np.ones(size, dtype=np.int64))


def flatten(datatype: MPI.Datatype) -> TypeRuns:
    """The byte runs of one item of a committed ``datatype`` (MPI errors propagate)."""
    size, extent = datatype.size, datatype.extent
    true_lb, true_extent = datatype.true_lb, datatype.true_extent
    elem = PREDEFINED.get(datatype.handle)
    if elem is not None and elem == extent:
        offsets, lengths = np.zeros(1, np.int64), np.array([elem], np.int64)
    else:
        described = _described(datatype)
        offsets, lengths = described if described is not None else probe_runs(datatype)
    return TypeRuns(offsets, lengths, size, extent, true_lb, true_lb + true_extent)


def _committed(datatype: MPI.Datatype) -> bool:
    """Whether MPI lets the type move data. No MPI call tells, so ask two that refuse an
    uncommitted type: a message of zero items to self (Open MPI checks there), then
    ``MPI_Pack_size`` of zero items (MPICH checks there; Open MPI may crash there on one)."""
    none = np.empty(0, dtype=np.uint8)
    try:
        MPI.COMM_SELF.Sendrecv([none, 0, datatype], 0, 0, [none, 0, datatype], 0, 0)
        datatype.Pack_size(0, MPI.COMM_SELF)
    except MPI.Exception:
        return False
    return True


def describe(datatype: MPI.Datatype) -> str:
    """A datatype as a message names it: a predefined one by its MPI name, a derived one by how
    it was made."""
    if datatype.is_predefined:
        return datatype.Get_name() or "a predefined datatype"
    combiner = datatype.combiner
    made = next((k[len("COMBINER_"):] for k in dir(MPI) if k.startswith("COMBINER_") and getattr(MPI, k) == combiner),
                str(combiner))
    return f"a {made.lower()} datatype of {datatype.size} B, extent {datatype.extent} B"


class TypeCache:
    """Runs of the datatypes a program passes, flattened once each (at most ``limit`` kept).

    Keyed by the Python object, which the cache keeps alive so that its id cannot be reused, and
    checked against the object's handle (``Free`` sets it to ``MPI.DATATYPE_NULL``)."""

    def __init__(self, limit: int = 4096):
        self.limit = limit
        self._kept: dict[int, tuple] = {}
        self._predefined: dict[int, TypeRuns] = {}

    def runs(self, datatype) -> tuple[Optional[TypeRuns], Optional[Problem]]:
        """(runs, None), or (None, what is wrong with ``datatype``)."""
        kept = self._kept.get(id(datatype))
        if kept is not None and kept[0] is datatype and kept[1] == datatype.handle:
            return kept[2], None
        if not isinstance(datatype, MPI.Datatype):
            return None, Problem(f"datatypes must be MPI.Datatype objects, got {type(datatype).__name__}",
                                 ExchangeTypeError)
        handle = datatype.handle
        found = self._predefined.get(handle)
        if found is not None:
            return found, None
        if datatype == MPI.DATATYPE_NULL:
            return None, Problem("datatype is MPI.DATATYPE_NULL (freed?)")
        if handle not in PREDEFINED and not _committed(datatype):
            return None, Problem(f"{describe(datatype)} is not committed (call .Commit() first)")
        try:
            runs = flatten(datatype)
        except (MPI.Exception, ValueError) as exc:
            return None, Problem(f"{describe(datatype)} cannot be read: {exc}")
        if int(runs.lengths.sum()) != runs.size:
            return None, Problem(f"{describe(datatype)}: its runs hold {int(runs.lengths.sum())} B, "
                                 f"MPI says {runs.size} B")
        if datatype.is_predefined:
            self._predefined[handle] = runs
        else:
            if len(self._kept) >= self.limit:
                self._kept.clear()
            self._kept[id(datatype)] = (datatype, handle, runs)
        return runs, None

    def clear(self) -> None:
        """Forget every kept datatype."""
        self._kept.clear()
