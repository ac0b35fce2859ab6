"""Threads per rank for the BLAS and OpenMP pools that numpy (and anything else loaded) uses.

A BLAS library starts one thread per core by default. With one MPI rank per core that makes
ranks x cores threads fighting over the cores; on a 2-core machine a 2-rank MLP step with
1024 hidden units ran 15x slower than with one thread per rank. The default therefore splits
the host's usable cores (this process's CPU affinity) evenly over the ranks on the host.
"""
from __future__ import annotations

import os

from mpi4py import MPI

from ..schema import check

__all__ = ["usable_cores", "host_ranks", "default_threads", "limit_threads", "thread_pools"]


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity; the CPU count where that is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def host_ranks(comm: MPI.Comm) -> int:
    """Ranks of ``comm`` on this host (collective). Real hosts, not virtual nodes: virtual nodes
    of one host share its cores."""
    shm = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    try:
        return shm.size
    finally:
        shm.Free()


def default_threads(comm: MPI.Comm) -> int:
    """The host's usable cores divided by its ranks, at least 1 (collective)."""
    return max(1, usable_cores() // host_ranks(comm))


def limit_threads(threads: int) -> list[dict]:
    """Limit every BLAS/OpenMP thread pool of this process to ``threads``; returns the pools after
    the change (see ``thread_pools``)."""
    check("threads", threads)
    from threadpoolctl import threadpool_limits
    threadpool_limits(limits=threads)
    return thread_pools()


def thread_pools() -> list[dict]:
    """This process's BLAS/OpenMP pools now: library, API (blas or openmp) and threads of each."""
    from threadpoolctl import threadpool_info
    return [{"library": p.get("internal_api"), "api": p.get("user_api"), "threads": p.get("num_threads")}
            for p in threadpool_info()]
