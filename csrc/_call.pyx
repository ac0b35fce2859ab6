"""The compiled hit path of a one-shot call: recognise the specs, agree, run the bound run.

A ``CallTable`` belongs to one ``HierComm``. It keeps, for each plan-cache slot whose specs were
seen again, a ``Slot``: what recognises those specs (their structure, data buffers and datatypes
by identity, count and displacement arrays by content, the buffers' dtypes, writability and
data addresses), the
rank's agreement record for them, and the persistent run bound to their buffers. A call whose
specs a slot recognises then runs from ``HierComm.Alltoallv``'s entry to its return here: fill
the record from the slot's, Start and Wait the agreement's persistent Allreduce, read the
verdict, and Start and Wait the run's persistent requests, with no Python frame between the MPI
calls and without the GIL while MPI works. Every other call, and a recognised call whose verdict
is not a clean hit, goes on in Python (``HierComm._general``), which also fills and empties the
table.

Misses of the common spec form (``CallTable.miss_path``) are parsed, agreed and run here too: flat
(``MPI_Alltoallv``/``MPI_Alltoall``), flat Bruck (``BruckOnce``), or hierarchical on plain,
pairwise or Bruck lanes (the node ``MPI_Allgather``, the planner's step program, and ``Runner``,
which runs any step program: one C loop over its steps). So are hits of a cached pattern on new
buffers, which run the entry's kept program.

MPI is reached through ``MPI_Start`` and ``MPI_Wait`` pointers that ``dlsym`` finds through the
mpi4py extension that is loaded (``docs/performance/exchange.md``, "Reaching MPI from compiled
code"): both take request handles by pointer, alike in every MPI family, so this module needs no
MPI header. Every request is built by mpi4py; a handle is passed by its address
(``MPI._addressof``). Statuses go to a scratch buffer: ``MPI_STATUS_IGNORE`` differs by family.
"""
from libc.stdint cimport int64_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport free, malloc
from cpython.object cimport PyObject_IsTrue
from libc.string cimport memcmp, memcpy
from posix.dlfcn cimport RTLD_LAZY, dlopen, dlsym

cimport numpy as cnp
import numpy as np
from mpi4py import MPI

cnp.import_array()

include "_record.pxi"
include "_copy.pxi"
include "_spec.pxi"
include "_steps.pxi"

ctypedef int (*start_t)(void*) noexcept nogil
ctypedef int (*wait_t)(void*, void*) noexcept nogil
ctypedef int (*test_t)(void*, int*, void*) noexcept nogil
# MPI_Alltoallv and MPI_Alltoall with the family's handle type: a pointer (Open MPI) or an int (MPICH).
ctypedef int (*alltoallv_ptr_t)(const void*, const int*, const int*, void*, void*, const int*, const int*,
                                void*, void*) noexcept nogil
ctypedef int (*alltoallv_int_t)(const void*, const int*, const int*, int, void*, const int*, const int*,
                                int, int) noexcept nogil
# MPI_Alltoall and MPI_Allgather have one signature.
ctypedef int (*alltoall_ptr_t)(const void*, int, void*, void*, int, void*, void*) noexcept nogil
ctypedef int (*alltoall_int_t)(const void*, int, int, void*, int, int, int) noexcept nogil
ctypedef int (*ialltoallv_ptr_t)(const void*, const int*, const int*, void*, void*, const int*, const int*,
                                 void*, void*, void*) noexcept nogil
ctypedef int (*ialltoallv_int_t)(const void*, const int*, const int*, int, void*, const int*, const int*,
                                 int, int, void*) noexcept nogil
ctypedef int (*barrier_ptr_t)(void*) noexcept nogil
ctypedef int (*barrier_int_t)(int) noexcept nogil
cdef start_t _mpi_start = NULL
cdef wait_t _mpi_wait = NULL
cdef test_t _mpi_test = NULL
cdef void* _mpi_alltoallv = NULL
cdef void* _mpi_alltoall = NULL
cdef void* _mpi_ialltoallv = NULL
cdef void* _mpi_allgather = NULL
cdef void* _mpi_barrier = NULL
cdef void* _mpi_isend = NULL
cdef void* _mpi_mprobe = NULL
cdef void* _mpi_get_count = NULL
cdef void* _mpi_imrecv = NULL
cdef void* _mpi_irecv = NULL
cdef int _handle_bytes = 0   # 8 or 4 (the miss path's MPI_Alltoallv is used only then)

cdef enum:
    STATUS_BYTES = 256   # more than any family's MPI_Status (checked at import)


cdef _resolve():
    global _mpi_start, _mpi_wait, _mpi_alltoallv, _mpi_alltoall, _handle_bytes, _mpi_ialltoallv, _mpi_allgather
    global _mpi_barrier, _mpi_isend, _mpi_mprobe, _mpi_get_count, _mpi_imrecv, _mpi_irecv, _mpi_test
    path = MPI.__file__.encode()
    handle = dlopen(path, RTLD_LAZY)  # already loaded: the same handle, its libmpi among its dependencies
    if handle != NULL:
        _mpi_start = <start_t>dlsym(handle, "MPI_Start")
        _mpi_wait = <wait_t>dlsym(handle, "MPI_Wait")
        _mpi_test = <test_t>dlsym(handle, "MPI_Test")
        _mpi_alltoallv = dlsym(handle, "MPI_Alltoallv")
        _mpi_alltoall = dlsym(handle, "MPI_Alltoall")
        _mpi_ialltoallv = dlsym(handle, "MPI_Ialltoallv")
        _mpi_allgather = dlsym(handle, "MPI_Allgather")
        _mpi_barrier = dlsym(handle, "MPI_Barrier")
        _mpi_isend = dlsym(handle, "MPI_Isend")
        _mpi_mprobe = dlsym(handle, "MPI_Mprobe")
        _mpi_get_count = dlsym(handle, "MPI_Get_count")
        _mpi_imrecv = dlsym(handle, "MPI_Imrecv")
        _mpi_irecv = dlsym(handle, "MPI_Irecv")
    if _mpi_start == NULL or _mpi_wait == NULL or _mpi_test == NULL:
        raise ImportError(f"hxmpi: MPI_Start, MPI_Wait and MPI_Test not found through {path.decode()} "
                          f"(mpi4py's extension)")
    if MPI._sizeof(MPI.Status) > STATUS_BYTES:
        raise ImportError(f"hxmpi: this MPI's MPI_Status ({MPI._sizeof(MPI.Status)} B) is larger than "
                          f"{STATUS_BYTES} B")


    if MPI._sizeof(MPI.Comm) == MPI._sizeof(MPI.Datatype) and MPI._sizeof(MPI.Comm) in (4, 8):
        _handle_bytes = MPI._sizeof(MPI.Comm)


_resolve()


cdef int _alltoallv(const void* sbuf, const int* sc, const int* sd, void* rbuf, const int* rc, const int* rd,
                    uint64_t datatype, uint64_t comm) noexcept nogil:
    """MPI_Alltoallv of ``datatype`` elements on ``comm`` (handles as ``.handle`` gives them)."""
    if _handle_bytes == 8:
        return (<alltoallv_ptr_t>_mpi_alltoallv)(sbuf, sc, sd, <void*><uintptr_t>datatype, rbuf, rc, rd,
                                                 <void*><uintptr_t>datatype, <void*><uintptr_t>comm)
    # An int handle: its low 32 bits (mpi4py gives MPICH's negative ones sign-extended).
    return (<alltoallv_int_t>_mpi_alltoallv)(sbuf, sc, sd, <int><uint32_t>datatype, rbuf, rc, rd,
                                             <int><uint32_t>datatype, <int><uint32_t>comm)


cdef int _alltoall(const void* sbuf, int scount, void* rbuf, int rcount, uint64_t datatype,
                   uint64_t comm) noexcept nogil:
    """MPI_Alltoall of ``scount`` (``rcount``) ``datatype`` elements per rank on ``comm`` (as ``_alltoallv``)."""
    if _handle_bytes == 8:
        return (<alltoall_ptr_t>_mpi_alltoall)(sbuf, scount, <void*><uintptr_t>datatype, rbuf, rcount,
                                               <void*><uintptr_t>datatype, <void*><uintptr_t>comm)
    return (<alltoall_int_t>_mpi_alltoall)(sbuf, scount, <int><uint32_t>datatype, rbuf, rcount,
                                           <int><uint32_t>datatype, <int><uint32_t>comm)


cdef int _apart(const int* counts, int* displs, Py_ssize_t n) noexcept nogil:
    """An exchange within one buffer (multi-leader's, in the node window) passes MPI a send buffer
    that starts higher than the receive buffer: libnbc takes equal starts for ``MPI_IN_PLACE`` and
    MPICH refuses them as aliased. Moves ``displs`` down by the first byte sent (at least 1: the
    planner leaves byte 0 unused) and returns that shift; an unsent peer's displacement is 0."""
    cdef Py_ssize_t k
    cdef int shift = -1
    for k in range(n):
        if counts[k] > 0 and (shift < 0 or displs[k] < shift):
            shift = displs[k]
    if shift < 1:
        shift = 1
    for k in range(n):
        displs[k] = displs[k] - shift if counts[k] > 0 else 0
    return shift


cdef int _ialltoallv(const void* sbuf, const int* sc, const int* sd, void* rbuf, const int* rc, const int* rd,
                     uint64_t datatype, uint64_t comm, uint64_t* request) noexcept nogil:
    """MPI_Ialltoallv (as ``_alltoallv``); the request handle goes to ``request``, zeroed first (an
    MPICH handle fills its low 4 bytes, which ``MPI_Wait`` reads back from the same address)."""
    request[0] = 0
    if _handle_bytes == 8:
        return (<ialltoallv_ptr_t>_mpi_ialltoallv)(sbuf, sc, sd, <void*><uintptr_t>datatype, rbuf, rc, rd,
                                                   <void*><uintptr_t>datatype, <void*><uintptr_t>comm, request)
    return (<ialltoallv_int_t>_mpi_ialltoallv)(sbuf, sc, sd, <int><uint32_t>datatype, rbuf, rc, rd,
                                               <int><uint32_t>datatype, <int><uint32_t>comm, request)


cdef int _allgather(const void* sbuf, int count, void* rbuf, uint64_t datatype, uint64_t comm) noexcept nogil:
    """MPI_Allgather of ``count`` ``datatype`` elements per rank (as ``_alltoallv``)."""
    if _handle_bytes == 8:
        return (<alltoall_ptr_t>_mpi_allgather)(sbuf, count, <void*><uintptr_t>datatype, rbuf, count,
                                                <void*><uintptr_t>datatype, <void*><uintptr_t>comm)
    return (<alltoall_int_t>_mpi_allgather)(sbuf, count, <int><uint32_t>datatype, rbuf, count,
                                            <int><uint32_t>datatype, <int><uint32_t>comm)


cdef int _barrier(uint64_t comm) noexcept nogil:
    """MPI_Barrier (as ``_alltoallv``)."""
    if _handle_bytes == 8:
        return (<barrier_ptr_t>_mpi_barrier)(<void*><uintptr_t>comm)
    return (<barrier_int_t>_mpi_barrier)(<int><uint32_t>comm)


#: ``CallTable.call``'s results: not recognised (nothing communicated), agreed but not a clean hit
#: or a miss the compiled path does not run (``take_pending``), done, done as a miss whose pattern
#: the plan cache keeps (``last_flags``: its verdict).
NOT_FOUND, AGREED, DONE, KEEP = 0, 1, 2, 3

cdef enum:
    # How ``CallTable._miss`` runs an agreed miss.
    ROUTE_PYTHON = 0
    ROUTE_FLAT = 1
    ROUTE_HIER = 2
    ROUTE_BRUCK = 3

cdef int _NOT_CLEAN = PROBLEM | SETTINGS | PAIRS | ANY_OVER_BUDGET
cdef int _CLEAN = HIT | ALL_SAME_BUFFERS


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


cdef extern from *:
    """
    static inline void hx_fence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
    """
    void hx_fence() noexcept nogil


cdef enum BoundKind:
    COPY = 0       # a copy list of ``n`` blocks
    REQUESTS = 1   # Start, then Wait, ``n`` persistent requests (``handles``)
    BARRIER = 2    # the same for a barrier request, between full memory fences
    SUB = 3        # another program's ``n`` steps (``sub``)


cdef struct Step:
    BoundKind kind
    const unsigned char* src
    unsigned char* dst
    const int64_t* src_off
    const int64_t* dst_off
    const int64_t* length
    Py_ssize_t n
    void** handles
    Step* sub


cdef int _start_wait(void** handles, Py_ssize_t n, char* status) noexcept nogil:
    """Start every request, then wait for every one; the first MPI error code, or 0."""
    cdef Py_ssize_t i
    cdef int err
    for i in range(n):
        err = _mpi_start(handles[i])
        if err:
            return err
    for i in range(n):
        err = _mpi_wait(handles[i], status)
        if err:
            return err
    return 0


cdef int _run_steps(Step* steps, Py_ssize_t n, char* status) noexcept nogil:
    """Run ``n`` steps; the first MPI error code, or 0."""
    cdef Py_ssize_t i
    cdef int err = 0
    cdef Step* st
    for i in range(n):
        st = &steps[i]
        if st.kind == COPY:
            _copy_list(st.dst, st.src, st.src_off, st.dst_off, st.length, st.n)
        elif st.kind == SUB:
            err = _run_steps(st.sub, st.n, status)
        elif st.kind == BARRIER:
            # The node window's barrier: MPI_Win_sync on a shared-memory window is a full memory
            # fence in both families; the fences order this rank's window writes before the
            # barrier and the others' reads after it.
            hx_fence()
            err = _start_wait(st.handles, st.n, status)
            hx_fence()
        else:
            err = _start_wait(st.handles, st.n, status)
        if err:
            return err
    return 0


cdef Py_ssize_t _flat_count(const Step* steps, Py_ssize_t n) noexcept nogil:
    """Steps of ``steps`` with every ``SUB`` step replaced by its own steps (recursively)."""
    cdef Py_ssize_t i, total = 0
    for i in range(n):
        total += _flat_count(steps[i].sub, steps[i].n) if steps[i].kind == SUB else 1
    return total


cdef Py_ssize_t _flatten(const Step* steps, Py_ssize_t n, Step* out) noexcept nogil:
    """Copy ``steps`` into ``out`` with sub-programs inlined (their buffers and handles stay
    theirs: the program keeps them alive); the steps written."""
    cdef Py_ssize_t i, k = 0
    for i in range(n):
        if steps[i].kind == SUB:
            k += _flatten(steps[i].sub, steps[i].n, out + k)
        else:
            out[k] = steps[i]
            k += 1
    return k


cdef class Program:
    """A run as compiled steps over fixed buffers, executed without the GIL and without Python
    between them: block copies, and Start + Wait of MPI persistent requests (built by mpi4py).

    ``steps``: a list of ``("copy", src, src_off, dst, dst_off, length)`` (contiguous 1-D uint8
    buffers, ``dst`` writable; int64 byte lists of one length, checked against the buffers here,
    once); ``("mpi", requests)`` (mpi4py persistent requests: every one started, then every one
    waited); ``("barrier", request)`` (a persistent barrier between memory fences: a node window's
    barrier); ``("program", program)`` (another program's steps). The program keeps what it points
    into alive; the requests stay their owner's.

    ``run()`` runs it blocking; ``start()`` and ``wait()`` split it, for a persistent request's
    Start and Wait, after the Start of the first top-level ``"mpi"`` step (without one, ``start``
    runs it whole). ``begin()``, ``test()`` and ``finish()`` run it as a state machine instead
    (a nonblocking request's): each call goes as far as it can without waiting, copies as soon
    as the requests before them complete (``MPI_Test``), next requests started at once.
    """
    cdef Step* _steps
    cdef Py_ssize_t _n
    cdef Step* _flat         # the steps with sub-programs inlined (``begin``'s, made at the first)
    cdef Py_ssize_t _nflat
    cdef Py_ssize_t _pos     # the state machine's next step
    cdef bint _posted        # its requests are started
    cdef bint _begun         # a ``begin`` not yet completed
    cdef void** _handles
    cdef list _keep
    cdef list _requests
    cdef char _status[STATUS_BYTES]
    cdef Py_ssize_t _split   # the first top-level REQUESTS step (``start`` ends with its Start), or -1
    cdef bint _started

    def __cinit__(self, list steps):
        cdef Py_ssize_t i, j = 0, nh = 0, bad
        cdef int64_t total
        cdef cnp.ndarray src, dst, so, do, ln
        cdef Step* st
        self._keep, self._requests = [], []
        for step in steps:
            if step[0] == "mpi":
                nh += len(step[1])
            elif step[0] == "barrier":
                nh += 1
        self._steps = <Step*>malloc(max(len(steps), 1) * sizeof(Step))
        self._handles = <void**>malloc(max(nh, 1) * sizeof(void*))
        if self._steps == NULL or self._handles == NULL:
            raise MemoryError()
        self._n = 0
        for i, step in enumerate(steps):
            st = &self._steps[i]
            st.sub, st.handles = NULL, NULL
            if step[0] in ("mpi", "barrier"):
                requests = step[1] if step[0] == "mpi" else [step[1]]
                st.kind = REQUESTS if step[0] == "mpi" else BARRIER
                st.handles, st.n = &self._handles[j], len(requests)
                for req in requests:
                    self._handles[j] = <void*><uintptr_t>MPI._addressof(req)
                    self._requests.append(req)
                    j += 1
            elif step[0] == "program":
                sub = <Program?>step[1]
                if sub._requests is None:
                    raise ValueError("Program: a freed program cannot be a step")
                st.kind, st.sub, st.n = SUB, sub._steps, sub._n
                self._keep.append(sub)
            elif step[0] == "copy":
                _, src, so, dst, do, ln = step
                for buf, writable in ((src, False), (dst, True)):
                    if buf.dtype != np.uint8 or buf.ndim != 1 or not cnp.PyArray_IS_C_CONTIGUOUS(buf) \
                            or (writable and not cnp.PyArray_ISWRITEABLE(buf)):
                        raise ValueError("Program: copy buffers must be contiguous 1-D uint8 (the target writable)")
                for lst in (so, do, ln):
                    if lst.dtype != np.int64 or lst.ndim != 1 or not cnp.PyArray_IS_C_CONTIGUOUS(lst) \
                            or lst.shape[0] != ln.shape[0]:
                        raise ValueError("Program: copy lists must be contiguous 1-D int64 of one length")
                st.src, st.dst = <const unsigned char*>cnp.PyArray_DATA(src), <unsigned char*>cnp.PyArray_DATA(dst)
                st.src_off, st.dst_off = <const int64_t*>cnp.PyArray_DATA(so), <const int64_t*>cnp.PyArray_DATA(do)
                st.kind, st.length, st.n = COPY, <const int64_t*>cnp.PyArray_DATA(ln), ln.shape[0]
                bad = _first_outside(st.src_off, st.dst_off, st.length, st.n, src.shape[0], dst.shape[0], &total)
                if bad >= 0:
                    raise ValueError(f"Program: step {i}, block {bad} ({st.length[bad]} B from {st.src_off[bad]} "
                                     f"to {st.dst_off[bad]}) lies outside its buffers ({src.shape[0]} B, "
                                     f"{dst.shape[0]} B)")
                self._keep.append(step)
            else:
                raise ValueError(f"Program: unknown step {step[0]!r}")
            self._n = i + 1
        self._split, self._started = -1, False
        self._flat, self._nflat, self._pos, self._posted, self._begun = NULL, 0, 0, False, False
        for i in range(self._n):
            if self._steps[i].kind == REQUESTS:
                self._split = i
                break
            if self._steps[i].kind != COPY:
                break

    def __dealloc__(self):
        free(self._steps)
        free(self._handles)
        free(self._flat)

    cdef int execute(self) except -1:
        cdef int err
        if self._requests is None:
            raise RuntimeError("this compiled run was freed")
        with nogil:
            err = _run_steps(self._steps, self._n, self._status)
        if err:
            raise MPI.Exception(err)
        return 0

    def run(self):
        """Run every step once (blocking)."""
        self.execute()

    def start(self):
        """Run the steps before the first ``"mpi"`` step and Start its requests (then ``wait``)."""
        cdef int err = 0
        cdef Py_ssize_t i
        cdef Step* st
        if self._requests is None:
            raise RuntimeError("this compiled run was freed")
        if self._started:
            raise RuntimeError("Program.start called twice without wait")
        if self._split < 0:
            self.execute()
            self._started = True
            return
        with nogil:
            err = _run_steps(self._steps, self._split, self._status)
            if not err:
                st = &self._steps[self._split]
                for i in range(st.n):
                    err = _mpi_start(st.handles[i])
                    if err:
                        break
        if err:
            raise MPI.Exception(err)
        self._started = True

    def wait(self):
        """Wait for the requests ``start`` started, then run the remaining steps."""
        cdef int err = 0
        cdef Py_ssize_t i
        cdef Step* st
        if not self._started:
            raise RuntimeError("Program.wait without start")
        self._started = False
        if self._split < 0:
            return
        with nogil:
            st = &self._steps[self._split]
            for i in range(st.n):
                err = _mpi_wait(st.handles[i], self._status)
                if err:
                    break
            if not err:
                err = _run_steps(&self._steps[self._split + 1], self._n - self._split - 1, self._status)
        if err:
            raise MPI.Exception(err)

    cdef int _advance(self, bint block, bint* done) noexcept nogil:
        """Run steps from ``_pos`` on; stop at requests not complete yet unless ``block``. Sets
        ``done`` when every step ran; the first MPI error code, or 0."""
        cdef Step* st
        cdef Py_ssize_t i
        cdef int err, flag
        done[0] = False
        while self._pos < self._nflat:
            st = &self._flat[self._pos]
            if st.kind == COPY:
                _copy_list(st.dst, st.src, st.src_off, st.dst_off, st.length, st.n)
                self._pos += 1
                continue
            if not self._posted:
                if st.kind == BARRIER:
                    hx_fence()  # as ``_run_steps``: window writes before the barrier
                for i in range(st.n):
                    err = _mpi_start(st.handles[i])
                    if err:
                        return err
                self._posted = True
            for i in range(st.n):  # a completed persistent request is inactive: it tests true again
                if block:
                    err = _mpi_wait(st.handles[i], self._status)
                else:
                    flag = 0
                    err = _mpi_test(st.handles[i], &flag, self._status)
                    if not err and not flag:
                        return 0
                if err:
                    return err
            if st.kind == BARRIER:
                hx_fence()
            self._posted = False
            self._pos += 1
        done[0] = True
        return 0

    cdef int _step(self, bint block) except -1:
        """One ``_advance`` from Python: 1 when the program completed (it is then idle), else 0."""
        cdef int err
        cdef bint done = False
        if not self._begun:
            return 1
        with nogil:
            err = self._advance(block, &done)
        if err:
            self._begun = False
            raise MPI.Exception(err)
        if done:
            self._begun = False
        return 1 if done else 0

    def begin(self):
        """Start a run as a state machine: copies up to the first requests, which it starts;
        returns whether the run already completed (then ``test``/``finish`` return at once)."""
        if self._requests is None:
            raise RuntimeError("this compiled run was freed")
        if self._started or self._begun:
            raise RuntimeError("Program.begin while a run of it is in progress")
        if self._flat == NULL:
            self._nflat = _flat_count(self._steps, self._n)
            self._flat = <Step*>malloc(max(self._nflat, 1) * sizeof(Step))
            if self._flat == NULL:
                raise MemoryError()
            _flatten(self._steps, self._n, self._flat)
        self._pos, self._posted, self._begun = 0, False, True
        return self._step(False) == 1

    def test(self):
        """Go on as far as possible without waiting; whether the run completed."""
        return self._step(False) == 1

    def finish(self):
        """Complete the run, waiting for each request in turn."""
        self._step(True)

    @property
    def running(self):
        """Whether a ``begin`` has not completed yet."""
        return self._begun

    def free(self):
        """Stop the program: it cannot run again. Its requests stay their owner's to free; what it
        points into stays alive until it is collected (a program that holds it as a step may
        still point there)."""
        self._requests, self._n, self._nflat, self._begun = None, 0, 0, False


cdef inline const int64_t* _i64(object arr, Py_ssize_t n, str name) except NULL:
    """The data of a contiguous int64 array of ``n`` items (ValueError naming ``name`` otherwise)."""
    if type(arr) is not np.ndarray or cnp.PyArray_TYPE(<cnp.ndarray>arr) != cnp.NPY_INT64 \
            or not cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>arr) or cnp.PyArray_SIZE(<cnp.ndarray>arr) != n:
        raise ValueError(f"{name} must be a contiguous int64 array of {n} items")
    return <const int64_t*>cnp.PyArray_DATA(<cnp.ndarray>arr)


include "_bruck_once.pxi"


cdef inline int64_t _total(const int64_t* v, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t k
    cdef int64_t t = 0
    for k in range(n):
        t += v[k]
    return t


cdef struct Buffers:
    # A program's four buffers (``Buffer``'s order) and their bytes.
    unsigned char* data[4]
    int64_t nbytes[4]


cdef struct Peers:
    # An exchange's communicator as the runner calls it.
    uint64_t comm
    int64_t rank
    int64_t size


_BUFFER_NAMES = ("send", "receive", "scratch", "stage")


cdef class Runner:
    """Step programs (``hxmpi.comm.plan``) run compiled on one ``HierComm``'s communicators: one
    C loop over the steps, without the GIL (but to grow a Bruck exchange's scratch) and with no
    Python between them. ``Run.run`` uses it for a one-shot run off the large-count path, and
    ``CallTable`` for a miss or a rebound hit it runs hierarchically.

    Copies are the steps' block lists; a linear exchange is one ``MPI_Ialltoallv`` (those posted
    together all started, then all waited for), or, marked blocking and alone, one
    ``MPI_Alltoallv`` (``MPI_Alltoall`` for uniform blocks); pairwise rounds are ``MPI_Irecv`` and
    ``MPI_Isend`` per round, waited for; Bruck rounds are a ``BruckOnce`` per communicator and
    radix (made at its first use, kept); the barrier is ``MPI_Barrier`` on the node between
    memory fences. These are the MPI calls ``Run``'s Python walk makes, so a rank that walks a
    program matches one that runs it here.

    ``world``, ``intra``: the world's and the node's communicators; ``served_lanes``:
    ``Topology.served_lanes``; ``byte``: ``MPI.BYTE``; ``tag``: the round-based exchanges' message
    tag; ``rounds_of(size, radix)``: the Bruck rounds of a communicator's size
    (``hxmpi.comm.plan.bruck_rounds``).
    """
    cdef Peers world_peers, node_peers
    cdef Py_ssize_t nlanes          # lanes numbered below this have a slot in ``lane_peers``
    cdef Peers* lane_peers          # by lane number (``comm`` 0: not served here)
    cdef uint64_t byte
    cdef int tag
    cdef dict brucks                # (communicator code, radix) -> BruckOnce
    cdef object comms, rounds_of
    cdef int* ints
    cdef Py_ssize_t ints_cap
    cdef uint64_t* requests
    cdef Py_ssize_t requests_cap
    cdef char status[STATUS_BYTES]
    cdef cnp.ndarray _events        # where traced runs note what they execute (``trace``), or None
    cdef int64_t* _log
    cdef Py_ssize_t _logged, _log_cap
    #: a copy of the words of the last program run while tracing (``trace``), or None
    cdef readonly object traced_words

    def __cinit__(self, world, intra, served_lanes, byte, int tag, rounds_of):
        cdef Py_ssize_t i
        if _handle_bytes == 0 or _mpi_ialltoallv == NULL or _mpi_alltoallv == NULL or _mpi_alltoall == NULL \
                or _mpi_barrier == NULL or _mpi_isend == NULL or _mpi_irecv == NULL:
            raise NotImplementedError("Runner: this MPI's handles cannot be passed from compiled code")
        self.byte, self.tag, self.rounds_of = <uint64_t>byte.handle, tag, rounds_of
        self.brucks = {}
        self.comms = {COMM_WORLD: world, COMM_NODE: intra, **dict(served_lanes)}
        self.world_peers.comm, self.world_peers.rank, self.world_peers.size = <uint64_t>world.handle, world.rank, world.size
        self.node_peers.comm, self.node_peers.rank, self.node_peers.size = <uint64_t>intra.handle, intra.rank, intra.size
        self.nlanes = max([lane + 1 for lane, _ in served_lanes] + [0])
        self.lane_peers = <Peers*>malloc(max(self.nlanes, 1) * sizeof(Peers))
        if self.lane_peers == NULL:
            raise MemoryError()
        for i in range(self.nlanes):
            self.lane_peers[i].comm = 0
        for lane, comm in served_lanes:
            self.lane_peers[lane].comm, self.lane_peers[lane].rank = <uint64_t>comm.handle, comm.rank
            self.lane_peers[lane].size = comm.size

    def __dealloc__(self):
        free(self.lane_peers)
        free(self.ints)
        free(self.requests)

    @property
    def scratch_bytes(self):
        """Scratch its Bruck exchanges hold (bytes; the others hold none beyond the caller's)."""
        return sum([(<BruckOnce>b).scratch_bytes for b in self.brucks.values()])

    def bruck_once(self, int64_t comm, int64_t radix):
        """The ``BruckOnce`` of communicator ``comm`` (``Comm`` or a lane number) at ``radix``,
        made at its first use and kept (with its scratch) for every later run."""
        once = self.brucks.get((comm, radix))
        if once is None:
            group = self.comms[comm]
            once = self.brucks[(comm, radix)] = BruckOnce(group, self.rounds_of(group.size, radix), self.tag, MPI.BYTE)
        return once

    def trace(self, cnp.ndarray events=None):
        """Note what the runs from now on execute in ``events`` (an (k, 4) int64 array, filled
        from its first row until it is full; None stops), and keep a copy of each run's program
        (``traced_words``): for tests. One row per event, (step, peer, bytes sent, bytes
        received): a copy (peer -1, its bytes both ways), a barrier (-1, 0, 0), every peer of a
        linear exchange (the counts MPI is given), every message a pairwise exchange posts (its
        block to itself as both), a Bruck exchange (-2, the bytes of its sides)."""
        if events is not None and (events.dtype != np.int64 or events.ndim != 2 or events.shape[1] != 4
                                   or not cnp.PyArray_IS_C_CONTIGUOUS(events)):
            raise ValueError("Runner.trace: events must be a contiguous (k, 4) int64 array")
        self._events, self._logged, self.traced_words = events, 0, None
        self._log = <int64_t*>cnp.PyArray_DATA(events) if events is not None else NULL
        self._log_cap = events.shape[0] if events is not None else 0

    @property
    def traced(self):
        """Events noted since ``trace``."""
        return self._logged

    cdef inline void _note(self, Py_ssize_t step, int64_t peer, int64_t sent, int64_t received) noexcept nogil:
        cdef int64_t* e
        if self._log != NULL and self._logged < self._log_cap:
            e = self._log + 4 * self._logged
            e[0], e[1], e[2], e[3] = step, peer, sent, received
            self._logged += 1

    cdef const Peers* _peers(self, int64_t comm) noexcept nogil:
        """The communicator of an exchange, or NULL where this rank is not in it."""
        if comm == COMM_WORLD:
            return &self.world_peers
        if comm == COMM_NODE:
            return &self.node_peers
        if 0 <= comm < self.nlanes and self.lane_peers[comm].comm != 0:
            return &self.lane_peers[comm]
        return NULL

    def run(self, program, cnp.ndarray send not None, cnp.ndarray recv not None, cnp.ndarray scratch not None,
            cnp.ndarray stage not None):
        """Run ``program`` (a ``StepProgram``) once on these buffers (contiguous uint8: the
        caller's send and receive views, the scratch and the stage buffer, the last three
        writable)."""
        for arr, writable in ((send, False), (recv, True), (scratch, True), (stage, True)):
            if cnp.PyArray_TYPE(arr) != cnp.NPY_UINT8 or not cnp.PyArray_IS_C_CONTIGUOUS(arr) \
                    or (writable and not cnp.PyArray_ISWRITEABLE(arr)):
                raise ValueError("Runner.run: buffers must be contiguous uint8 (the targets writable)")
        self.run_program(program.words, send, recv, scratch, stage)

    cdef int run_program(self, cnp.ndarray words, cnp.ndarray send, cnp.ndarray recv, cnp.ndarray scratch,
                         cnp.ndarray stage) except -1:
        """``run`` of a program's words on C-contiguous arrays of any item type (``recv``
        writable; ``scratch`` and ``stage`` uint8), their types unchecked: the buffers a call's
        specs name. Every step is checked against its buffers and communicators before the first
        one runs."""
        cdef int64_t* w = <int64_t*>cnp.PyArray_DATA(words)
        cdef Buffers b
        cdef Py_ssize_t i = 0, nrows
        cdef Row* r
        cdef int err
        b.data[<int>BUF_SEND], b.nbytes[<int>BUF_SEND] = <unsigned char*>cnp.PyArray_DATA(send), cnp.PyArray_NBYTES(send)
        b.data[<int>BUF_RECV], b.nbytes[<int>BUF_RECV] = <unsigned char*>cnp.PyArray_DATA(recv), cnp.PyArray_NBYTES(recv)
        b.data[<int>BUF_SCRATCH], b.nbytes[<int>BUF_SCRATCH] = <unsigned char*>cnp.PyArray_DATA(scratch), cnp.PyArray_NBYTES(scratch)
        b.data[<int>BUF_STAGE], b.nbytes[<int>BUF_STAGE] = <unsigned char*>cnp.PyArray_DATA(stage), cnp.PyArray_NBYTES(stage)
        self._check(w, cnp.PyArray_SIZE(words), &b)
        if self._log != NULL:
            self.traced_words = words.copy()
        nrows = _header(w).rows
        while i < nrows:
            with nogil:
                err = self._run_until_bruck(w, &i, &b)
            if err:
                raise MPI.Exception(err)
            if i < nrows:  # a Bruck exchange: its first run may grow its scratch (the GIL)
                r = _rows(w) + i
                (<BruckOnce>self.brucks[(r.comm, r.radix)]).exchange(
                    b.data[r.src], b.nbytes[r.src], b.data[r.dst], b.nbytes[r.dst], w + r.v0, w + r.v1, w + r.v2,
                    w + r.v3)
                if self._log != NULL:
                    self._note(i, -2, _total(w + r.v0, r.n), _total(w + r.v2, r.n))
                i += 1
        return 0

    cdef int _check(self, int64_t* w, int64_t nwords, Buffers* b) except -1:
        """ValueError unless every step fits its buffers and this rank's communicators; make the
        Bruck exchanges and grow the count and request scratch the steps need."""
        cdef Header* h = _header(w)
        cdef Row* r
        cdef const Peers* peers
        cdef Py_ssize_t i, bad, need_ints = 0, need_requests = 2, group_ints = 0, group = 0
        cdef int64_t total, k, v
        if h.rows < 0 or HEADER_WORDS + h.rows * ROW_WORDS > nwords:
            raise ValueError("Runner: the program's rows lie outside its words")
        for i in range(h.rows):
            r = _rows(w) + i
            if r.kind == STEP_BARRIER:
                continue
            if r.kind not in (STEP_COPY, STEP_EXCHANGE) or not (0 <= r.src < 4 and 0 <= r.dst < 4) or r.n < 0:
                raise ValueError(f"Runner: step {i} is not a step of a program")
            for k in range(3 if r.kind == STEP_COPY else 4):
                v = (&r.v0)[k]
                if v < HEADER_WORDS or v > nwords - r.n:
                    raise ValueError(f"Runner: step {i}'s vectors lie outside the program's words")
            if r.kind == STEP_COPY:
                bad = _first_outside(w + r.v0, w + r.v1, w + r.v2, r.n, b.nbytes[r.src], b.nbytes[r.dst], &total)
                if bad >= 0:
                    raise ValueError(f"Runner: step {i}, block {bad} ({w[r.v2 + bad]} B from {w[r.v0 + bad]} to "
                                     f"{w[r.v1 + bad]}) lies outside its buffers ({_BUFFER_NAMES[r.src]} "
                                     f"{b.nbytes[r.src]} B, {_BUFFER_NAMES[r.dst]} {b.nbytes[r.dst]} B)")
                continue
            peers = self._peers(r.comm)
            if peers == NULL or peers.size != r.n:
                raise ValueError(f"Runner: step {i} exchanges on communicator {r.comm}, which this rank is not in "
                                 f"or which has not {r.n} ranks")
            bad = _first_outside(w + r.v1, w + r.v1, w + r.v0, r.n, b.nbytes[r.src], b.nbytes[r.src], &total)
            if bad < 0:
                bad = _first_outside(w + r.v3, w + r.v3, w + r.v2, r.n, b.nbytes[r.dst], b.nbytes[r.dst], &total)
            if bad >= 0:
                raise ValueError(f"Runner: step {i}, peer {bad}'s block lies outside its buffers "
                                 f"({_BUFFER_NAMES[r.src]} {b.nbytes[r.src]} B, {_BUFFER_NAMES[r.dst]} "
                                 f"{b.nbytes[r.dst]} B)")
            if r.rounds == ROUNDS_LINEAR:
                group_ints += 4 * r.n
                group += 1
                if r.flags & WITH_NEXT and (i + 1 >= h.rows or (_rows(w) + i + 1).kind != STEP_EXCHANGE
                                            or (_rows(w) + i + 1).rounds != ROUNDS_LINEAR):
                    raise ValueError(f"Runner: step {i} is posted with a next step that is not a linear exchange")
                if not r.flags & WITH_NEXT:
                    need_ints, need_requests = max(need_ints, group_ints), max(need_requests, group)
                    group_ints = group = 0
            elif r.rounds == ROUNDS_PAIRWISE:
                if w[r.v0 + peers.rank] != w[r.v2 + peers.rank]:
                    raise ValueError(f"pairwise: rank {peers.rank} sends itself {w[r.v0 + peers.rank]} B but "
                                     f"expects {w[r.v2 + peers.rank]} B")
            elif r.rounds == ROUNDS_BRUCK:
                if (r.comm, r.radix) not in self.brucks:
                    self.bruck_once(r.comm, r.radix)
            else:
                raise ValueError(f"Runner: step {i} has no rounds {r.rounds}")
        if need_ints > self.ints_cap:
            free(self.ints)
            self.ints, self.ints_cap = <int*>malloc(need_ints * sizeof(int)), need_ints
        if need_requests > self.requests_cap:
            free(self.requests)
            self.requests, self.requests_cap = <uint64_t*>malloc(need_requests * sizeof(uint64_t)), need_requests
        if self.ints == NULL and self.ints_cap or self.requests == NULL:
            self.ints_cap = self.requests_cap = 0
            raise MemoryError()
        return 0

    cdef int _run_until_bruck(self, int64_t* w, Py_ssize_t* at, Buffers* b) noexcept nogil:
        """Run the steps from ``at[0]`` on, up to a Bruck exchange or the end (``at[0]`` is left
        there); the first MPI error code, or 0."""
        cdef Py_ssize_t i = at[0], j, nrows = _header(w).rows, nr
        cdef Row* r
        cdef const Peers* peers
        cdef int err = 0
        while i < nrows:
            r = _rows(w) + i
            if r.kind == STEP_COPY:
                _copy_list(b.data[r.dst], b.data[r.src], w + r.v0, w + r.v1, w + r.v2, r.n)
                if self._log != NULL:
                    self._note(i, -1, _total(w + r.v2, r.n), _total(w + r.v2, r.n))
            elif r.kind == STEP_BARRIER:
                self._note(i, -1, 0, 0)
                # The node window's barrier: MPI_Win_sync on a shared-memory window is a full memory
                # fence in both families; the fences order this rank's window writes before the
                # barrier and the others' reads after it.
                hx_fence()
                err = _barrier(self.node_peers.comm)
                hx_fence()
            elif r.rounds == ROUNDS_BRUCK:
                break
            elif r.rounds == ROUNDS_PAIRWISE:
                peers = self._peers(r.comm)
                err = self._pairwise(i, peers, w + r.v0, w + r.v1, w + r.v2, w + r.v3, b.data[r.src],
                                     b.data[r.dst])
            elif r.flags & BLOCKING and not r.flags & WITH_NEXT:
                err = self._blocking(i, r, w, b)
            else:  # linear exchanges posted together: every one started, then every one waited for
                nr = 0
                j = i
                while True:
                    r = _rows(w) + j
                    err = self._post(j, r, w, b, self.ints + 4 * r.n * nr, &self.requests[nr])
                    if err:
                        break
                    nr += 1
                    if not r.flags & WITH_NEXT:
                        break
                    j += 1
                for j in range(nr if not err else 0):
                    err = _mpi_wait(&self.requests[j], self.status)
                    if err:
                        break
                i = i + nr - 1
            if err:
                break
            i += 1
        at[0] = i
        return err

    cdef int _post(self, Py_ssize_t step, Row* r, int64_t* w, Buffers* b, int* v, uint64_t* request) noexcept nogil:
        """``MPI_Ialltoallv`` of one exchange (counts below a C int: off the large-count path)."""
        cdef Py_ssize_t k, n = r.n
        cdef int shift = self._counts(step, r, w, v)
        return _ialltoallv(b.data[r.src] + shift, v, v + n, b.data[r.dst], v + 2 * n, v + 3 * n, self.byte,
                           self._peers(r.comm).comm, request)

    cdef int _counts(self, Py_ssize_t step, Row* r, int64_t* w, int* v) noexcept nogil:
        """An exchange's four vectors as MPI reads them (C int; noted when tracing); returns the
        bytes the send buffer's start moves up (``apart``)."""
        cdef Py_ssize_t k, n = r.n
        cdef int shift = 0
        for k in range(n):
            v[k], v[n + k], v[2 * n + k], v[3 * n + k] = <int>w[r.v0 + k], <int>w[r.v1 + k], <int>w[r.v2 + k], \
                <int>w[r.v3 + k]
        if r.src == r.dst:
            shift = _apart(v, v + n, n)
        if self._log != NULL:
            for k in range(n):
                self._note(step, k, v[k], v[2 * n + k])
        return shift

    cdef int _blocking(self, Py_ssize_t step, Row* r, int64_t* w, Buffers* b) noexcept nogil:
        """One blocking ``MPI_Alltoallv``, or ``MPI_Alltoall`` of uniform blocks back to back."""
        cdef Py_ssize_t k, n = r.n
        cdef int* v = self.ints
        cdef uint64_t comm = self._peers(r.comm).comm
        cdef int shift = self._counts(step, r, w, v)
        if r.flags & UNIFORM:
            return _alltoall(b.data[r.src] + (w[r.v1] if n else 0), <int>(w[r.v0] if n else 0),
                             b.data[r.dst] + (w[r.v3] if n else 0), <int>(w[r.v2] if n else 0), self.byte, comm)
        return _alltoallv(b.data[r.src] + shift, v, v + n, b.data[r.dst], v + 2 * n, v + 3 * n, self.byte, comm)

    cdef int _pairwise(self, Py_ssize_t step, const Peers* peers, const int64_t* sc, const int64_t* sd,
                       const int64_t* rc, const int64_t* rd, const unsigned char* send,
                       unsigned char* recv) noexcept nogil:
        """``bruck.Pairwise``: the block to itself, then size - 1 rounds of a receive from rank - k
        and a send to rank + k, waited for (empty blocks are neither sent nor received)."""
        cdef Py_ssize_t k, n = peers.size, q = peers.rank, dst, src, nr, j
        cdef int err
        if sc[q] > 0:
            memcpy(recv + rd[q], send + sd[q], <size_t>sc[q])
            self._note(step, q, sc[q], sc[q])
        for k in range(1, n):
            dst, src, nr = (q + k) % n, (q - k + n) % n, 0
            if rc[src]:
                err = _irecv(recv + rd[src], <int>rc[src], self.byte, <int>src, self.tag, peers.comm,
                             &self.requests[nr])
                if err:
                    return err
                self._note(step, src, 0, rc[src])
                nr += 1
            if sc[dst]:
                err = _isend(send + sd[dst], <int>sc[dst], self.byte, <int>dst, self.tag, peers.comm,
                             &self.requests[nr])
                if err:
                    return err
                self._note(step, dst, sc[dst], 0)
                nr += 1
            for j in range(nr):
                err = _mpi_wait(&self.requests[j], self.status)
                if err:
                    return err
        return 0


cdef class Slot:
    """What recognises one cached pattern's specs and runs its bound run (see the module docstring)."""
    cdef readonly Py_ssize_t no
    #: the cache entry, and the sides parsed from the specs
    cdef readonly object entry, s, r
    cdef tuple then
    cdef object algorithm, send_leaf, recv_leaf, send_dtype, recv_dtype, run, stats
    cdef long long scratch_generation, window_generation   # what the run was bound to
    cdef Program program
    cdef bint validate, uniform
    cdef void* send_data
    cdef void* recv_data
    cdef Py_ssize_t send_nbytes, recv_nbytes
    cdef Record record


cdef class CallTable:
    """The compiled hit path of one ``HierComm`` (see the module docstring).

    ``agreement``: its ``Agreement`` (the record and sums arrays, and the persistent Allreduce,
    Started here through ``agreement.handle``, or ``agreement.exchange()`` where the library has
    none); ``cache``: its ``PlanCache``; ``scratch`` and ``window``: what a bound run's buffers
    come from (their ``generation`` counts regrowths). ``tick`` and ``misses`` count agreed calls
    and agreed misses since the last hit; ``stats`` and ``state`` describe the last call.

    Once ``miss_path`` has configured it, a call that no slot recognises but whose specs have the
    common form (``_common_form``, ``_uniform_form``) is parsed, agreed and, where it runs flat,
    run here too (``MPI_Alltoallv`` on reused count arrays, or ``MPI_Alltoall``): a pattern the
    cache does not hold (a miss), or one a flat entry holds, on new buffers (a hit, rebound). Once
    ``hier_path`` and ``bruck_path`` have, misses and rebound hits that run hierarchically
    (``Runner``; a rebound hit runs its entry's kept program) or as flat Bruck (``BruckOnce``) run
    here as well.
    """
    cdef list _slots
    cdef object agreement, cache, scratch, window
    cdef cnp.ndarray _record, _sums
    cdef void* _agree_handle
    cdef uint64_t _size
    cdef char _status[STATUS_BYTES]
    cdef Slot _pending
    cdef int _pending_flags
    cdef object _pending_entry
    cdef public long long tick, misses
    #: calls this table finished itself (clean hits, from entry to return in compiled code)
    cdef readonly long long compiled
    #: misses this table parsed, agreed and ran itself (from entry to return in compiled code)
    cdef readonly long long compiled_misses
    #: hits on new buffers it parsed, agreed and ran itself (every entry off the large-count path), the same way
    cdef readonly long long compiled_rebound
    #: the verdict bits of the last ``KEEP`` call
    cdef readonly int last_flags
    #: what the last ``KEEP`` call leaves for its cache entry: its send and receive arrays, and for
    #: a hierarchical run the program it ran (the planner's own, until its next plan), else None;
    #: its sides are ``parsed``
    cdef readonly tuple kept
    cdef object _planned
    cdef public object stats, state
    # The miss path (``miss_path``): None until configured.
    cdef object _choices, _codes, _flat_codes, _predefined, _datatype_type, _limits, _miss_stats
    cdef long _auto_code
    cdef Py_ssize_t _me
    cdef uint64_t _key_a, _key_b, _byte, _comm
    cdef int64_t _kib_cap
    cdef cnp.ndarray _parsed, _ints, _lists, _stats_counts
    # Hierarchical misses (``hier_path``): None until configured.
    cdef Runner _runner
    cdef dict _hier_algorithms, _planners, _hier_stats
    cdef object _sides, _make_stats
    cdef int _mode
    cdef bint _shared
    cdef object _route_alg, _route_planner   # the hierarchical run a miss takes (``_route``)
    cdef long _route_radix, _leaders
    cdef bint _route_both                    # its planner takes both sides of the node's counts
    cdef cnp.ndarray _both, _node_both       # this rank's send and receive counts; the node's
    # Bruck misses (``bruck_path``): None until configured.
    cdef object _bruck_codes, _bruck_stats, _bruck_once, _brucks
    cdef long _radix, _pick_radix
    cdef uint64_t _int64
    #: what every rank of this node receives from every rank (node size x world size, int64 bytes):
    #: the node ``Allgather`` of a hierarchical miss run here, what its plan was made from
    cdef readonly cnp.ndarray rc_node

    def __init__(self, agreement, cache, scratch, window, Py_ssize_t size):
        self._slots = []
        self.agreement, self.cache, self.scratch, self.window = agreement, cache, scratch, window
        self._record, self._sums = agreement.record, agreement.sums
        if self._record.dtype != np.uint64 or self._record.shape[0] * 8 != sizeof(Record) \
                or self._sums.dtype != np.uint64 or self._sums.shape[0] * 8 != sizeof(Record):
            raise ValueError("CallTable: the agreement's record and sums must be one Record of uint64 each")
        self._agree_handle = <void*><uintptr_t>agreement.handle
        self._size = <uint64_t>size
        self.tick = self.misses = self.compiled = self.compiled_misses = self.compiled_rebound = 0
        self.stats, self.state = None, "off"
        self._pending_flags, self._pending_entry = -1, None
        self._choices = None
        self._runner = None
        self._brucks = None

    def hier_path(self, dict algorithms, long radix, Runner runner, dict planners, int mode, bint shared,
                  make_stats, int64_type, long leaders=1):
        """Let the miss path also run misses hierarchically (call after ``miss_path``): those of
        ``algorithms`` (algorithm code: ``Algorithm``, hierarchical ones, with Bruck lanes at
        radix ``radix``) and auto's picks of them: the node ``Allgather`` of the receive counts,
        the program of the algorithm's planner (``planners``, by ``Algorithm.planner``) for
        node phase ``mode`` (``shared``: its stage is the node window), run by ``runner``.
        ``make_stats(algorithm, radix, program)``: the ``ExchangeStats`` of such runs (made once
        per algorithm and radix, then kept); ``int64_type``: ``MPI.INT64_T``, the node
        ``Allgather``'s datatype (``HierComm._hier_plan``'s). Multi-leader: ``planners["leaders"]``
        maps the leaders per node to the planner (filled on first use), ``leaders`` an explicit call's
        count; its node ``Allgather`` carries the send and the receive counts."""
        if self._choices is None:
            return
        n = self._size
        self._hier_algorithms, self._radix, self._runner, self._planners = algorithms, radix, runner, planners
        self._mode, self._shared, self._make_stats, self._hier_stats = mode, shared, make_stats, {}
        self._int64 = <uint64_t>int64_type.handle
        self.rc_node = np.zeros((runner.node_peers.size, n), np.int64)
        self._leaders = leaders
        self._both = np.zeros(2 * n, np.int64)
        self._node_both = np.zeros((runner.node_peers.size, 2 * n), np.int64)
        self._sides = tuple(self._parsed[i * n:(i + 1) * n] for i in range(4))

    def bruck_path(self, frozenset codes, long radix, once, stats):
        """Let the miss path also run flat Bruck misses (call after ``miss_path``): those of
        ``codes`` at radix ``radix``, and auto's picks of "bruck" at theirs, through the
        ``BruckOnce`` that ``once(radix)`` gives (the runner's: one per radix, kept). ``stats``: the
        ``ExchangeStats`` such a run leaves (``flat_counts`` and ``radix`` overwritten by each)."""
        if self._choices is None or _mpi_isend == NULL or _mpi_mprobe == NULL or _mpi_imrecv == NULL \
                or _mpi_get_count == NULL:
            return
        self._bruck_codes, self._radix, self._bruck_once, self._bruck_stats = codes, radix, once, stats
        self._brucks = {}

    def miss_path(self, dict choices, dict codes, long auto_code, frozenset flat_codes, dict predefined,
                  datatype_type, limits, Py_ssize_t me, tuple key, int64_t kib_cap, comm, byte, stats):
        """Let the table run misses (see the class docstring). ``choices``: auto's picks by
        ("oneshot",) + pattern class, as ``HierComm._pick`` fills them; ``codes``: algorithm
        codes by name; ``auto_code``: auto's; ``flat_codes``: the codes that run flat whatever the
        pattern; ``predefined``: element bytes by datatype handle, ``datatype_type``: ``MPI.Datatype``;
        ``limits``: the module whose ``INT_LIMIT`` bounds a plain MPI call (``transfer``); ``me``,
        ``key``: this rank and the agreement's keys; ``kib_cap``: the record's KiB cap; ``comm``
        and ``byte``: the communicator and ``MPI.BYTE``; ``stats``: the ``ExchangeStats`` a miss
        run here leaves (its ``flat_counts``, int64 per rank, are overwritten by each one)."""
        cdef Py_ssize_t n = self._size
        if _handle_bytes == 0 or _mpi_alltoallv == NULL or _mpi_alltoall == NULL:
            return  # an MPI whose handles this module cannot pass: misses stay in Python
        self._choices, self._codes, self._auto_code, self._flat_codes = choices, codes, auto_code, flat_codes
        self._predefined, self._datatype_type, self._limits = predefined, datatype_type, limits
        self._me, self._key_a, self._key_b, self._kib_cap = me, key[0], key[1], kib_cap
        self._comm, self._byte = <uint64_t>comm.handle, <uint64_t>byte.handle
        self._parsed = np.zeros(4 * n, np.int64)   # send counts, displs; receive counts, displs (bytes)
        self._ints = np.zeros(4 * n, np.intc)      # the same, as MPI reads them
        self._lists = np.zeros(2 * n, np.int64)    # counts and displacements given as lists of ints
        self._miss_stats, self._stats_counts = stats, stats.flat_counts
        if self._stats_counts.dtype != np.int64 or self._stats_counts.shape[0] != n:
            raise ValueError("miss_path: stats.flat_counts must be int64, one per rank")

    cdef Slot _find(self, sendbuf, recvbuf, algorithm, validate, bint uniform):
        """The slot that recognises these specs, or None. The leaves must still hold the memory
        they held (an array resized in place has moved, and its parsed sides are stale)."""
        cdef Slot slot
        send, recv = _leaf(sendbuf), _leaf(recvbuf)
        for slot in self._slots:
            if slot.send_leaf is send and slot.recv_leaf is recv:
                if slot.uniform == uniform and slot.validate == bool(validate) \
                        and (slot.algorithm is algorithm or slot.algorithm == algorithm) \
                        and cnp.PyArray_DATA(<cnp.ndarray>send) == slot.send_data \
                        and cnp.PyArray_NBYTES(<cnp.ndarray>send) == slot.send_nbytes \
                        and cnp.PyArray_DATA(<cnp.ndarray>recv) == slot.recv_data \
                        and cnp.PyArray_NBYTES(<cnp.ndarray>recv) == slot.recv_nbytes \
                        and (<cnp.ndarray>send).dtype is slot.send_dtype \
                        and (<cnp.ndarray>recv).dtype is slot.recv_dtype \
                        and cnp.PyArray_ISWRITEABLE(<cnp.ndarray>recv) \
                        and _same_shape(sendbuf, slot.then[0]) and _same_shape(recvbuf, slot.then[1]):
                    return slot
                return None
        return None

    def ready(self, sendbuf, recvbuf, algorithm, validate):
        """Whether a clean hit of these specs would run a slot's bound run (``call``'s first case)."""
        cdef Slot slot = self._find(sendbuf, recvbuf, algorithm, validate, False)
        return slot is not None and self._same_buffers(slot)

    cdef bint _same_buffers(self, Slot slot):
        """Whether the slot's run is bound to its (recognised) buffers and the scratch of now."""
        return slot.run is not None and slot.scratch_generation == self.scratch.generation \
            and slot.window_generation == self._window_generation()

    cdef long long _window_generation(self):
        return self.window.generation if self.window is not None else 0

    def call(self, sendbuf, recvbuf, algorithm, validate, bint uniform, default_algorithm):
        """One call's compiled path: ``NOT_FOUND`` (not recognised nor of the form the miss path
        reads; nothing was communicated), ``AGREED`` (agreed, but not a clean hit nor a miss run
        here: ``take_pending``), ``DONE`` or ``KEEP``. ``default_algorithm``: the ``HierComm``'s,
        for ``algorithm`` None."""
        cdef Slot slot
        cdef Record* rec
        cdef int flags, err
        slot = self._find(sendbuf, recvbuf, algorithm, validate, uniform)
        if slot is not None and self._choices is not None and not self._same_buffers(slot):
            # No run bound to these buffers: the miss path runs the entry's plan on them (a hit,
            # rebound), or, the same buffers on every rank, leaves binding one to Python.
            slot = None
        if slot is None:
            if self._choices is None:
                return NOT_FOUND
            return self._miss(sendbuf, recvbuf, algorithm if algorithm is not None else default_algorithm,
                              bool(validate), uniform)
        rec = <Record*>cnp.PyArray_DATA(self._record)
        memcpy(rec, &slot.record, sizeof(Record))
        rec.same_buffers = self._same_buffers(slot)
        rec.over_budget = self.cache.held > self.cache.max_bytes
        flags = self._agree()
        if flags & _NOT_CLEAN or flags & _CLEAN != _CLEAN:
            self._pending, self._pending_flags, self._pending_entry = slot, flags, slot.entry
            return AGREED
        self.tick += 1
        self.misses = 0
        self.touch(slot.entry)
        if slot.program is not None:
            slot.program.execute()
        else:
            slot.run.run()
        self.stats, self.state = slot.stats, "hit"
        self.compiled += 1
        return DONE

    cdef int _agree(self) except -1:
        """Sum the records (the agreement's persistent Allreduce); the verdict bits."""
        cdef int err
        if self._agree_handle != NULL:
            with nogil:
                err = _start_wait(&self._agree_handle, 1, self._status)
            if err:
                raise MPI.Exception(err)
        else:
            self.agreement.exchange()
        return _verdict(<const Record*>cnp.PyArray_DATA(self._sums), self._size)

    cdef int _miss(self, sendbuf, recvbuf, algorithm, bint validate, bint uniform) except -1:
        """A call no slot recognises: parse, agree and run it here where its specs have the common
        form and it runs flat, as a miss or, on new buffers, as a hit of a flat cache entry
        (``call``'s results). ``uniform``: an ``Alltoall``, run as ``MPI_Alltoall``."""
        cdef Py_ssize_t n = self._size, i
        cdef int64_t* sc = <int64_t*>cnp.PyArray_DATA(self._parsed)
        cdef int64_t* sd = sc + n
        cdef int64_t* rc = sd + n
        cdef int64_t* rd = rc + n
        cdef int* ints = <int*>cnp.PyArray_DATA(self._ints)
        cdef int64_t elem, sent, received, sn, rn, limit, block = 0, rblock = 0
        cdef int64_t* lists
        cdef uint64_t h
        cdef long code
        cdef int flags, err, route
        cdef bint big
        cdef Record* rec = <Record*>cnp.PyArray_DATA(self._record)
        cdef cnp.ndarray sa, ra
        cdef Py_ssize_t slot_no = 0
        cdef bint same = False
        cdef int rebound = ROUTE_PYTHON
        entry = None
        got = self._codes.get(algorithm)
        if got is None:
            return NOT_FOUND
        code = got
        if code != self._auto_code and got not in self._flat_codes \
                and (self._runner is None or got not in self._hier_algorithms) \
                and (self._brucks is None or got not in self._bruck_codes):
            return NOT_FOUND
        if uniform:
            sa = _uniform_form(sendbuf, n, False, self._predefined, self._datatype_type, &block, &elem)
            ra = _uniform_form(recvbuf, n, True, self._predefined, self._datatype_type, &rblock, &elem)
            if sa is None or ra is None:
                return NOT_FOUND
            sn, rn = cnp.PyArray_NBYTES(sa), cnp.PyArray_NBYTES(ra)
            for i in range(n):  # the sides' bytes as the general reader gives them
                sc[i], sd[i], rc[i], rd[i] = block, i * block, rblock, i * rblock
            sent = n * block
        else:  # blocks out of order on the receive side too go to the general reader (overlap)
            lists = <int64_t*>cnp.PyArray_DATA(self._lists)
            sa = _read_vector(sendbuf, n, False, self._predefined, self._datatype_type, sc, sd, &elem, &sent, lists)
            ra = _read_vector(recvbuf, n, True, self._predefined, self._datatype_type, rc, rd, &elem, &received,
                              lists)
            if sa is None or ra is None:
                return NOT_FOUND
            sn, rn = cnp.PyArray_NBYTES(sa), cnp.PyArray_NBYTES(ra)
        if self.cache.max_entries:
            with nogil:
                h = _hash_array(_hash_array(_hash_array(_hash_array(PATTERN_SEED, sc, n), sd, n), rc, n), rd, n)
            entry = self.cache.index.get(<int64_t>(h >> 1))
            if entry is not None:  # cached here: on new buffers, its plan is run here too
                rebound = self._rebinds(entry, code, validate, uniform)
                if rebound == ROUTE_PYTHON:
                    return NOT_FOUND  # the general path looks it up
                slot_no = entry.slot
                same = self._bound_to(entry.bound, sa, ra)
        limit = self._limits.INT_LIMIT  # ``transfer.needs_big``, on this rank's numbers
        big = (sn if sn > rn else rn) > limit or sent > limit // n
        with nogil:
            _fill_record(rec, big, 2 * code + uniform, validate, 0, slot_no, same, False, self._kib_cap, sc, rc, n,
                         validate, self._me, self._key_a, self._key_b)
        rec.over_budget = self.cache.held > self.cache.max_bytes
        flags = self._agree()
        # On in Python: a failed verdict, the large-count path, eviction, a hit on the buffers its
        # entry was last used with (bound for good there), a miss anywhere of a rank's cached
        # pattern, and auto's first pick for a pattern class, or a pick other than flat, hier or bruck.
        route = rebound if slot_no else ROUTE_FLAT if flags & (_NOT_CLEAN | BIG) else self._route(code, uniform)
        if flags & (_NOT_CLEAN | BIG) or (flags & _CLEAN != HIT if slot_no else route == ROUTE_PYTHON):
            self._pending, self._pending_flags, self._pending_entry = None, flags, entry
            return AGREED
        if route == ROUTE_HIER and slot_no:  # the entry's program, kept (detached) with it
            self._run_program(entry.plan.words, sa, ra)
            self.stats = self._entry_stats(entry)
        elif route == ROUTE_HIER:
            self._run_hier(sa, ra)
            key = (self._route_alg.name, self._route_radix)
            self.stats = self._hier_stats.get(key)
            if self.stats is None:
                self.stats = self._hier_stats[key] = self._make_stats(self._route_alg, self._route_radix,
                                                                      self._planned)
        elif route == ROUTE_BRUCK:
            self._run_bruck(sa, ra)
            memcpy(cnp.PyArray_DATA(self._bruck_stats.flat_counts), sc, n * sizeof(int64_t))
            self._bruck_stats.radix = self._pick_radix
            self.stats = self._bruck_stats
        else:
            with nogil:
                # Counts and displacements below INT_LIMIT everywhere: the verdict has no BIG.
                if uniform:
                    err = _alltoall(cnp.PyArray_DATA(sa), <int>block, cnp.PyArray_DATA(ra), <int>rblock,
                                    self._byte, self._comm)
                else:
                    for i in range(4 * n):
                        ints[i] = <int>sc[i]
                    err = _alltoallv(cnp.PyArray_DATA(sa), ints, ints + n, cnp.PyArray_DATA(ra), ints + 2 * n,
                                     ints + 3 * n, self._byte, self._comm)
            if err:
                raise MPI.Exception(err)
            memcpy(cnp.PyArray_DATA(self._stats_counts), sc, n * sizeof(int64_t))
            self.stats = self._miss_stats
        self.tick += 1
        if slot_no:  # a hit on new buffers (``HierComm._run_entry``): its entry now names them
            self.misses = 0
            self.touch(entry)
            entry.bound = (<size_t>cnp.PyArray_DATA(sa), sn, <size_t>cnp.PyArray_DATA(ra), rn,
                           self.scratch.generation, self._window_generation())
            self.state = "hit-rebound"
            self.compiled_rebound += 1
            return DONE
        return self._missed(flags, sa, ra, route == ROUTE_HIER)

    @property
    def parsed(self):
        """The sides the last miss read here, bytes (int64: send counts, send displacements,
        receive counts, receive displacements, one per rank each; the next miss overwrites them)."""
        return self._parsed

    cpdef touch(self, entry):
        """Count a hit of cache ``entry`` at the agreed call ``tick``: it becomes the cache's most
        recently used (``PlanCache.entries`` is kept in order of use)."""
        entries = self.cache.entries
        entry.last_use = self.tick
        entries[entry.slot] = entries.pop(entry.slot)
        self.cache.hits += 1

    cdef int _missed(self, int flags, sa, ra, bint hier) except -1:
        """Count a miss run here on arrays ``sa`` and ``ra`` (``hier``: run hierarchically);
        ``KEEP`` where the cache keeps its pattern (``kept``), else ``DONE``."""
        self.state = "miss" if self.cache.max_entries else "off"
        self.compiled_misses += 1
        if self.count_miss() and self.cache.max_entries:
            self.last_flags = flags
            self.kept = (sa, ra, self._planned if hier else None)
            return KEEP
        return DONE

    cdef int _route(self, long code, bint uniform) except -1:
        """How an agreed clean miss of ``code`` runs: flat or hierarchical here, or in Python
        (auto's first pick for a pattern class, or a pick of another algorithm)."""
        if code == self._auto_code:
            pick = self._picked(uniform)
            return self._route_of(pick[0], pick[1]) if pick is not None else ROUTE_PYTHON
        if code in self._flat_codes:
            return ROUTE_FLAT
        if self._brucks is not None and code in self._bruck_codes:
            self._pick_radix = self._radix
            return ROUTE_BRUCK
        algorithm = self._hier_algorithms[code]
        return self._route_of(algorithm, self._leaders if algorithm.planner == "leaders" else self._radix)

    cdef int _route_of(self, algorithm, long radix) except -1:
        """How a run of ``algorithm`` (an ``Algorithm``) at ``radix`` goes here (``ROUTE_PYTHON``:
        it does not), with the Bruck radix or the planner it takes."""
        cdef int rounds = algorithm.rounds
        planner = algorithm.planner
        if planner == "flat":
            if rounds == ROUNDS_LINEAR:
                return ROUTE_FLAT
            if rounds == ROUNDS_BRUCK and self._brucks is not None:
                self._pick_radix = radix
                return ROUTE_BRUCK
            return ROUTE_PYTHON
        if self._runner is not None and planner in self._planners:
            self._route_alg, self._route_planner = algorithm, self._planners[planner]
            self._route_both = planner == "leaders"
            if self._route_both:  # the planner of that many leaders (a dict: no Python frame on a hit)
                self._route_planner = self._route_planner[radix]
            self._route_radix = radix if rounds == ROUNDS_BRUCK or self._route_both else 0
            return ROUTE_HIER
        return ROUTE_PYTHON

    cdef cnp.ndarray _scratch_of(self, str name, int64_t nbytes):
        """``scratch.get(name, nbytes)``, with no call where the buffer is already large enough."""
        buf = self.scratch.buffers.get(name)
        if buf is not None and cnp.PyArray_DIMS(<cnp.ndarray>buf)[0] >= nbytes:
            return <cnp.ndarray>buf
        return self.scratch.get(name, nbytes)

    cdef cnp.ndarray _window_of(self, int64_t nbytes):
        """``window.ensure(nbytes)``, with no call where the window is already large enough (every
        node rank sees the same window, so every one takes the same branch)."""
        view = self.window.view
        if self.window.win is not None and cnp.PyArray_DIMS(<cnp.ndarray>view)[0] >= nbytes:
            return <cnp.ndarray>view
        return self.window.ensure(nbytes)

    cdef object _entry_stats(self, entry):
        """What a run of hierarchical cache ``entry``'s program leaves (made once per entry)."""
        st = entry.stats
        if st is None:
            st = entry.stats = self._make_stats(entry.algorithm, entry.radix, entry.plan)
        return st

    cdef int _run_bruck(self, cnp.ndarray sa, cnp.ndarray ra) except -1:
        """A miss run as a flat Bruck exchange at radix ``_pick_radix`` (the sides are in ``_parsed``)."""
        cdef Py_ssize_t n = self._size
        cdef const int64_t* sc = <const int64_t*>cnp.PyArray_DATA(self._parsed)
        cdef BruckOnce once = self._brucks.get(self._pick_radix)
        if once is None:
            once = self._brucks[self._pick_radix] = self._bruck_once(self._pick_radix)
        return once.exchange(<const unsigned char*>cnp.PyArray_DATA(sa), cnp.PyArray_NBYTES(sa),
                             <unsigned char*>cnp.PyArray_DATA(ra), cnp.PyArray_NBYTES(ra), sc, sc + n, sc + 2 * n,
                             sc + 3 * n)

    cdef int _run_hier(self, cnp.ndarray sa, cnp.ndarray ra) except -1:
        """A miss run hierarchically: the node ``Allgather`` of the receive counts, the planner's
        program, then the runner (the sides are in ``_parsed``)."""
        cdef Py_ssize_t n = self._size
        cdef int64_t* sc = <int64_t*>cnp.PyArray_DATA(self._parsed)
        cdef int64_t* both = <int64_t*>cnp.PyArray_DATA(self._both)
        cdef int err
        cdef bint two = self._route_both
        with nogil:
            if two:  # multi-leader: the send counts, then the receive counts
                memcpy(both, sc, n * sizeof(int64_t))
                memcpy(both + n, sc + 2 * n, n * sizeof(int64_t))
                err = _allgather(both, <int>(2 * n), cnp.PyArray_DATA(self._node_both), self._int64,
                                 self._runner.node_peers.comm)
            else:
                err = _allgather(sc + 2 * n, <int>n, cnp.PyArray_DATA(self.rc_node), self._int64,
                                 self._runner.node_peers.comm)
        if err:
            raise MPI.Exception(err)
        self._planned = self._route_planner.plan(self._mode, *self._sides,
                                                 self._node_both if two else self.rc_node,
                                                 self._route_alg.rounds, self._route_radix)
        return self._run_program(self._planned.words, sa, ra)

    cdef int _run_program(self, cnp.ndarray words, cnp.ndarray sa, cnp.ndarray ra) except -1:
        """Run a program's ``words`` on the caller's arrays, with the scratch and stage it needs."""
        cdef Header* h = _header(<int64_t*>cnp.PyArray_DATA(words))
        a = self._scratch_of("a", h.scratch_bytes)
        buf = self._window_of(h.stage_bytes) if h.flags & STAGE_SHARED else self._scratch_of("b", h.stage_bytes)
        return self._runner.run_program(words, sa, ra, a, buf)

    cdef int _rebinds(self, entry, long code, bint validate, bint uniform) except -1:
        """How a call of these settings and of the parsed pattern runs cached ``entry`` here
        (``_route_of``), or ``ROUTE_PYTHON``: not here. It runs here when it has the same settings
        and pattern, is not on the large-count path, has no persistent run (one the general path
        must free first) and, if hierarchical, has its plan."""
        cdef Py_ssize_t n = self._size, i
        cdef const int64_t* mine = <const int64_t*>cnp.PyArray_DATA(self._parsed)
        cdef cnp.ndarray part
        settings, parts = entry.settings, entry.parts
        if entry.big or entry.run is not None or parts is None or settings != (code, validate, 0, uniform) \
                or (entry.algorithm.planner != "flat" and entry.plan is None):
            return ROUTE_PYTHON
        for i in range(4):
            part = <cnp.ndarray?>parts[i]
            if part.dtype != np.int64 or part.shape[0] != n or not cnp.PyArray_IS_C_CONTIGUOUS(part) \
                    or memcmp(cnp.PyArray_DATA(part), mine + i * n, n * sizeof(int64_t)) != 0:
                return ROUTE_PYTHON
        return self._route_of(entry.algorithm, entry.radix)

    cdef bint _bound_to(self, bound, cnp.ndarray sa, cnp.ndarray ra) except -1:
        """Whether ``bound`` (``HierComm._identity``) names these buffers and the scratch of now."""
        return bound is not None and bound == (<size_t>cnp.PyArray_DATA(sa), cnp.PyArray_NBYTES(sa),
                                               <size_t>cnp.PyArray_DATA(ra), cnp.PyArray_NBYTES(ra),
                                               self.scratch.generation, self._window_generation())

    cdef object _picked(self, bint uniform):
        """Auto's memoised pick, (algorithm, radix), for the agreed pattern's class, or None (none yet)."""
        cdef const Record* t = <const Record*>cnp.PyArray_DATA(self._sums)
        key = ("oneshot", <Py_ssize_t>self._size, uniform, _quarter_log2(<double>t.bytes),
               _quarter_log2(<double>t.messages), _quarter_log2(<double>t.recv_kib_sq),
               _quarter_log2(<double>t.pairwise))
        return self._choices.get(key)

    def count_miss(self):
        """Count an agreed miss; whether the cache keeps its pattern. A long run of misses (a new
        pattern every call) keeps only every 8th: the cache's bookkeeping is then nearly free.
        Misses are agreed, so every rank keeps the same ones."""
        self.misses += 1
        return self.misses <= 2 * self.cache.max_entries or self.misses % 8 == 0

    def take_pending(self):
        """(slot, verdict bits, entry) of the last ``AGREED`` call, once: the ``Slot`` that
        recognised its specs, or None for a call the miss path agreed, with the cache entry this
        rank agreed with (None: none); (None, -1, None) when nothing is pending."""
        slot, flags, entry = self._pending, self._pending_flags, self._pending_entry
        self._pending, self._pending_flags, self._pending_entry = None, -1, None
        return slot, flags, entry

    def remember(self, Py_ssize_t no, tuple then, entry, s, r, algorithm, bint validate, bint uniform,
                 run, Program program):
        """Recognise these specs as slot ``no`` from now on (replacing what that slot or these
        leaves had). ``then``: (send, receive) copies of the specs, count and displacement arrays
        as ``Saved`` (``exchange._spec_memo``); the agreement's record must still be this call's. ``run``: the persistent run bound to these
        buffers, or None; ``program``: that run compiled (``run.program()``), or None (then
        ``run.run()`` runs)."""
        cdef Slot slot = Slot.__new__(Slot)
        cdef Py_ssize_t i
        slot.no, slot.entry, slot.s, slot.r = no, entry, s, r
        slot.then = then
        slot.algorithm, slot.validate, slot.uniform = algorithm, validate, uniform
        slot.send_leaf, slot.recv_leaf = _leaf(slot.then[0]), _leaf(slot.then[1])
        for leaf in (slot.send_leaf, slot.recv_leaf):
            if type(leaf) is not np.ndarray:
                raise TypeError("remember: a spec's data buffer must be a numpy array")
        slot.send_data = cnp.PyArray_DATA(<cnp.ndarray>slot.send_leaf)
        slot.send_nbytes = cnp.PyArray_NBYTES(<cnp.ndarray>slot.send_leaf)
        slot.recv_data = cnp.PyArray_DATA(<cnp.ndarray>slot.recv_leaf)
        slot.recv_nbytes = cnp.PyArray_NBYTES(<cnp.ndarray>slot.recv_leaf)
        slot.send_dtype, slot.recv_dtype = slot.send_leaf.dtype, slot.recv_leaf.dtype
        memcpy(&slot.record, cnp.PyArray_DATA(self._record), sizeof(Record))
        slot.run, slot.stats = run, (run.stats if run is not None else None)
        slot.scratch_generation, slot.window_generation = self.scratch.generation, self._window_generation()
        slot.program = program if run is not None else None
        self._slots = [x for x in self._slots if (<Slot>x).no != no
                       and not ((<Slot>x).send_leaf is slot.send_leaf and (<Slot>x).recv_leaf is slot.recv_leaf)]
        self._slots.append(slot)

    def forget(self, Py_ssize_t no):
        """Stop recognising slot ``no`` (its entry was dropped or its run freed)."""
        self._slots = [x for x in self._slots if (<Slot>x).no != no]

    def clear(self):
        """Forget every slot."""
        self._slots = []
        self._pending, self._pending_flags, self._pending_entry = None, -1, None
