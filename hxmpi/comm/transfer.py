"""Byte all-to-all transfers on one communicator: plain Alltoallv, or Alltoallw for large counts.

MPI calls whose counts or displacements exceed a C int use Alltoallw with one struct datatype per
peer (1 GiB chunks, 64-bit byte displacements), because Open MPI 5 has no MPI-4 large-count
(``_c``) routines. Whether a call is "big" must be decided alike on every rank of the communicator:
an Alltoallv never matches an Alltoallw.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .msgspec import Side

__all__ = ["needs_big", "Transfer"]

# The largest count or displacement a plain MPI call takes, and the chunk of the big-message
# datatypes. Module attributes so that tests can drive the big-message path with small buffers.
INT_LIMIT = 2**31 - 1
CHUNK_BYTES = 1 << 30


def needs_big(max_extent: int, max_total: int, size: int) -> bool:
    """Whether any count or displacement of any phase can pass a C int (inputs agreed, in bytes)."""
    return max_extent > INT_LIMIT or max_total * size > INT_LIMIT


def _struct_types(counts: np.ndarray, displs: np.ndarray, chunk: MPI.Datatype) -> list:
    """One committed datatype per peer covering its block, with 64-bit byte displacements."""
    types = []
    for c, d in zip(counts.tolist(), displs.tolist()):
        if c == 0:
            types.append(MPI.BYTE)
            continue
        q, r = divmod(c, CHUNK_BYTES)
        types.append(MPI.Datatype.Create_struct([q, r], [d, d + q * CHUNK_BYTES],
                                                [chunk, MPI.BYTE]).Commit())
    return types


class Transfer:
    """A byte Alltoallv on one communicator, plain or big-message, blocking or not, of ``send`` to
    ``recv`` (each a ``Side``: a uint8 view, int64 byte counts and displacements per peer).

    ``uniform``: every block has the same size and blocks lie back to back (an ``Alltoall``), so the
    transfer is an ``MPI_Alltoall`` and the MPI library's own algorithms for it apply (Bruck's for
    small blocks in Open MPI). Must be the same on every rank, as ``big`` must.
    """

    def __init__(self, comm, send: Side, recv: Side, big: bool, uniform: bool = False):
        # ``big`` must be the same on every rank of ``comm``: Alltoallv never matches Alltoallw.
        sview, sc, sd, rview, rc, rd = send.view, send.counts, send.displs, recv.view, recv.counts, recv.displs
        self.comm = comm
        self.types = []
        self._chunk = None
        self.uniform = uniform and not big
        if self.uniform:
            n = sc.shape[0]
            sblock, rblock = (int(sc[0]), int(rc[0])) if n else (0, 0)
            s0, r0 = (int(sd[0]), int(rd[0])) if n else (0, 0)
            self.sargs = [sview[s0:s0 + n * sblock], sblock, MPI.BYTE]
            self.rargs = [rview[r0:r0 + n * rblock], rblock, MPI.BYTE]
            self.big = False
        elif not big:
            # C int arrays go to MPI as they are; int64 ones would be converted item by item.
            self.sargs = [sview, (sc.astype(np.intc), sd.astype(np.intc)), MPI.BYTE]
            self.rargs = [rview, (rc.astype(np.intc), rd.astype(np.intc)), MPI.BYTE]
            self.big = False
        else:
            self._chunk = MPI.BYTE.Create_contiguous(CHUNK_BYTES).Commit()
            st = _struct_types(sc, sd, self._chunk)
            rt = _struct_types(rc, rd, self._chunk)
            self.types = st + rt
            ones_s, ones_r = (sc > 0).astype(np.int64), (rc > 0).astype(np.int64)
            zeros = np.zeros(sc.shape[0], dtype=np.int64)
            self.sargs = [sview, (ones_s, zeros), st]
            self.rargs = [rview, (ones_r, zeros), rt]
            self.big = True

    @property
    def _name(self) -> str:
        return "Alltoall" if self.uniform else "Alltoallw" if self.big else "Alltoallv"

    def run(self) -> None:
        """One blocking transfer (the datatypes stay until ``free``)."""
        getattr(self.comm, self._name)(self.sargs, self.rargs)

    def start(self) -> MPI.Request:
        """Start the transfer nonblocking (``MPI_Ialltoall*``)."""
        return getattr(self.comm, "Ia" + self._name[1:])(self.sargs, self.rargs)

    def init(self):
        """An MPI-4 persistent request for this transfer, or None where the MPI library has none."""
        try:
            return getattr(self.comm, self._name + "_init")(self.sargs, self.rargs)
        except (NotImplementedError, AttributeError):
            return None

    def program(self) -> None:
        """None: a transfer compiles only through its persistent request (``runs.Run.program``)."""
        return None

    def free(self) -> None:
        for t in self.types:
            if t != MPI.BYTE:
                t.Free()
        self.types = []
        if self._chunk is not None:
            self._chunk.Free()
            self._chunk = None
