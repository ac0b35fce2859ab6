"""What the model knows of a call's counts: the sums every rank agrees on (``Pattern``), and the
class of patterns that one pick of ``algorithm="auto"`` serves (``pattern_class``)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .._agree import quarter_log2

__all__ = ["KIB_CAP", "Pattern", "pattern_class"]

#: The agreement's cap on a rank's receive KiB (2 GiB): P * cap**2 stays below 2**64 up to 2**22 ranks.
KIB_CAP = (1 << 21) - 1


@dataclass(frozen=True)
class Pattern:
    """What the model knows of a call's counts: sums every rank can agree on with one SUM Allreduce.

    ``total_bytes``: send bytes summed over ranks; ``messages``: non-empty blocks to other ranks,
    summed over ranks (None: every block non-empty); ``sumsq_recv_kib``: sum over ranks of
    (receive bytes / 1024)**2 (None: every rank receives the mean); ``pairwise_bytes``: sum over
    ranks q of sum over k of max(bytes q sends q+k, bytes q receives from q-k), what pairwise
    rounds wait for (each rank computes its term from its own counts; None: even); ``uniform``:
    every block the same size (MPI_Alltoall applies).
    """
    size: int
    total_bytes: float
    messages: Optional[float] = None
    sumsq_recv_kib: Optional[float] = None
    uniform: bool = False
    pairwise_bytes: Optional[float] = None

    @classmethod
    def from_counts(cls, counts: np.ndarray, whole_kib: bool = False) -> "Pattern":
        """The agreed sums of a (P, P) bytes matrix (what a real call would agree on). ``whole_kib``:
        receive bytes in whole KiB, capped, exactly as ``hxmpi.comm.agreement`` carries them."""
        counts = np.asarray(counts, dtype=np.int64)
        p = counts.shape[0]
        off = counts.copy()
        np.fill_diagonal(off, 0)
        recv_kib = np.minimum(counts.sum(axis=0) >> 10, KIB_CAP) if whole_kib else counts.sum(axis=0) / 1024.0
        q, k = np.meshgrid(np.arange(p), np.arange(1, p), indexing="ij")
        pairwise = np.maximum(counts[q, (q + k) % p], counts[(q - k) % p, q]).sum() if p > 1 else 0
        return cls(p, float(counts.sum()), float(np.count_nonzero(off)), float((recv_kib ** 2).sum()),
                   bool((counts == counts.flat[0]).all()) if counts.size else True, float(pairwise))

    @classmethod
    def even(cls, size: int, block: float) -> "Pattern":
        """Every block ``block`` bytes."""
        return cls(size, float(block) * size * size, None, None, True)

    @property
    def rank_bytes(self) -> float:
        """Bytes a rank handles: the root mean square of per-rank receive bytes (the mean if even)."""
        mean = self.total_bytes / self.size
        if self.sumsq_recv_kib is None:
            return mean
        return max(mean, 1024.0 * math.sqrt(self.sumsq_recv_kib / self.size))

    @property
    def rank_messages(self) -> float:
        """Non-empty blocks a rank sends to other ranks (mean)."""
        return self.size - 1.0 if self.messages is None else self.messages / self.size



def pattern_class(pattern: Pattern) -> tuple:
    """The pattern's class: its size, uniformity and agreed sums rounded to quarter powers of two
    (a factor of 2**0.25 = 1.19). ``auto_pick`` decides per class."""
    sums = (pattern.total_bytes, pattern.messages, pattern.sumsq_recv_kib, pattern.pairwise_bytes)
    return (pattern.size, pattern.uniform) + tuple(None if x is None else quarter_log2(x) for x in sums)

