"""Alpha-beta cost model of flat vs hierarchical all-to-all, used by ``algorithm="auto"``.

For P = N * G ranks (N nodes of G ranks; irregular layouts use the largest G) and b bytes per
block, per call and per rank. Each exchange phase costs what the MPI algorithm that runs it
costs: Open MPI's ``alltoallv_algorithm`` rule picks pairwise rounds or linear posting from the
communicator size (``MPI_Alltoallv``), and hier's phase 1 is a nonblocking ``Ialltoallv``, which
Open MPI (libnbc) always runs linear. With m peers, o the CPU cost of posting or completing one
message, and a the latency of the slowest peer::

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
share, and only the sum of the two can be fitted); c P b local copy bytes, as ``hxmpi.comm.plan`` schedules them (shm: pack and
copy out of the node window, c P = 2P; mpi: pack, repack, unpack, c P = 3P - 2G); o_flat, o_hier: fixed cost of a call (collectives and Python, s). Both
algorithms move the same inter-node bytes, so hier wins where the saved messages and latencies
outweigh its copies and node phase: below a crossover block size. ``hxmpi.sim.simulate`` replays
the exact schedules in SimGrid and reports this model's error against it.

Parameters come from a calibration file (``benchmarks/calibrate.py`` writes one; pass its path
as ``HierComm(tuning=...)`` or env ``HXMPI_TUNING``), else from the built-in defaults below
(a typical InfiniBand cluster node: 1.5 us / 12 GB/s between nodes, 0.4 us / 8 GB/s inside).
Whole calls (``predict_call``, ``choose_call``, ``auto_pick``) charge hxmpi's own CPU per path from
a ``CpuTimes`` table (``benchmarks/bench_overhead.py --json``; ``HierComm`` reads
``overhead=FILE``, else env ``HXMPI_OVERHEAD``'s file, else the packaged ``overhead.json``);
without a table they charge o_flat and o_hier.
"""
from __future__ import annotations

import importlib.resources
import json
import math
import os
from dataclasses import asdict, dataclass, fields, replace
from typing import Mapping, Optional

import numpy as np

from ..errors import CpuFileError
from ._agree import quarter_log2
from .plan import ALGORITHM, ALGORITHMS, HEADER_BYTES, NODE_PHASES

__all__ = ["alltoallv_algorithm", "CostModel", "fit", "CpuTimes", "fixed_cpu", "Pattern", "predict_agreement",
           "predict_call", "choose_call", "pattern_class", "auto_pick"]

ENV_TUNING = "HXMPI_TUNING"
#: Env var naming a CPU-per-path file for ``HierComm``'s "auto" (default: the packaged ``CPU_FILE``).
ENV_OVERHEAD = "HXMPI_OVERHEAD"
#: hxmpi's measured CPU per call by path, shipped as data of ``hxmpi.comm``: the output of
#: ``benchmarks/bench_overhead.py --json`` (``--combine-flat/--combine-hier`` on this project's runs).
CPU_FILE = "overhead.json"
#: Keys of a CPU file's ``cpu_s_per_call``: per algorithm, a one-shot miss (its name), a one-shot
#: hit (``_hit``) and a persistent plan (``_plan``).
CPU_KEYS = tuple(a + kind for a in ALGORITHMS for kind in ("", "_hit", "_plan"))
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
            raise ValueError(f"node_phase must be one of {tuple(NODE_PHASES)}, got {node_phase!r}")
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
RADICES = (2, 3, 4, 8, 16, 32)
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


def _rounds_profile(size: int, radix: int) -> list[list[tuple[int, int]]]:
    """Per Bruck round, (distance, slots moved) of each message (``hxmpi.comm.plan.bruck_rounds``'s shape)."""
    radix = int(min(radix, max(size, 2)))
    idx = np.arange(size)
    out, dist = [], 1
    while dist < size:
        digit = (idx // dist) % radix
        out.append([(z * dist, int((digit == z).sum())) for z in range(1, radix) if z * dist < size])
        dist *= radix
    return out


def _bruck_exchange(m: "CostModel", size: int, per_node: int, block: float, radix: int, header: bool) -> float:
    """Seconds of a Bruck all-to-all of ``block``-byte blocks on ``size`` ranks of nodes of ``per_node``
    consecutive ranks (``per_node`` 1: a lane, every peer on another node, the node's lanes in parallel
    sharing its link: pass the lanes' count as ``share``)."""
    t = 0.0
    beta = m.beta_inter + m.beta_backbone
    for msgs in _rounds_profile(size, radix):
        nbytes = [s * block + (HEADER_BYTES * s if header else 0) for _, s in msgs]
        link = sum(min(d, per_node) * b for (d, _), b in zip(msgs, nbytes))
        # k messages each way (LogP): a rank posts its k sends, and takes each arrival as it comes,
        # so the round ends one overhead after the last arrival, L after the last send was posted;
        # only where posting outlasts the latency do all 2 k overheads line up.
        k = len(msgs)
        t += max(m.alpha_inter + (k + 1) * m.msg_overhead, 2 * k * m.msg_overhead) + link * beta \
            + sum(nbytes) * m.beta_copy
    return t + size * block * m.beta_copy


def _allreduce(m: "CostModel", p: int, inter: bool) -> float:
    """Recursive doubling of the agreement's 128 B (SMPI ``allreduce:rdb``), 2 extra steps off powers of two."""
    if p <= 1:
        return 0.0
    rounds = math.ceil(math.log2(p)) + (0 if p & (p - 1) == 0 else 2)
    a, b = (m.alpha_inter, m.beta_inter) if inter else (m.alpha_intra, m.beta_intra)
    return rounds * (a + 2 * m.msg_overhead + AGREEMENT_BYTES * b)


def predict_agreement(model: "CostModel", nodes: int, per_node: int, hier: bool, numpy: bool = False) -> float:
    """Seconds of a one-shot call's agreement: the 128 B Allreduce; the counts' Alltoall (numpy form);
    the node's Allgather of receive counts (hier, plan-cache miss), by dissemination rounds."""
    p = nodes * per_node
    t = _allreduce(model, p, nodes > 1)
    if numpy:
        t += _predict_call(model, "alltoall", "bare", nodes, per_node, Pattern.even(p, 8), "shm", 2, None, False)
    if hier and nodes > 1 and per_node > 1:
        t += math.ceil(math.log2(per_node)) * (model.alpha_intra + 2 * model.msg_overhead)
        t += (per_node - 1) * 8 * p * model.beta_intra
    return t


def _predict_call(m: "CostModel", algorithm: str, mode: str, nodes: int, per_node: int, pat: Pattern,
                  node_phase: str, radix: int, cpu, numpy: bool) -> float:
    n, g, p = nodes, per_node, pat.size
    degenerate = n <= 1 or g <= 1
    if _hierarchical(algorithm) and degenerate:
        algorithm = "flat"
    rb = pat.rank_bytes
    b = rb / p                        # effective block
    msgs = min(pat.rank_messages, p - 1.0)
    t = predict_agreement(m, n, g, _hierarchical(algorithm), numpy) if mode == "oneshot" else 0.0
    if mode in ("oneshot", "plan"):
        key = ("flat" if algorithm == "alltoall" else algorithm) + ("_plan" if mode == "plan" else "")
        t += cpu(key) if cpu is not None else fixed_cpu(m, key)
    bw = m.beta_inter + m.beta_backbone
    if algorithm in ("flat", "alltoall"):
        def direct(rule: str) -> float:
            lat = msgs if rule == "pairwise" else (1.0 if msgs > 0 else 0.0)
            # Pairwise rounds each wait for the larger of their two blocks.
            r = pat.pairwise_bytes / p * p / (p - 1) if rule == "pairwise" and pat.pairwise_bytes and p > 1 else rb
            return lat * (m.alpha_inter if n > 1 else m.alpha_intra) + 2 * msgs * m.msg_overhead + \
                g * r * (p - g) / p * bw + r * (g - 1) / p * m.beta_intra + b * m.beta_copy
        if algorithm == "flat":
            return t + direct(alltoallv_algorithm(p))
        # MPI_Alltoall: the library picks among Bruck, pairwise and linear; the model takes the best.
        return t + min(direct("pairwise"), direct("linear"), _bruck_exchange(m, p, g, b, 2, False))
    if algorithm == "bruck":
        return t + _bruck_exchange(m, p, g, b, radix, mode == "oneshot")
    # hier family: lanes, then the node phase and hier's copies
    if algorithm == "hier":
        ex = m.alpha_inter + 2 * (n - 1) * m.msg_overhead + g * rb * (p - g) / p * bw
    elif algorithm == "hier_pairwise":
        ex = (n - 1) * (m.alpha_inter + 2 * m.msg_overhead) + g * rb * (p - g) / p * bw
    else:
        # every lane message crosses nodes; the node's g lanes share its link: g node blocks of g*b
        ex = _bruck_exchange(replace(m, beta_inter=m.beta_inter * g, beta_backbone=m.beta_backbone * g),
                             n, 1, g * b, radix, mode == "oneshot")
    if node_phase == "shm":
        rounds = 2 * math.ceil(math.log2(g))
        ex += rounds * (m.alpha_intra + 2 * m.msg_overhead) + 2 * rb * m.beta_copy
    else:
        lat, ovh = _phase(g - 1, alltoallv_algorithm(g))
        ex += lat * m.alpha_intra + ovh * m.msg_overhead + (g - 1) * n * b * m.beta_intra
        ex += (3 * p - 2 * g) * b * m.beta_copy
    return t + ex


def predict_call(model: "CostModel", algorithm: str, mode: str, nodes: int, per_node: int, pattern,
                 node_phase: str = "shm", radix: int = 2, cpu=None, numpy: bool = False) -> float:
    """Predicted seconds of a whole call: ``mode`` "oneshot" (agreement + CPU + exchange), "plan"
    (CPU + exchange, lengths known) or "bare" (the exchange alone).

    ``pattern``: a ``Pattern`` or a block size (bytes, even counts). ``cpu(key)``: hxmpi's CPU seconds
    per path ("flat", "hier_plan", ...; default: the model's fixed costs). ``numpy``: the
    ``alltoallv(array, counts)`` form (its agreement also exchanges counts).
    """
    if algorithm not in CALL_ALGORITHMS:
        raise ValueError(f"algorithm must be one of {CALL_ALGORITHMS}, got {algorithm!r}")
    if mode not in ("oneshot", "plan", "bare"):
        raise ValueError(f"mode must be 'oneshot', 'plan' or 'bare', got {mode!r}")
    if node_phase not in NODE_PHASES:
        raise ValueError(f"node_phase must be one of {tuple(NODE_PHASES)}, got {node_phase!r}")
    pat = pattern if isinstance(pattern, Pattern) else Pattern.even(nodes * per_node, pattern)
    if algorithm == "alltoall" and not pat.uniform:
        raise ValueError("alltoall needs uniform counts")
    return _predict_call(model, algorithm, mode, nodes, per_node, pat, node_phase, radix, cpu, numpy)


def choose_call(model: "CostModel", mode: str, nodes: int, per_node: int, pattern, node_phase: str = "shm",
                cpu=None, numpy: bool = False, radices=RADICES) -> tuple[str, int, float]:
    """(algorithm, radix, predicted seconds) of the fastest call the model knows for this pattern.

    Candidates: flat, hier, hier_pairwise (layouts with hier), Bruck and hier_bruck at each radix
    in ``radices`` below the communicator size, and MPI_Alltoall for uniform counts.
    """
    pat = pattern if isinstance(pattern, Pattern) else Pattern.even(nodes * per_node, pattern)
    p = nodes * per_node
    cands = [("flat", 2)] + [("bruck", k) for k in radices if k < p or k == radices[0]]
    if nodes > 1 and per_node > 1:
        cands += [("hier", 2), ("hier_pairwise", 2)]
        cands += [("hier_bruck", k) for k in radices if k < nodes or k == radices[0]]
    if pat.uniform:
        cands.append(("alltoall", 2))
    best = min((predict_call(model, a, mode, nodes, per_node, pat, node_phase, k, cpu, numpy), i)
               for i, (a, k) in enumerate(cands))
    algo, radix = cands[best[1]]
    return algo, radix, best[0]


def pattern_class(pattern: Pattern) -> tuple:
    """The pattern's class: its size, uniformity and agreed sums rounded to quarter powers of two
    (a factor of 2**0.25 = 1.19). ``auto_pick`` decides per class."""
    sums = (pattern.total_bytes, pattern.messages, pattern.sumsq_recv_kib, pattern.pairwise_bytes)
    return (pattern.size, pattern.uniform) + tuple(None if x is None else quarter_log2(x) for x in sums)


def auto_pick(model: "CostModel", mode: str, nodes: int, per_node: int, pattern: Pattern,
              node_phase: str = "shm", hier_possible: bool = True, cpu=None) -> tuple[str, int]:
    """What ``HierComm(algorithm="auto")`` runs: (one of hxmpi's algorithms, Bruck radix).

    ``choose_call`` on the representative of the pattern's class (``pattern_class``), so that one
    pick serves every call of the class; MPI_Alltoall ("alltoall") is hxmpi's flat path of an
    ``Alltoall`` call, and the hierarchical ones run flat where the layout has no hierarchy
    (``hier_possible`` False). ``mode``: "oneshot" or "plan". ``cpu``: hxmpi's CPU per path
    (``CpuTimes``; default: the model's fixed costs).
    """
    size, uniform, *sums = pattern_class(pattern)
    total, messages, recv_sq, pairwise = (None if q is None else 2.0 ** (q / 4) - 1.0 for q in sums)
    rep = Pattern(size, total, messages, recv_sq, uniform, pairwise)
    algo, radix, _ = choose_call(model, mode, nodes, per_node, rep, node_phase, cpu)
    if algo == "alltoall" or (_hierarchical(algo) and not hier_possible):
        algo = "flat"
    return algo, radix
