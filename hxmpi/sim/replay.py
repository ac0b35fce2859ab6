"""Replaying traces: every rank's trace and the platform written out, ``smpirun -replay`` run, the
simulated end time read."""
from __future__ import annotations

import os
import re
import signal
import subprocess
from typing import Optional

import numpy as np

from ..comm.costmodel.cpu import CpuTimes
from ..comm.costmodel.model import CostModel
from ..comm.plan import Layout
from .actions import Coarse, Nic, nic_lines
from .errors import ReplayTimeout, SimulateError
from .platform import Network, platform_xml
from .simgrid import SimGrid, SimGridError
from .simgrid import find as find_simgrid
from .trace import rank_trace

__all__ = ["simgrid", "smpirun_path", "replay", "replay_traces"]


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
