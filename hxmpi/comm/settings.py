"""A HierComm's settings: checked on each rank, then agreed over the communicator.

Every rank must pass the same settings, and a bad value on one rank must raise on every rank (a
rank raising alone would leave the others waiting in the next collective). ``check`` says what
is wrong on this rank; ``pricing`` reads the files "auto" prices with; ``agree_settings`` agrees
both with every rank, and settles the node phase and the agreement's hash keys.
"""
from __future__ import annotations

import os
import secrets
from typing import Optional

from mpi4py import MPI

from ..errors import CpuFileError, ExchangeError, agree, agreed_error
from .costmodel import ENV_TUNING, CostModel, CpuTimes
from .nonblocking import PROGRESS_MODES
from .plan import ALGORITHM_CHOICES, MAX_CHUNKS, NODE_PHASES
from .topology import Topology

__all__ = ["ENV_NODE_PHASE", "check", "pricing", "agree_settings"]

#: Env var choosing the node phase where ``HierComm(node_phase=...)`` does not.
ENV_NODE_PHASE = "HXMPI_NODE_PHASE"


def check(algorithm, cache_entries, cache_bytes, radix, leaders, progress, chunks) -> Optional[str]:
    """What is wrong with these constructor settings on this rank, or None."""
    if algorithm not in ALGORITHM_CHOICES:
        return f"algorithm must be one of {ALGORITHM_CHOICES}, got {algorithm!r}"
    if type(cache_entries) is not int or cache_entries < 0 or type(cache_bytes) is not int or cache_bytes < 0:
        return f"cache_entries and cache_bytes must be integers >= 0, got {cache_entries!r}, {cache_bytes!r}"
    if type(radix) is not int or radix < 2:
        return f"radix must be an integer >= 2, got {radix!r}"
    if type(leaders) is not int or leaders < 1:
        return f"leaders must be an integer >= 1, got {leaders!r}"
    if progress not in PROGRESS_MODES:
        return f"progress must be one of {PROGRESS_MODES}, got {progress!r}"
    if type(chunks) is not int or not 1 <= chunks <= MAX_CHUNKS:
        return f"chunks must be an integer from 1 to {MAX_CHUNKS}, got {chunks!r}"
    return None


def pricing(tuning: Optional[str], overhead: Optional[str]) -> tuple[CostModel, CpuTimes, Optional[str]]:
    """(cost model, CPU per path, problem) for "auto". A file that cannot be read is this rank's
    problem, agreed by ``agree_settings``; the defaults stand in until then."""
    problem = None
    try:
        model = CostModel.from_env_or_default(tuning)
    except (OSError, ValueError, TypeError) as exc:
        path = tuning or os.environ.get(ENV_TUNING)
        problem = str(exc) if path in str(exc) else f"tuning file {path}: {exc}"
        model = CostModel()
    try:
        cpu = CpuTimes.from_env_or_default(overhead)
    except CpuFileError as exc:
        problem = problem or str(exc)
        cpu = CpuTimes.fixed(model)
    return model, cpu, problem


def agree_settings(topology: Topology, hier_possible: bool, requested: Optional[str], problem: Optional[str],
                   radix: int, leaders: int, model: CostModel, cpu: CpuTimes, progress: str,
                   chunks: int = 1) -> tuple[str, tuple]:
    """Agree on the constructor's settings (collective); return the node phase every rank uses
    ("shm" only where every node's ranks share memory; ``requested``: the argument, None for env
    ``HXMPI_NODE_PHASE`` or "auto") and the agreement's key (rank 0's draw). ``problem``: this
    rank's bad setting, if any: an ``ExchangeError`` on every rank."""
    requested = requested if requested is not None else os.environ.get(ENV_NODE_PHASE, "auto")
    if problem is None and requested not in ("auto", *NODE_PHASES):
        problem = f"node_phase must be 'auto', 'shm' or 'mpi', got {requested!r}"
    shared = True
    if hier_possible:  # can the node's ranks map one window? (not if a node spans hosts)
        probe = topology.intra.Split_type(MPI.COMM_TYPE_SHARED)
        shared = probe.size == topology.intra.size
        probe.Free()
    key = (secrets.randbits(64), secrets.randbits(64))
    prices = (tuple(model.vector().tolist()), tuple(cpu.seconds.values()))
    views = topology.comm.allgather((requested, shared, problem, key, (radix, leaders, chunks), prices, progress))
    if problem is None and len({v[0] for v in views}) > 1:
        problem = f"node_phase {requested!r} differs between ranks"
    if problem is None and len({v[6] for v in views}) > 1:
        problem = f"progress {progress!r} differs between ranks"
    if problem is None and len({v[4] for v in views}) > 1:
        problem = f"radix {radix!r}, leaders {leaders!r} or chunks {chunks!r} differs between ranks"
    if problem is None and len({v[5] for v in views}) > 1:  # "auto" would pick differently
        problem = (f"the cost model or CPU per path differs between ranks (tuning and overhead files; "
                   f"this rank's CPU from {cpu.source})")
    agree(topology.comm, problem, ExchangeError)
    everywhere = all(v[1] for v in views)
    if requested == "shm" and not everywhere:
        raise agreed_error(ExchangeError("node_phase='shm', but the ranks of a node do not all share memory"))
    return ("shm" if requested != "mpi" and everywhere else "mpi"), views[0][3]
