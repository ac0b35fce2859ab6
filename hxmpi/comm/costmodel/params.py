"""The cost model's parameters: the numbers of a platform, and the files that hold them.

``Parameters`` is what a calibration fits and a preset sets (latencies, CPU per message, seconds
per byte, fixed costs, the NIC's rates); ``CostModel`` (``model``) adds the prices made from them.
They are a class of their own so that the walk (``walk``), which prices in their order, sits
below the model that asks it.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from typing import Optional

import numpy as np

__all__ = ["ENV_TUNING", "RATE_FIELDS", "Parameters", "NAMES", "INDEX", "inverse"]

#: Env var naming a calibration file (``benchmarks/calibrate.py --out``) for ``HierComm``'s "auto".
ENV_TUNING = "HXMPI_TUNING"
#: Parameters given as rates (per second); ``Parameters.vector`` holds their inverses (seconds
#: per message, per byte), 0 where the rate is 0 (no NIC limit).
RATE_FIELDS = ("nic_msg_rate", "nic_bandwidth")


@dataclass(frozen=True)
class Parameters:
    """Model parameters: latencies, overheads and fixed costs in seconds, B_* in seconds per byte.

    ``nic_msg_rate`` (messages/s per node) and ``nic_bandwidth`` (bytes/s per node): the node's
    NIC, which every inter-node message of the node's ranks crosses; 0 (the default) leaves it out,
    and the prices are those of per-rank costs alone. Presets give them as ``nic_msg_rate`` and
    ``nic_bandwidth`` in their ``model`` dict. ``mpi_ddt_block``: CPU seconds the MPI library spends
    per block and round of its Bruck ``MPI_Alltoall`` (Open MPI builds, packs and unpacks an indexed
    datatype each round); 0 (the default) leaves it out, the ``slingshot`` preset gives its fit."""
    alpha_intra: float = 0.4e-6
    beta_intra: float = 1 / 8e9
    alpha_inter: float = 1.5e-6
    beta_inter: float = 1 / 12e9
    beta_copy: float = 1 / 10e9
    overhead_flat: float = 20e-6
    overhead_hier: float = 45e-6
    msg_overhead: float = 0.2e-6
    beta_backbone: float = 0.0
    nic_msg_rate: float = 0.0
    nic_bandwidth: float = 0.0
    mpi_ddt_block: float = 0.0

    def vector(self) -> np.ndarray:
        """The parameters in ``NAMES`` order (``CostModel.features``'), the rates (``RATE_FIELDS``)
        as their inverses (seconds per message, per byte)."""
        return np.array([inverse(getattr(self, f.name)) if f.name in RATE_FIELDS else getattr(self, f.name)
                         for f in fields(self)])

    # -- files
    def save(self, path: str, **extra) -> None:
        """Write the parameters (and any ``extra`` metadata) as JSON."""
        with open(path, "w") as fh:
            json.dump({"model": asdict(self), **extra}, fh, indent=1)

    @classmethod
    def load(cls, path: str) -> "Parameters":
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
    def from_env_or_default(cls, tuning: Optional[str] = None) -> "Parameters":
        """The model from ``tuning`` or env HXMPI_TUNING, else the built-in defaults."""
        path = tuning or os.environ.get(ENV_TUNING)
        return cls.load(path) if path else cls()


def inverse(x: float) -> float:
    """1/x, and 0 for 0 (a rate of 0: no limit)."""
    return 1.0 / x if x > 0 else 0.0


#: Parameter names in ``Parameters.vector`` order, and each one's index.
NAMES = tuple(f.name for f in fields(Parameters))
INDEX = {name: i for i, name in enumerate(NAMES)}
