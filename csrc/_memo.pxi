# Spec memos: what recognises a call's specs when they come back. ``Saved`` (count and
# displacement arrays by content) and ``SavedType`` (datatypes by object) are the leaves of a
# remembered spec; ``spec_unchanged`` compares specs with one; ``TypedCall`` is one
# ``HierComm.Alltoallw`` call remembered as bytes, which ``find_typed`` finds again. ``CallTable``
# (``_calltable.pxi``) recognises its slots' specs with ``_leaf`` and ``_same_shape``. Included by
# ``_call.pyx``.
from cpython.object cimport PyObject_IsTrue
from libc.string cimport memcmp

cimport numpy as cnp


cdef inline object _leaf(object spec):
    """The data buffer of a spec: its first item, or the spec itself."""
    t = type(spec)
    if t is list or t is tuple:
        return spec[0] if len(<object>spec) else None
    return spec


cdef class Saved:
    """A count or displacement array of a remembered spec, held by content: its dtype and bytes.
    A later spec matches it with any contiguous array of that dtype and those bytes, so specs
    rebuilt every call (``np.array(counts)``) are recognised too."""
    cdef object descr
    cdef bytes data

    def __cinit__(self, cnp.ndarray arr not None):
        if not cnp.PyArray_IS_C_CONTIGUOUS(arr):
            raise TypeError("Saved: the array must be C-contiguous")
        self.descr = arr.dtype
        self.data = arr.tobytes()


cdef bint _same_content(object now, Saved then):
    cdef cnp.ndarray a
    cdef Py_ssize_t n
    if not cnp.PyArray_CheckExact(now):
        return False
    a = <cnp.ndarray>now
    n = cnp.PyArray_NBYTES(a)
    if not cnp.PyArray_IS_C_CONTIGUOUS(a) or n != len(then.data):
        return False
    descr = <object>cnp.PyArray_DESCR(a)  # read in C: this runs for every array of every call
    if descr is not then.descr and descr != then.descr:
        return False
    return n == 0 or memcmp(cnp.PyArray_DATA(a), <const char*>then.data, n) == 0


cdef class SavedType:
    """A datatype of a remembered Alltoallw spec: the object itself. A later spec matches it with
    that object only, and only while it is not freed (an mpi4py datatype is false once ``Free``
    has set its handle to ``MPI.DATATYPE_NULL``: a C slot to ask, where ``.handle`` is a Python
    property, on every peer's datatype of every call)."""
    cdef object datatype

    def __cinit__(self, datatype not None):
        self.datatype = datatype


cdef bint _same_shape(object now, object then):
    """Same spec structure: lists/tuples of equal length, the same leaf objects (ints by value,
    ``Saved`` arrays by content, ``SavedType`` datatypes by object and handle)."""
    cdef Py_ssize_t i, n
    if now is then:
        return True
    if type(then) is Saved:
        return _same_content(now, <Saved>then)
    if type(then) is SavedType:
        return now is (<SavedType>then).datatype and PyObject_IsTrue(now) == 1
    t = type(now)
    if t is not type(then):
        return False
    if t is list or t is tuple:
        n = len(<object>now)
        if n != len(<object>then):
            return False
        for i in range(n):
            if not _same_shape(now[i], then[i]):
                return False
        return True
    if t is int:
        return now == then
    return False


def spec_unchanged(now, tuple then):
    """Whether the specs ``now`` (send, receive) are the specs ``then`` of an earlier call (a copy
    of their lists and tuples, count and displacement arrays as ``Saved``): the same structure,
    the same data buffers and datatypes, ints by value, arrays by content."""
    return _same_shape(now[0], then[0]) and _same_shape(now[1], then[1])


cdef object _saved(object item, int depth):
    """A copy of one part of an Alltoallw spec for ``TypedCall``: lists and tuples copied (two
    levels deep), integer arrays as ``Saved``, datatypes as ``SavedType``, ints and None kept;
    TypeError for anything else (a leaf that could change unseen)."""
    t = type(item)
    if t is list or t is tuple:
        if depth > 2:
            raise TypeError("nested too deep")
        out = [_saved(x, depth + 1) for x in <object>item]
        return out if t is list else tuple(out)
    if t is np.ndarray:
        return Saved(item)
    if t is int or item is None:
        return item
    if isinstance(item, MPI.Datatype):
        return SavedType(item)
    raise TypeError(f"{t.__name__} is not remembered")


cdef int _LAYOUT_FLAGS = cnp.NPY_ARRAY_C_CONTIGUOUS | cnp.NPY_ARRAY_F_CONTIGUOUS


cdef object _typed_spec(object spec):
    """``_saved`` of an Alltoallw spec whose data buffer, its first item, is a contiguous numpy
    array (kept as the object itself); TypeError for any other."""
    t = type(spec)
    if (t is not list and t is not tuple) or not len(<object>spec) or type(spec[0]) is not np.ndarray \
            or not cnp.PyArray_FLAGS(<cnp.ndarray>spec[0]) & _LAYOUT_FLAGS:
        raise TypeError("not a spec of a numpy array")
    out = [spec[0]] + [_saved(x, 1) for x in spec[1:]]
    return out if t is list else tuple(out)


cdef class TypedCall:
    """One ``HierComm.Alltoallw`` call as bytes, made once and run again while its specs are
    unchanged: the byte specs of the ``Alltoallv`` that moves it (the same list, array and count
    objects every run, so the compiled hit path recognises them), and the compiled copies that
    pack the send side's blocks before and scatter the received ones after (``Program``, or None
    where a side moves in place in the caller's buffer).

    ``recognise`` makes it recognisable: the specs' data buffers (numpy arrays) by object,
    address, bytes, memory order and, for the receive side, writability; their counts and
    displacements by value (arrays by content); their datatypes by object and handle; the call's
    algorithm and ``validate``. ``matches`` then says whether a later call's specs are these.
    """
    #: the ``Alltoallv`` specs and the copies around it
    cdef readonly object send_spec, recv_spec, pack, unpack
    #: (send view, send runs or None, receive view, receive runs or None): what a run that moves
    #: the call straight from and to the caller's buffers is composed from
    #: (``alltoallw.composed``), or None where the call has nothing to compose
    cdef public object parts
    #: the caller's own (send, receive) specs, which MPI's persistent ``Alltoallw_init`` takes as
    #: they are (a flat run bound for good: ``engine.Engine.bind``)
    cdef public object user
    cdef tuple then
    cdef object send_leaf, recv_leaf, algorithm
    cdef void* send_data
    cdef void* recv_data
    cdef Py_ssize_t send_nbytes, recv_nbytes
    cdef int send_flags, recv_flags
    cdef bint validate

    def __cinit__(self, send_spec, recv_spec, pack, unpack):
        self.send_spec, self.recv_spec, self.pack, self.unpack = send_spec, recv_spec, pack, unpack
        self.then = self.parts = None

    def recognise(self, sendbuf, recvbuf, algorithm, bint validate):
        """Remember these specs (those this call was made from); False where they cannot be
        recognised cheaply (a buffer that is not a numpy array, a leaf of another type)."""
        try:
            then = (sendbuf if sendbuf is MPI.IN_PLACE else _typed_spec(sendbuf), _typed_spec(recvbuf))
        except TypeError:
            return False
        self.send_leaf, self.recv_leaf = _leaf(then[0]), _leaf(then[1])
        if self.send_leaf is not MPI.IN_PLACE:
            self.send_data = cnp.PyArray_DATA(<cnp.ndarray>self.send_leaf)
            self.send_nbytes = cnp.PyArray_NBYTES(<cnp.ndarray>self.send_leaf)
            self.send_flags = cnp.PyArray_FLAGS(<cnp.ndarray>self.send_leaf) & _LAYOUT_FLAGS
        self.recv_data = cnp.PyArray_DATA(<cnp.ndarray>self.recv_leaf)
        self.recv_nbytes = cnp.PyArray_NBYTES(<cnp.ndarray>self.recv_leaf)
        self.recv_flags = cnp.PyArray_FLAGS(<cnp.ndarray>self.recv_leaf) & _LAYOUT_FLAGS
        self.algorithm, self.validate, self.then = algorithm, validate, then
        return True

    @property
    def leaves(self):
        """(send data buffer or ``MPI.IN_PLACE``, receive data buffer) recognised, or None."""
        return (self.send_leaf, self.recv_leaf) if self.then is not None else None

    cdef bint matches(self, sendbuf, recvbuf, algorithm, validate):
        cdef cnp.ndarray a
        if self.then is None or self.validate != bool(validate) \
                or not (self.algorithm is algorithm or self.algorithm == algorithm):
            return False
        if self.send_leaf is not MPI.IN_PLACE:
            a = <cnp.ndarray>self.send_leaf
            if cnp.PyArray_DATA(a) != self.send_data or cnp.PyArray_NBYTES(a) != self.send_nbytes \
                    or cnp.PyArray_FLAGS(a) & _LAYOUT_FLAGS != self.send_flags:
                return False
        a = <cnp.ndarray>self.recv_leaf
        if cnp.PyArray_DATA(a) != self.recv_data or cnp.PyArray_NBYTES(a) != self.recv_nbytes \
                or cnp.PyArray_FLAGS(a) & _LAYOUT_FLAGS != self.recv_flags or not cnp.PyArray_ISWRITEABLE(a):
            return False
        return _same_shape(sendbuf, self.then[0]) and _same_shape(recvbuf, self.then[1])


def find_typed(list calls, sendbuf, recvbuf, algorithm, validate):
    """The ``TypedCall`` of ``calls`` that recognises these Alltoallw specs, or None (the first
    one remembered for the same data buffers decides)."""
    cdef TypedCall c
    send = sendbuf if sendbuf is MPI.IN_PLACE else _leaf(sendbuf)
    recv = _leaf(recvbuf)
    for c in calls:
        if c.send_leaf is send and c.recv_leaf is recv:
            return c if c.matches(sendbuf, recvbuf, algorithm, validate) else None
    return None
