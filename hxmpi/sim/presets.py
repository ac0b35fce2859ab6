"""The simulator's platforms: named presets of the cost model's numbers, the calibrated one and its NIC.

The same numbers feed the platform SimGrid replays on (``platform``) and the cost model
(``hxmpi.comm.costmodel``), so a replay and the model differ in structure, not in parameters.
"""
from __future__ import annotations

import importlib.resources
import json
from dataclasses import replace

from ..comm.costmodel.model import CostModel
from ..comm.costmodel.params import RATE_FIELDS
from .actions import Nic

__all__ = ["SLINGSHOT_FILE", "PLATFORM_FIELDS", "calibrated_preset", "PRESETS", "PRESET_NICS"]


#: The calibrated preset's file (``benchmarks/fit_slingshot.py --preset-out``), package data.
SLINGSHOT_FILE = "slingshot.json"
#: The CostModel fields a calibrated preset sets: the platform's, not hxmpi's own per-call costs.
PLATFORM_FIELDS = ("alpha_intra", "beta_intra", "alpha_inter", "beta_inter", "beta_copy", "msg_overhead",
                   "beta_backbone")


def calibrated_preset(name: str = SLINGSHOT_FILE) -> tuple[CostModel, dict]:
    """(CostModel, the whole file) of a calibrated preset shipped with hxmpi.sim: its platform
    fields over the built-in defaults (hxmpi's fixed per-call costs are not the platform's)."""
    data = json.loads(importlib.resources.files(__package__).joinpath(name).read_text())
    # The NIC's rates (``costmodel.RATE_FIELDS``) where the preset gives them; absent: no NIC limit.
    nic = {k: float(data["model"][k]) for k in RATE_FIELDS if k in data["model"]}
    # Open MPI's CPU per block and round of its Bruck, as the fit found it (``RefCpu.ddt_block``).
    lib = {"mpi_ddt_block": float(data["reference_cpu"]["ddt_block"])} if "reference_cpu" in data else {}
    return replace(CostModel(), **{k: float(data["model"][k]) for k in PLATFORM_FIELDS}, **nic, **lib), data


# Presets: CostModel numbers of a cluster node (seconds, seconds per byte). Sources of each number
# are in docs/tools.md, "Presets". Fixed per-call costs and copy bandwidth stay the built-in defaults,
# except in "slingshot", whose platform is fitted to published measurements (docs/performance/scale.md).
_BASE = CostModel()
PRESETS = {
    # Slingshot-11, 48-core AMD nodes, Open MPI btl/ofi + sm (benchmarks/fit_slingshot.py).
    "slingshot": calibrated_preset()[0],
    # 100 Gb/s InfiniBand port (HDR100 / EDR): 12.5 GB/s, ~1 us MPI latency, ~0.2 us CPU per message.
    "hdr": replace(_BASE, alpha_inter=1.0e-6, beta_inter=1 / 12.5e9, msg_overhead=0.2e-6,
                   alpha_intra=0.4e-6, beta_intra=1 / 8e9),
    # 25 GbE with TCP: 3 GB/s of 3.125 GB/s line rate, ~5 us latency, ~1 us CPU per message (syscalls).
    "25gbe": replace(_BASE, alpha_inter=5.0e-6, beta_inter=1 / 3e9, msg_overhead=1.0e-6,
                     alpha_intra=0.4e-6, beta_intra=1 / 8e9),
}

#: The NIC of each preset that has one (fitted with its platform, ``benchmarks/fit_slingshot.py``).
PRESET_NICS = {"slingshot": Nic.of_preset(calibrated_preset()[1])}
