"""numpy models on flat parameter buffers: softmax regression, MLP, mixture of experts."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..schema import SETTINGS
from .base import FlatParams
from .mlp import MLP
from .moe import MoE

MODELS = SETTINGS["model"].choices


def build_model(name: str, n_features: int, n_classes: int, hidden: Sequence[int], seed: int,
                hc=None, num_experts: int = 4, capacity_factor: float = 1.25, dtype=np.float64):
    """Build a model by name, its parameters of ``dtype``; ``moe`` needs the HierComm that carries
    its tokens."""
    if name == "softmax":
        return MLP(n_features, n_classes, (), seed, dtype)
    if name == "mlp":
        return MLP(n_features, n_classes, hidden, seed, dtype)
    if name == "moe":
        return MoE(n_features, n_classes, hidden[0], num_experts, capacity_factor, hc, seed, dtype)
    raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")


__all__ = ["FlatParams", "MLP", "MoE", "MODELS", "build_model"]
