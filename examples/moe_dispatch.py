"""A mixture-of-experts token dispatch: every rank sends each token to the rank holding its
expert, the expert transforms it there, and the results come back to where the token came from.
Two ``HierComm.alltoallv(array, counts)`` calls: rows grouped by destination, counts learned by
the receivers.

Run: mpirun -np 4 python -m mpi4py examples/moe_dispatch.py
"""
import numpy as np

import hxmpi
from mpi4py import MPI

comm = MPI.COMM_WORLD
hc = hxmpi.HierComm(comm, ranks_per_node=2)
experts_per_rank, tokens, width = 2, 64, 8
num_experts = experts_per_rank * comm.size
rng = np.random.default_rng(comm.rank)

x = rng.standard_normal((tokens, width))
expert = rng.integers(0, num_experts, tokens)  # a gate's top-1 choice per token
owner = expert // experts_per_rank              # the rank that holds each expert

# Dispatch: group the tokens by destination rank; the expert id travels as a last column.
order = np.argsort(owner, kind="stable")
send = np.hstack([x, expert[:, None].astype(float)])[order]
counts = np.bincount(owner, minlength=comm.size)
received, received_counts = hc.alltoallv(send, counts)  # rows ordered by source rank

# Each expert scales its tokens by (its id + 1): a stand-in for the expert's layer.
out = received[:, :width] * (received[:, width:] + 1)

# Combine: send every row back to its source (the received counts are the return counts).
back, _ = hc.alltoallv(out, received_counts)
y = np.empty_like(back)
y[order] = back                                 # undo the grouping
assert np.allclose(y, x * (expert[:, None] + 1))
if comm.rank == 0:
    print("tokens kept on rank 0", int(counts[0]), "of", tokens)
    print("moe dispatch ok")
hc.free()
