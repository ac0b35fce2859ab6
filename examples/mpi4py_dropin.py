"""Route an existing mpi4py code through hxmpi: a function written for a communicator is handed a
HierComm instead, unchanged; a communicator derived from it (Split) is a HierComm of its own.

Run: mpirun -np 4 python -m mpi4py examples/mpi4py_dropin.py
"""
import numpy as np

import hxmpi  # before mpi4py.MPI (see the how-to "Route an existing mpi4py code")
from mpi4py import MPI


def redistribute(comm, values):
    """Existing mpi4py code: send every rank an equal share of ``values``; written for any
    communicator, it calls only communicator methods."""
    size = comm.Get_size()
    recv = np.empty_like(values)
    comm.Alltoall([values, len(values) // size, MPI.INT64_T], [recv, len(values) // size, MPI.INT64_T])
    total = comm.allreduce(int(recv.sum()), op=MPI.SUM)  # not a HierComm method: falls through
    return recv, total


world = MPI.COMM_WORLD
values = np.arange(4 * world.size, dtype=np.int64) + 100 * world.rank

plain, plain_total = redistribute(world, values)  # the code as it was
hc = hxmpi.HierComm(world)
routed, routed_total = redistribute(hc, values)  # the same code, through hxmpi
assert np.array_equal(plain, routed) and plain_total == routed_total

# A communicator derived from the HierComm (Split, Dup, Split_type, Create_cart, Create_group) is a
# HierComm too, with the parent's settings and nodes: the code's own process grid stays in hxmpi.
sub = hc.Split(color=world.rank % 2, key=world.rank)
assert isinstance(sub, hxmpi.HierComm)
sub_plain = world.Split(color=world.rank % 2, key=world.rank)  # the same group, plain
part = values[:4 * sub.Get_size()].copy()
expected, _ = redistribute(sub_plain, part)
got, _ = redistribute(sub, part)
assert np.array_equal(expected, got)

if world.rank == 0:
    print("world total", routed_total, "subcommunicator size", sub.Get_size())
    print("dropin ok")
sub.free()
sub_plain.Free()
hc.free()
