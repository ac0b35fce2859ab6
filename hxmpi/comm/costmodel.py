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
as ``HierComm(tuning=...)`` or env ``HXMPI_TUNING``), else from the built-in defaults below (a
typical InfiniBand cluster node). ``CostModel.features`` is the walk's price as coefficients of the
parameters (linear where no Bruck round or NIC is involved), what ``fit`` fits;
``hxmpi.sim.simulate`` replays the exact schedules in SimGrid and reports the model's error
against it.
"""
from __future__ import annotations

import importlib.resources
import json
import math
import os
from dataclasses import asdict, dataclass, fields, replace
from functools import lru_cache
from typing import Mapping, Optional, Sequence

import numpy as np

from ..errors import CpuFileError
from ._agree import quarter_log2
from .plan import (ALGORITHM, ALGORITHMS, HEADER_BYTES, NODE_PHASES, Algorithm, BarrierStep, CopyStep, Layout,
                   StepProgram, bruck_rounds, check_radix, exclusive_cumsum, has_hierarchy, program, program_steps,
                   runs_as)

__all__ = ["alltoallv_algorithm", "alltoall_algorithm", "CostModel", "fit", "CpuTimes", "fixed_cpu", "Pattern",
           "ProgramPrice", "price_program", "layout_price", "representative_ranks", "AgreementStep",
           "agreement_steps", "predict_agreement", "predict_call", "settings_of", "choose_call", "pattern_class", "auto_pick",
           "RATE_FIELDS", "COUNT_BYTES", "ALLTOALL_TUNED", "bruck_blocks"]

ENV_TUNING = "HXMPI_TUNING"
#: Env var naming a CPU-per-path file for ``HierComm``'s "auto" (default: the packaged ``CPU_FILE``).
ENV_OVERHEAD = "HXMPI_OVERHEAD"
#: hxmpi's measured CPU per call by path, shipped as data of ``hxmpi.comm``: the output of
#: ``benchmarks/bench_overhead.py --json`` (``--combine-flat/--combine-hier`` on this project's runs).
CPU_FILE = "overhead.json"
#: Keys of a CPU file's ``cpu_s_per_call``: per algorithm with code of its own (``Algorithm.cpu_key``),
#: a one-shot miss (its name), a one-shot hit (``_hit``) and a persistent plan (``_plan``).
CPU_KEYS = tuple(a + kind for a in ALGORITHMS if ALGORITHM[a].cpu_key == a for kind in ("", "_hit", "_plan"))
#: The algorithm of each CPU key.
_KEY_ALGORITHM = {a + kind: ALGORITHM[a] for a in ALGORITHMS for kind in ("", "_hit", "_plan")}


def _hierarchical(name: str) -> bool:
    """Whether ``name`` (one of ``CALL_ALGORITHMS``, or a CPU key) is one of hxmpi's
    hierarchical algorithms (or a path of one)."""
    algo = _KEY_ALGORITHM.get(name)
    return algo is not None and algo.hierarchical


def alltoallv_algorithm(size: int) -> str:
    """Open MPI's (coll/tuned, fixed rules) choice for a blocking MPI_Alltoallv on ``size`` ranks."""
    if size < 4 or 64 <= size < 128 or 256 <= size < 1024:
        return "pairwise"
    return "linear"


#: CostModel fields given as rates (per second); ``CostModel.vector`` holds their inverses (seconds
#: per message, per byte), 0 where the rate is 0 (no NIC limit).
RATE_FIELDS = ("nic_msg_rate", "nic_bandwidth")


@dataclass(frozen=True)
class CostModel:
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

    # -- the model is linear in ``vector()`` where the NIC is off: time = features . vector
    @staticmethod
    def features(algorithm: str, nodes: int, per_node: int, block: float,
                 node_phase: str = "shm") -> np.ndarray:
        """Coefficients of ``vector()`` (``fields`` order) in the seconds of one bare exchange of
        ``algorithm`` ("flat" or one of the lane algorithms; a Bruck round's two LogP regimes are
        not linear: ``predict`` prices them), plus the fixed cost of its path (``overhead_flat`` or
        ``overhead_hier``). What ``fit`` fits; without a NIC, ``predict`` is this times ``vector``."""
        if node_phase not in NODE_PHASES:
            raise ValueError(f"node_phase must be one of {tuple(NODE_PHASES)}, got {node_phase!r}")
        algo = runs_as(algorithm, has_hierarchy(nodes, per_node))
        if algo.radixed:
            raise ValueError(f"features: {algo.name}'s rounds are not linear in the parameters; use predict")
        sk = _skeleton(_shape(nodes, per_node), algo.name, 2, node_phase, True, "")
        f = sk.linear(float(block))
        f[_INDEX["overhead_hier" if algo.hierarchical else "overhead_flat"]] += 1.0
        return f
    def vector(self) -> np.ndarray:
        """The parameters in ``features`` order, the rates (``RATE_FIELDS``) as their inverses."""
        return np.array([_inverse(getattr(self, f.name)) if f.name in RATE_FIELDS else getattr(self, f.name)
                         for f in fields(self)])

    def predict(self, algorithm: str, nodes: int, per_node: int, block: float,
                node_phase: str = "shm") -> float:
        """Predicted seconds of one bare exchange of ``algorithm`` plus its path's fixed cost, for
        ``block`` bytes per destination (the walk of its step program, ``price_program``)."""
        if node_phase not in NODE_PHASES:
            raise ValueError(f"node_phase must be one of {tuple(NODE_PHASES)}, got {node_phase!r}")
        algo = runs_as(algorithm, has_hierarchy(nodes, per_node))
        fixed = self.overhead_hier if algo.hierarchical else self.overhead_flat
        return fixed + _skeleton(_shape(nodes, per_node), algo.name, 2, node_phase, True, "").price(self,
                                                                                                  float(block))

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
    the NIC's rates and the library's Bruck CPU (``mpi_ddt_block``: no sample runs MPI_Alltoall)
    are not fitted (pinned, by default off); ``node_phase`` is the node phase the
    hier samples ran with.
    """
    names = [f.name for f in fields(CostModel)]
    fixed = {**dict.fromkeys(RATE_FIELDS, 0.0), "mpi_ddt_block": 0.0, **dict(fixed or {})}
    A = np.array([CostModel.features(a, n, g, b, node_phase) for a, n, g, b, _ in samples])
    y = np.array([t for *_, t in samples])
    w = 1.0 / y
    free = [i for i, name in enumerate(names) if name not in fixed]
    pinned = np.array([_inverse(fixed[name]) if name in RATE_FIELDS else fixed.get(name, 0.0) for name in names])
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
    values = {name: _inverse(v) if name in RATE_FIELDS else v for name, v in zip(names, theta.tolist())}
    return CostModel(**values)


def _inverse(x: float) -> float:
    """1/x, and 0 for 0 (a rate of 0: no limit)."""
    return 1.0 / x if x > 0 else 0.0


# ------------------------------------------------------------------------------- measured CPU
@dataclass(frozen=True)
class CpuTimes:
    """hxmpi's own CPU seconds per call by path (``cpu_s_per_call`` of ``bench_overhead.py --json``):
    what ``predict_call`` charges a call besides its MPI time. ``source``: where the numbers came
    from (a file, or the cost model's fixed costs). ``cpu(key)``: seconds for a key of ``CPU_KEYS``."""
    seconds: Mapping[str, float]
    source: str

    def __call__(self, key: str) -> float:
        return self.seconds[key]

    @classmethod
    def load(cls, path: Optional[str] = None) -> "CpuTimes":
        """Read a CPU file, or the packaged one (``CPU_FILE``) if ``path`` is None. A missing or
        malformed file raises ``CpuFileError`` naming it: never a silent fallback to fixed costs."""
        if path is None:
            res = importlib.resources.files(__package__).joinpath(CPU_FILE)
            source, read = f"{res} (packaged with hxmpi)", res.read_text
        else:
            source = str(path)

            def read() -> str:
                with open(path) as fh:
                    return fh.read()
        try:
            text = read()
        except OSError as exc:
            raise CpuFileError(f"CPU file {source}: cannot read it: {exc.strerror or exc}") from None
        return cls.parse(text, source)

    @classmethod
    def parse(cls, text: str, source: str) -> "CpuTimes":
        """The table in a CPU file's ``text``; ``source`` names the file in errors."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise CpuFileError(f"CPU file {source}: not JSON: {exc}") from None
        table = data.get("cpu_s_per_call") if isinstance(data, dict) else None
        if not isinstance(table, dict):
            raise CpuFileError(f"CPU file {source}: no cpu_s_per_call mapping (bench_overhead.py --json writes one)")
        missing = [k for k in CPU_KEYS if k not in table]
        if missing:
            raise CpuFileError(f"CPU file {source}: cpu_s_per_call lacks {', '.join(missing)}")
        bad = [k for k in CPU_KEYS if isinstance(table[k], bool) or not isinstance(table[k], (int, float))
               or not math.isfinite(table[k]) or table[k] < 0]
        if bad:
            raise CpuFileError(f"CPU file {source}: cpu_s_per_call values must be seconds >= 0, not "
                               + ", ".join(f"{k}={table[k]!r}" for k in bad))
        return cls({k: float(table[k]) for k in CPU_KEYS}, source)

    @classmethod
    def from_env_or_default(cls, path: Optional[str] = None) -> "CpuTimes":
        """The table of ``path``, else of env HXMPI_OVERHEAD's file, else the packaged one."""
        return cls.load(path or os.environ.get(ENV_OVERHEAD) or None)

    @classmethod
    def fixed(cls, model: CostModel) -> "CpuTimes":
        """The cost model's two fixed costs as a table: ``overhead_hier`` for the hier paths,
        ``overhead_flat`` for flat and Bruck (what ``predict_call`` charges without a table)."""
        return cls({k: fixed_cpu(model, k) for k in CPU_KEYS}, "the cost model's fixed costs")


def fixed_cpu(model: CostModel, key: str) -> float:
    """The cost model's fixed CPU seconds for path ``key``: ``overhead_hier`` for the hier paths,
    ``overhead_flat`` for flat and Bruck."""
    return model.overhead_hier if _hierarchical(key) else model.overhead_flat


# ------------------------------------------------------------------------------- whole calls
#: The algorithms ``predict_call`` knows: hxmpi's (``plan.ALGORITHMS``) and "alltoall"
#: (MPI_Alltoall, uniform blocks only).
CALL_ALGORITHMS = (*ALGORITHMS, "alltoall")
#: Radices ``choose_call`` tries for the Bruck algorithms.
RADICES = (2, 3, 4, 6, 8, 12, 16, 24, 32)
#: The agreement of a one-shot call: one SUM Allreduce of 16 uint64 (``_agree.WORDS``, checked by ``agreement``).
AGREEMENT_BYTES = 128
#: The agreement's cap on a rank's receive KiB (2 GiB): P * cap**2 stays below 2**64 up to 2**22 ranks.
KIB_CAP = (1 << 21) - 1


@dataclass(frozen=True)
class Pattern:
    """What the model knows of a call's counts: sums every rank can agree on with one SUM Allreduce.

    ``total_bytes``: send bytes summed over ranks; ``messages``: non-empty blocks to other ranks,
    summed over ranks (None: every block non-empty); ``sumsq_recv_kib``: sum over ranks of
    (receive bytes / 1024)**2 (None: every rank receives the mean); ``pairwise_bytes``: sum over
    ranks q of sum over k of max(bytes q sends q+k, bytes q receives from q-k), what pairwise
    rounds wait for (each rank computes its term from its own counts; None: even); ``uniform``:
    every block the same size (MPI_Alltoall applies).
    """
    size: int
    total_bytes: float
    messages: Optional[float] = None
    sumsq_recv_kib: Optional[float] = None
    uniform: bool = False
    pairwise_bytes: Optional[float] = None

    @classmethod
    def from_counts(cls, counts: np.ndarray, whole_kib: bool = False) -> "Pattern":
        """The agreed sums of a (P, P) bytes matrix (what a real call would agree on). ``whole_kib``:
        receive bytes in whole KiB, capped, exactly as ``hxmpi.comm.agreement`` carries them."""
        counts = np.asarray(counts, dtype=np.int64)
        p = counts.shape[0]
        off = counts.copy()
        np.fill_diagonal(off, 0)
        recv_kib = np.minimum(counts.sum(axis=0) >> 10, KIB_CAP) if whole_kib else counts.sum(axis=0) / 1024.0
        q, k = np.meshgrid(np.arange(p), np.arange(1, p), indexing="ij")
        pairwise = np.maximum(counts[q, (q + k) % p], counts[(q - k) % p, q]).sum() if p > 1 else 0
        return cls(p, float(counts.sum()), float(np.count_nonzero(off)), float((recv_kib ** 2).sum()),
                   bool((counts == counts.flat[0]).all()) if counts.size else True, float(pairwise))

    @classmethod
    def even(cls, size: int, block: float) -> "Pattern":
        """Every block ``block`` bytes."""
        return cls(size, float(block) * size * size, None, None, True)

    @property
    def rank_bytes(self) -> float:
        """Bytes a rank handles: the root mean square of per-rank receive bytes (the mean if even)."""
        mean = self.total_bytes / self.size
        if self.sumsq_recv_kib is None:
            return mean
        return max(mean, 1024.0 * math.sqrt(self.sumsq_recv_kib / self.size))

    @property
    def rank_messages(self) -> float:
        """Non-empty blocks a rank sends to other ranks (mean)."""
        return self.size - 1.0 if self.messages is None else self.messages / self.size


# ------------------------------------------------------------------------- pricing a step program
#: Parameter names in ``CostModel.vector`` order, and each one's index.
_NAMES = tuple(f.name for f in fields(CostModel))
_INDEX = {name: i for i, name in enumerate(_NAMES)}
_O = _INDEX["msg_overhead"]


@dataclass(frozen=True)
class ProgramPrice:
    """A call's step programs as priced rows, at a block of 1 byte, so any block size is priced by
    arithmetic: what ``price_program`` returns and ``predict_call`` caches per layout.

    The programs are cut into **units**, each a step every rank takes at once (a copy, a node
    barrier, a message phase: exchanges posted together, one pairwise exchange, one Bruck round).
    Each row is one rank's cost of one unit in one regime (a Bruck round: latency-bound or
    CPU-bound; the NIC: bound by the node's messages and bytes), as coefficients of ``vector()``:
    ``const`` (independent of the block) plus ``per_byte`` times the block. A unit costs its
    costliest row, and a call the sum of its units. ``world``: rows of a message phase on the
    world (flat), whose message count a sparse pattern scales; ``pairwise``: rows of pairwise
    rounds, which wait for the larger block of each pair (``Pattern.pairwise_bytes``)."""
    unit: np.ndarray
    const: np.ndarray
    per_byte: np.ndarray
    world: np.ndarray
    pairwise: np.ndarray
    units: int

    def price(self, model: "CostModel", block: float, pairwise_block: Optional[float] = None,
              messages: float = 1.0) -> float:
        """Seconds at ``block`` bytes per destination; ``pairwise_block``: the block pairwise rounds
        wait for (default ``block``); ``messages``: the fraction of a flat phase's messages sent."""
        theta = model.vector()
        t = self.const @ theta
        if messages != 1.0:
            t = t - (1.0 - messages) * self.world * self.const[:, _O] * theta[_O]
        b = np.where(self.pairwise, block if pairwise_block is None else pairwise_block, block)
        t = t + b * (self.per_byte @ theta)
        if not self.units:
            return 0.0
        starts = np.flatnonzero(np.r_[True, self.unit[1:] != self.unit[:-1]])  # rows come in unit order
        return float(np.maximum.reduceat(t, starts).sum())

    def linear(self, block: float) -> np.ndarray:
        """Coefficients of ``vector()`` at ``block`` where each unit has one costliest row whatever
        the parameters (no Bruck rounds, no NIC; ranks that differ in what they copy or send):
        the sum of each unit's costliest row, found at the default parameters."""
        rows = self.const + block * self.per_byte
        t = rows @ CostModel().vector()
        pick = [int(np.flatnonzero(self.unit == u)[np.argmax(t[self.unit == u])]) for u in range(self.units)]
        return rows[pick].sum(axis=0)


class _Rows:
    """Builder of a ``ProgramPrice``: blocks of rows (one per rank of a unit), each a (const,
    per_byte) pair of (ranks, parameters) arrays."""

    def __init__(self):
        self.blocks: list = []

    def add(self, unit: int, const: np.ndarray, per_byte: np.ndarray, world: bool, pairwise: bool) -> None:
        self.blocks.append((unit, const, per_byte, world, pairwise))

    def done(self, units: int) -> ProgramPrice:
        if not self.blocks:
            z = np.zeros((0, len(_NAMES)))
            return ProgramPrice(np.zeros(0, dtype=np.int64), z, z, np.zeros(0), np.zeros(0, dtype=bool), 0)
        rows = np.concatenate([np.column_stack([np.full(len(c), u), c, b, np.full(len(c), w), np.full(len(c), pw)])
                               for u, c, b, w, pw in self.blocks])
        # Ranks alike price alike: one row of each (rows compared as bytes), in unit order.
        rows = np.ascontiguousarray(rows)
        _, keep = np.unique(rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel(),
                            return_index=True)
        rows = rows[np.sort(keep)]
        rows = rows[np.argsort(rows[:, 0], kind="stable")]
        k = len(_NAMES)
        return ProgramPrice(rows[:, 0].astype(np.int64), rows[:, 1:1 + k], rows[:, 1 + k:1 + 2 * k],
                            rows[:, 1 + 2 * k], rows[:, 2 + 2 * k].astype(bool), units)


def _cols(n: int, **coef) -> np.ndarray:
    """(n, parameters) coefficients: each named parameter's column set to its value (a number or
    an array of n)."""
    out = np.zeros((n, len(_NAMES)))
    for name, v in coef.items():
        out[:, _INDEX[name]] += v
    return out


def _units(layout: Layout, rank: int, prog: StepProgram, learned: bool, rule: str) -> list:
    """One rank's program cut into units (see ``ProgramPrice``), each a dict of what the rank
    does in it: its kind, copied bytes, and the world ranks it sends to (``to``) with the bytes of
    each, per block byte (``nu``) and constant (``nc``: Bruck's length headers)."""
    node_of = layout.node_of
    me = int(node_of[rank])
    out: list = []
    group: list = []

    def members(comm) -> np.ndarray:
        if comm == "world":
            return np.arange(layout.size)
        if comm == "node":
            return layout.members[me]
        return np.array([layout.lane_server(comm, m) for m in range(layout.num_nodes)], dtype=np.int64)

    def messages(kind: str, peers_: np.ndarray, nu: np.ndarray, nc: np.ndarray, copy_u: float = 0.0,
                 copy_c: float = 0.0, **extra) -> dict:
        """A message unit: to world ranks ``peers_``, bytes per block byte ``nu`` and constant ``nc``."""
        return {"kind": kind, "copy_u": copy_u, "copy_c": copy_c, "to": peers_, "nu": nu, "nc": nc, **extra}

    def copied(nbytes: float) -> None:
        """Consecutive copies are one unit (one rank packs where another does not)."""
        if out and out[-1]["kind"] == "copy":
            out[-1]["copy_u"] += nbytes
        else:
            out.append({"kind": "copy", "copy_u": nbytes, "copy_c": 0.0})

    for st in program_steps(prog):
        if isinstance(st, CopyStep):
            copied(float(st.nbytes))
            continue
        if isinstance(st, BarrierStep):
            out.append({"kind": "barrier", "size": layout.node_sizes[me]})
            continue
        peers = members(st.comm)
        n = len(peers)
        pos = int(np.flatnonzero(peers == rank)[0])
        sc = st.send_counts
        if st.rounds == "bruck":
            radix = check_radix(st.radix, n)
            for rnd in bruck_rounds(n, radix):
                dist = np.array([d for d, _ in rnd], dtype=np.int64)
                sizes = np.array([slots.size for _, slots in rnd], dtype=np.int64)
                to = peers[(pos + dist) % n]
                nu = np.add.reduceat(sc[(pos + np.concatenate([slots for _, slots in rnd])) % n],
                                     exclusive_cumsum(sizes)).astype(float)
                nc = np.zeros(sizes.size) if learned else (HEADER_BYTES * sizes).astype(float)
                keep = nu > 0 if learned else np.ones(nu.size, dtype=bool)
                out.append(messages("round", to[keep], nu[keep], nc[keep], float(nu[keep].sum()),
                                    float(nc[keep].sum())))
            copied(float(st.recv_counts.sum()))
            continue
        sent = np.flatnonzero(sc)
        sent = sent[sent != pos]
        group.append((peers[sent], sc[sent].astype(float), float(sc[pos])))
        if st.with_next and st.rounds != "pairwise":
            continue  # linear exchanges posted together are one unit; pairwise ones run in turn
        if st.rounds == "pairwise":
            how = "pairwise"
        elif st.blocking and len(group) == 1:
            how = rule or alltoallv_algorithm(n)  # a blocking call: Open MPI's rule picks
        else:
            how = "linear"  # nonblocking: libnbc posts every message at once
        to = np.concatenate([g[0] for g in group])
        nu = np.concatenate([g[1] for g in group])
        out.append(messages(how, to, nu, np.zeros(nu.size), sum(g[2] for g in group), world=st.comm == "world"))
        group = []
    return out


def _sided(units: list, layout: Layout, rank: int, shift: int = 0) -> list:
    """``units`` of ``rank`` with each message unit's messages and bytes split by whether they
    leave the node (``m_inter``, ``inter_u``, ``inter_c``) or not (``m_intra``, ...); ``shift``:
    read them as rank + shift's, every peer shifted alike (a flat program on even counts)."""
    p = layout.size
    me = layout.node_of[(rank + shift) % p]
    out = []
    for u in units:
        if "to" not in u:
            out.append(u)
            continue
        to = u["to"] + shift if shift else u["to"]
        inter = (layout.node_of[to % p if shift else to] != me).astype(float)
        v = {k: x for k, x in u.items() if k not in ("to", "nu", "nc")}
        v["m_inter"] = int(inter.sum())
        v["m_intra"] = int(inter.size) - v["m_inter"]
        for key, x in (("u", u["nu"]), ("c", u["nc"])):
            v[f"inter_{key}"] = float(x @ inter)
            v[f"intra_{key}"] = float(x.sum()) - v[f"inter_{key}"]
        out.append(v)
    return out


def _aligned(per_rank: dict) -> dict:
    """Each rank's units lined up with the longest program's, by kind in order: a rank that skips
    a unit (a multi-leader rank that leads nothing has no exchange) idles there."""
    template = max(per_rank.values(), key=len, default=[])
    out = {}
    for r, us in per_rank.items():
        if len(us) == len(template):
            out[r] = us
            continue
        lined, i = [], 0
        for t in template:
            if i < len(us) and us[i]["kind"] == t["kind"]:
                lined.append(us[i])
                i += 1
            else:
                lined.append({"kind": "idle"})
        if i < len(us):
            raise ValueError(f"rank {r}'s program does not line up with the longest one")
        out[r] = lined
    return out


def price_program(layout: Layout, programs: Mapping[int, StepProgram], learned: bool = True,
                  rule: str = "", shifts: Sequence[int] = ()) -> ProgramPrice:
    """Price step programs of some ranks of ``layout`` (``programs``: rank -> its program), made
    with 1-byte blocks: the call's time is the sum over units of the costliest rank's unit.

    Copies cost their bytes at ``beta_copy``; a node barrier ceil(log2 G) dissemination rounds; a
    message phase, with m peers, o the CPU cost of posting or completing one message and a the
    latency (inter-node if any peer is on another node), and its bytes::

      linear (all posted at once):    a + 2 m o
      pairwise rounds (one by one):   sum over rounds of (a + 2 o)
      a Bruck round of k messages:    max(a + (k + 1) o, 2 k o)   (LogP: posting vs arrival)

    plus the larger of the node's bytes to other nodes at ``beta_inter +
    beta_backbone`` (a node's ranks share its link: the sum over the node's ranks in ``programs``,
    scaled to the whole node where only some are given) and the rank's own to its node at
    ``beta_intra`` (link and loopback run in parallel); with a NIC, a phase costs at least a
    plus the node's inter-node messages at ``1 / nic_msg_rate`` and bytes at ``1 / nic_bandwidth``.
    A blocking exchange runs as Open MPI's rule says (``alltoallv_algorithm``; ``rule`` forces
    one), a nonblocking one linear. ``learned``: Bruck lengths known (no headers, no empty
    messages). ``shifts``: ``programs`` is one rank's flat program on even counts, which is also
    that of rank + shift for each shift (peers shifted alike): price those ranks from it."""
    if shifts:  # one flat program on even counts stands for rank + shift's, for each shift
        (r0, prog), = programs.items()
        units = _units(layout, r0, prog, learned, rule)
        per_rank = {(r0 + s) % layout.size: _sided(units, layout, r0, s) for s in shifts}
    else:
        per_rank = {r: _sided(_units(layout, r, prog, learned, rule), layout, r) for r, prog in programs.items()}
    per_rank = _aligned(per_rank)
    units = max((len(u) for u in per_rank.values()), default=0)
    # The node's share of each unit: its given ranks' inter-node bytes and messages, scaled up.
    given: dict = {}
    for r in per_rank:
        given.setdefault(int(layout.node_of[r]), []).append(r)
    load: dict = {}
    for node, ranks in given.items():
        scale = layout.node_sizes[node] / len(ranks)
        for i in range(units):
            us = [per_rank[r][i] for r in ranks if i < len(per_rank[r]) and "m_inter" in per_rank[r][i]]
            load[node, i] = tuple(scale * sum(u[k] for u in us) for k in ("inter_u", "inter_c", "m_inter"))
    rows = _Rows()
    for i in range(units):
        at = [(r, us[i]) for r, us in per_rank.items() if i < len(us)]
        for kind in {u["kind"] for _, u in at} - {"idle"}:
            group = [(r, u) for r, u in at if u["kind"] == kind]
            _unit_rows(rows, i, kind, group, layout, load)
    return rows.done(units)


def _unit_rows(rows: _Rows, i: int, kind: str, group: list, layout: Layout, load: dict) -> None:
    """Rows of unit ``i`` for its ranks of one ``kind`` (see ``price_program``), all ranks at once."""
    n = len(group)
    col = lambda key: np.array([u[key] for _, u in group], dtype=float)  # noqa: E731
    if kind == "barrier":
        size = col("size")
        rounds = np.where(size > 1, np.ceil(np.log2(np.maximum(size, 1))), 0.0)
        rows.add(i, _cols(n, alpha_intra=rounds, msg_overhead=2 * rounds), _cols(n), False, False)
        return
    copy_c, copy_u = _cols(n, beta_copy=col("copy_c")), _cols(n, beta_copy=col("copy_u"))
    if kind == "copy":
        rows.add(i, copy_c, copy_u, False, False)
        return
    world = bool(group[0][1].get("world", False))
    pw = world and kind == "pairwise"
    nodes = [int(layout.node_of[r]) for r, _ in group]
    node_u, node_c, node_m = (np.array([load[m, i][k] for m in nodes]) for k in range(3))
    m_inter, m_intra = col("m_inter"), col("m_intra")
    msgs = m_inter + m_intra
    lat = _cols(n, alpha_inter=(m_inter > 0) * 1.0, alpha_intra=(m_inter == 0) * (msgs > 0) * 1.0)
    ovh = lambda per_msg, extra=0.0: _cols(n, msg_overhead=np.where(msgs > 0, per_msg * msgs + extra, 0.0))  # noqa: E731
    # The node's link and the rank's own intra-node bytes (its loopback) run in parallel.
    has = (msgs > 0) * 1.0  # a rank that sends nothing here waits for nobody's bytes
    wires = [(_cols(n, beta_inter=has * node_c, beta_backbone=has * node_c),
              _cols(n, beta_inter=has * node_u, beta_backbone=has * node_u)),
             (_cols(n, beta_intra=col("intra_c")), _cols(n, beta_intra=col("intra_u")))]
    alone = []  # regimes without the bytes' time
    if kind == "linear":
        regimes = [lat + ovh(2)]
    elif kind == "pairwise":
        regimes = [_cols(n, alpha_inter=m_inter, alpha_intra=m_intra) + ovh(2)]
    else:  # a Bruck round: the wire carries the first messages while the rank posts the rest
        alone = [lat + ovh(1, 1.0), ovh(2)]
        regimes = [lat + _cols(n, msg_overhead=np.where(msgs > 0, 2.0, 0.0))]
    for reg in alone:
        rows.add(i, reg + copy_c, copy_u, world, pw)
    for reg in regimes:
        for c, b in wires:
            rows.add(i, reg + copy_c + c, copy_u + b, world, pw)
    if (m_inter > 0).any():  # the NIC: the node's inter-node messages and bytes, one after another
        on = (m_inter > 0) * 1.0
        rows.add(i, lat + copy_c + _cols(n, nic_msg_rate=on * node_m, nic_bandwidth=on * node_c),
                 copy_u + _cols(n, nic_bandwidth=on * node_u), world, pw)


def _even_sides(p: int) -> tuple:
    """A rank's sides with a 1-byte block to every rank (counts, displacements; send, receive)."""
    ones = np.ones(p, dtype=np.int64)
    displs = np.arange(p, dtype=np.int64)
    return ones, displs, ones.copy(), displs.copy()


def representative_ranks(layout: Layout, algorithm: Algorithm) -> tuple:
    """The ranks whose programs price an even call on ``layout`` (nodes of one size; irregular
    layouts: every rank). A flat program is the same on every node (a shift by one node maps the
    programs onto each other): node 0's ranks, and rank 0 alone where every exchange is direct (one
    message to each peer), as only rounds at distance d cross a node boundary from some of a
    node's ranks and not others. The lanes treat a node's ranks alike, but the nodes differ in
    their copies (an inner node packs its send blocks around its own): the first rank of the
    first, second and last nodes. Multi-leader: every rank of those nodes (a node's leaders send, its
    other ranks do not)."""
    if len(set(layout.node_sizes)) > 1:
        return tuple(range(layout.size))
    if algorithm.led:  # leaders and the others differ: whole nodes
        return tuple(int(r) for m in sorted({0, 1 % layout.num_nodes, layout.num_nodes - 1})
                     for r in layout.members[m])
    if algorithm.hierarchical:
        return tuple(sorted({int(layout.members[m][0]) for m in (0, 1 % layout.num_nodes, layout.num_nodes - 1)}))
    if not algorithm.radixed:
        return (0,)
    return tuple(int(r) for r in layout.members[0])


def layout_price(layout: Layout, algorithm, radix: int = 2, node_phase: str = "shm", learned: bool = True,
                 rule: str = "", ranks: Optional[Sequence[int]] = None, uniform: bool = False) -> ProgramPrice:
    """The ``ProgramPrice`` of an even call of ``algorithm`` on ``layout`` (it runs as ``runs_as``
    says): the programs the planners make for ``ranks`` (default ``representative_ranks``; every
    rank for the full walk) with 1-byte blocks. ``uniform``: an Alltoall's flat program."""
    algo = layout.runs(algorithm)
    p = layout.size
    if algo.led and node_phase != "shm":
        raise ValueError(f"{algo.name} runs with the 'shm' node phase only, not {node_phase!r}")
    if ranks is None and not algo.hierarchical:  # every rank's flat program is rank 0's, shifted
        reps = representative_ranks(layout, algo)
        return price_program(layout, {0: program(algo, _even_sides(p), radix=radix, uniform=uniform)}, learned,
                             rule, shifts=reps)
    progs = {}
    for r in (representative_ranks(layout, algo) if ranks is None else ranks):
        if algo.hierarchical:
            progs[r] = program(algo, _even_sides(p), layout.planner_for(r, algo, radix), NODE_PHASES[node_phase],
                               layout.node_counts(algo, np.ones((p, p), dtype=np.int64), r), radix).detach()
        else:
            progs[r] = program(algo, _even_sides(p), radix=radix, uniform=uniform)
    return price_program(layout, progs, learned, rule)


@lru_cache(maxsize=512)
def _skeleton(shape: tuple, algorithm: str, radix: int, node_phase: str, learned: bool, rule: str) -> ProgramPrice:
    """``layout_price`` of consecutive nodes of ``shape``'s sizes, cached: a layout's prices are
    made once, then any block and pattern is arithmetic."""
    return layout_price(_layout(shape), algorithm, radix, node_phase, learned, rule, uniform=rule != "")


@lru_cache(maxsize=16)
def _layout(shape: tuple) -> Layout:
    return Layout(np.repeat(np.arange(len(shape)), shape))


#: Irregular layouts up to this many ranks are priced by the walk of every rank's program; larger
#: ones as nodes of the largest size (the walk of every rank would cost seconds there).
IRREGULAR_WALK_MAX = 256


def _shape(nodes: int, per_node: int, sizes: Optional[Sequence[int]] = None) -> tuple:
    """Node sizes of a call: ``sizes`` where given (irregular ones above ``IRREGULAR_WALK_MAX``
    ranks as nodes of the largest), else ``nodes`` nodes of ``per_node``."""
    if sizes is None or (len(set(sizes)) > 1 and sum(sizes) > IRREGULAR_WALK_MAX):
        return (int(per_node if sizes is None else max(sizes)),) * int(nodes if sizes is None else len(sizes))
    return tuple(int(g) for g in sizes)


# --------------------------------------------------------------------------------- the agreement
@dataclass(frozen=True)
class AgreementStep:
    """One collective of a one-shot call's agreement: ``kind`` "allreduce" (the world, ``nbytes``
    in all), "alltoall" (the world, ``nbytes`` per peer) or "allgather" (the rank's node,
    ``nbytes`` from each rank)."""
    kind: str
    nbytes: int


#: Bytes per rank and peer of a count: the numpy form's counts, the node's receive counts (int64).
COUNT_BYTES = 8


def agreement_steps(size: int, hier: bool, numpy: bool = False, miss: bool = True, both: bool = False) -> tuple:
    """The collectives a one-shot call issues before its exchange, in order, on ``size`` ranks:
    the numpy form's counts (one Alltoall of an int64 per peer), the agreement's SUM Allreduce of
    ``AGREEMENT_BYTES``, and, for a hierarchical algorithm on a plan-cache miss, the node's
    Allgather of every rank's receive counts (``COUNT_BYTES`` per world rank; ``both``: its send
    counts too, as multi-leader gathers them). ``hier``: the call runs a hierarchical algorithm (on
    a layout with a hierarchy). The one statement of these steps: the simulator replays them and
    ``predict_agreement`` prices them."""
    steps = [AgreementStep("alltoall", COUNT_BYTES)] if numpy else []
    steps.append(AgreementStep("allreduce", AGREEMENT_BYTES))
    if hier and miss:
        steps.append(AgreementStep("allgather", COUNT_BYTES * size * (2 if both else 1)))
    return tuple(steps)


def _allreduce(m: "CostModel", nodes: int, per_node: int, nbytes: int) -> float:
    """Recursive doubling (SMPI ``allreduce:rdb``) on nodes of ``per_node`` consecutive ranks: the
    rounds at distance below ``per_node`` stay on the node; off powers of two, 2 extra steps."""
    p = nodes * per_node
    if p <= 1:
        return 0.0
    rounds = math.ceil(math.log2(p)) if p & (p - 1) == 0 else math.floor(math.log2(p))
    intra = min(rounds, math.ceil(math.log2(per_node)) if per_node > 1 else 0)
    inter = rounds - intra + (0 if p & (p - 1) == 0 else 2)
    one = lambda a, b: a + 2 * m.msg_overhead + nbytes * b  # noqa: E731
    return intra * one(m.alpha_intra, m.beta_intra) + inter * one(m.alpha_inter, m.beta_inter)


def predict_agreement(model: "CostModel", nodes: int, per_node: int, hier: bool, numpy: bool = False,
                      miss: bool = True, both: bool = False) -> float:
    """Seconds of a one-shot call's agreement (``agreement_steps``): the Allreduce by recursive
    doubling, the counts' Alltoall as MPI_Alltoall, the node's Allgather by dissemination rounds;
    ``both``: multi-leader's, of both sides' counts."""
    p = nodes * per_node
    t = 0.0
    for st in agreement_steps(p, hier and has_hierarchy(nodes, per_node), numpy, miss, both):
        if st.kind == "allreduce":
            t += _allreduce(model, nodes, per_node, st.nbytes)
        elif st.kind == "alltoall":
            t += _alltoall(model, _shape(nodes, per_node), st.nbytes)
        else:
            rounds = math.ceil(math.log2(per_node)) if per_node > 1 else 0
            t += rounds * (model.alpha_intra + 2 * model.msg_overhead) + (per_node - 1) * st.nbytes * model.beta_intra
    return t


#: Open MPI's tuned fixed decision for MPI_Alltoall above 2 ranks: (communicator size below
#: which the row holds, ((block bytes below which the algorithm holds, algorithm), ...)); the last
#: row and the last entry of a row hold beyond. "linear" stands for its linear and linear_sync.
ALLTOALL_TUNED = (
    (8, ((8192, "linear"), (16384, "linear"), (65536, "linear"), (524288, "linear"), (1048576, "pairwise"),
         (None, "linear"))),
    (16, ((None, "linear"),)),
    (32, ((4, "linear"), (512, "bruck"), (None, "linear"))),
    (64, ((512, "bruck"), (524288, "linear"), (None, "linear"))),
    (128, ((1024, "bruck"), (262144, "linear"), (None, "pairwise"))),
    (256, ((1024, "bruck"), (262144, "linear"), (None, "pairwise"))),
    (512, ((1024, "bruck"), (32768, "linear"), (None, "pairwise"))),
    (1024, ((512, "bruck"), (262144, "linear"), (None, "pairwise"))),
    (2048, ((512, "bruck"), (None, "linear"))),
    (4096, ((1024, "bruck"), (None, "linear"))),
    (None, ((2048, "bruck"), (None, "linear"))),
)


def alltoall_algorithm(size: int, block: float) -> str:
    """What Open MPI's tuned component (fixed rules) runs ``MPI_Alltoall`` of ``block``-byte blocks
    on ``size`` ranks as: "bruck" (its modified Bruck, radix 2), "linear" (every message posted at
    once) or "pairwise" (one peer per round)."""
    if size <= 2:
        return "pairwise"
    for below, rules in ALLTOALL_TUNED:
        if below is None or size < below:
            for limit, algo in rules:
                if limit is None or block < limit:
                    return algo
    raise AssertionError("unreachable: the table's last row holds beyond")


def bruck_blocks(size: int) -> list[tuple[int, int]]:
    """(distance, blocks sent) of each round of Open MPI's modified Bruck on ``size`` ranks: round
    d sends the blocks whose index (1 .. size - 1) has bit d set."""
    idx = np.arange(1, size)
    out, d = [], 1
    while d < size:
        out.append((d, int(np.count_nonzero(idx & d))))
        d <<= 1
    return out


def _alltoall(m: "CostModel", shape: tuple, block: float, library: bool = True) -> float:
    """Seconds of MPI_Alltoall of ``block``-byte blocks on nodes of ``shape``, run as
    ``alltoall_algorithm`` says: the flat program's exchange priced as radix-2 Bruck rounds (no
    headers), linear or pairwise, plus the library's copies (Bruck: the two rotations and each
    round's pack, unpack and copy back; the others: the own block) and, with ``library``, its CPU
    per block and Bruck round (``mpi_ddt_block``); without: the CPU-free lower bound."""
    p = sum(shape)
    how = alltoall_algorithm(p, block)
    free = replace(m, beta_copy=0.0)  # the exchange alone; the library's copies are added below
    if how != "bruck":
        return _skeleton(shape, "flat", 2, "shm", True, how).price(free, block) + block * m.beta_copy
    k = sum(n for _, n in bruck_blocks(p))  # blocks sent over all rounds
    cpu = k * m.mpi_ddt_block if library else 0.0
    copies = (2 * p + 3 * k) * block * m.beta_copy
    return _skeleton(shape, "bruck", 2, "shm", True, "").price(free, block) + cpu + copies


def _predict_call(m: "CostModel", algorithm: str, mode: str, shape: tuple, pat: Pattern, node_phase: str,
                  radix: int, cpu, numpy: bool) -> float:
    n, g, p = len(shape), max(shape), pat.size
    hier_ok = has_hierarchy(n, g)
    call = "alltoall" if algorithm == "alltoall" else runs_as(algorithm, hier_ok).name
    hier = call != "alltoall" and ALGORITHM[call].hierarchical
    both = hier and ALGORITHM[call].led
    t = predict_agreement(m, n, g, hier, numpy, both=both) if mode == "oneshot" else 0.0
    if mode in ("oneshot", "plan"):
        key = ("flat" if call == "alltoall" else ALGORITHM[call].cpu_key) + ("_plan" if mode == "plan" else "")
        t += cpu(key) if cpu is not None else fixed_cpu(m, key)
    b = pat.rank_bytes / p                        # effective block
    if call == "alltoall":
        return t + _alltoall(m, shape, b, library=mode != "bare")
    # Pairwise rounds each wait for the larger of their two blocks (flat: the agreed sum).
    pair = pat.pairwise_bytes / (p * (p - 1)) if pat.pairwise_bytes and p > 1 else None
    frac = min(pat.rank_messages, p - 1.0) / (p - 1) if p > 1 else 1.0
    k = radix if ALGORITHM[call].radixed or ALGORITHM[call].led else 2
    sk = _skeleton(shape, call, k, node_phase, mode != "oneshot", "")
    return t + sk.price(m, b, pair, frac)


def predict_call(model: "CostModel", algorithm: str, mode: str, nodes: int, per_node: int, pattern,
                 node_phase: str = "shm", radix: int = 2, cpu=None, numpy: bool = False,
                 sizes: Optional[Sequence[int]] = None) -> float:
    """Predicted seconds of a whole call: ``mode`` "oneshot" (agreement + CPU + exchange), "plan"
    (CPU + exchange, lengths known) or "bare" (the exchange alone).

    ``pattern``: a ``Pattern`` or a block size (bytes, even counts). ``cpu(key)``: hxmpi's CPU seconds
    per path ("flat", "hier_plan", ...; default: the model's fixed costs). ``numpy``: the
    ``alltoallv(array, counts)`` form (its agreement also exchanges counts). ``sizes``: the node
    sizes where they differ (default: ``nodes`` nodes of ``per_node`` ranks).
    """
    if algorithm not in CALL_ALGORITHMS:
        raise ValueError(f"algorithm must be one of {CALL_ALGORITHMS}, got {algorithm!r}")
    if mode not in ("oneshot", "plan", "bare"):
        raise ValueError(f"mode must be 'oneshot', 'plan' or 'bare', got {mode!r}")
    if node_phase not in NODE_PHASES:
        raise ValueError(f"node_phase must be one of {tuple(NODE_PHASES)}, got {node_phase!r}")
    pat = pattern if isinstance(pattern, Pattern) else Pattern.even(sum(_shape(nodes, per_node, sizes)), pattern)
    if algorithm == "alltoall" and not pat.uniform:
        raise ValueError("alltoall needs uniform counts")
    return _predict_call(model, algorithm, mode, _shape(nodes, per_node, sizes), pat, node_phase, radix, cpu,
                         numpy)


def settings_of(algorithm, shape: tuple, radices=RADICES) -> list[int]:
    """The settings ``choose_call`` tries for ``algorithm`` on nodes of ``shape``: Bruck radices
    (each of ``radices`` up to the size of the communicator the rounds run on, the world or a lane
    of one rank per node, and that size: one round to every peer), leaders per node for
    multi-leader (powers of two below the smallest node: at its size the lanes do better), else [2]."""
    algo = ALGORITHM[algorithm] if isinstance(algorithm, str) else algorithm
    if algo.led:
        return [1 << i for i in range(max(min(shape) - 1, 1).bit_length()) if (1 << i) < min(shape)] or [1]
    if algo.radixed:
        size = len(shape) if algo.hierarchical else sum(shape)
        return sorted({min(k, max(size, 2)) for k in radices} | {max(size, 2)})
    return [2]


def choose_call(model: "CostModel", mode: str, nodes: int, per_node: int, pattern, node_phase: str = "shm",
                cpu=None, numpy: bool = False, radices=RADICES,
                sizes: Optional[Sequence[int]] = None) -> tuple[str, int, float]:
    """(algorithm, radix, predicted seconds) of the fastest call the model knows for this pattern.

    Candidates: every algorithm of ``ALGORITHMS`` the layout runs as itself (the hierarchical ones
    where it has a hierarchy), the radixed ones at each radix of ``radices`` up to the size of the
    communicator their rounds run on (the world, or a lane of one rank per node) and at that size
    (one round to every peer), multi-leader (with the "shm" node phase) at every power of two
    leaders per node below the smallest node's size, and MPI_Alltoall for uniform counts. The
    radix of the pick is its leaders per node for multi-leader. ``sizes``: as ``predict_call``.
    """
    shape = _shape(nodes, per_node, sizes)
    pat = pattern if isinstance(pattern, Pattern) else Pattern.even(sum(shape), pattern)
    hier_ok = has_hierarchy(len(shape), max(shape))
    # MPI_Alltoall first: on a tie (the same linear exchange) the library's own call, without
    # count arrays, is the one to run.
    cands = [("alltoall", 2)] if pat.uniform else []
    for algo in ALGORITHM.values():
        if runs_as(algo, hier_ok) is not algo or (algo.led and node_phase != "shm"):
            continue
        cands += [(algo.name, k) for k in settings_of(algo, shape, radices)]
    best = min((predict_call(model, a, mode, nodes, per_node, pat, node_phase, k, cpu, numpy, shape), i)
               for i, (a, k) in enumerate(cands))
    algo, radix = cands[best[1]]
    return algo, radix, best[0]


def pattern_class(pattern: Pattern) -> tuple:
    """The pattern's class: its size, uniformity and agreed sums rounded to quarter powers of two
    (a factor of 2**0.25 = 1.19). ``auto_pick`` decides per class."""
    sums = (pattern.total_bytes, pattern.messages, pattern.sumsq_recv_kib, pattern.pairwise_bytes)
    return (pattern.size, pattern.uniform) + tuple(None if x is None else quarter_log2(x) for x in sums)


def auto_pick(model: "CostModel", mode: str, nodes: int, per_node: int, pattern: Pattern,
              node_phase: str = "shm", hier_possible: bool = True, cpu=None,
              sizes: Optional[Sequence[int]] = None) -> tuple[str, int]:
    """What ``HierComm(algorithm="auto")`` runs: (one of hxmpi's algorithms, Bruck radix).

    ``choose_call`` on the representative of the pattern's class (``pattern_class``), so that one
    pick serves every call of the class; MPI_Alltoall ("alltoall") is hxmpi's flat path of an
    ``Alltoall`` call, and the hierarchical ones run flat where the layout has no hierarchy
    (``hier_possible`` False). ``mode``: "oneshot" or "plan". ``cpu``: hxmpi's CPU per path
    (``CpuTimes``; default: the model's fixed costs). ``sizes``: the node sizes where they differ.
    """
    size, uniform, *sums = pattern_class(pattern)
    total, messages, recv_sq, pairwise = (None if q is None else 2.0 ** (q / 4) - 1.0 for q in sums)
    rep = Pattern(size, total, messages, recv_sq, uniform, pairwise)
    algo, radix, _ = choose_call(model, mode, nodes, per_node, rep, node_phase, cpu, sizes=sizes)
    return ("flat" if algo == "alltoall" else runs_as(algo, hier_possible).name), radix
