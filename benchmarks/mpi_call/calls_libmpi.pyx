# cython: language_level=3
"""Start + Wait of a persistent MPI request, n times, with ``cimport mpi4py.libmpi``: direct C calls
without the GIL, but compiled against an ``mpi.h`` (``mpicc``), which must match the one mpi4py was
built with: mpi4py checks its object sizes when this module is imported. The caller times it."""
from mpi4py.libmpi cimport MPI_STATUS_IGNORE, MPI_Request, MPI_Start, MPI_Wait
from mpi4py.MPI cimport Request


def loop_libmpi(Request request, int n):
    """``n`` times MPI_Start/MPI_Wait on ``request``'s handle."""
    cdef MPI_Request* handle = &request.ob_mpi
    cdef int i
    with nogil:
        for i in range(n):
            MPI_Start(handle)
            MPI_Wait(handle, MPI_STATUS_IGNORE)
