"""The numpy form of the all-to-all: rows of an array to each rank, receive counts learned in the call.

``Rows`` holds ``HierComm.alltoallv(array, counts)``: the receive counts come from their senders
(a persistent 8-byte ``Alltoall``, bound once to reused count buffers), then the call is agreed
and run as any one-shot call, the row kind (dtype and row shape) agreed with it.
"""
from __future__ import annotations

import zlib
from typing import Optional

import numpy as np

from ..errors import guarded
from .engine import Call
from .msgspec import Side, int_vector
from .plan import exclusive_cumsum

__all__ = ["Rows"]

_KIND_BITS = 20  # row kinds are agreed as a 20-bit code: its square summed over ranks fits in 64 bits


class Rows:
    """``alltoallv``, the numpy form of a HierComm's all-to-all. A class using it has ``comm``, its
    engine (``_engine``), ``Alltoall_init`` and the count exchange's buffers (``_count_send``,
    ``_count_recv``, ``_count_request``)."""

    @guarded(owner="HierComm")
    def alltoallv(self, array, counts, algorithm: Optional[str] = None,
                  validate: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Send ``counts[d]`` consecutive rows of ``array`` (axis 0) to rank d; return (rows, recv counts).

        The numpy form of ``Alltoallv``: the receive counts are learned from their senders (one 8-byte
        all-to-all), then the call is agreed as any other. Collective over the HierComm's ranks.

        Parameters
        ----------
        array : array_like
            The rows to send, along axis 0, ordered by destination rank. Every rank must pass the same
            dtype and row shape.
        counts : sequence of int
            Rows for each rank (one per rank); they sum to ``len(array)``.
        algorithm : str, optional
            This call's algorithm; None: the HierComm's own.
        validate : bool, default True
            False skips only the pairwise byte check.

        Returns
        -------
        rows : numpy.ndarray
            The rows received, ordered by source rank; ``array``'s dtype and row shape.
        recv_counts : numpy.ndarray
            Rows received from each rank (int64).

        Raises
        ------
        hxmpi.ExchangeError
            On every rank, for bad input on any rank: counts that are not one integer per rank or do not
            sum to the rows, an array without rows (0-d), a dtype or row shape that differs between
            ranks.

        Examples
        --------
        >>> rows = np.full(((rank + 1) * size, 3), float(rank))  # rank + 1 rows of 3 for each rank
        >>> got, got_counts = hc.alltoallv(rows, [rank + 1] * size)
        >>> got_counts.tolist() == rcounts.tolist(), np.array_equal(got[:, 0], expected)
        (True, True)
        """
        size = self.comm.size
        array = np.ascontiguousarray(array)
        c, problem = int_vector(counts, size, "counts")
        row_shape = array.shape[1:] if array.ndim else ()
        row_bytes = int(array.itemsize * int(np.prod(row_shape, dtype=np.int64)))
        if problem is None and array.ndim == 0:
            problem = "array must have at least one dimension (rows along axis 0)"
        if problem is None and int(c.sum()) != array.shape[0]:
            problem = f"counts sum to {int(c.sum())} rows but the array has {array.shape[0]}"
        kind_text = f"{array.dtype.str if array.dtype.names is None else array.dtype.descr} rows of shape {row_shape}"
        kind = 1 + zlib.crc32(f"{kind_text} {row_bytes}".encode()) % ((1 << _KIND_BITS) - 1)
        rcounts = self._exchange_counts(c if problem is None else None)
        if problem is None and (rcounts < 0).any():
            rcounts = np.zeros(size, dtype=np.int64)  # a sender has a problem: the agreement names it
        s = Side(np.frombuffer(array, np.uint8) if array.nbytes else np.empty(0, np.uint8),
                 c * row_bytes if problem is None else None,
                 exclusive_cumsum(c) * row_bytes if problem is None else None)
        out = np.empty((int(rcounts.sum()) if problem is None else 0,) + row_shape, dtype=array.dtype)
        r = Side(out.reshape(-1).view(np.uint8) if out.nbytes else np.empty(0, np.uint8),
                 rcounts * row_bytes, exclusive_cumsum(rcounts) * row_bytes)
        # The counts came from their senders; the fingerprint still checks the bytes (row sizes).
        self._engine.one_shot(Call(algorithm, validate, kind=kind, kind_text=kind_text), s, r, problem, True)
        return out, rcounts

    def _exchange_counts(self, counts: Optional[np.ndarray]) -> np.ndarray:
        """Every rank learns what each sender sends it (int64 per peer; -1 from a rank with a problem),
        by a persistent ``Alltoall`` of 8-byte blocks, its algorithm the cost model's pick."""
        send, recv = self._count_send, self._count_recv
        if counts is None:
            send.fill(-1)
        else:
            send[:] = counts
        if self._count_request is None:  # bound once, to the reused count buffers
            self._count_request = self.Alltoall_init(send, recv, algorithm="auto")
        self._count_request.Start()
        self._count_request.Wait()
        return recv.copy()

