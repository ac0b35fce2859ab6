"""SGD with momentum and weight decay, learning-rate schedules and global-norm clipping, on flat buffers."""
from __future__ import annotations

import math

import numpy as np
from mpi4py import MPI

from ..schema import SETTINGS
from ._sgd import sgd_update

__all__ = ["learning_rate", "SGD"]

SCHEDULES = SETTINGS["schedule"].choices


def learning_rate(step: int, base_lr: float, schedule: str, total_steps: int, warmup_steps: int = 0,
                  step_every: int = 0, gamma: float = 0.1) -> float:
    """Learning rate at optimizer step ``step`` (0-based): linear warm-up, then the schedule."""
    if warmup_steps and step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return base_lr
    if schedule == "step":
        return base_lr * gamma ** (step // step_every) if step_every > 0 else base_lr
    if schedule == "cosine":
        span = max(1, total_steps - warmup_steps)
        t = min(1.0, (step - warmup_steps) / span)
        return 0.5 * base_lr * (1.0 + math.cos(math.pi * t))
    raise ValueError(f"unknown schedule {schedule!r}; choose from {', '.join(SCHEDULES)}")


class SGD:
    """Momentum SGD over a FlatParams; ``clip_norm`` bounds the global L2 norm across all ranks."""

    def __init__(self, flat, comm: MPI.Comm, lr: float, momentum: float = 0.9, weight_decay: float = 0.0,
                 clip_norm: float = 0.0):
        self.flat, self.comm = flat, comm
        self.lr, self.momentum, self.weight_decay, self.clip_norm = lr, momentum, weight_decay, clip_norm
        self.velocity = np.zeros_like(flat.params)
        self.steps = 0

    def global_grad_norm(self) -> float:
        """L2 norm of the whole model's gradient: dense part (identical on all ranks) + local parts."""
        local_sq = 0.0
        if self.flat.local_grads.size:  # the same on every rank for a given model
            local_sq = self.comm.allreduce(float(self.flat.local_grads @ self.flat.local_grads), op=MPI.SUM)
        return math.sqrt(float(self.flat.dense_grads @ self.flat.dense_grads) + local_sq)

    def step(self, lr: float) -> None:
        """Apply one update with learning rate ``lr`` to the already-averaged gradients."""
        g = self.flat.grads
        if self.clip_norm > 0:
            norm = self.global_grad_norm()
            if norm > self.clip_norm:
                g *= self.clip_norm / norm
        # One compiled pass (GIL released), bit-equal to g += wd * p; v = m * v + g; p -= lr * v.
        sgd_update(self.flat.params, g, self.velocity, lr, self.momentum, self.weight_decay)
        self.steps += 1
