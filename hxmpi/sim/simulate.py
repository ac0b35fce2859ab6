"""``python -m hxmpi.sim``: replay hxmpi's exact message schedules in SimGrid (SMPI).

Evidence at a scale this machine cannot run. For every layout and block size, every rank's part
of one flat and one hier all-to-all is written as a time-independent trace and replayed with
``smpirun -replay`` (SimGrid's ``smpireplaymain``, Debian package ``libsimgrid-dev``) on a
simulated cluster. The traces come from ``hxmpi.comm.plan.rank_schedule``, the planner ``HierComm``
executes, so the simulated messages and copies are the ones hxmpi makes:

- messages: each all-to-all phase as Open MPI runs it. A blocking ``MPI_Alltoallv`` (flat, and
  hier's message-passing node phase) follows Open MPI's fixed rule (``costmodel.alltoallv_algorithm``):
  pairwise rounds (send to rank+k, receive from rank-k, wait) or linear (post every receive and
  send, then wait). Hier's lane phase is a nonblocking ``Ialltoallv``, which Open MPI runs linear.
- copies (pack, repack, copy out of the node window, unpack) and hxmpi's own CPU per call:
  ``sleep`` actions, at the model's copy bandwidth and the measured CPU per path (``--overhead``,
  default the file packaged with hxmpi: ``costmodel.CpuTimes``);
- node barriers of the shared-memory node phase: dissemination rounds of 1-byte messages.

The platform is a SimGrid cluster of N hosts of G cores: a private link per host (inter-node
latency and bandwidth, full duplex), a backbone (non-blocking unless ``--oversubscription``) or a
two-level fat tree, a loopback link per host for intra-node messages, and a per-message CPU
overhead at the sender and the receiver. The numbers come from a tuning file (``calibrate.py``'s)
or a preset (``PRESETS``), and the same numbers feed ``hxmpi.comm.costmodel``, so the report's model
columns and errors show what the model's structure misses, not a difference in parameters.
"""
from __future__ import annotations

import argparse
import importlib.resources
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from typing import Optional, Sequence

import numpy as np

from ..comm.costmodel import (
    RADICES,
    RATE_FIELDS,
    CostModel,
    CpuTimes,
    Pattern,
    alltoallv_algorithm,
    choose_call,
    predict_agreement,
    predict_call,
    settings_of,
)
from ..comm.costmodel import agreement_steps as cost_agreement_steps
from ..comm.plan import ALGORITHM, ALGORITHMS, Layout
from ..errors import CpuFileError, HxmpiError
from ..provenance import provenance
from .actions import (P2P_VERBS, PHASE_TAG, TAG_STRIDE, WAITALL_MAX, Coarse, Nic, _Tags, barrier_actions,
                      coarse_actions, coarsenable, dissemination, exchange_actions, nic_lines, phase_algorithm,
                      wait_lines)
from .reference import RefCpu, reference_actions
from .schedule import Collective, Copy, Exchange, rank_schedule
from .simgrid import SimGrid, SimGridError
from .simgrid import find as find_simgrid

__all__ = ["SimulateError", "Network", "oversubscription", "oversubscribe", "node_of_sizes", "make_counts",
           "Call", "agreement_steps", "call_steps", "CpuTimes", "phase_algorithm", "exchange_actions",
           "barrier_actions", "collective_actions", "rank_trace", "trace_stats", "platform_xml",
           "smpirun_path", "replay", "ReplayTimeout", "simulate_point", "summarize", "crossover",
           "osu_calls", "compare_measured", "block_sizes", "print_layout", "plot", "build_parser", "main",
           "simgrid", "replay_traces", "wait_lines", "WAITALL_MAX", "calibrated_preset", "SLINGSHOT_FILE",
           "PLATFORM_FIELDS", "needs_hierarchy", "has_radix", "Nic", "nic_lines", "P2P_VERBS", "PRESET_NICS",
           "Coarse", "coarsenable", "coarse_actions", "DEFAULT_MAX_REPLAY_RANKS"]


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
NETWORKS = ("backbone", "fat-tree")


class SimulateError(HxmpiError):
    """A flag, file or replay that cannot work; the CLI prints it as one ``error:`` line."""


@dataclass(frozen=True)
class Network:
    """How hosts connect: "backbone" (one shared switch) or "fat-tree" (two levels, ``leaf`` hosts per
    leaf switch). The model's ``beta_backbone`` sets the oversubscription (see ``oversubscribe``)."""
    kind: str = "backbone"
    leaf: int = 16


#: The NIC of each preset that has one (fitted with its platform, ``benchmarks/fit_slingshot.py``).
PRESET_NICS = {"slingshot": Nic.of_preset(calibrated_preset()[1])}


def oversubscription(model: CostModel) -> float:
    """R: how many times slower the backbone (or spine) is than all node links together."""
    return 1.0 + model.beta_backbone / model.beta_inter


def oversubscribe(model: CostModel, ratio: float) -> CostModel:
    """The model on a network whose backbone carries 1/ratio of all node links' bandwidth."""
    return replace(model, beta_backbone=(ratio - 1.0) * model.beta_inter)


# ---------------------------------------------------------------------------------------- counts
def node_of_sizes(sizes: Sequence[int]) -> np.ndarray:
    """Node id of every rank for consecutive nodes of the given sizes."""
    return np.repeat(np.arange(len(sizes)), sizes)


def make_counts(size: int, block: int, uneven: bool, seed: int = 0) -> np.ndarray:
    """(P, P) bytes matrix: ``block`` everywhere, or skewed Zipf-like rows with the same row sums."""
    if not uneven:
        return np.full((size, size), block, dtype=np.int64)
    rng = np.random.default_rng(seed)
    counts = np.empty((size, size), dtype=np.int64)
    for src in range(size):
        weights = 1.0 / (1 + rng.permutation(size)) ** 1.2
        row = np.floor(weights / weights.sum() * block * size).astype(np.int64)
        row[src] += block * size - row.sum()
        counts[src] = row
    return counts


# ---------------------------------------------------------------------------------------- calls
@dataclass(frozen=True)
class Call:
    """One simulated call: ``algorithm`` (``plan.ALGORITHMS``, or "alltoall": MPI_Alltoall inside hxmpi,
    uniform counts only), its ``radix``, and ``mode``: "oneshot" (hxmpi's agreement on a plan-cache
    miss, then the exchange; Bruck sends length headers), "hit" (a one-shot call the plan cache
    serves: the agreement's Allreduce, no node Allgather, lengths known), "plan" (a persistent
    request: no agreement, lengths known), "bare" (the MPI call alone, no hxmpi CPU) or
    "agreement" (the agreement's collectives alone). ``numpy``: the ``alltoallv(array, counts)`` form, whose
    agreement also exchanges the counts (one Alltoall of an int64 per peer)."""
    algorithm: str
    mode: str = "oneshot"
    radix: int = 2
    numpy: bool = False

    @property
    def hier(self) -> bool:
        """Whether its algorithm is one of hxmpi's hierarchical ones."""
        return needs_hierarchy(self.algorithm)

    @property
    def label(self) -> str:
        """Name in tables and JSON: the algorithm, with its radix for the Bruck ones."""
        return f"{self.algorithm}/{self.radix}" if has_radix(self.algorithm) else self.algorithm

    @property
    def cpu_key(self) -> str:
        """Key of ``cpu_s_per_call`` for hxmpi's own CPU time of this call."""
        base = "flat" if self.algorithm == "alltoall" else ALGORITHM[self.algorithm].cpu_key
        return base + {"plan": "_plan", "hit": "_hit"}.get(self.mode, "")


def agreement_steps(layout: Layout, call: Call) -> list:
    """The collectives a one-shot call issues before its exchange, in order (hxmpi's agreement,
    ``costmodel.agreement_steps``; the node counts on a miss only)."""
    hier = call.hier and layout.hier_possible
    return [Collective(st.kind, st.nbytes) for st in
            cost_agreement_steps(layout.size, hier, call.numpy, call.mode != "hit",
                                 hier and ALGORITHM[call.algorithm].led)]


def call_steps(layout: Layout, counts: np.ndarray, rank: int, call: Call, node_phase: str) -> list:
    """Every step of ``rank`` in one call: agreement (one-shot), then the exchange."""
    steps = agreement_steps(layout, call) if call.mode in ("oneshot", "hit", "agreement") else []
    if call.mode == "agreement":
        return steps
    if call.algorithm == "alltoall":
        block = int(counts[0, 0])
        if not (counts == block).all():
            raise SimulateError("MPI_Alltoall needs uniform counts")
        return steps + [Collective("alltoall", block)]
    return steps + rank_schedule(layout, counts, rank, call.algorithm, node_phase, call.radix,
                                 learned=call.mode != "oneshot")


# ---------------------------------------------------------------------------------------- traces
def collective_actions(rank: int, step: Collective, layout: Layout, model: CostModel, library: RefCpu = RefCpu(),
                       coarse: Optional[Coarse] = None) -> list[str]:
    """A collective's trace lines: the Allreduce as SMPI's action (recursive doubling); an
    ``MPI_Alltoall`` as Open MPI's tuned decision runs it (``reference_actions("ompi_tuned")``:
    its messages, so they pay the NIC, its copies at the model's copy bandwidth and ``library``'s
    CPU per block; ``coarse`` as ``rank_trace``'s); the node's Allgather as Bruck dissemination
    rounds (the replay has collectives on the world only)."""
    if step.kind == "allreduce":
        return [f"{rank} allreduce {step.nbytes} 0"]
    if step.kind == "alltoall":
        return reference_actions("ompi_tuned", layout, step.nbytes, rank, model, library, coarse)
    return dissemination(rank, layout, "agree", lambda d, g: min(d, g - d) * step.nbytes)



def rank_trace(layout: Layout, counts: np.ndarray, rank: int, algorithm, node_phase: str,
               model: CostModel, cpu: Optional[CpuTimes] = None, coarse: Optional[Coarse] = None) -> list[str]:
    """Time-independent trace of ``rank`` for one call: hxmpi's CPU, agreement, copies, messages.

    ``algorithm``: a ``Call``, or a name (a one-shot call of it). ``cpu``: measured CPU per path
    (default: the model's fixed costs). ``coarse``: replay linear world phases coarsely
    (``coarse_actions``; the faster replay of large worlds). ``MPI_Alltoall`` (the "alltoall" call,
    the numpy form's counts) runs as Open MPI's tuned decision, with the MPI library's CPU per
    block (the model's ``mpi_ddt_block``) but in a "bare" call: the CPU-free lower bound.
    """
    call = algorithm if isinstance(algorithm, Call) else Call(algorithm)
    cpu = cpu or CpuTimes.fixed(model)
    steps = call_steps(layout, counts, rank, call, node_phase)
    lines = [f"{rank} init"]
    fixed = cpu(call.cpu_key) if call.mode in ("oneshot", "hit", "plan") else 0.0
    library = RefCpu() if call.mode == "bare" else RefCpu(ddt_block=model.mpi_ddt_block)
    tags = _Tags()
    copy_bytes = 0

    def flush(copy_bytes: int) -> None:
        if copy_bytes:
            lines.append(f"{rank} sleep {copy_bytes * model.beta_copy:.12g}")

    if fixed > 0:
        lines.append(f"{rank} sleep {fixed:.12g}")
    for step in steps:
        if isinstance(step, Copy):
            copy_bytes += step.nbytes  # consecutive copies are one sleep
            continue
        flush(copy_bytes)
        copy_bytes = 0
        if isinstance(step, Exchange):
            lines += coarse_actions(rank, step, layout, counts, coarse, tags) \
                if coarse and coarsenable(step, layout, rank) else exchange_actions(rank, step, layout, tags)
        elif isinstance(step, Collective):
            lines += collective_actions(rank, step, layout, model, library, coarse)
        else:
            lines += barrier_actions(rank, layout)
    flush(copy_bytes)
    lines.append(f"{rank} finalize")
    return lines


def trace_stats(lines: Sequence[str]) -> dict:
    """Messages and bytes a trace sends, per phase ("flat", "lane", "node", "barrier", "round", "agree";
    "library": the MPI library's own, those of an ``MPI_Alltoall``)."""
    names = {v: k for k, v in PHASE_TAG.items()}
    stats: dict[str, dict] = {}
    for ln in lines:
        parts = ln.split()
        if parts[1] == "isend":
            phase = names.get(int(parts[3]) // TAG_STRIDE, "library")
            entry = stats.setdefault(phase, {"messages": 0, "bytes": 0})
            entry["messages"] += 1
            entry["bytes"] += int(parts[4])
    return stats


# -------------------------------------------------------------------------------------- platform
def platform_xml(layout: Layout, model: CostModel, network: Network, nic: Optional[Nic] = None) -> str:
    """SimGrid cluster: one host per node, a private full-duplex link (the NIC's bandwidth with a
    ``nic``), backbone or fat tree, loopback."""
    n, g = layout.num_nodes, layout.max_node_size
    bw_inter, bw_intra = (nic.bandwidth if nic else 1 / model.beta_inter), 1 / model.beta_intra
    attrs = dict(id="cluster", prefix="node-", suffix="", radical=f"0-{n - 1}", speed="1Gf", core=str(g),
                 bw=f"{bw_inter:.6g}Bps", loopback_bw=f"{bw_intra:.6g}Bps",
                 loopback_lat=f"{model.alpha_intra:.6g}s", sharing_policy="SPLITDUPLEX")
    if network.kind == "backbone":
        # Host -> backbone -> host crosses two private links: each carries half the latency.
        attrs.update(lat=f"{model.alpha_inter / 2:.6g}s", bb_lat="0s",
                     bb_bw=f"{n * bw_inter / oversubscription(model):.6g}Bps")
    else:
        leaf = min(network.leaf, n)
        if n % leaf:
            raise SimulateError(f"fat-tree: {n} nodes do not fill leaf switches of {leaf} hosts")
        up = max(1, round(leaf / oversubscription(model)))
        # Host -> leaf -> spine -> leaf -> host crosses four links: each carries a quarter.
        attrs.update(lat=f"{model.alpha_inter / 4:.6g}s", topology="FAT_TREE",
                     topo_parameters=f"2;{leaf},{n // leaf};1,{up};1,1")
    attr_text = " ".join(f'{k}="{v}"' for k, v in attrs.items())
    return ("<?xml version='1.0'?>\n<!DOCTYPE platform SYSTEM \"https://simgrid.org/simgrid.dtd\">\n"
            f"<platform version=\"4.1\">\n  <cluster {attr_text}/>\n</platform>\n")


def simgrid(smpirun: Optional[str] = None) -> SimGrid:
    """The SimGrid replays use (``hxmpi.sim.simgrid.find``: ``smpirun``, env HXMPI_SMPIRUN, the
    source build in the cache prefix, else PATH's), or SimulateError saying what to install."""
    try:
        return find_simgrid(smpirun)
    except SimGridError as exc:
        raise SimulateError(str(exc)) from None


def smpirun_path(smpirun: Optional[str] = None) -> str:
    """Path of the smpirun replays use (``simgrid``), or SimulateError saying what to install."""
    return simgrid(smpirun).smpirun


_TIME = re.compile(r"^\[(\d+\.\d+)\] Simulation time")


def replay(layout: Layout, counts: np.ndarray, algorithm, node_phase: str, model: CostModel,
           network: Network, workdir: str, timeout: Optional[float] = None,
           cpu: Optional[CpuTimes] = None, sg: Optional[SimGrid] = None, nic: Optional[Nic] = None,
           coarse: bool = False) -> float:
    """Simulated seconds of one call (a ``Call`` or an algorithm name: one-shot): write every
    rank's trace, run smpirun (``sg``, default ``simgrid()``), read the end time. ``nic``: the
    platform's NIC; ``coarse``: linear world phases replayed coarsely (``coarse_actions``)."""
    how = Coarse.of(model, nic) if coarse else None
    traces = (rank_trace(layout, counts, rank, algorithm, node_phase, model, cpu, how) for rank in range(layout.size))
    return replay_traces(layout, traces, model, network, workdir, timeout, sg,
                         getattr(algorithm, "label", algorithm), nic)


def replay_traces(layout: Layout, traces, model: CostModel, network: Network, workdir: str,
                  timeout: Optional[float] = None, sg: Optional[SimGrid] = None, what: str = "a call",
                  nic: Optional[Nic] = None) -> float:
    """Simulated seconds of every rank's trace (an iterable of line lists, rank order) on the
    platform of ``model``, ``network`` and ``nic`` (``nic_lines``); ``what`` names the replay in a
    timeout's message."""
    smpirun = (sg or simgrid()).smpirun
    os.makedirs(workdir, exist_ok=True)
    names = []
    for rank, lines in enumerate(traces):
        name = os.path.join(workdir, f"rank{rank}.txt")
        with open(name, "w") as fh:
            fh.write("\n".join(nic_lines(lines, layout, nic)) + "\n")
        names.append(name)
    files = {"traces.txt": "\n".join(names) + "\n",
             "hosts.txt": "".join(f"node-{i}:{g}\n" for i, g in enumerate(layout.node_sizes)),
             "platform.xml": platform_xml(layout, model, network, nic)}
    for fname, text in files.items():
        with open(os.path.join(workdir, fname), "w") as fh:
            fh.write(text)
    o_send, o_recv = (nic or Nic(1.0, 1.0)).overheads(model.msg_overhead)
    cmd = [smpirun, "-np", str(layout.size), "-platform", "platform.xml", "-hostfile", "hosts.txt",
           "-replay", "traces.txt", "-no-privatize",  # privatization crashes the replay here (3.32)
           "--cfg=smpi/host-speed:1Gf",
           # Plain latency and bandwidth: no piecewise correction factors, no TCP ack cross-traffic.
           "--cfg=smpi/bw-factor:0:1", "--cfg=smpi/lat-factor:0:1", "--cfg=network/crosstraffic:0",
           f"--cfg=smpi/ois:0:{o_send:.6g}:0", f"--cfg=smpi/os:0:{o_send:.6g}:0", f"--cfg=smpi/or:0:{o_recv:.6g}:0",
           "--cfg=network/optim:Full",  # same results, 1.5x faster than Lazy on large linear phases
           # Collectives as Open MPI picks them, but the agreement's Allreduce by recursive doubling:
           # the ompi selector's allreduce crashes the 3.32 replay at 256+ ranks (munmap_chunk).
           "--cfg=smpi/coll-selector:ompi", "--cfg=smpi/allreduce:rdb",
           "--log=root.fmt:[%.9r]%e%m%n", "--log=xbt_cfg.thres:warning"]
    # A session of its own: on a timeout the whole group goes (smpirun is a script; killing it
    # alone would leave smpimain running).
    proc = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        proc = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise ReplayTimeout(f"replay of {what} on {layout.size} ranks took over {timeout:g} s") from None
    for line in (proc.stdout + proc.stderr).splitlines():
        m = _TIME.match(line)
        if m and proc.returncode == 0:
            return float(m.group(1))
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    raise SimulateError(f"smpirun failed (exit {proc.returncode}): {' | '.join(tail)}")


# ------------------------------------------------------------------------------------ experiment
#: Replays above this many ranks are skipped (the point is given by the model, marked so).
DEFAULT_MAX_REPLAY_RANKS = 1024


#: The replayed fields of a record (``<name>_sim_s``), in replay order; ``--only`` picks among them.
REPLAYED = ("bare_alltoallv", "bare_alltoall",
            *(f for a in ALGORITHMS for f in ((a,) if a == "flat" else (a, f"{a}_plan"))),
            "auto", "auto_plan", "agreement")


def needs_hierarchy(algorithm: str) -> bool:
    """Whether an algorithm of hxmpi's works through nodes (and runs flat where the layout has none);
    False for a bare MPI call's name ("alltoall")."""
    return algorithm in ALGORITHM and ALGORITHM[algorithm].hierarchical


def has_radix(algorithm: str) -> bool:
    """Whether an algorithm takes a setting: the Bruck radix, or multi-leader's leaders per node
    (the simulator picks it by the model, per point)."""
    return algorithm in ALGORITHM and (ALGORITHM[algorithm].radixed or ALGORITHM[algorithm].led)


class ReplayTimeout(SimulateError):
    """A replay that did not finish within ``--timeout``."""


def _replayer(layout, counts, node_phase, model, network, base, timeout, cpu, rec: dict, sg: SimGrid,
              nic: Optional[Nic] = None, coarse: bool = False):
    """Replay each distinct Call once (cached); wall seconds go to ``rec["replay_s"]``, and a replay
    that times out gives None and is named in ``rec["timed_out"]`` (the sweep goes on)."""
    done: dict = {}

    def run(call: Call) -> Optional[float]:
        key = (call.label, call.mode, call.numpy)
        if key not in done:
            t0 = time.perf_counter()
            name = f"{call.label} {call.mode}"
            try:
                done[key] = replay(layout, counts, call, node_phase, model, network,
                                   os.path.join(base, f"{call.label.replace('/', '-')}-{call.mode}"), timeout, cpu,
                                   sg, nic, coarse)
            except ReplayTimeout:
                done[key] = None
                rec["timed_out"].append(name)
            rec["replay_s"][name] = round(time.perf_counter() - t0, 3)
        return done[key]
    return run


def simulate_point(sizes: Sequence[int], block: int, model: CostModel, network: Network,
                   node_phase: str = "shm", uneven: bool = False, workdir: Optional[str] = None,
                   timeout: Optional[float] = None, cpu: Optional[CpuTimes] = None, numpy: bool = False,
                   max_replay_ranks: int = DEFAULT_MAX_REPLAY_RANKS, only: Optional[Sequence[str]] = None,
                   sg: Optional[SimGrid] = None, nic: Optional[Nic] = None, coarse: bool = False) -> dict:
    """One JSON record: whole calls replayed (one-shot and plan), the bare MPI baselines, the model.

    One-shot calls pay the agreement (``agreement_steps``) and hxmpi's CPU per call (``cpu``);
    plans pay their CPU only. ``*_sim_s`` of hier variants are None where the layout is
    degenerate (hxmpi runs flat there); ``bare_alltoall_sim_s`` is None for uneven counts. Worlds
    above ``max_replay_ranks`` are not replayed: every ``*_sim_s`` is None and ``by_model`` is true.
    ``only``: replay just these fields (``REPLAYED`` names, e.g. "auto"); the others stay None and
    are listed in ``not_run``. ``sg``: the SimGrid to replay with (default ``simgrid()``), named in
    the record's ``simgrid``. ``nic``: the platform's NIC (``Nic``); ``coarse``: replay linear
    world phases coarsely (``coarse_actions``), recorded in the record's ``coarse``.
    """
    layout = Layout(node_of_sizes(sizes))
    counts = make_counts(layout.size, block, uneven)
    pattern = Pattern.from_counts(counts)
    n, g, p = layout.num_nodes, layout.max_node_size, layout.size
    cpu = cpu or CpuTimes.fixed(model)
    hier_ok = layout.hier_possible
    sizes = layout.node_sizes  # the model prices the layout itself, as HierComm's auto does
    pick = lambda mode: choose_call(model, mode, n, g, pattern, node_phase, cpu, numpy, sizes=sizes)  # noqa: E731
    auto, auto_plan = pick("oneshot"), pick("plan")
    tried = lambda a: settings_of(a, layout.node_sizes) if ALGORITHM[a].led else RADICES  # noqa: E731
    radix = {a: min(tried(a), key=lambda k: predict_call(model, a, "plan", n, g, pattern, node_phase, k, cpu,
                                                        sizes=sizes))
             if has_radix(a) else 2 for a in ALGORITHMS}
    model_s = lambda algo, mode, k=2: predict_call(model, algo, mode, n, g, pattern, node_phase, k, cpu, numpy,  # noqa: E731
                                                   sizes)
    usable = [a for a in ALGORITHMS if (hier_ok or not needs_hierarchy(a))
              and not (ALGORITHM[a].led and node_phase != "shm")]
    rec = {"nodes": n, "ranks_per_node": g, "node_sizes": list(layout.node_sizes), "block_bytes": block,
           "uneven": uneven, "by_model": p > max_replay_ranks,
           **{f"{a}_radix": radix[a] for a in ALGORITHMS if has_radix(a)},
           "auto_pick": Call(auto[0], radix=auto[1]).label, "auto_plan_pick": Call(auto_plan[0], radix=auto_plan[1]).label,
           "model_auto_s": auto[2], "model_auto_plan_s": auto_plan[2],
           "model_bare_alltoallv_s": model_s("flat", "bare"),
           "model_bare_alltoall_s": model_s("alltoall", "bare") if pattern.uniform else None,
           "model_agreement_s": predict_agreement(model, n, g, Call(auto[0]).hier, numpy)}
    for a in ALGORITHMS:
        rec[f"model_{a}_s"] = model_s(a, "oneshot", radix[a]) if a in usable else None
        if a != "flat":
            rec[f"model_{a}_plan_s"] = model_s(a, "plan", radix[a]) if a in usable else None
    rec.update({"model_pick": auto[0], "flat_schedule": alltoallv_algorithm(p), "numpy_call": numpy})
    rec.update({f"{k}_sim_s": None for k in REPLAYED})
    rec["replay_s"], rec["timed_out"], rec["not_run"] = {}, [], []
    rec["simgrid"] = None
    rec["coarse"], rec["nic"] = coarse, None if nic is None else dict(nic.__dict__)
    if rec["by_model"]:
        return rec
    sg = sg or simgrid()
    rec["simgrid"] = sg.version
    tmp = tempfile.TemporaryDirectory(prefix="hxmpi-sim-") if workdir is None else None
    base = tmp.name if tmp else workdir
    replayer = _replayer(layout, counts, node_phase, model, network, base, timeout, cpu, rec, sg, nic, coarse)
    rec["not_run"] = [k for k in REPLAYED if only is not None and k not in only]

    def run(call: Call, field: str) -> Optional[float]:
        return None if field in rec["not_run"] else replayer(call)
    try:
        rec["bare_alltoallv_sim_s"] = run(Call("flat", "bare"), "bare_alltoallv")
        if pattern.uniform:
            rec["bare_alltoall_sim_s"] = run(Call("alltoall", "bare"), "bare_alltoall")
        # flat's exchange timed out bare: flat calls (the same exchange and more) are not repeated
        slow = "flat bare" in rec["timed_out"]
        for a in usable:
            if a == "flat" and slow:
                rec["timed_out"].append("flat oneshot (not run: its exchange timed out bare)")
                continue
            rec[f"{a}_sim_s"] = run(Call(a, radix=radix[a], numpy=numpy), a)
            if a != "flat":
                rec[f"{a}_plan_sim_s"] = run(Call(a, "plan", radix[a]), f"{a}_plan")
        if not (slow and auto[0] == "flat"):
            rec["auto_sim_s"] = run(Call(auto[0], radix=auto[1], numpy=numpy), "auto")
        if not (slow and auto_plan[0] == "flat"):
            rec["auto_plan_sim_s"] = run(Call(auto_plan[0], "plan", auto_plan[1]), "auto_plan")
        rec["agreement_sim_s"] = run(Call(auto[0], "agreement", auto[1], numpy), "agreement")
    finally:
        if tmp:
            tmp.cleanup()
    flat, hier = rec["flat_sim_s"], rec["hier_sim_s"]
    rec["sim_pick"] = None if flat is None and hier is None else \
        ("flat" if hier is None or (flat is not None and flat <= hier) else "hier")
    bare = [v for v in (rec["bare_alltoallv_sim_s"], rec["bare_alltoall_sim_s"]) if v is not None]
    rec["best_bare_sim_s"] = min(bare) if bare else None
    sims = {k: rec[f"{k}_sim_s"] for k in ALGORITHMS}
    rec["sim_best"] = min(((v, k) for k, v in sims.items() if v is not None), default=(None, None))[1]
    return rec


def _ratio(a, b):
    return a / b if a is not None and b else None


def summarize(records: list[dict]) -> dict:
    """Model error against the simulation per algorithm (whole calls), right picks, and the targets."""
    out = {}
    pairs = {k: (f"model_{k}_s", f"{k}_sim_s") for k in REPLAYED if k != "agreement"}
    for algo, (km, ks) in pairs.items():
        errs = [abs(r[km] - r[ks]) / r[ks] for r in records if r.get(ks) is not None and r.get(km) is not None]
        out[algo] = {"mean_rel_error": float(np.mean(errs)) if errs else None,
                     "max_rel_error": float(np.max(errs)) if errs else None, "points": len(errs)}
    sim = [r for r in records if None not in (r.get("auto_sim_s"), r.get("auto_plan_sim_s"), r.get("agreement_sim_s"),
                                                r.get("best_bare_sim_s"))]
    # Right pick: the model's one-shot pick is within 5% of the fastest replayed hxmpi algorithm.
    best = lambda r: min(r[f"{k}_sim_s"] for k in ALGORITHMS if r.get(f"{k}_sim_s") is not None)  # noqa: E731
    out["auto_right"] = sum(r["auto_sim_s"] <= 1.05 * best(r) for r in sim)
    out["auto_points"] = len(sim)
    out["plan_vs_best_bare_max"] = max((r["auto_plan_sim_s"] / r["best_bare_sim_s"] for r in sim), default=None)
    out["oneshot_minus_agreement_vs_best_bare_max"] = max(
        ((r["auto_sim_s"] - r["agreement_sim_s"]) / r["best_bare_sim_s"] for r in sim), default=None)
    return out


def crossover(records: list[dict], key_flat: str = "flat_sim_s", key_hier: str = "hier_sim_s") -> Optional[float]:
    """Block size (B) where hier stops beating flat, interpolated in log-log between sweep points.

    None if hier wins at every simulated size, 0 if it never wins.
    """
    rows = sorted((r for r in records if r[key_hier] is not None), key=lambda r: r["block_bytes"])
    if not rows:
        return 0.0
    ratios = [math.log(r[key_hier] / r[key_flat]) for r in rows]  # < 0 where hier wins
    if ratios[0] >= 0:
        return 0.0
    for (r0, q0), (r1, q1) in zip(zip(rows, ratios), zip(rows[1:], ratios[1:])):
        if q1 >= 0:
            x0, x1 = math.log(r0["block_bytes"]), math.log(r1["block_bytes"])
            return math.exp(x0 + (x1 - x0) * q0 / (q0 - q1))
    return None


def osu_calls(report: dict) -> dict:
    """Column of an ``osu_alltoallv.py --json`` report -> the Call it measured: "bare" (MPI_Alltoallv),
    A (one-shot, same specs every call: plan-cache hits), "A-new" (a new pattern every call: misses),
    "A-plan" (persistent requests), for the algorithms A the report has; "auto" and "naive" are left out."""
    radix = int(report.get("radix", 2))
    calls = {}
    for col, v in report["results"][0].items():
        if not (isinstance(v, dict) and "avg_us" in v):
            continue
        algo, _, kind = col.rpartition("-") if "-" in col else (col, "", "hit")
        if col == "bare":
            calls[col] = Call("flat", "bare")
        elif algo in ALGORITHMS:
            calls[col] = Call(algo, {"hit": "hit", "new": "oneshot", "plan": "plan"}[kind], radix)
    return calls


def compare_measured(report: dict, model: CostModel, network: Network, node_phase: str,
                     cpu: Optional[CpuTimes] = None, sg: Optional[SimGrid] = None) -> list[dict]:
    """Simulate the layout and block sizes of a measured report; rows with both times.

    ``report``: a ``calibrate.py --json`` report (its flat and hier rows, one-shot calls, with its
    fitted fixed costs), or an ``osu_alltoallv.py --json`` report (every column ``osu_calls`` maps,
    with ``cpu``: hxmpi's CPU per path)."""
    if report.get("benchmark") == "osu_alltoallv":
        layout = Layout(node_of_sizes(report["node_sizes"]))
        todo = [(col, call, r["size"], r[col]["avg_us"]) for r in report["results"]
                for col, call in osu_calls(report).items()]
    else:
        layout = Layout(node_of_sizes(report["layout"]["node_sizes"]))
        todo = [(r["algorithm"], Call(r["algorithm"]), r["block"], r["measured_us"]) for r in report["rows"]]
    rows = []
    for col, call, block, measured_us in todo:
        with tempfile.TemporaryDirectory(prefix="hxmpi-sim-") as tmp:
            sim = replay(layout, make_counts(layout.size, block, False), call, node_phase, model, network, tmp,
                         cpu=cpu, sg=sg)
        rows.append({"algorithm": col, "block_bytes": block, "measured_s": measured_us * 1e-6,
                     "sim_s": sim, "rel_error": abs(sim - measured_us * 1e-6) / (measured_us * 1e-6)})
    return rows


# ------------------------------------------------------------------------------------------- CLI
def _int_list(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SimulateError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise SimulateError(f"{what} must be positive integers, got {text!r}")
    return values


def block_sizes(text: str, factor: int) -> list[int]:
    """Block sizes MIN, MIN*factor, ... <= MAX from "MIN:MAX" (bytes)."""
    lo, _, hi = text.partition(":")
    try:
        lo_i, hi_i = int(lo), int(hi or lo)
    except ValueError:
        raise SimulateError(f"-m must be MIN:MAX bytes, got {text!r}") from None
    if lo_i < 1 or hi_i < lo_i:
        raise SimulateError(f"-m {text}: the size range is empty (need 1 <= MIN <= MAX)")
    if factor < 2:
        raise SimulateError(f"--factor must be at least 2, got {factor}")
    sizes, b = [], lo_i
    while b <= hi_i:
        sizes.append(b)
        b *= factor
    return sizes


def _layouts(args) -> list[list[int]]:
    layouts = [[g] * n for n in _int_list(args.nodes, "--nodes")
               for g in _int_list(args.ranks_per_node, "--ranks-per-node")] if args.nodes else []
    for text in args.shape or []:
        n, x, g = text.lower().partition("x")
        if not x:
            raise SimulateError(f"--shape must be NODESxRANKS, e.g. 128x8, got {text!r}")
        n_i, g_i = _int_list(n, "--shape")[0], _int_list(g, "--shape")[0]
        layouts.append([g_i] * n_i)
    for text in args.layout or []:
        layouts.append(_int_list(text.replace("+", ","), "--layout"))
    if not layouts:
        raise SimulateError("give --nodes and --ranks-per-node, --shape or --layout")
    return layouts


def _model(args) -> tuple[CostModel, str]:
    if args.tuning:
        try:
            return CostModel.load(args.tuning), f"tuning {args.tuning}"
        except (OSError, ValueError) as exc:
            raise SimulateError(f"--tuning {args.tuning}: {exc}") from None
    if args.preset not in PRESETS:
        raise SimulateError(f"unknown preset {args.preset!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[args.preset], f"preset {args.preset}"


def _us(x: Optional[float], width: int = 12) -> str:
    return f"{x * 1e6:{width}.1f}" if x is not None else f"{'-':>{width}}"


def print_layout(records: list[dict], out=sys.stdout) -> None:
    """OSU-style table of one layout's records (microseconds): one-shot calls, plans, baselines."""
    r0 = records[0]
    p = sum(r0["node_sizes"])
    shape = "+".join(map(str, r0["node_sizes"])) if len(set(r0["node_sizes"])) > 1 \
        else f"{r0['nodes']} x {r0['ranks_per_node']}"
    how = "BY THE MODEL (not replayed)" if r0["by_model"] else "replayed"
    print(f"# nodes {shape} ({p} ranks), {how}; bare MPI_Alltoallv as Open MPI's {r0['flat_schedule']}, "
          "MPI_Alltoall as Open MPI's tuned decision", file=out)
    cols = (("bare a2av", "bare_alltoallv"), ("bare a2a", "bare_alltoall"), ("agree", "agreement"),
            *((a, a) for a in ALGORITHMS), ("auto", "auto"),
            *((f"{a} plan", f"{a}_plan") for a in ALGORITHMS if a != "flat"), ("auto plan", "auto_plan"))
    widths = [max(12, len(c) + 2) for c, _ in cols]
    print(f"{'# Block [B]':<12}" + "".join(f"{c:>{w}}" for (c, _), w in zip(cols, widths))
          + f"{'auto pick':>14}{'plan pick':>14}  [us]", file=out)
    for r in records:
        if r["by_model"]:
            vals = [r.get(f"model_{k}_s") for _, k in cols]
        else:
            vals = [r.get(f"{k}_sim_s") for _, k in cols]
        print(f"{r['block_bytes']:<12d}" + "".join(_us(v, w) for v, w in zip(vals, widths)) +
              f"{r['auto_pick']:>14}{r['auto_plan_pick']:>14}", file=out)
    sim = [r for r in records if not r["by_model"] and None not in (r["auto_sim_s"], r["auto_plan_sim_s"],
                                                                      r["agreement_sim_s"], r["best_bare_sim_s"])]
    for r in records:
        if r["timed_out"]:
            print(f"# {r['block_bytes']} B: replay over --timeout (shown -): {', '.join(r['timed_out'])}", file=out)
        if r.get("not_run"):
            print(f"# {r['block_bytes']} B: not replayed (--only; shown -): {', '.join(r['not_run'])}", file=out)
    if sim:
        worst = max(r["auto_plan_sim_s"] / r["best_bare_sim_s"] for r in sim)
        worst1 = max((r["auto_sim_s"] - r["agreement_sim_s"]) / r["best_bare_sim_s"] for r in sim)
        print(f"# worst auto / best bare MPI: plan {worst:.2f}, one-shot minus agreement {worst1:.2f}", file=out)


def plot(records: list[dict], path: str, title: str) -> None:
    """auto / best bare MPI per layout vs block size: plans (solid), one-shot calls (dashed); model
    points (not replayed) use the model on both sides."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault(tuple(r["node_sizes"]), []).append(r)
    for sizes, rows in groups.items():
        label = f"{len(sizes)}x{max(sizes)}" if len(set(sizes)) == 1 else "+".join(map(str, sizes))
        pts = []
        for r in rows:
            if r["by_model"]:
                bare = min(v for v in (r["model_bare_alltoallv_s"], r["model_bare_alltoall_s"]) if v is not None)
                pts.append((r["block_bytes"], r["model_auto_plan_s"] / bare, r["model_auto_s"] / bare))
            elif r["best_bare_sim_s"] and r["auto_plan_sim_s"] and r["auto_sim_s"]:
                pts.append((r["block_bytes"], r["auto_plan_sim_s"] / r["best_bare_sim_s"],
                            r["auto_sim_s"] / r["best_bare_sim_s"]))
        if not pts:
            continue
        xs, plan, one = zip(*pts)
        label += " (model)" if rows[0]["by_model"] else ""
        line, = ax.plot(xs, plan, marker="o", label=label)
        ax.plot(xs, one, ls="--", marker=".", color=line.get_color())
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(1.1, color="r", lw=0.6, ls=":")
    ax.set(yscale="log", xlabel="block size [B]", ylabel="auto / best bare MPI",
           title=title + "\nsolid: plan, dashed: one-shot (with agreement); red: 1.1")
    ax.set_xscale("log", base=2)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def build_parser() -> argparse.ArgumentParser:
    """The flags of ``python -m hxmpi.sim`` (docs/tools.md, Simulator, lists them)."""
    p = argparse.ArgumentParser(prog="python -m hxmpi.sim", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Presets: " + "; ".join(
                                    f"{k}: inter {m.alpha_inter * 1e6:g} us / {1 / m.beta_inter / 1e9:g} GB/s, "
                                    f"intra {m.alpha_intra * 1e6:g} us / {1 / m.beta_intra / 1e9:g} GB/s, "
                                    f"{m.msg_overhead * 1e6:g} us per message" for k, m in PRESETS.items()))
    p.add_argument("--nodes", help="node counts, comma-separated (e.g. 8,64)")
    p.add_argument("--ranks-per-node", default="8", help="ranks per node, comma-separated (default 8); "
                   "every pair with --nodes is one layout")
    p.add_argument("--shape", action="append", help="one layout of N nodes of G ranks, as NxG, e.g. 128x8 "
                   "(repeatable; beside the pairs of --nodes and --ranks-per-node)")
    p.add_argument("--layout", action="append", help="an irregular layout as node sizes, e.g. 2+2+1 (repeatable)")
    p.add_argument("-m", "--message-size", default="8:1048576", help="MIN:MAX block bytes (default 8:1048576)")
    p.add_argument("--factor", type=int, default=2, help="step between block sizes (default 2: powers of two)")
    p.add_argument("--uneven", action="store_true", help="skewed Zipf-like counts per destination, same mean")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--tuning", help="platform and model from a calibration file (benchmarks/calibrate.py --out)")
    src.add_argument("--preset", default="hdr", help=f"named platform: {', '.join(PRESETS)} (default hdr)")
    p.add_argument("--node-phase", choices=("shm", "mpi"), default="shm",
                   help="hier's node phase: shared-memory window (default) or message passing")
    p.add_argument("--network", choices=NETWORKS, default="backbone", help="backbone (default) or fat-tree")
    p.add_argument("--oversubscription", type=float, default=None,
                   help="the backbone (or spine) carries 1/R of all node links' bandwidth (default: the "
                   "model's beta_backbone; 1 = non-blocking); the model gets the matching beta_backbone")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per replay (default 1800)")
    p.add_argument("--overhead", metavar="FILE",
                   help="bench_overhead.py --json output: hxmpi's CPU seconds per call by path (key "
                   "cpu_s_per_call, every path; default: the file packaged with hxmpi, hxmpi/comm/overhead.json); "
                   "a missing or malformed file is an error")
    p.add_argument("--numpy-call", action="store_true",
                   help="simulate the alltoallv(array, counts) form: its agreement also exchanges the counts")
    p.add_argument("--max-replay-ranks", type=int, default=DEFAULT_MAX_REPLAY_RANKS,
                   help=f"larger worlds are given by the model only, marked so (default {DEFAULT_MAX_REPLAY_RANKS})")
    p.add_argument("--no-nic", action="store_true", help="replay without the preset's NIC (its message rate and "
                   "bandwidth per node; presets with one: " + ", ".join(k for k, v in PRESET_NICS.items() if v) + ")")
    p.add_argument("--coarse", action="store_true", help="replay linear world phases coarsely: one message per "
                   "node pair and local rank, their CPU and NIC costs kept (much faster at 1024 ranks)")
    p.add_argument("--only", help="replay only these fields of each record, comma-separated, of: "
                   f"{', '.join(REPLAYED)} (default: all); the others are null and listed in not_run")
    p.add_argument("--compare", help="a calibrate.py --json report: simulate its layout and sizes with its "
                   "model and print simulated vs measured (the layout flags are then not needed); or an "
                   "osu_alltoallv.py --json report: every hxmpi column (one-shot hits, -new misses, -plan) and "
                   "bare, on --tuning's platform with --overhead's CPU per path")
    p.add_argument("--smpirun", help="the SimGrid smpirun to replay with (default: env HXMPI_SMPIRUN, else the "
                   "source build of python -m hxmpi.sim.simgrid build, else smpirun on PATH)")
    p.add_argument("--json", help="write the records (and the summary) here")
    p.add_argument("--plot", help="write a PNG of auto / best bare MPI per layout here (needs matplotlib)")
    return p


def main(argv=None) -> int:
    """``python -m hxmpi.sim``: replay the sweep (or ``--compare`` a report); returns the exit code."""
    args = build_parser().parse_args(argv)
    if args.compare:
        return _main_compare(args, argv)
    try:
        layouts = _layouts(args)
        sizes = block_sizes(args.message_size, args.factor)
        only = None
        if args.only is not None:
            only = [k.strip() for k in args.only.split(",") if k.strip()]
            bad = sorted(set(only) - set(REPLAYED))
            if bad or not only:
                raise SimulateError(f"--only: unknown field(s) {bad or args.only!r}; choose from {', '.join(REPLAYED)}")
        model, source = _model(args)
        cpu = _cpu(args)
        if args.oversubscription is not None:
            if args.oversubscription < 1:
                raise SimulateError(f"--oversubscription must be >= 1, got {args.oversubscription:g}")
            model = oversubscribe(model, args.oversubscription)
        network = Network(args.network)
        nic = None if args.tuning or args.no_nic else PRESET_NICS.get(args.preset)
        sg = simgrid(args.smpirun)
        if args.plot:
            try:
                import matplotlib  # noqa: F401  (checked before hours of replay, not after)
            except ImportError:
                raise SimulateError("--plot needs matplotlib: pip install -e '.[bench]'") from None
        records = []
        print(f"# hxmpi.sim: {sg.label} SMPI replay ({sg.smpirun}), {source}, {args.network} network, "
              f"node phase {args.node_phase}{', uneven counts' if args.uneven else ''}"
              f"{', NIC ' + format(nic.msg_rate / 1e6, '.4g') + ' M msg/s per node' if nic else ''}"
              f"{', coarse linear phases' if args.coarse else ''}", flush=True)
        for lay in layouts:
            rows = [simulate_point(lay, b, model, network, args.node_phase, args.uneven, timeout=args.timeout,
                                   cpu=cpu, numpy=args.numpy_call, max_replay_ranks=args.max_replay_ranks,
                                   only=only, sg=sg, nic=nic, coarse=args.coarse)
                    for b in sizes]
            print_layout(rows)
            sys.stdout.flush()
            records += rows
    except SimulateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    summary = summarize(records)
    for algo, s in summary.items():
        if isinstance(s, dict) and s["points"]:
            print(f"# model vs simulation, {algo}: mean error {s['mean_rel_error']:.1%}, "
                  f"max {s['max_rel_error']:.1%} over {s['points']} points")
    print(f"# model's pick within 5% of the fastest replayed algorithm at {summary['auto_right']}/"
          f"{summary['auto_points']} points")
    if summary["plan_vs_best_bare_max"] is not None:
        print(f"# worst auto / best bare MPI over the sweep: plan {summary['plan_vs_best_bare_max']:.2f}, "
              f"one-shot minus agreement {summary['oneshot_minus_agreement_vs_best_bare_max']:.2f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"benchmark": "simulate", "provenance": provenance(_command(argv), sg.label),
                       "simgrid": sg.version, "source": source, "network": args.network,
                       "oversubscription": oversubscription(model), "node_phase": args.node_phase,
                       "uneven": args.uneven, "model": model.__dict__, "summary": summary,
                       "nic": None if nic is None else nic.__dict__, "coarse": args.coarse,
                       "overhead": cpu.source, "cpu_s_per_call": dict(cpu.seconds),
                       "records": records}, fh, indent=1)
    if args.plot:
        plot(records, args.plot, f"SimGrid replay, {source}, node phase {args.node_phase}")
    return 0


def _command(argv) -> str:
    """The command line a result records: ``python -m hxmpi.sim`` and its arguments."""
    return shlex.join(["python", "-m", "hxmpi.sim", *(sys.argv[1:] if argv is None else argv)])


def _cpu(args) -> CpuTimes:
    """--overhead's CPU per path, or the packaged file's; SimulateError naming a bad file."""
    try:
        return CpuTimes.load(args.overhead)
    except CpuFileError as exc:
        raise SimulateError(f"--overhead: {exc}") from None


def _main_compare(args, argv=None) -> int:
    try:
        with open(args.compare) as fh:
            report = json.load(fh)
        osu = report.get("benchmark") == "osu_alltoallv"
        if osu and not args.tuning:
            raise SimulateError("--compare of an osu_alltoallv.py report needs --tuning (the platform)")
        model = _model(args)[0] if osu else CostModel(**report["model"])
        cpu = _cpu(args) if osu else None
        network = Network(args.network)
        node_phase = report.get("node_phase", args.node_phase)
        sg = simgrid(args.smpirun)
        rows = compare_measured(report, model, network, node_phase, cpu, sg)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"error: --compare {args.compare}: {exc}", file=sys.stderr)
        return 2
    except SimulateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sizes = report["node_sizes"] if osu else report["layout"]["node_sizes"]
    print(f"# simulated vs measured: nodes {sizes}, model of {args.tuning if osu else args.compare}, "
          f"node phase {node_phase}" + (f", CPU per path from {cpu.source}" if osu else ""))
    print(f"{'# Block [B]':<12}{'algorithm':>20}{'measured':>12}{'simulated':>12}{'error':>8}  [us]")
    for r in rows:
        print(f"{r['block_bytes']:<12d}{r['algorithm']:>20}{_us(r['measured_s'])}{_us(r['sim_s'])}{r['rel_error']:8.1%}")
    summary = {a: float(np.mean([r["rel_error"] for r in rows if r["algorithm"] == a]))
               for a in dict.fromkeys(r["algorithm"] for r in rows)}
    print("# mean |simulated - measured| / measured: " + ", ".join(f"{a} {e:.1%}" for a, e in summary.items()))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"benchmark": "simulate-compare", "provenance": provenance(_command(argv), sg.label),
                       "simgrid": sg.version, "source": args.compare, "node_phase": node_phase,
                       "layout": report.get("layout", {"node_sizes": sizes}), "tuning": args.tuning if osu else None,
                       "overhead": cpu.source if osu else None,
                       "cpu_s_per_call": dict(cpu.seconds) if osu else None,
                       "summary": summary, "rows": rows}, fh, indent=1)
    return 0
