"""Load-balanced synchronous steps: each global batch split over ranks in proportion to their speed.

A global batch is a sequence of b samples (the global shuffle's order); rank r holds a contiguous
piece of it, ``counts[r]`` samples, in rank order. Rebalancing changes only where the piece
boundaries lie: the samples that cross a boundary move to their new rank with one uneven
``HierComm.alltoallv`` for all remaining steps of a window. Every rank still scales its samples'
gradients by 1/b and the Allreduce sums them, so each step's gradient is the same global mean as
in plain sync (up to the order of floating-point additions).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..comm.exchange import HierComm

__all__ = ["fit_costs", "balanced_counts", "proportional_counts", "moved_samples", "redistribute"]


def proportional_counts(weights: Sequence[float], total: int) -> np.ndarray:
    """``total`` split in proportion to ``weights`` (largest remainders first, ties to the lower
    rank): non-negative integers summing to ``total``. Deterministic, so every rank given the same
    weights computes the same counts."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or w.size == 0 or not np.all(np.isfinite(w)) or w.min() < 0 or w.sum() <= 0:
        raise ValueError(f"weights must be finite, non-negative and not all zero, got {list(w)}")
    exact = total * w / w.sum()
    counts = np.floor(exact).astype(np.int64)
    short = int(total - counts.sum())
    order = np.lexsort((np.arange(w.size), -(exact - counts)))  # largest remainder, then lower rank
    counts[order[:short]] += 1
    return counts


def balanced_counts(fixed_s: Sequence[float], per_sample_s: Sequence[float], total: int) -> np.ndarray:
    """Split ``total`` samples so that every rank's modelled step time ``fixed_s[r] + n[r] *
    per_sample_s[r]`` (seconds) is equal, as far as whole samples allow; every rank keeps at
    least one sample (so its costs stay measurable). Deterministic (the same on every rank).

    Equal times T need n[r] = (T - fixed[r]) / per_sample[r] summing to the total; a rank whose
    fixed cost alone exceeds T gets the minimum and T is solved again over the others.
    """
    a = np.asarray(fixed_s, dtype=np.float64)
    b = np.asarray(per_sample_s, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or a.size == 0 or not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))) \
            or a.min() < 0 or b.min() <= 0:
        raise ValueError(f"need finite costs, fixed >= 0 and per-sample > 0, got {list(a)} and {list(b)}")
    if total < a.size:
        raise ValueError(f"{total} samples cannot give each of {a.size} ranks one")
    free = total - a.size  # one sample each is set aside
    active = np.ones(a.size, bool)
    while True:
        T = (free + np.sum((a + b)[active] / b[active])) / np.sum(1.0 / b[active])
        n = np.where(active, np.maximum(0.0, (T - a - b) / b), 0.0)
        out = active & (n <= 0)
        if not out.any() or out.all():
            break
        active &= ~out
    if n.sum() <= 0:
        n = np.ones(a.size)
    return 1 + proportional_counts(n, free)


# The fixed part is at most this fraction of the last measured step (a fit through two noisy
# points may put it above the step itself).
MAX_FIXED_FRACTION = 0.9


def fit_costs(samples: np.ndarray, times: np.ndarray, before=None) -> tuple[np.ndarray, np.ndarray]:
    """Per rank (fixed seconds per step, seconds per sample) from this window's samples per step
    and step times (seconds), and ``before``: the window before's (samples, times, fixed) or None.
    Where a rank's share moved by a sample or more, the line through both points; where it did
    not, the fixed cost found before; with no window before, none (all cost per sample). The
    line always passes through this window's point."""
    samples, times = np.asarray(samples, np.float64), np.asarray(times, np.float64)
    fixed = np.zeros_like(times)
    if before is not None:
        n0, t0, fixed0 = before
        moved = np.abs(samples - n0) >= 1
        slope = np.where(moved, (times - t0) / np.where(moved, samples - n0, 1.0), 0.0)
        fit = np.where(moved & (slope > 0), times - slope * samples, 0.0)
        fixed = np.clip(np.where(moved, fit, fixed0), 0.0, MAX_FIXED_FRACTION * times)
    return fixed, (times - fixed) / np.maximum(samples, 1.0)


def _bounds(counts: np.ndarray) -> np.ndarray:
    """Per step, where each rank's piece starts (and the last one ends): shape (steps, ranks + 1)."""
    return np.concatenate([np.zeros((counts.shape[0], 1), np.int64), np.cumsum(counts, axis=1)], axis=1)


def _overlap(a_lo, a_hi, b_lo, b_hi):
    return np.maximum(0, np.minimum(a_hi, b_hi) - np.maximum(a_lo, b_lo))


def moved_samples(current: np.ndarray, target: np.ndarray) -> int:
    """Samples that change rank when the (steps, ranks) counts go from ``current`` to ``target``."""
    cb, tb = _bounds(current), _bounds(target)
    stay = _overlap(cb[:, :-1], cb[:, 1:], tb[:, :-1], tb[:, 1:]).sum()
    return int(current.sum() - stay)


def redistribute(hc: HierComm, steps: list, current: np.ndarray, target: np.ndarray) -> list:
    """Move samples so rank r holds ``target[s, r]`` samples of step s (collective).

    ``steps``: this rank's (X, y, global_batch) per step; ``current`` and ``target``: (steps, ranks)
    sample counts, the same on every rank, with equal row sums. Returns the new steps (X, y,
    global_batch), each rank's piece still in batch order.
    """
    me, size = hc.comm.rank, hc.comm.size
    if current.shape != target.shape or not np.array_equal(current.sum(axis=1), target.sum(axis=1)):
        raise ValueError("current and target counts must cover the same batches")
    cb, tb = _bounds(current), _bounds(target)
    X = np.concatenate([s[0] for s in steps]) if steps else None
    y = np.concatenate([s[1] for s in steps]) if steps else None
    if X is None:
        return []
    rec = np.empty(len(y), dtype=[("x", X.dtype, X.shape[1:]), ("y", y.dtype)])
    rec["x"], rec["y"] = X, y
    start = np.concatenate([[0], np.cumsum(current[:, me])])  # where each step begins in rec
    # Send: for each destination q, for each step, my samples that land in q's new piece.
    pieces, send_counts = [], np.zeros(size, np.int64)
    for q in range(size):
        lo = np.maximum(cb[:, me], tb[:, q])
        hi = np.minimum(cb[:, me + 1], tb[:, q + 1])
        for s in np.flatnonzero(hi > lo):
            pieces.append(np.arange(lo[s], hi[s]) - cb[s, me] + start[s])
            send_counts[q] += hi[s] - lo[s]
    order = np.concatenate(pieces) if pieces else np.empty(0, np.int64)
    got, recv_counts = hc.alltoallv(rec[order], send_counts)
    # Receive: from each source in rank order, its pieces in step order; reassemble per step.
    src_start = np.concatenate([[0], np.cumsum(recv_counts)])
    cursor = src_start[:-1].copy()
    take = []
    for s in range(len(steps)):
        sizes = _overlap(cb[s, :-1], cb[s, 1:], tb[s, me], tb[s, me + 1])
        for r in np.flatnonzero(sizes):
            take.append(np.arange(cursor[r], cursor[r] + sizes[r]))
            cursor[r] += sizes[r]
    mine = got[np.concatenate(take)] if take else got[:0]
    cuts = np.cumsum(target[:, me])[:-1]
    return [(part["x"], part["y"], gb) for part, (_, _, gb) in zip(np.split(mine, cuts), steps)]
