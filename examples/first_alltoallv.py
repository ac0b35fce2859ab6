"""A first Alltoallv through hxmpi.HierComm, checked against the expected rows, and what
``last_stats`` says about the call.

Run: mpirun -np 4 python -m mpi4py examples/first_alltoallv.py [K]

With K, the ranks form virtual nodes of K ranks each (to see a hierarchical layout on one host);
without it, hxmpi uses the real nodes (or env HXMPI_RANKS_PER_NODE, when set).
"""
import sys

import numpy as np

import hxmpi  # before mpi4py.MPI: hxmpi sets Open MPI's one-sided component choice before MPI starts
from mpi4py import MPI

comm = MPI.COMM_WORLD
ranks_per_node = int(sys.argv[1]) if len(sys.argv) > 1 else None  # None: the real nodes
hc = hxmpi.HierComm(comm, ranks_per_node=ranks_per_node)

# Rank r sends d + 1 doubles, each equal to r, to rank d; so it receives r + 1 doubles from everyone.
scounts = np.arange(comm.size) + 1
rcounts = np.full(comm.size, comm.rank + 1)
sbuf = np.full(scounts.sum(), float(comm.rank))
rbuf = np.empty(rcounts.sum())

hc.Alltoallv([sbuf, scounts, MPI.DOUBLE], [rbuf, rcounts, MPI.DOUBLE])  # mpi4py's spec, counts in items
expected = np.repeat(np.arange(comm.size, dtype=float), comm.rank + 1)
assert np.array_equal(rbuf, expected), (comm.rank, rbuf)

stats = hc.last_stats  # what the call just did on this rank
if comm.rank == 0:
    print("nodes", hc.topology.node_sizes)
    print("algorithm", stats["algorithm"], "plan_cache", stats["plan_cache"])
    print("inter_node messages", stats["inter_node"]["messages"], "bytes", stats["inter_node"]["bytes"])

hc.Alltoallv([sbuf, scounts, MPI.DOUBLE], [rbuf, rcounts, MPI.DOUBLE])  # the same pattern again
if comm.rank == 0:
    print("second call plan_cache", hc.last_stats["plan_cache"])
    print("alltoallv ok")
hc.free()
