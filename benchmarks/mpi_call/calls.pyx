# cython: language_level=3
"""Start + Wait of a persistent MPI request, n times, from compiled code without MPI headers.

- ``loop_methods``: Cython calling mpi4py's ``Start``/``Wait`` methods (a Python call each).
- ``loop_dlsym``: C function pointers to ``MPI_Start``/``MPI_Wait``, resolved with ``dlsym`` from
  the libmpi that mpi4py already loaded (``resolve``), the request passed by its address
  (``MPI._addressof``); the loop runs without the GIL. Works for both MPI families from one build:
  both functions take handles by pointer, and only ``MPI_STATUS_IGNORE`` differs (a parameter).

The caller times each loop.
"""
from libc.stdint cimport uintptr_t
from posix.dlfcn cimport RTLD_LAZY, dlopen, dlsym


cdef extern from "<dlfcn.h>":
    const int RTLD_NOLOAD  # glibc: only a library already loaded (built with -D_GNU_SOURCE)


ctypedef int (*start_t)(void*) noexcept nogil
ctypedef int (*wait_t)(void*, void*) noexcept nogil
cdef start_t c_start = NULL
cdef wait_t c_wait = NULL


def resolve(bytes libmpi):
    """Point the function pointers at ``libmpi`` (a path), which must be loaded already."""
    global c_start, c_wait
    handle = dlopen(libmpi, RTLD_NOLOAD | RTLD_LAZY)
    if handle == NULL:
        raise OSError(f"{libmpi!r} is not loaded in this process")
    c_start = <start_t>dlsym(handle, "MPI_Start")
    c_wait = <wait_t>dlsym(handle, "MPI_Wait")
    if c_start == NULL or c_wait == NULL:
        raise OSError(f"MPI_Start or MPI_Wait not found in {libmpi!r}")


def loop_methods(request, int n):
    """``n`` times ``request.Start(); request.Wait()`` through mpi4py's methods."""
    cdef int i
    start, wait = request.Start, request.Wait
    for i in range(n):
        start()
        wait()


def loop_dlsym(uintptr_t request_address, int n, uintptr_t status_ignore):
    """``n`` times MPI_Start/MPI_Wait through the resolved pointers; ``status_ignore`` is the
    family's ``MPI_STATUS_IGNORE`` (Open MPI 0, MPICH 1)."""
    if c_start == NULL:
        raise RuntimeError("call resolve() first")
    cdef void* request = <void*>request_address
    cdef void* status = <void*>status_ignore
    cdef int i
    with nogil:
        for i in range(n):
            c_start(request)
            c_wait(request, status)
