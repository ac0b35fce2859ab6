"""Whole calls: a call's price (``predict_call``) and the pick of ``algorithm="auto"``
(``choose_call`` over every algorithm and setting, ``auto_pick`` per pattern class).

A whole call adds to the walk of its step program (``walk``) the one-shot agreement
(``agreement``) and hxmpi's own CPU per path (``cpu``); ``MPI_Alltoall`` is priced as Open MPI
runs it (``alltoall``).
"""
from __future__ import annotations

from typing import Optional, Sequence

from ..plan import ALGORITHM, ALGORITHMS, NODE_PHASES, chunks_run, has_hierarchy, runs_as
from .agreement import predict_agreement
from .alltoall import alltoall_price
from .cpu import fixed_cpu
from .params import Parameters
from .pattern import Pattern, pattern_class
from .walk import call_shape, shape_price

__all__ = ["CALL_ALGORITHMS", "MODES", "RADICES", "CHUNKS", "predict_call", "settings_of", "choose_call", "auto_pick"]

#: The algorithms ``predict_call`` knows: hxmpi's (``plan.ALGORITHMS``) and "alltoall"
#: (MPI_Alltoall, uniform blocks only).
CALL_ALGORITHMS = (*ALGORITHMS, "alltoall")
#: The modes of a whole call ``predict_call`` prices (hxmpi's one-shot call and plan; MPI's
#: one-shot call and persistent collective).
MODES = ("oneshot", "plan", "bare", "bare_plan")
#: Radices ``choose_call`` tries for the Bruck algorithms.
RADICES = (2, 3, 4, 6, 8, 12, 16, 24, 32)
#: Chunks ``choose_call`` tries for the pipelined node phase (1: none; up to ``plan.MAX_CHUNKS``).
CHUNKS = (1, 2, 4, 8)


def _predict_call(m: Parameters, algorithm: str, mode: str, shape: tuple, pat: Pattern, node_phase: str,
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
    frac = min(pat.rank_messages, p - 1.0) / (p - 1) if p > 1 else 1.0
    if mode == "bare_plan":
        # MPI's persistent collective (MPI_Alltoallv_init, MPI_Alltoall_init; then Start + Wait).
        # Open MPI 5 serves both from coll/libnbc, whose schedule (built once, at init) posts every
        # message at once: the flat exchange run linear, whatever the blocking call's rule (or,
        # for MPI_Alltoall, its tuned Bruck) would pick. What a persistent call saves is per-call
        # setup, and a bare one-shot call is charged none (it is the CPU-free floor: no hxmpi CPU,
        # no mpi_ddt_block), so nothing is taken off; the messages stay, with their per-message
        # CPU and, on a platform with a NIC, its rates. MPI_Alltoall_init is the same exchange.
        return shape_price(shape, "flat", 2, node_phase, True, "linear").price(m, b, None, frac)
    if call == "alltoall":
        return t + alltoall_price(m, shape, b, library=mode != "bare")
    # Pairwise rounds each wait for the larger of their two blocks (flat: the agreed sum).
    pair = pat.pairwise_bytes / (p * (p - 1)) if pat.pairwise_bytes and p > 1 else None
    k = ALGORITHM[call].setting(radix)
    sk = shape_price(shape, call, k, node_phase, mode != "oneshot", "")
    return t + sk.price(m, b, pair, frac)


def predict_call(model: Parameters, algorithm: str, mode: str, nodes: int, per_node: int, pattern,
                 node_phase: str = "shm", radix: Optional[int] = None, cpu=None, numpy: bool = False,
                 sizes: Optional[Sequence[int]] = None) -> float:
    """Predicted seconds of a whole call: ``mode`` "oneshot" (agreement + CPU + exchange), "plan"
    (CPU + exchange, lengths known), "bare" (MPI's one-shot call of the exchange alone) or
    "bare_plan" (MPI's persistent collective, ``MPI_Alltoallv_init`` or ``MPI_Alltoall_init``, as
    Open MPI's coll/libnbc runs it: the flat exchange, every message posted at once; ``algorithm``
    "flat" or "alltoall", the same price).

    ``pattern``: a ``Pattern`` or a block size (bytes, even counts). ``radix``: the algorithm's
    setting (``plan.Algorithm.setting``: Bruck radix, leaders, chunks; None: its default).
    ``cpu(key)``: hxmpi's CPU seconds
    per path ("flat", "hier_plan", ...; default: the model's fixed costs). ``numpy``: the
    ``alltoallv(array, counts)`` form (its agreement also exchanges counts). ``sizes``: the node
    sizes where they differ (default: ``nodes`` nodes of ``per_node`` ranks).
    """
    if algorithm not in CALL_ALGORITHMS:
        raise ValueError(f"algorithm must be one of {CALL_ALGORITHMS}, got {algorithm!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode == "bare_plan" and algorithm not in ("flat", "alltoall"):
        raise ValueError(f"a bare plan is MPI's own persistent collective: algorithm 'flat' or 'alltoall', "
                         f"got {algorithm!r}")
    if node_phase not in NODE_PHASES:
        raise ValueError(f"node_phase must be one of {tuple(NODE_PHASES)}, got {node_phase!r}")
    pat = pattern if isinstance(pattern, Pattern) else Pattern.even(sum(call_shape(nodes, per_node, sizes)), pattern)
    if algorithm == "alltoall" and not pat.uniform:
        raise ValueError("alltoall needs uniform counts")
    return _predict_call(model, algorithm, mode, call_shape(nodes, per_node, sizes), pat, node_phase, radix, cpu,
                         numpy)


def settings_of(algorithm, shape: tuple, radices=RADICES, node_phase: str = "shm") -> list[int]:
    """The settings ``choose_call`` tries for ``algorithm`` on nodes of ``shape``: Bruck radices
    (each of ``radices`` up to the size of the communicator the rounds run on, the world or a lane
    of one rank per node, and that size: one round to every peer), leaders per node for
    multi-leader (powers of two below the smallest node: at its size the lanes do better), the
    pipelined node phase's chunks for linear lanes (``CHUNKS``, as many as run: ``chunks_run``;
    with the "shm" node phase only, the one that pipelines), else [2]."""
    algo = ALGORITHM[algorithm] if isinstance(algorithm, str) else algorithm
    if algo.chunked:
        return sorted({chunks_run(k, shape) for k in CHUNKS}) if node_phase == "shm" else [1]
    if algo.led:
        return [1 << i for i in range(max(min(shape) - 1, 1).bit_length()) if (1 << i) < min(shape)] or [1]
    if algo.radixed:
        size = len(shape) if algo.hierarchical else sum(shape)
        return sorted({min(k, max(size, 2)) for k in radices} | {max(size, 2)})
    return [2]


def choose_call(model: Parameters, mode: str, nodes: int, per_node: int, pattern, node_phase: str = "shm",
                cpu=None, numpy: bool = False, radices=RADICES,
                sizes: Optional[Sequence[int]] = None) -> tuple[str, int, float]:
    """(algorithm, radix, predicted seconds) of the fastest call the model knows for this pattern.

    Candidates: every algorithm of ``ALGORITHMS`` the layout runs as itself (the hierarchical ones
    where it has a hierarchy), the radixed ones at each radix of ``radices`` up to the size of the
    communicator their rounds run on (the world, or a lane of one rank per node) and at that size
    (one round to every peer), multi-leader (with the "shm" node phase) at every power of two
    leaders per node below the smallest node's size, and MPI_Alltoall for uniform counts. The
    radix of the pick is its leaders per node for multi-leader, its chunks for linear lanes. ``sizes``: as
    ``predict_call``.
    """
    shape = call_shape(nodes, per_node, sizes)
    pat = pattern if isinstance(pattern, Pattern) else Pattern.even(sum(shape), pattern)
    hier_ok = has_hierarchy(len(shape), max(shape))
    # MPI_Alltoall first: on a tie (the same linear exchange) the library's own call, without
    # count arrays, is the one to run.
    cands = [("alltoall", 2)] if pat.uniform else []
    for algo in ALGORITHM.values():
        if runs_as(algo, hier_ok) is not algo or (algo.led and node_phase != "shm"):
            continue
        cands += [(algo.name, k) for k in settings_of(algo, shape, radices, node_phase)]
    best = min((predict_call(model, a, mode, nodes, per_node, pat, node_phase, k, cpu, numpy, shape), i)
               for i, (a, k) in enumerate(cands))
    algo, radix = cands[best[1]]
    return algo, radix, best[0]



def auto_pick(model: Parameters, mode: str, nodes: int, per_node: int, pattern: Pattern,
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
