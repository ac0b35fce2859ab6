"""Softmax regression and MLPs (ReLU hidden layers, softmax cross-entropy) on a flat buffer."""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

from .base import FlatParams, glorot, softmax_xent

__all__ = ["MLP"]


class MLP:
    """Dense classifier; ``hidden=()`` is softmax regression. Call ``loss_and_grad`` per batch."""

    collective_steps = False  # a step touches this rank's data only: ranks may step independently

    def __init__(self, n_features: int, n_classes: int, hidden: Sequence[int], seed: int, dtype=np.float64):
        dims = [n_features, *hidden, n_classes]
        shapes = {}
        for i in range(len(dims) - 1):
            shapes[f"W{i}"] = (dims[i], dims[i + 1])
            shapes[f"b{i}"] = (dims[i + 1],)
        self.flat = FlatParams(shapes, dtype=dtype)
        self.layers = len(dims) - 1
        rng = np.random.default_rng(seed)
        for i in range(self.layers):
            self.flat.p[f"W{i}"][:] = glorot(rng, dims[i], dims[i + 1])

    def logits(self, X: np.ndarray) -> np.ndarray:
        """Forward pass only (evaluation)."""
        h = X
        for i in range(self.layers):
            h = h @ self.flat.p[f"W{i}"] + self.flat.p[f"b{i}"]
            if i < self.layers - 1:
                h = np.maximum(h, 0.0)
        return h

    def grad_segments(self) -> list[tuple[int, int]]:
        """The dense gradient ranges [lo, hi) (elements of ``flat.grads``) that ``loss_and_grad``
        completes one after another, in that order: one per layer, last layer first."""
        bounds = self.flat.offsets
        return [(bounds[f"W{i}"][0], bounds[f"b{i}"][1]) for i in reversed(range(self.layers))]

    def loss_and_grad(self, X: np.ndarray, y: np.ndarray, scale: float,
                      segment_done: Optional[Callable[[int], None]] = None) -> tuple[float, int]:
        """Add scale * d(sum of losses) to the gradients; return (summed loss, correct count).

        ``segment_done(k)`` is called as soon as the k-th range of ``grad_segments()`` holds its
        final gradient, while the rest of the backward pass still runs (gradient reduction hooks)."""
        p, g = self.flat.p, self.flat.g
        acts = [X]
        for i in range(self.layers):
            z = acts[-1] @ p[f"W{i}"] + p[f"b{i}"]
            acts.append(np.maximum(z, 0.0) if i < self.layers - 1 else z)
        loss, correct, delta = softmax_xent(acts[-1], y, scale)
        for i in reversed(range(self.layers)):
            g[f"W{i}"] += acts[i].T @ delta
            g[f"b{i}"] += delta.sum(axis=0)
            if segment_done is not None:
                segment_done(self.layers - 1 - i)
            if i:
                delta = (delta @ p[f"W{i}"].T) * (acts[i] > 0)
        return loss, correct
