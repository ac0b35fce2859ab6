"""The agreement of a one-shot call: the collectives it issues before its exchange, and their price.

``agreement_steps`` is the one statement of those steps: the simulator replays them
(``hxmpi.sim.calls.agreement_steps``) and ``predict_agreement`` prices them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..plan import has_hierarchy
from .alltoall import alltoall_price
from .collectives import allgather_blocks, dissemination_distances
from .params import Parameters
from .walk import call_shape

__all__ = ["AGREEMENT_BYTES", "COUNT_BYTES", "AgreementStep", "agreement_steps", "predict_agreement"]

#: The agreement of a one-shot call: one SUM Allreduce of 16 uint64 (``_agree.WORDS``, checked by ``agreement``).
AGREEMENT_BYTES = 128


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


def _allreduce(m: Parameters, nodes: int, per_node: int, nbytes: int) -> float:
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


def predict_agreement(model: Parameters, nodes: int, per_node: int, hier: bool, numpy: bool = False,
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
            t += alltoall_price(model, call_shape(nodes, per_node), st.nbytes)
        else:
            rounds = dissemination_distances(per_node)
            blocks = sum(allgather_blocks(d, per_node) for d in rounds)
            t += len(rounds) * (model.alpha_intra + 2 * model.msg_overhead) + blocks * st.nbytes * model.beta_intra
    return t
