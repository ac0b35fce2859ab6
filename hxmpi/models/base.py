"""Flat parameter buffers: every model keeps parameters and gradients in one array each (float32 or float64).

Gradient averaging is then one Allreduce over ``grads[:dense_size]``; parameters that live on one
rank only (MoE experts) sit after the dense part and are never averaged.
"""
from __future__ import annotations

import numpy as np

__all__ = ["FlatParams", "glorot", "softmax_xent"]


class FlatParams:
    """Named views into one parameter buffer and one gradient buffer, both of ``dtype``."""

    def __init__(self, shapes: dict[str, tuple], local_shapes: dict[str, tuple] | None = None,
                 dtype=np.float64):
        self.names = list(shapes) + list(local_shapes or {})
        all_shapes = {**shapes, **(local_shapes or {})}
        sizes = [int(np.prod(all_shapes[n])) for n in self.names]
        self.dense_size = int(sum(int(np.prod(s)) for s in shapes.values()))
        self.params = np.zeros(int(sum(sizes)), dtype=dtype)
        self.grads = np.zeros_like(self.params)
        self.p, self.g = {}, {}
        self.offsets: dict[str, tuple[int, int]] = {}  # name -> [lo, hi) in params and grads
        offset = 0
        for name, size in zip(self.names, sizes):
            self.offsets[name] = (offset, offset + size)
            self.p[name] = self.params[offset:offset + size].reshape(all_shapes[name])
            self.g[name] = self.grads[offset:offset + size].reshape(all_shapes[name])
            offset += size

    @property
    def dense_grads(self) -> np.ndarray:
        """The gradient slice that data-parallel ranks average."""
        return self.grads[:self.dense_size]

    @property
    def local_grads(self) -> np.ndarray:
        """The gradient slice owned by this rank alone (expert parameters)."""
        return self.grads[self.dense_size:]


def glorot(rng: np.random.Generator, fan_in: int, fan_out: int) -> np.ndarray:
    """Glorot-uniform initial weights of shape (fan_in, fan_out)."""
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, size=(fan_in, fan_out))


def softmax_xent(logits: np.ndarray, y: np.ndarray, scale: float) -> tuple[float, int, np.ndarray]:
    """Summed cross-entropy, correct count, and d(scale * loss_sum)/dlogits."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    n = y.shape[0]
    loss = float(-logp[np.arange(n), y].sum())
    correct = int((logits.argmax(axis=1) == y).sum())
    dlogits = np.exp(logp)
    dlogits[np.arange(n), y] -= 1.0
    return loss, correct, dlogits * scale
