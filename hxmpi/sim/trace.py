"""A call as SMPI's time-independent trace of each rank: hxmpi's CPU, the agreement, copies, messages."""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ..comm.costmodel.collectives import allgather_blocks
from ..comm.costmodel.cpu import CpuTimes
from ..comm.costmodel.model import CostModel
from ..comm.plan import Layout
from .actions import (PHASE_TAG, TAG_STRIDE, Coarse, _Tags, barrier_actions, coarse_actions, coarsenable,
                      dissemination, exchange_actions, wait_lines)
from .calls import Call, call_steps
from .reference import RefCpu, reference_actions
from .schedule import Collective, Copy, Exchange, Wait

__all__ = ["collective_actions", "rank_trace", "trace_stats"]


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
    tag = PHASE_TAG["agree"] * TAG_STRIDE
    return dissemination(rank, layout, tag, lambda d, g: allgather_blocks(d, g) * step.nbytes)

def rank_trace(layout: Layout, counts: np.ndarray, rank: int, algorithm, node_phase: str,
               model: CostModel, cpu: Optional[CpuTimes] = None, coarse: Optional[Coarse] = None) -> list[str]:
    """Time-independent trace of ``rank`` for one call: hxmpi's CPU, agreement, copies, messages.

    ``algorithm``: a ``Call``, or a name (a one-shot call of it). ``cpu``: measured CPU per path
    (default: the model's fixed costs). ``coarse``: replay linear world phases coarsely
    (``coarse_actions``; the faster replay of large worlds). ``MPI_Alltoall`` (the "alltoall" call,
    the numpy form's counts) runs as Open MPI's tuned decision, with the MPI library's CPU per
    block (the model's ``mpi_ddt_block``) but in a bare call (``Call.bare``): the CPU-free lower bound.
    """
    call = algorithm if isinstance(algorithm, Call) else Call(algorithm)
    cpu = cpu or CpuTimes.fixed(model)
    steps = call_steps(layout, counts, rank, call, node_phase)
    lines = [f"{rank} init"]
    fixed = cpu(call.cpu_key) if call.mode in ("oneshot", "hit", "plan") else 0.0
    library = RefCpu() if call.bare else RefCpu(ddt_block=model.mpi_ddt_block)
    tags = _Tags()
    copy_bytes = 0
    in_flight: list = []  # the posts of messages left in flight, up to the next Wait

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
        if isinstance(step, Exchange) and step.in_flight:
            in_flight = exchange_actions(rank, step, layout, tags, wait=False)
            lines += in_flight
        elif isinstance(step, Exchange):
            lines += coarse_actions(rank, step, layout, counts, coarse, tags) \
                if coarse and coarsenable(step, layout, rank) else exchange_actions(rank, step, layout, tags)
        elif isinstance(step, Wait):
            lines += wait_lines(in_flight, by_name=True)
            in_flight = []
        elif isinstance(step, Collective):
            lines += collective_actions(rank, step, layout, model, library, coarse)
        else:  # beside messages in flight, a barrier waits for its own alone
            lines += barrier_actions(rank, layout, alone=bool(in_flight))
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
