"""Alpha-beta cost model of flat vs hierarchical all-to-all, used by ``algorithm="auto"``.

For P = N * G ranks (N nodes of G ranks; irregular layouts use the largest G) and b bytes per
block, per call and per rank. Each exchange phase costs what the MPI algorithm that runs it
costs: Open MPI's ``alltoallv_algorithm`` rule picks pairwise rounds or linear posting from the
communicator size (``MPI_Alltoallv``), and hier's phase 1 is a nonblocking ``Ialltoallv``, which
Open MPI (libnbc) always runs linear. With m peers, o the CPU cost of posting or completing one
message, and a the latency of the slowest peer:

  pairwise: m (a + 2 o)          every round waits for its slowest message
  linear:   a + 2 m o            all messages in flight at once; the CPU posts them one by one

  flat = phase(P-1 peers, a_inter) + G (P-G) b (B_inter + B_backbone) + (G-1) b B_intra + b B_copy + o_flat
  hier = phase1(N-1 peers, linear, a_inter) + G (P-G) b (B_inter + B_backbone) + node + c P b B_copy + o_hier
    node, shared-memory phase ("shm"): 2 ceil(log2 G) (a_intra + 2 o)   (two node barriers)
    node, message-passing phase ("mpi"): phase(G-1 peers, a_intra) + (G-1) N b B_intra

B: seconds per byte (1 / bandwidth); inter-node bytes are multiplied by G because the G ranks of
a node share its link; B_inter + B_backbone where the network between nodes is oversubscribed
(B_backbone = (R - 1) B_inter for a backbone or spine R times slower than all node links together,
0 for a non-blocking network: the node's traffic then runs at the slower of link and backbone
share, and only the sum of the two can be fitted); c P b local copy bytes, as ``hxmpi.plan`` schedules them (shm: pack and
copy out of the node window, c P = 2P; mpi: pack, repack, unpack, c P = 3P - 2G); o_flat, o_hier: fixed cost of a call (collectives and Python, s). Both
algorithms move the same inter-node bytes, so hier wins where the saved messages and latencies
outweigh its copies and node phase: below a crossover block size. ``hxmpi.simulate`` replays
the exact schedules in SimGrid and reports this model's error against it.

Parameters come from a calibration file (``benchmarks/calibrate.py`` writes one; pass its path
as ``HierComm(tuning=...)`` or env ``HXMPI_TUNING``), else from the built-in defaults below
(a typical InfiniBand cluster node: 1.5 us / 12 GB/s between nodes, 0.4 us / 8 GB/s inside).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, fields
from typing import Optional

import numpy as np

ENV_TUNING = "HXMPI_TUNING"
NODE_PHASES = ("shm", "mpi")


def alltoallv_algorithm(size: int) -> str:
    """Open MPI's (coll/tuned, fixed rules) choice for a blocking MPI_Alltoallv on ``size`` ranks."""
    if size < 4 or 64 <= size < 128 or 256 <= size < 1024:
        return "pairwise"
    return "linear"


def _phase(peers: int, algorithm: str) -> tuple[float, float]:
    """(latencies, message overheads) of one exchange phase with ``peers`` peers."""
    if peers <= 0:
        return 0.0, 0.0
    if algorithm == "pairwise":
        return float(peers), 2.0 * peers
    return 1.0, 2.0 * peers


@dataclass(frozen=True)
class CostModel:
    """Model parameters: latencies, overheads and fixed costs in seconds, B_* in seconds per byte."""
    alpha_intra: float = 0.4e-6
    beta_intra: float = 1 / 8e9
    alpha_inter: float = 1.5e-6
    beta_inter: float = 1 / 12e9
    beta_copy: float = 1 / 10e9
    overhead_flat: float = 20e-6
    overhead_hier: float = 45e-6
    msg_overhead: float = 0.2e-6
    beta_backbone: float = 0.0

    # -- the model is linear in its parameters: time = features . params
    @staticmethod
    def features(algorithm: str, nodes: int, per_node: int, block: float,
                 node_phase: str = "shm") -> np.ndarray:
        """Coefficients of the parameters (``fields`` order) for one call."""
        if node_phase not in NODE_PHASES:
            raise ValueError(f"node_phase must be one of {NODE_PHASES}, got {node_phase!r}")
        if nodes <= 1 or per_node <= 1:
            algorithm = "flat"  # degenerate layouts always run flat
        n, g, b = nodes, per_node, float(block)
        p = n * g
        f = dict.fromkeys((fl.name for fl in fields(CostModel)), 0.0)
        if algorithm == "flat":
            lat, ovh = _phase(p - 1, alltoallv_algorithm(p))
            f["alpha_inter" if n > 1 else "alpha_intra"] += lat
            f["msg_overhead"] += ovh
            f["beta_inter"] += g * (p - g) * b
            f["beta_backbone"] += g * (p - g) * b
            f["beta_intra"] += (g - 1) * b
            f["beta_copy"] += b  # its own block
            f["overhead_flat"] = 1.0
        else:
            lat, ovh = _phase(n - 1, "linear")
            f["alpha_inter"] += lat
            f["msg_overhead"] += ovh
            f["beta_inter"] += g * (p - g) * b
            f["beta_backbone"] += g * (p - g) * b
            if node_phase == "shm":
                rounds = 2 * math.ceil(math.log2(g)) if g > 1 else 0  # a barrier before and after the copy-out
                f["alpha_intra"] += rounds
                f["msg_overhead"] += 2.0 * rounds
                f["beta_copy"] += 2 * p * b
            else:
                lat, ovh = _phase(g - 1, alltoallv_algorithm(g))
                f["alpha_intra"] += lat
                f["msg_overhead"] += ovh
                f["beta_intra"] += (g - 1) * n * b
                f["beta_copy"] += (3 * p - 2 * g) * b
            f["overhead_hier"] = 1.0
        return np.array(list(f.values()))

    def vector(self) -> np.ndarray:
        """The parameters in ``features`` order."""
        return np.array([getattr(self, f.name) for f in fields(self)])

    def predict(self, algorithm: str, nodes: int, per_node: int, block: float,
                node_phase: str = "shm") -> float:
        """Predicted seconds per call for ``block`` bytes per destination."""
        return float(self.features(algorithm, nodes, per_node, block, node_phase) @ self.vector())

    def choose(self, nodes: int, per_node: int, block: float, node_phase: str = "shm") -> str:
        """"hier" or "flat", whichever the model predicts faster."""
        if nodes <= 1 or per_node <= 1:
            return "flat"
        hier = self.predict("hier", nodes, per_node, block, node_phase)
        return "hier" if hier < self.predict("flat", nodes, per_node, block, node_phase) else "flat"

    def crossover(self, nodes: int, per_node: int, node_phase: str = "shm") -> Optional[float]:
        """Block size (bytes) below which hier is faster; 0 if never, None if always."""
        if nodes <= 1 or per_node <= 1:
            return 0.0
        args = (nodes, per_node)
        f0 = self.features("flat", *args, 0.0, node_phase) - self.features("hier", *args, 0.0, node_phase)
        f1 = self.features("flat", *args, 1.0, node_phase) - self.features("hier", *args, 1.0, node_phase) - f0
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
        """Read a calibration file written by ``save``; unknown keys are an error, missing ones default."""
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


def fit(samples: list[tuple[str, int, int, float, float]], fixed: Optional[dict] = None,
        node_phase: str = "shm") -> CostModel:
    """Least-squares fit, with non-negative parameters, of (algorithm, nodes, per_node, block, seconds).

    Each sample is weighted by 1/seconds, so small and large messages count alike (relative error).
    ``fixed`` pins parameters that the samples cannot identify (e.g. inter-node ones on one host);
    ``node_phase`` is the node phase the hier samples ran with.
    """
    names = [f.name for f in fields(CostModel)]
    fixed = dict(fixed or {})
    A = np.array([CostModel.features(a, n, g, b, node_phase) for a, n, g, b, _ in samples])
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
