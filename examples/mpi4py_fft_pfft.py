"""mpi4py-fft's PFFT with its global transposes routed through hxmpi: hand PFFT a Subcomm that
holds HierComms (one per axis) instead of plain subcommunicators. Skips, saying so,
where mpi4py-fft is not installed (pip install mpi4py-fft needs FFTW's headers).

Run: mpirun -np 4 python -m mpi4py examples/mpi4py_fft_pfft.py
"""
import sys

import numpy as np

import hxmpi
from mpi4py import MPI

try:
    from mpi4py_fft import PFFT
    from mpi4py_fft.pencil import Subcomm
except ImportError:
    if MPI.COMM_WORLD.rank == 0:
        print("mpi4py-fft is not installed: skipped")
    sys.exit(0)

comm = MPI.COMM_WORLD
shape = (16, 12, 10)
plain = Subcomm(comm, [0, 0, 1])  # distribute axes 0 and 1, as PFFT would
# PFFT takes its subcommunicators as a Subcomm (a tuple subclass): make one holding a HierComm over
# each plain subcommunicator (the same ranks in the same order).
routed = tuple.__new__(Subcomm, [hxmpi.HierComm(c) for c in plain])
fft = PFFT(routed, shape, axes=(0, 1, 2), dtype=np.complex128)
reference = PFFT(plain, shape, axes=(0, 1, 2), dtype=np.complex128)

# Plain arrays of this rank's shapes (newDistArray wants a Subcomm of mpi4py communicators).
u = np.random.default_rng(comm.rank).standard_normal(fft.shape(False)).astype(np.complex128)
u_hat = fft.forward(u, np.empty(fft.shape(True), np.complex128))  # transposes by HierComm.Alltoallw
expected = reference.forward(u, np.empty(reference.shape(True), np.complex128))
assert np.array_equal(u_hat, expected)
back = fft.backward(u_hat, np.empty(fft.shape(False), np.complex128))
assert np.allclose(back, u)
if comm.rank == 0:
    print("pfft ok")
fft.destroy()        # frees the HierComms (Subcomm.destroy calls Free on each)
reference.destroy()  # frees the plain subcommunicators
