"""Per-epoch global shuffle over HierComm (source A's exchange, used for training data).

Every epoch has a global order that depends only on (seed, epoch): position i of the epoch goes to
global step i // B, and within that step's batch to the rank ``j * P // b`` for offset j of b
samples. Each rank sends the samples it holds to the ranks that need them with one
``HierComm.alltoallv``, so with the same global batch size, -np 1 and -np 4 see the same samples
in every step. Every rank runs the same number of steps (the last batch may be smaller).
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from ..exchange import HierComm

SHUFFLES = ("hier", "flat", "none")


def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """The global sample order of an epoch (a permutation of range(n))."""
    return np.random.default_rng([seed, epoch, 0x5EED]).permutation(n)


class GlobalShuffle:
    """Holds this rank's share of the training set and reshuffles it across ranks every epoch."""

    def __init__(self, hc: HierComm, X: np.ndarray, y: np.ndarray, batch_size: int, seed: int,
                 mode: str = "hier"):
        if mode not in SHUFFLES:
            raise ValueError(f"unknown shuffle {mode!r}; choose from {', '.join(SHUFFLES)}")
        if batch_size < 1:
            raise ValueError(f"batch size must be >= 1, got {batch_size}")
        self.hc, self.mode, self.seed, self.batch_size = hc, mode, seed, batch_size
        size, rank = hc.comm.size, hc.comm.rank
        self.n = X.shape[0]
        self.steps_per_epoch = -(-self.n // batch_size)
        # Each rank starts with a contiguous shard, as if it had loaded only its part of the store.
        lo, hi = rank * self.n // size, (rank + 1) * self.n // size
        # Records keep the features' own dtype: a float32 store is not doubled in every rank's share.
        self.record = np.dtype([("x", X.dtype, X.shape[1:]), ("y", np.int64), ("idx", np.int64)])
        self.held = np.empty(hi - lo, dtype=self.record)
        self.held["x"], self.held["y"], self.held["idx"] = X[lo:hi], y[lo:hi], np.arange(lo, hi)
        self.bytes_moved = 0

    def _destination(self, position: np.ndarray) -> np.ndarray:
        size, b = self.hc.comm.size, self.batch_size
        step = position // b
        batch = np.minimum(b, self.n - step * b)
        return (position - step * b) * size // batch

    def epoch(self, epoch: int) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
        """Yield (X_local, y_local, global_batch_size) for every step of ``epoch`` (collective)."""
        b, rank = self.batch_size, self.hc.comm.rank
        if self.mode == "none":
            yield from self._local_epoch(epoch)
            return
        order = epoch_order(self.n, self.seed, epoch)
        position = np.empty(self.n, dtype=np.int64)
        position[order] = np.arange(self.n)
        pos = position[self.held["idx"]]
        dest = self._destination(pos)
        by_dest = np.argsort(dest, kind="stable")
        counts = np.bincount(dest, minlength=self.hc.comm.size)
        mine, _ = self.hc.alltoallv(self.held[by_dest], counts, algorithm=self.mode)
        self.bytes_moved += int(self.held.nbytes - counts[rank] * self.record.itemsize)
        mine = mine[np.argsort(position[mine["idx"]], kind="stable")]
        self.held = mine
        starts = np.searchsorted(position[mine["idx"]], np.arange(self.steps_per_epoch + 1) * b)
        for s in range(self.steps_per_epoch):
            part = mine[starts[s]:starts[s + 1]]
            yield part["x"], part["y"], min(b, self.n - s * b)

    def _local_epoch(self, epoch: int):
        """No exchange: each rank walks its own shard; a step's global batch is the sum of local ones."""
        size, rank, steps = self.hc.comm.size, self.hc.comm.rank, self.steps_per_epoch
        shard = np.array([(r + 1) * self.n // size - r * self.n // size for r in range(size)])
        local_b = -(-shard // steps)  # per-rank samples per step, so every rank has `steps` steps
        rng = np.random.default_rng([self.seed, epoch, rank])
        held = self.held[rng.permutation(len(self.held))]
        for s in range(steps):
            part = held[s * local_b[rank]:(s + 1) * local_b[rank]]
            sizes = np.clip(shard - s * local_b, 0, local_b)
            yield part["x"], part["y"], int(sizes.sum())
