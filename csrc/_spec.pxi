# Reading one side of a vector spec in compiled code: the common spec form and the scaling of its
# counts and displacements to checked bytes. Included by ``_packing.pyx`` (``side_bytes`` and
# ``common_vector``, what ``msgspec`` calls) and ``_call.pyx`` (the compiled miss path), so that
# both compile the one definition.
from cpython.long cimport PyLong_AsLongLongAndOverflow
from libc.stdint cimport int64_t

cimport numpy as cnp


cpdef enum SideCheck:
    # ``side_bytes``'s verdict on one side's counts and displacements (``msgspec`` words each one).
    SIDE_OK = 0
    NEGATIVE_COUNT = 1
    NEGATIVE_DISPL = 2
    PAST_BUFFER = 3      # a block ends past the buffer
    OVERFLOW = 4         # a count or displacement past 2**62 bytes
    NOT_ASCENDING = 5    # non-empty blocks out of order (only with ``no_overlap``): the caller sorts


cdef struct IntVec:
    # A contiguous integer array of one spec part, read in place: int64 or C int.
    const void* data     # NULL: absent (packed displacements)
    bint wide            # int64 (else C int)


cdef inline int64_t _at(IntVec v, Py_ssize_t i) noexcept nogil:
    return (<const int64_t*>v.data)[i] if v.wide else <int64_t>(<const int*>v.data)[i]


cdef SideCheck _scale_side(IntVec cnt, IntVec d, Py_ssize_t n, int64_t elem, int64_t nbytes, bint no_overlap,
                           int64_t* oc, int64_t* od, Py_ssize_t* where, int64_t* total) noexcept nogil:
    """Counts/displs (elements) to bytes in ``oc``/``od``, each block checked against a buffer of
    ``nbytes``; stops at the first bad block (its index in ``where``). ``total``: bytes of all
    blocks."""
    cdef int64_t limit = (<int64_t>1 << 62) // (elem if elem > 0 else 1)
    cdef int64_t pos = 0, prev_end = 0, c, off
    cdef bint packed = d.data == NULL
    cdef SideCheck kind = SIDE_OK
    cdef Py_ssize_t i
    total[0] = 0
    for i in range(n):
        c = _at(cnt, i)
        off = pos if packed else _at(d, i)
        if c < 0:
            where[0] = i
            return NEGATIVE_COUNT
        if off < 0:
            where[0] = i
            return NEGATIVE_DISPL
        if c > limit or off > limit:
            where[0] = i
            return OVERFLOW
        oc[i] = c * elem
        od[i] = off * elem
        total[0] += oc[i]  # at most 2**62 per block: a bad side stops at its first bad block
        pos += c
        if c > 0:
            if od[i] + oc[i] > nbytes:
                where[0] = i
                return PAST_BUFFER
            if no_overlap and kind == SIDE_OK:
                if od[i] < prev_end:
                    kind, where[0] = NOT_ASCENDING, i  # bounds still checked; the caller sorts
                else:
                    prev_end = od[i] + oc[i]
    return kind


cdef bint _int_list(list values, Py_ssize_t size, int64_t* into):
    """Whether ``values`` is a list of ``size`` Python ints (not bools) that fit in int64, copied
    ``into`` (the caller's scratch of ``size``)."""
    cdef Py_ssize_t i
    cdef int overflow
    if len(values) != size:
        return False
    for i in range(size):
        item = values[i]
        if type(item) is not int:
            return False
        into[i] = PyLong_AsLongLongAndOverflow(item, &overflow)
        if overflow:
            return False
    return True


cdef inline bint _int_vector(object values, Py_ssize_t size, IntVec* out, int64_t* lists):
    """Whether ``values`` is a contiguous 1-D int64 or C int array of ``size`` entries (read in
    ``out``) or, where ``lists`` (scratch of ``size``) is given, a list of ``size`` Python ints,
    copied there."""
    cdef cnp.ndarray a
    cdef int t
    if type(values) is not cnp.ndarray:
        if lists != NULL and type(values) is list and _int_list(<list>values, size, lists):
            out.data, out.wide = lists, True
            return True
        return False
    a = <cnp.ndarray>values
    t = cnp.PyArray_TYPE(a)
    if (t != cnp.NPY_INT64 and t != cnp.NPY_INT) or cnp.PyArray_NDIM(a) != 1 or a.shape[0] != size \
            or not cnp.PyArray_IS_C_CONTIGUOUS(a):
        return False
    out.data, out.wide = cnp.PyArray_DATA(a), t == cnp.NPY_INT64
    return True


cdef object _common_form(object spec, Py_ssize_t size, bint writable, dict predefined, object datatype_type,
                         IntVec* counts, IntVec* displs, int64_t* elem, int64_t* lists):
    """The data array of a spec of the form hot loops pass, ``[ndarray, counts, displs, datatype]``
    or ``[ndarray, counts or (counts, displs)(, datatype)]`` (a list or tuple; counts and displs
    contiguous int64 or C int arrays, one per rank, or lists of Python ints where ``lists``, scratch
    of 2 x ``size`` int64, is given; a predefined datatype, or none for the buffer's items; a
    non-empty C-contiguous buffer, writable for a receive side), with its parts read into
    ``counts``, ``displs`` and ``elem``; None for any other spec (the general reader then parses
    it, and says what is wrong)."""
    cdef Py_ssize_t n
    cdef cnp.ndarray a
    counts.data = displs.data = NULL
    counts.wide = displs.wide = True
    elem[0] = 1
    t = type(spec)
    if t is not list and t is not tuple:
        return None
    n = len(spec)
    datatype = dis = None
    if n == 4:
        buf, cnt, dis, datatype = spec
    elif n == 3 or n == 2:
        if n == 3:
            buf, cnt, datatype = spec
        else:
            buf, cnt = spec
        if type(cnt) is tuple:  # in a vector spec only a tuple there is (counts, displs)
            if len(<tuple>cnt) != 2:
                return None
            cnt, dis = <tuple>cnt
    else:
        return None
    if type(buf) is not cnp.ndarray or (datatype is not None and type(datatype) is not datatype_type):
        return None
    a = <cnp.ndarray>buf
    if not cnp.PyArray_IS_C_CONTIGUOUS(a) or cnp.PyArray_NBYTES(a) == 0 \
            or (writable and not cnp.PyArray_ISWRITEABLE(a)):
        return None
    if datatype is None:  # counts in the buffer's own items, as the general reader takes them
        got = cnp.PyArray_ITEMSIZE(a)
    else:
        got = predefined.get(datatype.handle)
        if got is None:
            return None
    if not _int_vector(cnt, size, counts, lists):
        return None
    if dis is not None and not _int_vector(dis, size, displs, lists + size if lists != NULL else NULL):
        return None
    elem[0] = <int64_t>got
    return a



cdef object _read_vector(object spec, Py_ssize_t size, bint writable, dict predefined, object datatype_type,
                         int64_t* oc, int64_t* od, int64_t* elem, int64_t* total, int64_t* lists=NULL):
    """The data array of a vector spec of the common form (``_common_form``; ``lists``: its scratch
    for counts and displacements given as lists, or NULL), its counts and displacements in bytes
    in ``oc``/``od`` (every block in the buffer; a receive side's in ascending order), or None: not
    that form, or not valid (the general reader says why)."""
    cdef IntVec c, d
    cdef Py_ssize_t where
    cdef int64_t nbytes
    cdef SideCheck check
    a = _common_form(spec, size, writable, predefined, datatype_type, &c, &d, elem, lists)
    if a is None:
        return None
    nbytes = cnp.PyArray_NBYTES(<cnp.ndarray>a)
    with nogil:
        check = _scale_side(c, d, size, elem[0], nbytes, writable, oc, od, &where, total)
    return a if check == SIDE_OK else None

cdef object _uniform_form(object spec, Py_ssize_t size, bint writable, dict predefined, object datatype_type,
                          int64_t* block, int64_t* elem):
    """The data array of an ``Alltoall`` spec of the form hot loops pass, a non-empty C-contiguous
    ndarray or ``[ndarray, datatype]`` (a list or tuple; a predefined datatype, else the buffer's
    items; writable for a receive side) that splits in ``size`` equal blocks of whole elements,
    with the bytes of one block in ``block`` and of one element in ``elem``; None for any other
    spec (the general reader then parses it, and says what is wrong)."""
    cdef cnp.ndarray a
    cdef int64_t nbytes
    datatype = None
    block[0], elem[0] = 0, 1
    t = type(spec)
    if t is list or t is tuple:
        if len(spec) != 2:
            return None
        buf, datatype = spec
        if type(datatype) is not datatype_type:
            return None
    else:
        buf = spec
    if type(buf) is not cnp.ndarray:
        return None
    a = <cnp.ndarray>buf
    nbytes = cnp.PyArray_NBYTES(a)
    if not cnp.PyArray_IS_C_CONTIGUOUS(a) or nbytes == 0 or (writable and not cnp.PyArray_ISWRITEABLE(a)):
        return None
    if datatype is None:
        elem[0] = cnp.PyArray_ITEMSIZE(a)
    else:
        got = predefined.get(datatype.handle)
        if got is None:
            return None
        elem[0] = got
    if nbytes % elem[0] or (nbytes // elem[0]) % size:
        return None
    block[0] = nbytes // elem[0] // size * elem[0]
    return a
