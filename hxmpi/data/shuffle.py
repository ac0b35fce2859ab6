"""Per-epoch global shuffle over HierComm (the two-stage exchange of docs/method.md, for training data).

Every epoch (or, when streaming, every window of an epoch) has a global order that depends only on
(seed, epoch[, window]): position i goes to global step i // B, and within that step's batch to
the rank ``j * P // b`` for offset j of b samples. Each rank sends the samples it holds to the ranks
that need them with one ``HierComm.alltoallv``, so with the same global batch size, -np 1 and
-np 4 see the same samples in every step. Every rank runs the same number of steps (the last batch
of an epoch or window may be smaller).

``GlobalShuffle`` reshuffles a training set held in memory (one window per epoch);
``ShardStream`` does the same for a distributed-mode store, one window of shards at a time.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from ..comm.exchange import HierComm
from ..schema import SETTINGS, check

__all__ = ["epoch_order", "records", "deal", "GlobalShuffle", "ShardStream"]

SHUFFLES = SETTINGS["shuffle"].choices


def epoch_order(n: int, seed: int, epoch: int, window: int = -1) -> np.ndarray:
    """The global sample order of an epoch, or of one window of it (a permutation of range(n))."""
    key = [seed, epoch, 0x5EED] if window < 0 else [seed, epoch, 0x5EED, window]
    return np.random.default_rng(key).permutation(n)


def records(X: np.ndarray, y: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Samples as one structured array (x, y, global index); x keeps the features' dtype."""
    # The features' own dtype: a float32 store is not doubled in every rank's share.
    out = np.empty(len(y), dtype=[("x", X.dtype, X.shape[1:]), ("y", np.int64), ("idx", np.int64)])
    out["x"], out["y"], out["idx"] = X, y, idx
    return out


class _Steps(list):
    """A window's steps, (X, y, global_batch) each, plus the bytes this rank sent to others."""
    bytes_sent = 0


def deal(hc: HierComm, held: np.ndarray, order: np.ndarray, batch_size: int, mode: str):
    """Exchange ``held`` records (``idx`` in range(len(order))) so every rank gets its part of every
    batch of ``order``; returns (records now held, in order, and the window's steps) (collective)."""
    n, size, b = len(order), hc.comm.size, batch_size
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n)
    pos = position[held["idx"]]
    step = pos // b
    dest = (pos - step * b) * size // np.minimum(b, n - step * b)
    by_dest = np.argsort(dest, kind="stable")
    counts = np.bincount(dest, minlength=size)
    mine, _ = hc.alltoallv(held[by_dest], counts, algorithm=mode)
    mine_pos = position[mine["idx"]]
    in_order = np.argsort(mine_pos, kind="stable")
    mine = mine[in_order]
    steps = -(-n // b)
    starts = np.searchsorted(mine_pos[in_order], np.arange(steps + 1) * b)
    out = _Steps((mine[starts[s]:starts[s + 1]]["x"], mine[starts[s]:starts[s + 1]]["y"], min(b, n - s * b))
                 for s in range(steps))
    out.bytes_sent = int(held.nbytes - counts[hc.comm.rank] * held.dtype.itemsize)
    return mine, out


class GlobalShuffle:
    """Holds this rank's share of the training set and reshuffles it across ranks every epoch."""

    def __init__(self, hc: HierComm, X: np.ndarray, y: np.ndarray, batch_size: int, seed: int,
                 mode: str = "hier"):
        check("shuffle", mode)
        check("batch_size", batch_size)
        self.hc, self.mode, self.seed, self.batch_size = hc, mode, seed, batch_size
        size, rank = hc.comm.size, hc.comm.rank
        self.n = X.shape[0]
        self.steps_per_epoch = -(-self.n // batch_size)
        # Each rank starts with a contiguous shard, as if it had loaded only its part of the store.
        lo, hi = rank * self.n // size, (rank + 1) * self.n // size
        self.held = records(X[lo:hi], y[lo:hi], np.arange(lo, hi))
        self.bytes_moved = 0

    def steps(self, epoch: int) -> int:
        """Global steps in ``epoch``."""
        return self.steps_per_epoch

    def epoch(self, epoch: int) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
        """Yield (X_local, y_local, global_batch_size) for every step of ``epoch`` (collective)."""
        if self.mode == "none":
            yield from self._local_epoch(epoch)
            return
        self.held, parts = deal(self.hc, self.held, epoch_order(self.n, self.seed, epoch), self.batch_size,
                                self.mode)
        self.bytes_moved += parts.bytes_sent
        yield from parts

    def epoch_windows(self, epoch: int) -> Iterator[list]:
        """The whole epoch as one window: a list of its steps' (X, y, global_batch)."""
        yield list(self.epoch(epoch))

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


class ShardStream:
    """The global shuffle for a distributed-mode store: one exchange per window of shards.

    ``store`` (a ``staging.DistributedTrain``) hands each rank its slice of its node's shard of the
    window; the window's samples are then dealt over all ranks like ``GlobalShuffle`` deals an epoch.
    """

    def __init__(self, hc: HierComm, store, batch_size: int, seed: int, mode: str = "hier"):
        if mode not in ("hier", "flat"):
            raise ValueError(f"distributed staging needs a global shuffle (hier or flat), not {mode!r}: "
                             f"nodes hold disjoint shards")
        check("batch_size", batch_size)
        self.hc, self.store, self.batch_size, self.seed, self.mode = hc, store, batch_size, seed, mode
        self.bytes_moved = 0

    def steps(self, epoch: int) -> int:
        """Global steps in ``epoch`` (every window ends with a possibly smaller batch)."""
        return sum(-(-n // self.batch_size) for n in self.store.window_sizes(epoch))

    def epoch_windows(self, epoch: int) -> Iterator[list]:
        """Per window of ``epoch``: stage, load and exchange it, then the list of its steps (collective)."""
        sizes = self.store.window_sizes(epoch)
        for t, window in enumerate(self.store.windows(epoch)):
            X, y, idx = self.store.load(epoch, t, window)
            _, parts = deal(self.hc, records(X, y, idx), epoch_order(sizes[t], self.seed, epoch, t),
                            self.batch_size, self.mode)
            self.bytes_moved += parts.bytes_sent
            yield parts
