"""Alpha-beta cost model of flat vs hierarchical all-to-all, used by ``algorithm="auto"``.

For P = N * G ranks (N nodes of G ranks; irregular layouts use the largest G) and b bytes per
block, per call and per rank:

  flat = (G-1) (a_intra + b B_intra) + (P-G) a_inter + G (P-G) b B_inter + o_flat
  hier = (N-1) a_inter + G (P-G) b B_inter + (G-1) (a_intra + N b B_intra) + c P b B_copy + o_hier

a: latency per message (s); B: seconds per byte (1 / bandwidth); inter-node bytes are multiplied
by G because the G ranks of a node share its link; c = 3 local copies (pack, repack, unpack);
o: fixed cost of a call (collectives and Python, s). Both algorithms move the same inter-node
bytes, so hier wins where the saved (P-G) - (N-1) inter-node latencies outweigh its extra copies,
phase and intra-node bytes: below a crossover block size.

Parameters come from a calibration file (``benchmarks/calibrate.py`` writes one; pass its path
as ``HierComm(tuning=...)`` or env ``HXMPI_TUNING``), else from the built-in defaults below
(a typical InfiniBand cluster node: 1.5 us / 12 GB/s between nodes, 0.4 us / 8 GB/s inside).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from typing import Optional

import numpy as np

ENV_TUNING = "HXMPI_TUNING"
COPIES = 3


@dataclass(frozen=True)
class CostModel:
    """Model parameters: latencies and fixed costs in seconds, B_* in seconds per byte."""
    alpha_intra: float = 0.4e-6
    beta_intra: float = 1 / 8e9
    alpha_inter: float = 1.5e-6
    beta_inter: float = 1 / 12e9
    beta_copy: float = 1 / 10e9
    overhead_flat: float = 20e-6
    overhead_hier: float = 45e-6

    # -- the model is linear in its parameters: time = features . params
    @staticmethod
    def features(algorithm: str, nodes: int, per_node: int, block: float) -> np.ndarray:
        """Coefficients of (alpha_intra, beta_intra, alpha_inter, beta_inter, beta_copy, o_flat, o_hier)."""
        n, g, b = nodes, per_node, float(block)
        p = n * g
        if algorithm == "flat":
            return np.array([g - 1, (g - 1) * b, p - g, g * (p - g) * b, 0.0, 1.0, 0.0])
        return np.array([g - 1, (g - 1) * n * b, n - 1, g * (p - g) * b, COPIES * p * b, 0.0, 1.0])

    def vector(self) -> np.ndarray:
        """The parameters in ``features`` order."""
        return np.array([getattr(self, f.name) for f in fields(self)])

    def predict(self, algorithm: str, nodes: int, per_node: int, block: float) -> float:
        """Predicted seconds per call for ``block`` bytes per destination."""
        if nodes <= 1 or per_node <= 1:
            algorithm = "flat"  # degenerate layouts always run flat
        return float(self.features(algorithm, nodes, per_node, block) @ self.vector())

    def choose(self, nodes: int, per_node: int, block: float) -> str:
        """"hier" or "flat", whichever the model predicts faster."""
        if nodes <= 1 or per_node <= 1:
            return "flat"
        return "hier" if self.predict("hier", nodes, per_node, block) < self.predict("flat", nodes, per_node, block) else "flat"

    def crossover(self, nodes: int, per_node: int) -> Optional[float]:
        """Block size (bytes) below which hier is faster; 0 if never, None if always."""
        if nodes <= 1 or per_node <= 1:
            return 0.0
        f0 = self.features("flat", nodes, per_node, 0.0) - self.features("hier", nodes, per_node, 0.0)
        f1 = self.features("flat", nodes, per_node, 1.0) - self.features("hier", nodes, per_node, 1.0) - f0
        gain, slope = float(f0 @ self.vector()), float(f1 @ self.vector())  # flat - hier = gain + slope*b
        if slope >= 0:
            return None if gain > 0 else 0.0
        return max(0.0, gain / -slope)

    # -- files
    def save(self, path: str, **extra) -> None:
        """Write the parameters (and any ``extra`` metadata) as JSON."""
        with open(path, "w") as fh:
            json.dump({"model": asdict(self), **extra}, fh, indent=1)

    @classmethod
    def load(cls, path: str) -> "CostModel":
        """Read a calibration file written by ``save``; unknown keys are an error."""
        with open(path) as fh:
            data = json.load(fh)
        params = data.get("model", data)
        known = {f.name for f in fields(cls)}
        unknown = set(params) - known
        if unknown:
            raise ValueError(f"{path}: unknown cost-model parameters {sorted(unknown)}")
        bad = [k for k, v in params.items() if not isinstance(v, (int, float)) or v < 0]
        if bad:
            raise ValueError(f"{path}: parameters must be non-negative numbers: {bad}")
        return cls(**params)

    @classmethod
    def from_env_or_default(cls, tuning: Optional[str] = None) -> "CostModel":
        """The model from ``tuning`` or env HXMPI_TUNING, else the built-in defaults."""
        path = tuning or os.environ.get(ENV_TUNING)
        return cls.load(path) if path else cls()


def fit(samples: list[tuple[str, int, int, float, float]], fixed: Optional[dict] = None) -> CostModel:
    """Least-squares fit, with non-negative parameters, of (algorithm, nodes, per_node, block, seconds).

    Each sample is weighted by 1/seconds, so small and large messages count alike (relative error).
    ``fixed`` pins parameters that the samples cannot identify (e.g. inter-node ones on one host).
    """
    names = [f.name for f in fields(CostModel)]
    fixed = dict(fixed or {})
    A = np.array([CostModel.features(a, n, g, b) for a, n, g, b, _ in samples])
    y = np.array([t for *_, t in samples])
    w = 1.0 / y
    free = [i for i, name in enumerate(names) if name not in fixed]
    pinned = np.array([fixed.get(name, 0.0) for name in names])
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
    return CostModel(**dict(zip(names, theta.tolist())))
