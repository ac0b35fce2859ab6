"""Alltoallw with subarray datatypes: the global transpose of a 2-D FFT's pencil decomposition.
Each rank holds a slab of rows (all columns) and receives a slab of columns (all rows); one
subarray type per peer picks the blocks in place, with no packing by hand.

Run: mpirun -np 4 python -m mpi4py examples/pencil_transpose.py
"""
import numpy as np

import hxmpi
from mpi4py import MPI

comm = MPI.COMM_WORLD
P, rank = comm.size, comm.rank
N, M = 12, 10  # global array shape


def share(n, parts):
    """Start and length of each part of n split as evenly as possible."""
    lengths = [n // parts + (i < n % parts) for i in range(parts)]
    return np.cumsum([0] + lengths[:-1]), lengths


row0, rows = share(N, P)  # before: rank r holds rows row0[r] .. + rows[r], every column
col0, cols = share(M, P)  # after: rank r holds columns col0[r] .. + cols[r], every row
full = np.arange(N * M, dtype=np.complex128).reshape(N, M) * (1 + 1j)  # the global array, for checking
a = np.ascontiguousarray(full[row0[rank]:row0[rank] + rows[rank]])  # shape (rows[rank], M)
b = np.zeros((N, cols[rank]), dtype=np.complex128)

T = MPI.C_DOUBLE_COMPLEX
# To peer d: my rows, d's columns. From peer s: s's rows, my columns. One item of each type.
send_types = [T.Create_subarray([rows[rank], M], [rows[rank], cols[d]], [0, col0[d]]).Commit() for d in range(P)]
recv_types = [T.Create_subarray([N, cols[rank]], [rows[s], cols[rank]], [row0[s], 0]).Commit() for s in range(P)]
ones, zeros = [1] * P, [0] * P  # Alltoallw displacements are in bytes

hc = hxmpi.HierComm(comm)
hc.Alltoallw([a, (ones, zeros), send_types], [b, (ones, zeros), recv_types])
assert np.array_equal(b, full[:, col0[rank]:col0[rank] + cols[rank]])

check = np.zeros_like(b)
comm.Alltoallw([a, (ones, zeros), send_types], [check, (ones, zeros), recv_types])  # MPI's own, the same bytes
assert check.tobytes() == b.tobytes()
if rank == 0:
    print("algorithm", hc.last_stats["algorithm"])
    print("pencil transpose ok")
for t in send_types + recv_types:
    t.Free()
hc.free()
