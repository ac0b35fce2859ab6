"""Block copy kernels for the hierarchical exchange: gather blocks into a phase layout, scatter back.

All offsets and lengths are int64 byte counts. The copy loop runs without the GIL and does no
Python-object work per block; bounds are checked once per call, before any byte moves.
"""
from libc.stdint cimport int64_t

cimport numpy as cnp
import numpy as np

cnp.import_array()

include "_copy.pxi"


cpdef enum SideCheck:
    # ``side_bytes``'s verdict on one side's counts and displacements (``msgspec`` words each one).
    SIDE_OK = 0
    NEGATIVE_COUNT = 1
    NEGATIVE_DISPL = 2
    PAST_BUFFER = 3      # a block ends past the buffer
    OVERFLOW = 4         # a count or displacement past 2**62 bytes
    NOT_ASCENDING = 5    # non-empty blocks out of order (only with ``no_overlap``): the caller sorts


def copy_blocks(cnp.ndarray src not None, cnp.ndarray src_off not None, cnp.ndarray dst not None,
                cnp.ndarray dst_off not None, cnp.ndarray length not None):
    """Copy block i: length[i] bytes from src[src_off[i]:] to dst[dst_off[i]:]. Returns bytes copied.

    ``src``/``dst``: contiguous 1-D uint8 arrays (``dst`` writable); the lists: contiguous 1-D
    int64 arrays of one length. Read through pointers: a hierarchical call makes 3 or 4 of these,
    and typed memoryviews cost more to acquire than small copies take."""
    cdef Py_ssize_t n = _int64_1d(length, "length")
    if _int64_1d(src_off, "src_off") != n or _int64_1d(dst_off, "dst_off") != n:
        raise ValueError("copy_blocks: src_off, dst_off and length must have the same length")
    _check_bytes(src, "src", False)
    _check_bytes(dst, "dst", True)
    cdef const int64_t* so = <const int64_t*>cnp.PyArray_DATA(src_off)
    cdef const int64_t* do = <const int64_t*>cnp.PyArray_DATA(dst_off)
    cdef const int64_t* ln = <const int64_t*>cnp.PyArray_DATA(length)
    cdef int64_t total = 0
    cdef Py_ssize_t bad
    with nogil:
        # One pass of checks first: a bookkeeping bug must raise, never overrun memory.
        bad = _first_outside(so, do, ln, n, src.shape[0], dst.shape[0], &total)
    if bad >= 0:
        raise ValueError(
            f"copy_blocks: block {bad} (src_off={so[bad]}, dst_off={do[bad]}, "
            f"length={ln[bad]}) exceeds src ({src.shape[0]} B) or dst ({dst.shape[0]} B)")
    if total == 0:
        return 0
    cdef const unsigned char* s = <const unsigned char*>cnp.PyArray_DATA(src)
    cdef unsigned char* d = <unsigned char*>cnp.PyArray_DATA(dst)
    with nogil:
        _copy_list(d, s, so, do, ln, n)
    return total


def side_bytes(cnp.ndarray counts not None, displs, int64_t elem, int64_t nbytes, bint no_overlap):
    """Scale one side's counts/displs (elements) to bytes and check them in one pass.

    ``counts``: a contiguous 1-D int64 array; ``displs`` one of the same length or None (packed
    prefix sums). Returns (count_bytes, displ_bytes, check, index, total bytes): ``check`` a
    ``SideCheck``, ``index`` the peer it concerns.
    """
    # Raw pointers rather than typed memoryviews: this runs twice on every new call's path, and
    # acquiring four memoryviews cost more than the loop.
    cdef Py_ssize_t n = _int64_1d(counts, "counts"), i
    cdef const int64_t* cnt = <const int64_t*>cnp.PyArray_DATA(counts)
    cdef const int64_t* d = NULL
    cdef bint packed = displs is None
    if not packed:
        if _int64_1d(displs, "displs") != n:
            raise ValueError("side_bytes: counts and displs differ in length")
        d = <const int64_t*>cnp.PyArray_DATA(<cnp.ndarray>displs)
    cdef cnp.npy_intp dims = n
    cdef cnp.ndarray out_c = cnp.PyArray_EMPTY(1, &dims, cnp.NPY_INT64, 0)
    cdef cnp.ndarray out_d = cnp.PyArray_EMPTY(1, &dims, cnp.NPY_INT64, 0)
    cdef int64_t* oc = <int64_t*>cnp.PyArray_DATA(out_c)
    cdef int64_t* od = <int64_t*>cnp.PyArray_DATA(out_d)
    cdef int64_t limit = (<int64_t>1 << 62) // (elem if elem > 0 else 1)
    cdef int64_t pos = 0, prev_end = 0, c, off, total = 0
    cdef SideCheck kind = SIDE_OK
    cdef Py_ssize_t where = 0
    with nogil:
        for i in range(n):
            c = cnt[i]
            off = pos if packed else d[i]
            if c < 0:
                kind, where = NEGATIVE_COUNT, i
                break
            if off < 0:
                kind, where = NEGATIVE_DISPL, i
                break
            if c > limit or off > limit:
                kind, where = OVERFLOW, i
                break
            oc[i] = c * elem
            od[i] = off * elem
            total += oc[i]  # at most 2**62 per block: a bad side stops at its first bad block
            pos += c
            if c > 0:
                if od[i] + oc[i] > nbytes:
                    kind, where = PAST_BUFFER, i
                    break
                if no_overlap and kind == SIDE_OK:
                    if od[i] < prev_end:
                        kind, where = NOT_ASCENDING, i  # bounds still checked; the caller sorts
                    else:
                        prev_end = od[i] + oc[i]
    return out_c, out_d, kind, where, total


cdef Py_ssize_t _int64_1d(object arr, str name) except -1:
    """The length of a contiguous 1-D int64 array; ValueError naming ``name`` otherwise."""
    if type(arr) is not np.ndarray and not isinstance(arr, np.ndarray):
        raise ValueError(f"{name} must be an int64 array")
    cdef cnp.ndarray a = <cnp.ndarray>arr
    if cnp.PyArray_TYPE(a) != cnp.NPY_INT64 or cnp.PyArray_NDIM(a) != 1 or not cnp.PyArray_IS_C_CONTIGUOUS(a):
        raise ValueError(f"{name} must be a contiguous 1-D int64 array")
    return a.shape[0]


cdef int _check_bytes(cnp.ndarray a, str name, bint writable) except -1:
    if cnp.PyArray_TYPE(a) != cnp.NPY_UINT8 or cnp.PyArray_NDIM(a) != 1 or not cnp.PyArray_IS_C_CONTIGUOUS(a):
        raise ValueError(f"copy_blocks: {name} must be a contiguous 1-D uint8 array")
    if writable and not cnp.PyArray_ISWRITEABLE(a):
        raise ValueError(f"copy_blocks: {name} is read-only")
    return 0


cdef cnp.ndarray _bytes_view(cnp.ndarray a):
    """A 1-D uint8 view of a C-contiguous array's bytes (read-only where ``a`` is), kept alive by ``a``:
    what ``np.frombuffer(a, np.uint8)`` gives, without the buffer protocol's round trip."""
    cdef cnp.npy_intp n = cnp.PyArray_NBYTES(a)
    cdef cnp.ndarray view = cnp.PyArray_SimpleNewFromData(1, &n, cnp.NPY_UINT8, cnp.PyArray_DATA(a))
    cnp.set_array_base(view, a)
    if not cnp.PyArray_ISWRITEABLE(a):
        cnp.PyArray_CLEARFLAGS(view, cnp.NPY_ARRAY_WRITEABLE)
    return view


cdef inline bint _int64_vector(object values, Py_ssize_t size):
    if type(values) is not np.ndarray:
        return False
    cdef cnp.ndarray a = <cnp.ndarray>values
    return (cnp.PyArray_TYPE(a) == cnp.NPY_INT64 and cnp.PyArray_NDIM(a) == 1 and a.shape[0] == size
            and cnp.PyArray_IS_C_CONTIGUOUS(a))


def common_vector(spec, Py_ssize_t size, bint writable, dict predefined, object datatype_type):
    """The form hot loops pass, ``[ndarray, int64 counts or (counts, displs), predefined datatype]``,
    read in one compiled pass: (uint8 view, count bytes, displacement bytes, element bytes, None,
    total bytes: ``msgspec.Side``'s fields), or None when the spec is not that form or not valid (the general reader then says why).

    ``predefined``: element bytes by datatype handle; ``datatype_type``: ``MPI.Datatype``.
    """
    if type(spec) is not list or len(<list>spec) != 3:
        return None
    buf, counts, datatype = <list>spec
    if type(buf) is not np.ndarray or type(datatype) is not datatype_type:
        return None
    cdef cnp.ndarray a = <cnp.ndarray>buf
    cdef Py_ssize_t nbytes = cnp.PyArray_NBYTES(a)
    if not cnp.PyArray_IS_C_CONTIGUOUS(a) or nbytes == 0 or (writable and not cnp.PyArray_ISWRITEABLE(a)):
        return None
    elem = predefined.get(datatype.handle)
    if elem is None:
        return None
    displs = None
    if type(counts) is tuple and len(<tuple>counts) == 2:
        counts, displs = <tuple>counts
        if displs is not None and not _int64_vector(displs, size):
            return None
    if not _int64_vector(counts, size):
        return None
    cb, db, kind, _, total = side_bytes(counts, displs, elem, nbytes, writable)
    if kind != SIDE_OK:
        return None
    return _bytes_view(a), cb, db, elem, None, total
