"""A nonblocking all-to-all beside computation: Ialltoallv returns a request at once, the caller
computes, polls with Test, and Waits; hxmpi.waitall completes several requests.

Run: mpirun -np 4 python -m mpi4py examples/nonblocking_overlap.py
"""
import numpy as np

import hxmpi
from mpi4py import MPI

comm = MPI.COMM_WORLD
hc = hxmpi.HierComm(comm)
n = 1024  # items to every rank
send = np.repeat(np.arange(comm.size, dtype=np.float64) + 10 * comm.rank, n)
recv = np.empty_like(send)

req = hc.Ialltoallv([send, n, MPI.DOUBLE], [recv, n, MPI.DOUBLE])  # send and recv stay untouched until done
a = np.random.default_rng(comm.rank).standard_normal((200, 200))
polls = 0
while not req.Test():  # compute in slices, checking in between
    a = np.tanh(a @ a.T / 200)
    polls += 1
expected = np.repeat(10.0 * np.arange(comm.size) + comm.rank, n)
assert np.array_equal(recv, expected)

# Several requests at once; every one completes before an error, if any, is raised.
outs = [np.empty_like(send) for _ in range(3)]
reqs = [hc.Ialltoallv([send, n, MPI.DOUBLE], [out, n, MPI.DOUBLE]) for out in outs]
hxmpi.waitall(reqs)
assert all(np.array_equal(out, expected) for out in outs)
if comm.rank == 0:
    print("nonblocking ok")
hc.free()
