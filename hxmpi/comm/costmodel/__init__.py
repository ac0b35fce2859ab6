"""Cost model of hxmpi's all-to-all calls, used by ``algorithm="auto"``: it prices the step program.

A call's price is the walk of the step programs the planners make (``hxmpi.comm.plan``: the same
programs the runners execute and ``hxmpi.sim`` replays), so an algorithm is priced from what it
runs, and a new one (a new planner or ``Algorithm``) needs no model code. ``price_program`` cuts
each rank's program into units every rank takes at once (a run of copies, a node barrier, a
message phase: exchanges posted together, one pairwise exchange, one Bruck round) and prices
each with alpha-beta-LogP terms; a call costs, per unit, its costliest rank, summed over units:

  copies                        bytes * B_copy
  node barrier                  ceil(log2 G) (a_intra + 2 o)
  linear (all posted at once)   a + 2 m o
  pairwise rounds, in turn      sum over rounds of (a + 2 o), each at its peer's latency
  Bruck round of k messages     max(a + (k + 1) o, 2 k o)

plus each message phase's bytes: the larger of the node's inter-node bytes (its ranks share its
link) at B_inter + B_backbone and the rank's own intra-node bytes at B_intra; and, with a NIC
(``nic_msg_rate``, ``nic_bandwidth``: per node, 0 = none), at least a plus the node's inter-node
messages and bytes at the NIC's rates. a: the latency, inter-node where any peer is on another
node; m: peers; o: CPU seconds to post or complete one message; B: seconds per byte. A blocking
exchange runs as Open MPI's fixed rule says (``alltoallv_algorithm``), a nonblocking one linear
(libnbc), MPI_Alltoall as Open MPI's decision for it (``alltoall_algorithm``), with the library's
own copies and CPU per block (``mpi_ddt_block``). Even layouts are
priced from a few representative ranks (``representative_ranks``), checked against the walk of
every rank in the tests; a layout's prices are made once at 1-byte blocks and cached, so any
block and pattern is then arithmetic.

Whole calls (``predict_call``, ``choose_call``, ``auto_pick``) add the one-shot agreement
(``agreement_steps``: the steps the simulator replays, priced by ``predict_agreement``) and
hxmpi's own CPU per path from a ``CpuTimes`` table (``benchmarks/bench_overhead.py --json``;
``HierComm`` reads ``overhead=FILE``, else env ``HXMPI_OVERHEAD``'s file, else the packaged
``overhead.json``); without a table they charge the fixed costs o_flat and o_hier.

Parameters come from a calibration file (``benchmarks/calibrate.py`` writes one; pass its path
as ``HierComm(tuning=...)`` or env ``HXMPI_TUNING``), else from the built-in defaults (``Parameters``:
a typical InfiniBand cluster node). ``CostModel.features`` is the walk's price as coefficients of the
parameters (linear where no Bruck round or NIC is involved), what ``fit`` fits;
``python -m hxmpi.sim`` replays the exact schedules in SimGrid and reports the model's error
against it.

The package, one job a module, imports run down this list:

- ``params``: the parameters (``Parameters``) and their files;
- ``collectives``: how MPI runs the collectives a call meets (Open MPI's fixed decisions, its
  Bruck's rounds, dissemination rounds), as the model prices them and the simulator replays them;
- ``walk``: a step program priced (``price_program``, ``layout_price``);
- ``model``: ``CostModel`` (the parameters and the price of one bare exchange) and ``fit``;
- ``cpu``: hxmpi's CPU per path (``CpuTimes``); ``pattern``: what the model knows of the counts;
- ``alltoall``: ``MPI_Alltoall``'s price; ``agreement``: the one-shot agreement's steps and price;
- ``pick``: whole calls and ``algorithm="auto"``'s pick.

This package's names are those of its modules, re-exported: ``from hxmpi.comm.costmodel import X``.
"""
from __future__ import annotations

from .agreement import AGREEMENT_BYTES, COUNT_BYTES, AgreementStep, agreement_steps, predict_agreement
from .collectives import (ALLTOALL_TUNED, alltoall_algorithm, alltoallv_algorithm, bruck_schedule,
                          dissemination_distances)
from .cpu import CPU_KEYS, ENV_OVERHEAD, CpuTimes, fixed_cpu
from .model import CostModel, fit
from .params import ENV_TUNING, RATE_FIELDS
from .pattern import KIB_CAP, Pattern, pattern_class
from .pick import CALL_ALGORITHMS, CHUNKS, MODES, RADICES, auto_pick, choose_call, predict_call, settings_of
from .walk import ProgramPrice, layout_price, price_program, representative_ranks

__all__ = ["alltoallv_algorithm", "alltoall_algorithm", "CostModel", "fit", "CpuTimes", "fixed_cpu", "Pattern",
           "ProgramPrice", "price_program", "layout_price", "representative_ranks", "AgreementStep",
           "agreement_steps", "predict_agreement", "predict_call", "settings_of", "choose_call", "pattern_class",
           "auto_pick", "RATE_FIELDS", "COUNT_BYTES", "ALLTOALL_TUNED", "bruck_schedule", "dissemination_distances",
           "ENV_TUNING", "ENV_OVERHEAD", "CPU_KEYS", "CALL_ALGORITHMS", "MODES", "RADICES", "CHUNKS",
           "AGREEMENT_BYTES", "KIB_CAP"]
