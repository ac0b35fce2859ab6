"""Reference schedules: Open MPI's own all-to-alls, as traces and as cost formulas.

The ``slingshot`` preset is fitted to Open MPI's published timings (coll/han's alltoall pull
request, 4 nodes x 48 ranks on Slingshot-11), so the simulator replays what those timings
measured, not hxmpi's algorithms:

- ``ompi_bruck``: ``MPI_Alltoall`` as Open MPI's tuned component runs it below 1 KiB blocks on
  16 to 4095 ranks (its fixed decision: "modified Bruck"). A local rotation of the send buffer,
  then ceil(log2 P) rounds: round d sends the k_d blocks whose index has bit d set as one indexed
  datatype to rank + d and receives as many from rank - d (a sendrecv), and copies them back; a
  last rotation. Each round builds, commits and frees the datatype and packs and unpacks it
  block by block: ``RefCpu.ddt_block`` seconds per block per round.
- ``han_alltoall``: coll/han's ``alltoall_using_smsc`` (XPMEM): an Allgather of buffer addresses
  over the node, every receive posted at once (one per node, G blocks each, from the rank of the
  same local rank there), then one round per node, the own node last: copy the G blocks the
  partner's rank needs out of the node's ranks' mapped send buffers (``RefCpu.han_block`` seconds
  per block, plus the bytes at copy bandwidth) and send them as one blocking message.
- ``ompi_linear``: ``MPI_Alltoallv`` as Open MPI runs it on 1024 ranks and more (and on 4-63,
  128-255): every receive and send posted at once, then one wait for all.
- ``ompi_pairwise``: P - 1 rounds, round k a send to rank + k and a receive from rank - k.

``tuned_alltoall`` is Open MPI's tuned component's fixed decision for ``MPI_Alltoall`` (by
communicator size and block bytes; its "linear_sync" is replayed as linear), so
``reference_trace("ompi_tuned", ...)`` replays what Open MPI would run, with its CPU per block.

``python -m hxmpi.sim`` replays hxmpi's calls beside bare MPI; these schedules serve the
calibration (``benchmarks/fit_slingshot.py``) and the comparison with HAN's published ratios.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..comm.costmodel.collectives import alltoall_algorithm, allgather_blocks, bruck_schedule, dissemination_distances
from ..comm.costmodel.model import CostModel
from ..comm.plan import Layout
from .actions import Coarse, coarse_actions, coarsenable, dissemination, wait_lines
from .schedule import Exchange

__all__ = ["REFERENCES", "RefCpu", "tuned_alltoall", "mbw_mr_trace", "MBW_WINDOW", "ring_partner",
           "reference_trace", "reference_actions", "predict_reference", "reference_features"]

#: The reference schedules this module knows.
REFERENCES = ("ompi_bruck", "han_alltoall", "ompi_linear", "ompi_pairwise", "ompi_tuned")
#: Tags of each schedule's messages: above every phase of ``actions.PHASE_TAG`` (a trace may hold
#: both: hxmpi's call around an MPI_Alltoall), so ``trace.trace_stats`` names them "library".
_TAG = {"ompi_bruck": 600000, "han_alltoall": 700000, "ompi_linear": 800000, "allgather": 900000,
        "mbw_mr": 950000, "ompi_pairwise": 650000}


def tuned_alltoall(size: int, block: int) -> str:
    """The reference schedule Open MPI's tuned component runs ``MPI_Alltoall`` as, on ``size``
    ranks with ``block``-byte blocks (``costmodel.alltoall_algorithm``): "ompi_bruck",
    "ompi_linear" or "ompi_pairwise"."""
    return f"ompi_{alltoall_algorithm(size, block)}"


#: Bytes each rank contributes to HAN's node Allgather (three addresses).
HAN_ALLGATHER_BYTES = 24


@dataclass(frozen=True)
class RefCpu:
    """CPU seconds of Open MPI's code paths that hxmpi's model has no parameter for:
    ``ddt_block``, per block per Bruck round (indexed datatype built, committed, packed, unpacked,
    copied back, freed); ``han_block``, per block HAN copies out of a node peer's mapped buffer
    (one convertor set up, packed and cleaned up per block, the peer's address looked up)."""
    ddt_block: float = 0.0
    han_block: float = 0.0


def ring_partner(node: int, round_: int, nodes: int) -> int:
    """The node that ``node`` sends to in round ``round_`` of HAN's alltoall: round - node mod N,
    with the round that would give the node itself skipped, and the node's own data last. (Every
    receive is posted first, so a round need not pair nodes both ways.)"""
    if round_ == nodes - 1:
        return node
    own = (2 * node) % nodes   # the round in which round - node == node
    r = round_ if round_ < own else round_ + 1
    return (r - node) % nodes


def _sleep(rank: int, seconds: float) -> list[str]:
    return [f"{rank} sleep {seconds:.12g}"] if seconds > 0 else []


def _allgather(rank: int, layout: Layout, nbytes: int) -> list[str]:
    """Bruck dissemination Allgather over the rank's node (``actions.dissemination``), sending to
    the rank d behind as Bruck's Allgather does: ceil(log2 G) rounds of ``allgather_blocks``."""
    return dissemination(rank, layout, _TAG["allgather"], lambda d, g: allgather_blocks(d, g) * nbytes, ahead=False)


def reference_trace(name: str, layout: Layout, block: int, rank: int, model: CostModel, cpu: RefCpu,
                    coarse: Optional[Coarse] = None) -> list[str]:
    """Time-independent trace of ``rank`` in one call of reference schedule ``name`` with
    ``block``-byte blocks (every block the same); "ompi_tuned": the one ``tuned_alltoall`` picks.
    ``coarse``: replay a linear exchange coarsely (``actions.coarse_actions``)."""
    return [f"{rank} init"] + reference_actions(name, layout, block, rank, model, cpu, coarse) + [f"{rank} finalize"]


def reference_actions(name: str, layout: Layout, block: int, rank: int, model: CostModel, cpu: RefCpu,
                      coarse: Optional[Coarse] = None) -> list[str]:
    """The lines of ``reference_trace`` between its init and finalize: one call, to put in a
    longer trace (the simulator replays hxmpi's ``MPI_Alltoall`` calls as "ompi_tuned")."""
    if name == "ompi_tuned":
        name = tuned_alltoall(layout.size, block)
    p, lines = layout.size, []
    copy = model.beta_copy
    if name == "ompi_bruck":
        tag = _TAG[name]
        lines += _sleep(rank, p * block * copy)  # local rotation
        for i, (d, k, nbytes) in enumerate(bruck_schedule(p, block)):
            lines += _sleep(rank, k * cpu.ddt_block + nbytes * copy)  # build and pack the round's datatype
            lines += [f"{rank} irecv {(rank - d) % p} {tag + i} {nbytes}",
                      f"{rank} isend {(rank + d) % p} {tag + i} {nbytes}", f"{rank} waitall"]
            lines += _sleep(rank, 2 * nbytes * copy)  # unpack, copy back
        lines += _sleep(rank, p * block * copy)  # last rotation
    elif name == "han_alltoall":
        node, local = int(layout.node_of[rank]), int(layout.local_of[rank])
        n, g = layout.num_nodes, int(layout.node_sizes[node])
        if not layout.is_regular:
            raise ValueError("han_alltoall needs nodes of equal size (HAN falls back otherwise)")
        peer = lambda m: int(layout.members[m][local])  # noqa: E731
        tag = _TAG[name]
        lines += _allgather(rank, layout, HAN_ALLGATHER_BYTES)
        lines += [f"{rank} irecv {peer(ring_partner(node, j, n))} {tag} {g * block}" for j in range(n)]
        for j in range(n):
            lines += _sleep(rank, g * cpu.han_block + g * block * copy)
            lines.append(f"{rank} send {peer(ring_partner(node, j, n))} {tag} {g * block}")
        lines += [f"{rank} waitall"]
    elif name == "ompi_linear":
        tag = _TAG[name]
        others = [q for q in range(p) if q != rank]
        lines += _sleep(rank, block * copy)  # the own block
        step = Exchange("flat", tuple((q, block) for q in others), tuple((q, block) for q in others), "linear")
        if coarse and coarsenable(step, layout, rank):
            lines += coarse_actions(rank, step, layout, np.full((p, p), block, dtype=np.int64), coarse)
        else:
            posted = [f"{rank} irecv {q} {tag} {block}" for q in others] + \
                     [f"{rank} isend {q} {tag} {block}" for q in others]
            lines += posted + wait_lines(posted)
    elif name == "ompi_pairwise":
        tag = _TAG[name]
        lines += _sleep(rank, block * copy)  # the own block
        for k in range(1, p):
            lines += [f"{rank} irecv {(rank - k) % p} {tag} {block}", f"{rank} isend {(rank + k) % p} {tag} {block}",
                      f"{rank} waitall"]
    else:
        raise ValueError(f"unknown reference schedule {name!r}; choose one of {REFERENCES}")
    return lines


#: ``reference_features`` columns beyond CostModel's fields.
REF_FIELDS = ("ddt_block", "han_block")


def reference_features(name: str, nodes: int, per_node: int, block: float) -> dict:
    """Coefficients of the parameters (CostModel's fields and ``REF_FIELDS``) in the predicted
    seconds of one call: the model is linear in them, as ``CostModel.features`` is.

    - ``ompi_bruck``: each round costs its datatype CPU, its copies, and one message each way (a
      latency and two overheads; the inter-node latency once nodes > 1: every round's chain of
      dependencies crosses a node somewhere); a round of distance d puts min(d, G) of a node's
      ranks' k_d blocks on its link, the rest on the node's loopback.
    - ``han_alltoall``: the node Allgather's rounds, then per node round the G blocks' CPU and copy
      and a send's overhead; the last message's latency and the receives' overheads; a node's link
      carries G (N - 1) messages of G blocks.
    - ``ompi_linear``: one latency, 2 (P - 1) overheads, the node's G (P - G) blocks on its link and
      G - 1 on the loopback.
    """
    n, g, b = nodes, per_node, float(block)
    p = n * g
    if name == "ompi_tuned":
        name = tuned_alltoall(p, block)
    f = dict.fromkeys((*CostModel.__dataclass_fields__, *REF_FIELDS), 0.0)
    inter = "alpha_inter" if n > 1 else "alpha_intra"
    if name == "ompi_bruck":
        f["beta_copy"] += 2 * p * b
        for d, k, _ in bruck_schedule(p):
            f["ddt_block"] += k
            f["beta_copy"] += 3 * k * b
            f[inter] += 1
            f["msg_overhead"] += 2
            cross = min(d, g) if n > 1 else 0  # a node's ranks whose partner is on another node
            f["beta_inter"] += cross * k * b     # they share the node's link
            f["beta_intra"] += k * b if cross < g else 0.0  # the loopback is not shared
    elif name == "han_alltoall":
        rounds = dissemination_distances(g)
        f["alpha_intra"] += len(rounds)
        f["msg_overhead"] += 2 * len(rounds) + 2 * n
        f["beta_intra"] += sum(allgather_blocks(d, g) for d in rounds) * HAN_ALLGATHER_BYTES
        f["han_block"] += n * g
        f["beta_copy"] += n * g * b
        f[inter] += 1
        f["beta_inter"] += g * (n - 1) * g * b
        f["beta_intra"] += g * b  # the own node's message, through the loopback
    elif name in ("ompi_pairwise", "ompi_linear"):
        # Pairwise: every round waits for its message, most of them between nodes; linear: one wait.
        f[inter] += p - 1 if name == "ompi_pairwise" else 1
        f["msg_overhead"] += 2 * (p - 1)
        f["beta_inter"] += g * (p - g) * b
        f["beta_intra"] += (g - 1) * b
        f["beta_copy"] += b
    else:
        raise ValueError(f"unknown reference schedule {name!r}; choose one of {REFERENCES}")
    return f


def predict_reference(name: str, nodes: int, per_node: int, block: float, model: CostModel, cpu: RefCpu) -> float:
    """Predicted seconds of one call of reference schedule ``name`` (``reference_features``)."""
    values = {**model.__dict__, **cpu.__dict__}
    return sum(c * values[k] for k, c in reference_features(name, nodes, per_node, block).items())


#: osu_mbw_mr's defaults: messages posted per window, and the acknowledgement's bytes.
MBW_WINDOW, MBW_ACK_BYTES = 64, 4


def mbw_mr_trace(rank: int, pairs: int, nbytes: int, iterations: int, window: int = MBW_WINDOW) -> list[str]:
    """Trace of ``rank`` in an ``osu_mbw_mr``-like run on 2 nodes of ``pairs`` ranks (ranks 0..pairs-1
    on the first): rank i sends ``iterations`` windows of ``window`` ``nbytes``-byte messages to
    rank pairs + i (posted at once, one wait) and waits for a 4-byte acknowledgement after each."""
    tag, lines = _TAG["mbw_mr"], [f"{rank} init"]
    sender = rank < pairs
    peer = rank + pairs if sender else rank - pairs
    verb = "isend" if sender else "irecv"
    for _ in range(iterations):
        posted = [f"{rank} {verb} {peer} {tag + j} {nbytes}" for j in range(window)]
        lines += posted + wait_lines(posted)
        lines.append(f"{rank} recv {peer} {tag + window} {MBW_ACK_BYTES}" if sender
                     else f"{rank} send {peer} {tag + window} {MBW_ACK_BYTES}")
    return lines + [f"{rank} finalize"]
