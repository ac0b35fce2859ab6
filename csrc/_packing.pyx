"""Block copy kernels for the hierarchical exchange: gather blocks into a phase layout, scatter back.

All offsets and lengths are int64 byte counts. The copy loop runs without the GIL and does no
Python-object work per block; bounds are checked once per call, before any byte moves.
"""
from libc.stdint cimport int64_t

cimport numpy as cnp
import numpy as np

cnp.import_array()

include "_copy.pxi"
include "_spec.pxi"


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
    cdef Py_ssize_t n = _int64_1d(counts, "counts"), where = 0
    cdef IntVec c, d
    c.data, c.wide, d.data, d.wide = cnp.PyArray_DATA(counts), True, NULL, True
    if displs is not None:
        if _int64_1d(displs, "displs") != n:
            raise ValueError("side_bytes: counts and displs differ in length")
        d.data = cnp.PyArray_DATA(<cnp.ndarray>displs)
    cdef cnp.npy_intp dims = n
    cdef cnp.ndarray out_c = cnp.PyArray_EMPTY(1, &dims, cnp.NPY_INT64, 0)
    cdef cnp.ndarray out_d = cnp.PyArray_EMPTY(1, &dims, cnp.NPY_INT64, 0)
    cdef int64_t total = 0
    cdef SideCheck kind
    with nogil:
        kind = _scale_side(c, d, n, elem, nbytes, no_overlap, <int64_t*>cnp.PyArray_DATA(out_c),
                           <int64_t*>cnp.PyArray_DATA(out_d), &where, &total)
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


def common_vector(spec, Py_ssize_t size, bint writable, dict predefined, object datatype_type):
    """The form hot loops pass (``_common_form``: an ndarray, int64 or C int counts and
    displacements, a predefined datatype), read in one compiled pass: (uint8 view, count bytes,
    displacement bytes, element bytes, None, total bytes: ``msgspec.Side``'s fields), or None when
    the spec is not that form or not valid (the general reader then says why).

    ``predefined``: element bytes by datatype handle; ``datatype_type``: ``MPI.Datatype``.
    """
    cdef int64_t elem, total
    cdef cnp.npy_intp dims = size
    cdef cnp.ndarray cb = cnp.PyArray_EMPTY(1, &dims, cnp.NPY_INT64, 0)
    cdef cnp.ndarray db = cnp.PyArray_EMPTY(1, &dims, cnp.NPY_INT64, 0)
    a = _read_vector(spec, size, writable, predefined, datatype_type, <int64_t*>cnp.PyArray_DATA(cb),
                     <int64_t*>cnp.PyArray_DATA(db), &elem, &total)
    if a is None:
        return None
    return _bytes_view(a), cb, db, elem, None, total


def common_block(spec, Py_ssize_t size, bint writable, dict predefined, object datatype_type):
    """The ``Alltoall`` spec form hot loops pass (``_uniform_form``: an ndarray, optionally with a
    predefined datatype, in ``size`` equal blocks), read in one compiled pass: ``common_vector``'s
    result for it, or None when the spec is not that form (the general reader then parses it)."""
    cdef int64_t block, elem
    cdef Py_ssize_t i
    a = _uniform_form(spec, size, writable, predefined, datatype_type, &block, &elem)
    if a is None:
        return None
    cdef cnp.npy_intp dims = size
    cdef cnp.ndarray cb = cnp.PyArray_EMPTY(1, &dims, cnp.NPY_INT64, 0)
    cdef cnp.ndarray db = cnp.PyArray_EMPTY(1, &dims, cnp.NPY_INT64, 0)
    cdef int64_t* c = <int64_t*>cnp.PyArray_DATA(cb)
    cdef int64_t* d = <int64_t*>cnp.PyArray_DATA(db)
    for i in range(size):
        c[i], d[i] = block, i * block
    return _bytes_view(a), cb, db, elem, None, size * block
