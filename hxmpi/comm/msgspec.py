"""Message specs: mpi4py-style buffer specs for Alltoall/Alltoallv, parsed into byte counts.

Kept apart from the exchange (as mpi4py keeps ``msgbuffer.pxi`` apart from ``Comm.pyx``) so that it is
testable without MPI collectives. Nothing here communicates: every function returns a problem instead
of raising, because the caller must agree on errors with the other ranks before raising. A problem is
a ``Problem`` string that also names the exception type mpi4py raises for the same spec (TypeError,
KeyError or ValueError), so every rank raises the same type.

The spec forms follow mpi4py's message rules (a plain buffer; ``[buf, counts]``; ``[buf, datatype]``;
``[buf, counts, datatype]``; ``[buf, counts, displs, datatype]``; in vector specs a *tuple*
``(counts, displs)`` in the counts place, in block specs a tuple or list ``(count, displ)``). A
datatype is an ``MPI.Datatype`` or a typecode string (``'i'``, ``'d'``); a single integer as counts
means that count for every peer, as displacements the stride between blocks. Buffers are anything
exposing the buffer protocol (C- or Fortran-contiguous), DLPack tensors in host memory, or ``None`` /
``MPI.BOTTOM`` with zero counts. Where mpi4py would hand MPI something we cannot check (absolute
addresses via ``BOTTOM``, accelerator memory), hxmpi refuses with a problem instead.
"""
from __future__ import annotations

import ctypes
import functools
import operator
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
from mpi4py import MPI

from ..errors import ExchangeError, ExchangeKeyError, ExchangeTypeError
from ._packing import SideCheck, common_block, common_vector, side_bytes

__all__ = ["PREDEFINED", "Problem", "Side", "count_arrays", "int_vector", "parse_vector", "parse_uniform", "parse_alltoallv",
           "parse_alltoall"]


class Problem(str):
    """A problem text that also carries the ``ExchangeError`` subclass to raise for it."""

    def __new__(cls, text: str, error: type = ExchangeError):
        obj = super().__new__(cls, text)
        obj.error = error
        return obj

    def __reduce__(self):  # problems travel between ranks by pickle
        return Problem, (str(self), self.error)


@dataclass
class Side:
    """One side (send or receive) of an exchange, in bytes."""
    view: Optional[np.ndarray]      # uint8 view of the caller's buffer
    counts: Optional[np.ndarray]    # int64 bytes per peer
    displs: Optional[np.ndarray]    # int64 byte offsets per peer
    elem: int = 1                   # bytes per element of the caller's datatype
    keep: Any = None                # what must outlive ``view`` (a DLPack capsule)
    _total: int = -1

    @property
    def total(self) -> int:
        """Bytes of all blocks (computed once: a memoised Side serves many calls)."""
        if self._total < 0:
            self._total = int(self.counts.sum()) if self.counts is not None else 0
        return self._total


_EMPTY = np.empty(0, dtype=np.uint8)
_NO_SIDE = Side(None, None, None)

# ------------------------------------------------------------------ buffers


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManaged(ctypes.Structure):  # DLPack 0.x capsule "dltensor"
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _DLManagedVersioned(ctypes.Structure):  # DLPack 1.x capsule "dltensor_versioned"
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


_capsule_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_valid.argtypes, _capsule_valid.restype = [ctypes.py_object, ctypes.c_char_p], ctypes.c_int
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.argtypes, _capsule_pointer.restype = [ctypes.py_object, ctypes.c_char_p], ctypes.c_void_p
_DL_HOST_DEVICES = {1: "CPU", 3: "CUDA host", 11: "ROCm host"}  # memory the CPU can address
_DL_READ_ONLY = 1


def _dlpack_view(obj, writable: bool):
    """(uint8 view, element bytes, capsule, problem) of a DLPack tensor in host memory.

    The capsule is read in place, not consumed, so the producer keeps ownership (as mpi4py does);
    the caller keeps the capsule alive as long as the view.
    """
    try:
        device_type, _ = obj.__dlpack_device__()
    except Exception as exc:  # a broken producer is the caller's input error, reported collectively
        return None, 1, None, Problem(f"__dlpack_device__() failed: {exc}", ExchangeTypeError)
    if device_type not in _DL_HOST_DEVICES:
        return None, 1, None, Problem(
            f"DLPack buffer lives on device type {device_type}, not in host memory; hxmpi moves host "
            f"memory only (copy it to the host first)", ExchangeTypeError)
    try:
        capsule = obj.__dlpack__(max_version=(1, 0), copy=False)
    except TypeError:  # a DLPack 0.x producer knows no keywords
        capsule = obj.__dlpack__()
    if _capsule_valid(capsule, b"dltensor_versioned"):
        managed = _DLManagedVersioned.from_address(_capsule_pointer(capsule, b"dltensor_versioned"))
        tensor, readonly = managed.dl_tensor, bool(managed.flags & _DL_READ_ONLY)
    elif _capsule_valid(capsule, b"dltensor"):
        tensor, readonly = _DLManaged.from_address(_capsule_pointer(capsule, b"dltensor")).dl_tensor, False
    else:
        return None, 1, None, Problem("__dlpack__() returned no valid DLPack capsule", ExchangeTypeError)
    shape = [tensor.shape[i] for i in range(tensor.ndim)]
    dtype = tensor.dtype
    itemsize = (dtype.bits * dtype.lanes + 7) // 8
    if tensor.strides and any(n > 1 for n in shape):
        expect, c_order = 1, True
        for i in reversed(range(tensor.ndim)):
            if shape[i] > 1 and tensor.strides[i] != expect:
                c_order = False
            expect *= shape[i]
        expect, f_order = 1, True
        for i in range(tensor.ndim):
            if shape[i] > 1 and tensor.strides[i] != expect:
                f_order = False
            expect *= shape[i]
        if not (c_order or f_order):
            return None, 1, None, Problem("DLPack buffer is not contiguous")
    if writable and readonly:
        return None, 1, None, Problem("receive buffer is read-only")
    nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize
    if nbytes == 0:
        return _EMPTY, max(itemsize, 1), capsule, None
    address = tensor.data + tensor.byte_offset
    view = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))
    if dtype.lanes != 1 and not (dtype.code == 2 and dtype.lanes == 2):
        itemsize = 1  # vector lanes other than complex pairs travel as bytes, as in mpi4py
    return view, itemsize, capsule, None


def _host_bytes(buf, writable: bool):
    """(uint8 view, default element bytes, keep-alive, problem) for a buffer object."""
    try:
        mv = memoryview(buf)
    except TypeError:
        if hasattr(buf, "__dlpack__") and hasattr(buf, "__dlpack_device__"):
            return _dlpack_view(buf, writable)
        if hasattr(buf, "__cuda_array_interface__"):
            return None, 1, None, Problem(
                f"{type(buf).__name__} exposes only __cuda_array_interface__ (accelerator memory); hxmpi "
                f"moves host memory only: pass a host buffer (e.g. cupy.asnumpy(x))", ExchangeTypeError)
        return None, 1, None, Problem(f"{type(buf).__name__} does not expose a buffer", ExchangeTypeError)
    if writable and mv.readonly:
        return None, 1, None, Problem("receive buffer is read-only")
    if mv.nbytes == 0:
        return _EMPTY, mv.itemsize, None, None
    if mv.c_contiguous:
        flat = mv if mv.ndim == 1 and mv.format == "B" else mv.cast("B")
        return np.frombuffer(flat, dtype=np.uint8), mv.itemsize, None, None
    if mv.f_contiguous:  # memory order of a Fortran array is its transpose's C order
        arr = np.asarray(mv).T
        return arr.reshape(-1).view(np.uint8), mv.itemsize, None, None
    return None, 1, None, Problem("buffer is not contiguous")


# ------------------------------------------------------------------ datatypes

@functools.lru_cache(maxsize=None)  # typecodes are few; fromcode costs 5x a dict lookup per parse
def _from_code(code: str) -> Optional[MPI.Datatype]:
    """mpi4py's datatype for a typecode (numpy's, e.g. "d", or sized, e.g. "i8"), None if it has none."""
    try:
        return MPI.Datatype.fromcode(code)
    except (ValueError, KeyError):
        return None


def _predefined() -> dict:
    """Element bytes by handle of the datatypes numpy's typecodes map to, and BYTE and PACKED."""
    codes = list(np.typecodes["All"]) + [f"{k}{n}" for k in "iufcb" for n in (1, 2, 4, 8, 16)]
    types = [t for t in map(_from_code, codes) if t is not None] + [MPI.BYTE, MPI.PACKED]
    return {t.handle: t.size for t in types if t != MPI.DATATYPE_NULL and t.size > 0}


#: Element bytes of the predefined datatypes by handle: asking MPI for size and extent costs
#: microseconds on every call (the compiled miss path reads it too).
PREDEFINED = _predefined()


def _datatype_elem(datatype) -> tuple[int, Optional[Problem]]:
    """Bytes per element of an MPI datatype or typecode string."""
    if isinstance(datatype, str):
        found = _from_code(datatype)
        if found is None:
            return 1, Problem(f"cannot map typecode {datatype!r} to an MPI datatype", ExchangeKeyError)
        datatype = found
    if not isinstance(datatype, MPI.Datatype):
        return 1, Problem(f"datatype {datatype!r} is neither an MPI.Datatype nor a typecode string",
                          ExchangeTypeError)
    elem = PREDEFINED.get(datatype.handle)
    if elem is not None:
        return elem, None
    if datatype == MPI.DATATYPE_NULL:
        return 1, Problem("datatype is MPI.DATATYPE_NULL")
    if datatype.lb != 0 or datatype.size != datatype.extent or datatype.true_lb != 0:
        return 1, Problem(f"datatype {datatype!r} is not contiguous (size {datatype.size} B, extent "
                          f"{datatype.extent} B); hxmpi moves contiguous types only")
    return datatype.size, None


def _is_datatype(item) -> bool:
    return isinstance(item, (MPI.Datatype, str))


# ------------------------------------------------------------------ counts


def _is_integral(value) -> bool:
    """A single integer (Python, numpy scalar or 0-d array), not a sequence of them."""
    if not hasattr(type(value), "__index__"):
        return False
    try:
        len(value)
        return False
    except TypeError:
        pass
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def _index(value, what: str) -> tuple[int, Optional[Problem]]:
    try:
        return operator.index(value), None
    except TypeError:
        return 0, Problem(f"{what} must be an integer, got {type(value).__name__}", ExchangeTypeError)


def int_vector(values, size: int, what: str) -> tuple[Optional[np.ndarray], Optional[Problem]]:
    """Return (contiguous int64 array of length ``size``, None) or (None, what is wrong)."""
    if isinstance(values, np.ndarray):
        if values.dtype == np.int64 and values.shape == (size,):
            return np.ascontiguousarray(values), None  # the common case, without a copy
        if values.ndim != 1 or (values.size and values.dtype.kind not in "iu"):
            return None, Problem(f"{what} must hold integers, one per rank, got an array of dtype "
                                 f"{values.dtype} and shape {values.shape}", ExchangeTypeError)
        arr = values
    else:
        try:
            arr = np.fromiter((operator.index(v) for v in values), dtype=np.int64)
        except TypeError:
            return None, Problem(f"{what} must be an integer or a sequence of integers", ExchangeTypeError)
        except OverflowError:
            return None, Problem(f"{what} holds an integer beyond 64 bits")
    if arr.shape[0] != size:
        return None, Problem(f"{what} has {arr.shape[0]} entries, expected {size}: one per rank")
    return np.ascontiguousarray(arr, dtype=np.int64), None


# ------------------------------------------------------------------ specs


def _unpack(spec, vector: bool):
    """Split a spec into (buf, counts, displs, datatype, problem) by mpi4py's rules.

    The only difference between the two kinds: in a vector spec only a tuple in the counts place
    means ``(counts, displs)`` (a list there is the counts), in a block spec a list means it too.
    """
    pair = tuple if vector else (tuple, list)
    if isinstance(spec, (list, tuple)):
        counts = displs = datatype = None
        if len(spec) == 2:
            buf, counts = spec
            if _is_datatype(counts):
                counts, datatype = None, counts
            elif isinstance(counts, pair):
                if len(counts) != 2:
                    return None, None, None, None, Problem("(counts, displs) must have 2 items")
                counts, displs = counts
        elif len(spec) == 3:
            buf, counts, datatype = spec
            if isinstance(counts, pair):
                if len(counts) != 2:
                    return None, None, None, None, Problem("(counts, displs) must have 2 items")
                counts, displs = counts
        elif len(spec) == 4:
            buf, counts, displs, datatype = spec
        else:
            return None, None, None, None, Problem(
                f"spec has {len(spec)} items, expected 2 to 4: [buf, counts(, displs), datatype]")
        return buf, counts, displs, datatype, None
    if spec is MPI.IN_PLACE or spec is MPI.BOTTOM or spec is None:
        return spec, None, None, None, None
    if isinstance(spec, (str, int, float)) or not (
            _has_buffer(spec) or hasattr(spec, "__dlpack__") or hasattr(spec, "__cuda_array_interface__")):
        return None, None, None, None, Problem(
            f"spec must be a buffer or a list/tuple, got {type(spec).__name__}", ExchangeTypeError)
    return spec, None, None, None, None


def _has_buffer(obj) -> bool:
    try:
        memoryview(obj)
        return True
    except TypeError:
        return False


def _buffer(buf, datatype, writable: bool):
    """(uint8 view, element bytes, keep-alive, problem) for a spec's buffer and datatype."""
    if buf is MPI.IN_PLACE:
        return None, 1, None, Problem("MPI.IN_PLACE is valid only as the send buffer of Alltoall/Alltoallv "
                                      "(not as a receive buffer)")
    if buf is None or buf is MPI.BOTTOM:
        if datatype is None:
            return None, 1, None, Problem("a None/MPI.BOTTOM buffer needs an explicit datatype",
                                          ExchangeKeyError)
        elem, problem = _datatype_elem(datatype)
        return _EMPTY, elem, None, problem
    view, elem, keep, problem = _host_bytes(buf, writable)
    if problem is None and datatype is not None:
        elem, problem = _datatype_elem(datatype)
    return view, elem, keep, problem


def _named(problem: Optional[Problem], name: str) -> Optional[Problem]:
    return Problem(f"{name}: {problem}", problem.error) if problem else None


def _read(spec, vector: bool, writable: bool, name: str):
    """(buf, counts, displs, uint8 view, element bytes, keep-alive, problem) of a spec."""
    buf, counts, displs, datatype, problem = _unpack(spec, vector)
    if problem is None:
        view, elem, keep, problem = _buffer(buf, datatype, writable)
        if problem is None:
            return buf, counts, displs, view, elem, keep, None
    return None, None, None, None, 1, None, _named(problem, name)


def parse_vector(spec, size: int, writable: bool, name: str) -> tuple[Side, Optional[Problem]]:
    """Parse an mpi4py vector buffer spec (as ``Alltoallv`` takes it) into bytes.

    Counts and displacements are in elements of the datatype (of the buffer's items when none is
    given). Counts default to the buffer split as evenly as possible (the first ``n % size`` peers
    get one more); displacements default to the packed prefix sums, and a single integer is a stride.
    """
    side = _common_vector(spec, size, writable)
    return (side, None) if side is not None else _parse_vector(spec, size, writable, name)


def _common_vector(spec, size: int, writable: bool) -> Optional[Side]:
    """The form hot loops pass, ``[ndarray, counts or (counts, displs)(, datatype)]`` and ``[ndarray,
    counts, displs, datatype]``, read without the general reader, in one compiled pass
    (``_packing.common_vector``; it is on every call's path); counts and displacements given as
    lists of integers are made arrays first. None: not that form, or not valid (the general reader
    then says why); same result as the general reader otherwise."""
    got = common_vector(spec, size, writable, PREDEFINED, MPI.Datatype)
    if got is None:
        arrays = count_arrays(spec)
        if arrays is not None:
            got = common_vector(arrays, size, writable, PREDEFINED, MPI.Datatype)
    return None if got is None else Side(*got)


def count_arrays(spec) -> Optional[list]:
    """A vector spec (a list or tuple of 2 to 4 items) with its counts and displacements given as
    lists of integers made int64 arrays, the form the compiled paths read; None if it has no such
    list (then it is left as it is)."""
    if type(spec) in (list, tuple) and 2 <= len(spec) <= 4:
        return _lists_as_arrays(spec)
    return None


def _int_array(values):
    """``values`` as an int64 array if it is a list of integers (numpy infers an integer dtype for
    exactly those; bools, floats and integers past 64 bits it does not), else ``values``."""
    if type(values) is not list:
        return values
    arr = np.array(values)
    return arr.astype(np.int64, copy=False) if arr.ndim == 1 and arr.dtype.kind in "iu" else values


def _lists_as_arrays(spec) -> Optional[list]:
    """The spec with its count and displacement lists as int64 arrays, or None if it has none."""
    items = list(spec)
    if len(items) == 4:
        items[1], items[2] = _int_array(items[1]), _int_array(items[2])
        changed = items[1] is not spec[1] or items[2] is not spec[2]
    elif type(items[1]) is tuple and len(items[1]) == 2:  # (counts, displs)
        counts, displs = items[1]
        items[1] = (_int_array(counts), _int_array(displs))
        changed = items[1][0] is not counts or items[1][1] is not displs
    else:
        items[1] = _int_array(items[1])
        changed = items[1] is not spec[1]
    return items if changed else None


def _parse_vector(spec, size: int, writable: bool, name: str) -> tuple[Side, Optional[Problem]]:
    """The general reader behind ``parse_vector``: every form mpi4py accepts."""
    buf, counts, displs, view, elem, keep, problem = _read(spec, True, writable, name)
    if problem:
        return _NO_SIDE, problem
    nbytes = view.shape[0]
    if counts is None:
        if nbytes % elem:
            return _NO_SIDE, Problem(f"{name}: cannot infer counts, buffer of {nbytes} B is not a "
                                     f"multiple of the {elem} B element")
        total = nbytes // elem
        c = np.full(size, total // size, dtype=np.int64)
        c[:total % size] += 1
    elif _is_integral(counts):
        c = np.full(size, operator.index(counts), dtype=np.int64)
    else:
        c, problem = int_vector(counts, size, f"{name} counts")
        if problem:
            return _NO_SIDE, problem
    d = None
    if _is_integral(displs):
        d = np.arange(size, dtype=np.int64) * operator.index(displs)
    elif displs is not None:
        d, problem = int_vector(displs, size, f"{name} displs")
        if problem:
            return _NO_SIDE, problem
    return _checked(view, c, d, elem, keep, writable, name, buf)


def parse_uniform(spec, size: int, writable: bool, name: str) -> tuple[Side, Optional[Problem]]:
    """Parse an mpi4py block buffer spec (as ``Alltoall`` takes it): ``size`` equal blocks, in bytes.

    The count per peer defaults to the buffer (after the optional displacement, in elements) split
    in ``size`` equal parts; it must split exactly.
    """
    got = common_block(spec, size, writable, PREDEFINED, MPI.Datatype)  # the form hot loops pass, compiled
    return (Side(*got), None) if got is not None else _parse_uniform(spec, size, writable, name)


def _parse_uniform(spec, size: int, writable: bool, name: str) -> tuple[Side, Optional[Problem]]:
    """The general reader behind ``parse_uniform``: every form mpi4py accepts."""
    buf, count, displ, view, elem, keep, problem = _read(spec, False, writable, name)
    if problem:
        return _NO_SIDE, problem
    start = 0
    if displ is not None:
        start, problem = _index(displ, "displacement")
        if problem is None and (start < 0 or start * elem > view.shape[0]):
            problem = Problem(f"displacement {start} lies outside the buffer of {view.shape[0]} B")
        if problem:
            return _NO_SIDE, _named(problem, name)
    if count is None:
        length = view.shape[0] - start * elem
        if length % elem or (length // elem) % size:
            return _NO_SIDE, Problem(f"{name}: cannot infer the count, {length} B is not {size} "
                                     f"equal blocks of {elem} B elements")
        count = length // elem // size
    else:
        count, problem = _index(count, "count")
        if problem:
            return _NO_SIDE, _named(problem, name)
    c = np.full(size, count, dtype=np.int64)
    d = start + np.arange(size, dtype=np.int64) * count
    return _checked(view, c, d, elem, keep, writable, name, buf)


# Read on every new spec's path: an attribute of an enum class costs about 0.1 us a lookup.
_SIDE_OK = SideCheck.SIDE_OK


def _checked(view, c, d, elem, keep, writable, name, buf) -> tuple[Side, Optional[Problem]]:
    """Scale counts and displacements to bytes and check every block lies in the buffer."""
    cb, db, check, i, total = side_bytes(c, d, elem, view.shape[0], writable)
    side = Side(view, cb, db, elem, keep, total if check == _SIDE_OK else -1)
    if check == _SIDE_OK:
        return side, None
    if check == SideCheck.NOT_ASCENDING:  # receive blocks out of order: overlap needs a sort
        return side, _overlap(side, name)
    if check == SideCheck.PAST_BUFFER and (buf is None or buf is MPI.BOTTOM):
        return side, Problem(f"{name}: a None/MPI.BOTTOM buffer takes zero counts only (count {c[i]} "
                             f"for rank {i}); absolute addresses are not supported")
    if check == SideCheck.NEGATIVE_COUNT:
        what = f"{name} counts[{i}] = {c[i]} is negative"
    elif check == SideCheck.NEGATIVE_DISPL:
        what = f"{name} displs[{i}] = {d[i] if d is not None else 0} is negative"
    elif check == SideCheck.OVERFLOW:
        what = f"{name} counts/displs for rank {i} exceed 2**62 bytes"
    else:  # PAST_BUFFER
        what = (f"{name} block for rank {i} (displ {db[i] // elem}, count {c[i]}, element {elem} B) "
                f"ends at byte {db[i] + cb[i]}, past the buffer's {view.shape[0]} B")
    return side, Problem(what)


def _overlap(side: Side, name: str) -> Optional[Problem]:
    live = np.flatnonzero(side.counts > 0)
    idx = live[np.argsort(side.displs[live], kind="stable")]
    ends = side.displs[idx] + side.counts[idx]
    clash = np.flatnonzero(side.displs[idx[1:]] < ends[:-1])
    if clash.size:
        return Problem(f"{name} blocks for ranks {int(idx[clash[0]])} and {int(idx[clash[0] + 1])} overlap")
    return None


def _pair(parse, sendbuf, recvbuf, size: int) -> tuple[Side, Side, Optional[Problem]]:
    r, recv_problem = parse(recvbuf, size, True, "recv")
    if sendbuf is MPI.IN_PLACE:  # the data to send is in the receive buffer, which MPI overwrites
        if recv_problem:
            return _NO_SIDE, r, recv_problem
        live = r.counts > 0
        end = int((r.displs + r.counts)[live].max()) if live.any() else 0
        return Side(r.view[:end].copy(), r.counts, r.displs, r.elem), r, None
    s, send_problem = parse(sendbuf, size, False, "send")
    return s, r, recv_problem or send_problem


def parse_alltoallv(sendbuf, recvbuf, size: int) -> tuple[Side, Side, Optional[Problem]]:
    """Both sides of an ``Alltoallv``: (send, receive, first problem). ``MPI.IN_PLACE`` as the
    send buffer sends from a copy of the receive buffer's blocks (counts as the receive side's)."""
    return _pair(parse_vector, sendbuf, recvbuf, size)


def parse_alltoall(sendbuf, recvbuf, size: int) -> tuple[Side, Side, Optional[Problem]]:
    """Both sides of an ``Alltoall``, as ``parse_alltoallv`` does for vector specs."""
    return _pair(parse_uniform, sendbuf, recvbuf, size)
