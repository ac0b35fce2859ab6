"""One simulated call: its layout and counts, the ``Call`` record, and every step a rank takes in it
(the agreement's collectives, then the exchange as the planner's step program says)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence

import numpy as np

from ..comm.costmodel.agreement import agreement_steps as cost_agreement_steps
from ..comm.plan import ALGORITHM, Layout
from .errors import SimulateError
from .schedule import Collective, Exchange, rank_schedule

__all__ = ["node_of_sizes", "make_counts", "BARE_MODES", "Call", "needs_hierarchy", "has_radix", "agreement_steps", "call_steps"]


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


#: The modes of MPI's own calls, without hxmpi: one-shot and persistent.
BARE_MODES = ("bare", "bare_plan")


@dataclass(frozen=True)
class Call:
    """One simulated call: ``algorithm`` (``plan.ALGORITHMS``, or "alltoall": MPI_Alltoall inside hxmpi,
    uniform counts only), its ``radix`` (its setting, ``plan.Algorithm.setting``: the Bruck radix,
    leaders per node, chunks; None: its default), and ``mode``: "oneshot" (hxmpi's agreement on a plan-cache
    miss, then the exchange; Bruck sends length headers), "hit" (a one-shot call the plan cache
    serves: the agreement's Allreduce, no node Allgather, lengths known), "plan" (a persistent
    request: no agreement, lengths known), "bare" (the MPI call alone, no hxmpi CPU), "bare_plan"
    (MPI's persistent collective, ``MPI_Alltoallv_init`` or ``MPI_Alltoall_init`` then Start + Wait,
    as Open MPI's coll/libnbc runs it: the flat exchange with every message posted at once, built
    once, so no per-call CPU; ``algorithm`` "flat" or "alltoall", the same messages) or
    "agreement" (the agreement's collectives alone). ``numpy``: the ``alltoallv(array, counts)`` form, whose
    agreement also exchanges the counts (one Alltoall of an int64 per peer)."""
    algorithm: str
    mode: str = "oneshot"
    radix: Optional[int] = None
    numpy: bool = False

    @property
    def bare(self) -> bool:
        """Whether it is MPI's call alone (one-shot or persistent): no hxmpi CPU, no library CPU."""
        return self.mode in BARE_MODES

    @property
    def hier(self) -> bool:
        """Whether its algorithm is one of hxmpi's hierarchical ones."""
        return needs_hierarchy(self.algorithm)

    @property
    def label(self) -> str:
        """Name in tables and JSON: the algorithm, with its setting where it takes one (a Bruck
        radix, leaders per node; chunks where it pipelines)."""
        if not has_radix(self.algorithm):
            return self.algorithm
        setting = ALGORITHM[self.algorithm].setting(self.radix)
        return self.algorithm if ALGORITHM[self.algorithm].chunked and setting <= 1 else f"{self.algorithm}/{setting}"

    @property
    def cpu_key(self) -> str:
        """Key of ``cpu_s_per_call`` for hxmpi's own CPU time of this call."""
        base = "flat" if self.algorithm == "alltoall" else ALGORITHM[self.algorithm].cpu_key
        return base + {"plan": "_plan", "hit": "_hit"}.get(self.mode, "")


def needs_hierarchy(algorithm: str) -> bool:
    """Whether an algorithm of hxmpi's works through nodes (and runs flat where the layout has none);
    False for a bare MPI call's name ("alltoall")."""
    return algorithm in ALGORITHM and ALGORITHM[algorithm].hierarchical


def has_radix(algorithm: str) -> bool:
    """Whether an algorithm takes a setting: the Bruck radix, multi-leader's leaders per node, the
    pipelined node phase's chunks (the simulator picks it by the model, per point)."""
    return algorithm in ALGORITHM and ALGORITHM[algorithm].setting() != 0


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
        if call.mode != "bare_plan":
            return steps + [Collective("alltoall", block)]
    if call.mode == "bare_plan":
        # libnbc's persistent schedule: the flat exchange, every message posted at once (its
        # MPI_Alltoall_init too: its Bruck is disabled), whatever the blocking call's rule says.
        return [replace(st, schedule="linear") if isinstance(st, Exchange) else st
                for st in rank_schedule(layout, counts, rank, "flat", node_phase, learned=True)]
    return steps + rank_schedule(layout, counts, rank, call.algorithm, node_phase, call.radix,
                                 learned=call.mode != "oneshot")
