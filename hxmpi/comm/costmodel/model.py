"""The cost model: the parameters (``params``) and the prices of one bare exchange made from them.

``CostModel`` is what ``algorithm="auto"`` holds: ``Parameters`` with ``predict`` (seconds of one
bare exchange, the walk of its step program), ``features`` (the same as coefficients of the
parameters, linear where no Bruck round or NIC is involved), ``choose`` and ``crossover``;
``fit`` fits the parameters to measured samples by those coefficients.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..plan import NODE_PHASES, has_hierarchy, runs_as
from .params import INDEX, NAMES, RATE_FIELDS, Parameters, inverse
from .walk import call_shape, shape_price

__all__ = ["CostModel", "fit"]


@dataclass(frozen=True)
class CostModel(Parameters):
    """The cost model: its ``Parameters`` (seconds, seconds per byte; rates per second) and the
    prices of one bare exchange made from them (``predict``, ``features``, ``choose``,
    ``crossover``). Made from defaults, a calibration file (``load``) or a preset."""

    # -- the model is linear in ``vector()`` where the NIC is off: time = features . vector
    @staticmethod
    def features(algorithm: str, nodes: int, per_node: int, block: float,
                 node_phase: str = "shm") -> np.ndarray:
        """Coefficients of ``vector()`` (``NAMES`` order) in the seconds of one bare exchange of
        ``algorithm`` ("flat" or one of the lane algorithms; a Bruck round's two LogP regimes are
        not linear: ``predict`` prices them), plus the fixed cost of its path (``overhead_flat`` or
        ``overhead_hier``). What ``fit`` fits; without a NIC, ``predict`` is this times ``vector``."""
        if node_phase not in NODE_PHASES:
            raise ValueError(f"node_phase must be one of {tuple(NODE_PHASES)}, got {node_phase!r}")
        algo = runs_as(algorithm, has_hierarchy(nodes, per_node))
        if algo.radixed:
            raise ValueError(f"features: {algo.name}'s rounds are not linear in the parameters; use predict")
        sk = shape_price(call_shape(nodes, per_node), algo.name, algo.setting(), node_phase, True, "")
        f = sk.linear(float(block))
        f[INDEX["overhead_hier" if algo.hierarchical else "overhead_flat"]] += 1.0
        return f

    def predict(self, algorithm: str, nodes: int, per_node: int, block: float,
                node_phase: str = "shm") -> float:
        """Predicted seconds of one bare exchange of ``algorithm`` plus its path's fixed cost, for
        ``block`` bytes per destination (the walk of its step program, ``price_program``)."""
        if node_phase not in NODE_PHASES:
            raise ValueError(f"node_phase must be one of {tuple(NODE_PHASES)}, got {node_phase!r}")
        algo = runs_as(algorithm, has_hierarchy(nodes, per_node))
        fixed = self.overhead_hier if algo.hierarchical else self.overhead_flat
        walk = shape_price(call_shape(nodes, per_node), algo.name, algo.setting(), node_phase, True, "")
        return fixed + walk.price(self, float(block))

    def choose(self, nodes: int, per_node: int, block: float, node_phase: str = "shm") -> str:
        """"hier" or "flat", whichever the model predicts faster."""
        if not has_hierarchy(nodes, per_node):
            return "flat"
        hier = self.predict("hier", nodes, per_node, block, node_phase)
        return "hier" if hier < self.predict("flat", nodes, per_node, block, node_phase) else "flat"

    def crossover(self, nodes: int, per_node: int, node_phase: str = "shm") -> Optional[float]:
        """Block size (bytes) below which hier is faster; 0 if never, None if always."""
        if not has_hierarchy(nodes, per_node):
            return 0.0
        args = (nodes, per_node)
        f0 = self.features("flat", *args, 0.0, node_phase) - self.features("hier", *args, 0.0, node_phase)
        f1 = self.features("flat", *args, 1.0, node_phase) - self.features("hier", *args, 1.0, node_phase) - f0
        gain, slope = float(f0 @ self.vector()), float(f1 @ self.vector())  # flat - hier = gain + slope*b
        if slope >= 0:
            return None if gain > 0 else 0.0
        return max(0.0, gain / -slope)


def fit(samples: list[tuple[str, int, int, float, float]], fixed: Optional[dict] = None,
        node_phase: str = "shm") -> CostModel:
    """Least-squares fit, with non-negative parameters, of (algorithm, nodes, per_node, block, seconds).

    Each sample is weighted by 1/seconds, so small and large messages count alike (relative error).
    ``fixed`` pins parameters that the samples cannot identify (e.g. inter-node ones on one host);
    the NIC's rates and the library's Bruck CPU (``mpi_ddt_block``: no sample runs MPI_Alltoall)
    are not fitted (pinned, by default off); ``node_phase`` is the node phase the
    hier samples ran with.
    """
    names = NAMES
    fixed = {**dict.fromkeys(RATE_FIELDS, 0.0), "mpi_ddt_block": 0.0, **dict(fixed or {})}
    A = np.array([CostModel.features(a, n, g, b, node_phase) for a, n, g, b, _ in samples])
    y = np.array([t for *_, t in samples])
    w = 1.0 / y
    free = [i for i, name in enumerate(names) if name not in fixed]
    pinned = np.array([inverse(fixed[name]) if name in RATE_FIELDS else fixed.get(name, 0.0) for name in names])
    target = (y - A @ pinned) * w
    active = list(free)
    theta = np.zeros(len(names))
    while active:  # active-set NNLS: drop the most negative parameter, refit
        sol, *_ = np.linalg.lstsq(A[:, active] * w[:, None], target, rcond=None)
        if (sol >= 0).all():
            theta[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    theta += pinned
    values = {name: inverse(v) if name in RATE_FIELDS else v for name, v in zip(names, theta.tolist())}
    return CostModel(**values)
