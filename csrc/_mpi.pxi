# MPI from compiled code: the symbols ``dlsym`` finds through the loaded mpi4py extension
# (``_resolve``, run at import), and thin C wrappers of the MPI calls the compiled paths make, each
# passing handles in the family's type (a pointer in Open MPI, an int in MPICH) as ``.handle``
# gives them. Included by ``_call.pyx`` before everything that calls MPI (``_program.pxi``,
# ``_bruck_once.pxi``, ``_runner.pxi``, ``_calltable.pxi``); the module docstring says why no MPI
# header is needed.
from libc.stdint cimport uint32_t, uint64_t, uintptr_t
from posix.dlfcn cimport RTLD_LAZY, dlopen, dlsym

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


# MPI_Isend and MPI_Irecv have one signature; MPI_Mprobe, MPI_Get_count and MPI_Imrecv (the Bruck
# first run's receives). As above, with the family's handle type.
ctypedef int (*isend_ptr_t)(const void*, int, void*, int, int, void*, void*) noexcept nogil
ctypedef int (*isend_int_t)(const void*, int, int, int, int, int, void*) noexcept nogil
ctypedef int (*mprobe_ptr_t)(int, int, void*, void*, void*) noexcept nogil
ctypedef int (*mprobe_int_t)(int, int, int, void*, void*) noexcept nogil
ctypedef int (*get_count_ptr_t)(const void*, void*, int*) noexcept nogil
ctypedef int (*get_count_int_t)(const void*, int, int*) noexcept nogil
ctypedef int (*imrecv_ptr_t)(void*, int, void*, void*, void*) noexcept nogil
ctypedef int (*imrecv_int_t)(void*, int, int, void*, void*) noexcept nogil


cdef inline int _isend(const void* buf, int count, uint64_t datatype, int dest, int tag, uint64_t comm,
                       uint64_t* request) noexcept nogil:
    request[0] = 0
    if _handle_bytes == 8:
        return (<isend_ptr_t>_mpi_isend)(buf, count, <void*><uintptr_t>datatype, dest, tag, <void*><uintptr_t>comm,
                                         request)
    return (<isend_int_t>_mpi_isend)(buf, count, <int><uint32_t>datatype, dest, tag, <int><uint32_t>comm, request)


cdef inline int _irecv(void* buf, int count, uint64_t datatype, int source, int tag, uint64_t comm,
                       uint64_t* request) noexcept nogil:
    """MPI_Irecv (MPI_Isend's signature, the buffer writable)."""
    request[0] = 0
    if _handle_bytes == 8:
        return (<isend_ptr_t>_mpi_irecv)(buf, count, <void*><uintptr_t>datatype, source, tag, <void*><uintptr_t>comm,
                                         request)
    return (<isend_int_t>_mpi_irecv)(buf, count, <int><uint32_t>datatype, source, tag, <int><uint32_t>comm, request)


cdef inline int _mprobe(int source, int tag, uint64_t comm, uint64_t* message, char* status) noexcept nogil:
    message[0] = 0
    if _handle_bytes == 8:
        return (<mprobe_ptr_t>_mpi_mprobe)(source, tag, <void*><uintptr_t>comm, message, status)
    return (<mprobe_int_t>_mpi_mprobe)(source, tag, <int><uint32_t>comm, message, status)


cdef inline int _get_count(const char* status, uint64_t datatype, int* count) noexcept nogil:
    if _handle_bytes == 8:
        return (<get_count_ptr_t>_mpi_get_count)(status, <void*><uintptr_t>datatype, count)
    return (<get_count_int_t>_mpi_get_count)(status, <int><uint32_t>datatype, count)


cdef inline int _imrecv(void* buf, int count, uint64_t datatype, uint64_t* message, uint64_t* request) noexcept nogil:
    request[0] = 0
    if _handle_bytes == 8:
        return (<imrecv_ptr_t>_mpi_imrecv)(buf, count, <void*><uintptr_t>datatype, message, request)
    return (<imrecv_int_t>_mpi_imrecv)(buf, count, <int><uint32_t>datatype, message, request)


# The node window's barrier fence (``_program.pxi``'s ``_run_steps``, ``_runner.pxi``'s runner).
cdef extern from *:
    """
    static inline void hx_fence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
    """
    void hx_fence() noexcept nogil
