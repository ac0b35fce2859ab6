"""Message specs: mpi4py-style buffer specs for Alltoall/Alltoallv, parsed into byte counts.

Kept apart from the exchange (as mpi4py keeps ``msgbuffer.pxi`` apart from ``Comm.pyx``) so that it is
testable without MPI collectives. Nothing here communicates: every function returns a problem string
instead of raising, because the caller must agree on errors with the other ranks before raising.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
from mpi4py import MPI

from ._packing import side_bytes


def exclusive_cumsum(x: np.ndarray) -> np.ndarray:
    out = np.zeros(x.shape[0], dtype=np.int64)
    np.cumsum(x[:-1], out=out[1:])
    return out


@dataclass
class Side:
    """One side (send or receive) of an exchange, in bytes."""
    view: Optional[np.ndarray]      # uint8 view of the caller's buffer
    counts: Optional[np.ndarray]    # int64 bytes per peer
    displs: Optional[np.ndarray]    # int64 byte offsets per peer
    elem: int = 1                   # bytes per element of the caller's datatype

    @property
    def total(self) -> int:
        return int(self.counts.sum()) if self.counts is not None else 0


def _bytes_view(buf, writable: bool) -> tuple[Optional[np.ndarray], int, Optional[str]]:
    """Return (uint8 view, default element size, problem)."""
    if buf is None or buf is MPI.IN_PLACE or buf is MPI.BOTTOM:
        return None, 1, "MPI.IN_PLACE/BOTTOM/None buffers are not supported; pass a real buffer"
    try:
        mv = memoryview(buf)
    except TypeError:
        return None, 1, f"{type(buf).__name__} does not expose a buffer"
    if not mv.c_contiguous:
        return None, 1, "buffer is not C-contiguous"
    view = np.frombuffer(mv.cast("B") if mv.ndim != 1 or mv.format != "B" else mv, dtype=np.uint8) \
        if mv.nbytes else np.empty(0, dtype=np.uint8)
    if writable and mv.readonly:
        return None, 1, "receive buffer is read-only"
    return view, mv.itemsize, None


def int_vector(values, size: int, what: str) -> tuple[Optional[np.ndarray], Optional[str]]:
    """Return (contiguous int64 array of length ``size``, None) or (None, what is wrong)."""
    if isinstance(values, np.ndarray) and values.dtype == np.int64 and values.shape == (size,):
        return np.ascontiguousarray(values), None  # the common case, without a copy
    try:
        arr = np.asarray(values)
    except Exception as exc:  # unconvertible user input is reported, not raised here
        return None, f"{what} is not a sequence of integers ({exc})"
    if arr.ndim != 1 or arr.shape[0] != size:
        return None, f"{what} has shape {arr.shape}, expected ({size},): one entry per rank"
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        return None, f"{what} must hold integers, got dtype {arr.dtype}"
    return np.ascontiguousarray(arr, dtype=np.int64), None


# Predefined types by handle: asking MPI for size and extent costs microseconds on every call.
_PREDEFINED = {t.handle: t.size for t in [*MPI._typedict.values(), MPI.BYTE, MPI.PACKED]
               if t != MPI.DATATYPE_NULL and t.size > 0}


def _datatype_elem(datatype) -> tuple[int, Optional[str]]:
    if isinstance(datatype, MPI.Datatype):
        elem = _PREDEFINED.get(datatype.handle)
        if elem is not None:
            return elem, None
    if not isinstance(datatype, MPI.Datatype) or datatype == MPI.DATATYPE_NULL:
        return 1, f"datatype {datatype!r} is not an MPI datatype"
    if datatype.lb != 0 or datatype.size != datatype.extent or datatype.true_lb != 0:
        return 1, (f"datatype {datatype!r} is not contiguous (size {datatype.size} B, extent "
                   f"{datatype.extent} B); hxmpi moves contiguous types only")
    return datatype.size, None


def _buffer_elem(buf, datatype, writable: bool, name: str) -> tuple[Optional[np.ndarray], int, Optional[str]]:
    """(uint8 view, bytes per element, problem) for a buffer and an optional datatype."""
    view, elem, problem = _bytes_view(buf, writable)
    if problem is None and datatype is not None:
        elem, problem = _datatype_elem(datatype)
    return view, elem, (f"{name}: {problem}" if problem else None)


def parse_vector(spec, size: int, writable: bool, name: str) -> tuple[Side, Optional[str]]:
    """Parse an mpi4py vector buffer spec into bytes.

    Accepted: ``[buf, counts]``, ``[buf, (counts, displs)]``, ``[buf, counts, displs]``, each with an
    optional trailing MPI datatype. Counts and displacements are in elements of the datatype (or of
    the buffer's items when no datatype is given); displs default to the packed prefix sums.
    """
    side = Side(None, None, None)
    if not isinstance(spec, (list, tuple)) or len(spec) not in (2, 3, 4):
        return side, f"{name} spec must be [buf, counts(, displs)(, datatype)], got {type(spec).__name__}"
    items = list(spec)
    datatype = items.pop() if isinstance(items[-1], MPI.Datatype) else None
    buf, rest = items[0], items[1:]
    if len(rest) == 1 and isinstance(rest[0], tuple) and len(rest[0]) == 2:
        counts, displs = rest[0]
    elif len(rest) == 1:
        counts, displs = rest[0], None
    elif len(rest) == 2:
        counts, displs = rest
    else:
        return side, f"{name} spec has too many items"
    view, elem, problem = _buffer_elem(buf, datatype, writable, name)
    if problem:
        return side, problem
    c, problem = int_vector(counts, size, f"{name} counts")
    if problem:
        return side, problem
    d = None
    if displs is not None:
        d, problem = int_vector(displs, size, f"{name} displs")
        if problem:
            return side, problem
    cb, db, kind, i = side_bytes(c, d, elem, view.shape[0], writable)
    side = Side(view, cb, db, elem)
    if kind == 0:
        return side, None
    if kind == 6:  # receive blocks out of order: overlap needs a sort
        return side, _overlap(side, name)
    what = {1: f"{name} counts[{i}] = {c[i]} is negative",
            2: f"{name} displs[{i}] = {d[i] if d is not None else 0} is negative",
            4: f"{name} counts/displs for rank {i} exceed 2**62 bytes"}.get(kind)
    if what is None:  # 3: past the buffer
        what = (f"{name} block for rank {i} (displ {db[i] // elem}, count {c[i]}, element {elem} B) "
                f"ends at byte {db[i] + cb[i]}, past the buffer's {view.shape[0]} B")
    return side, what


def _overlap(side: Side, name: str) -> Optional[str]:
    live = np.flatnonzero(side.counts > 0)
    idx = live[np.argsort(side.displs[live], kind="stable")]
    ends = side.displs[idx] + side.counts[idx]
    clash = np.flatnonzero(side.displs[idx[1:]] < ends[:-1])
    if clash.size:
        return f"{name} blocks for ranks {int(idx[clash[0]])} and {int(idx[clash[0] + 1])} overlap"
    return None


def uniform_to_vector(spec, size: int, writable: bool, name: str):
    """Turn an Alltoall spec (buf | [buf, datatype] | [buf, count, datatype]) into a vector spec."""
    items = list(spec) if isinstance(spec, (list, tuple)) else [spec]
    datatype = items.pop() if len(items) > 1 and isinstance(items[-1], MPI.Datatype) else None
    if len(items) not in (1, 2):
        return None, f"{name} spec must be buf, [buf, datatype] or [buf, count, datatype]"
    view, elem, problem = _buffer_elem(items[0], datatype, writable, name)
    if problem:
        return None, problem
    if len(items) == 2:
        count = items[1]
    else:
        total = view.shape[0] // elem
        if total % size or view.shape[0] % elem:
            return None, f"{name} buffer of {view.shape[0]} B does not split into {size} equal blocks"
        count = total // size
    counts = [count] * size
    displs = [count * i for i in range(size)]
    return [items[0], (counts, displs)] + ([datatype] if datatype is not None else []), None


def parse_uniform(spec, size: int, writable: bool, name: str) -> tuple[Side, Optional[str]]:
    """Parse an Alltoall spec (equal blocks) into bytes, as ``parse_vector`` does for vector specs."""
    vector, problem = uniform_to_vector(spec, size, writable, name)
    if problem:
        return Side(None, None, None), problem
    return parse_vector(vector, size, writable, name)
