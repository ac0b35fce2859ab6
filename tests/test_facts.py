"""Each fact once: the function that holds a fact (a round count, a schedule, a layout rule) and what
each of its users makes of it, the cost model's prices and the simulator's traces alike."""
from dataclasses import replace

import numpy as np
import pytest

from hxmpi.comm.costmodel import CostModel, predict_agreement, predict_call
from hxmpi.comm.costmodel.collectives import (alltoall_algorithm, allgather_blocks, bruck_schedule,
                                              dissemination_distances)
from hxmpi.comm.costmodel.walk import layout_price
from hxmpi.comm.plan import ALGORITHM, BarrierStep, Layout, bruck_rounds, has_hierarchy, program_steps, runs_as
from hxmpi.sim.actions import PHASE_TAG, TAG_STRIDE, barrier_actions, coarsenable, even_hierarchy
from hxmpi.sim.calls import Call, make_counts, node_of_sizes
from hxmpi.sim.reference import RefCpu, reference_actions, reference_features
from hxmpi.sim.schedule import Exchange, rank_schedule
from hxmpi.sim.trace import rank_trace

#: A model whose only cost is one parameter, so a price counts that parameter's terms.
ZERO = CostModel(**{k: 0.0 for k in CostModel.__dataclass_fields__})


def only(**values) -> CostModel:
    return replace(ZERO, **values)


def sends(lines, tags=None):
    """(rank, peer, tag, bytes) of every isend line, those with a tag in ``tags`` if given."""
    out = []
    for ln in lines:
        r, verb, *rest = ln.split()
        if verb == "isend" and (tags is None or int(rest[1]) in tags):
            out.append((int(r), int(rest[0]), int(rest[1]), int(rest[2])))
    return out


# ------------------------------------------------------------------------ Open MPI's Bruck rounds
@pytest.mark.parametrize("p", [2, 3, 5, 8, 17, 24, 40, 100])
def test_bruck_schedule_is_hxmpis_radix_2_rounds(p):
    """Open MPI's modified Bruck sends, per round, hxmpi's own radix-2 Bruck round: the blocks
    whose index has the round's bit set."""
    assert [(r.distance, r.blocks) for r in bruck_schedule(p)] == \
        [(d, slots.size) for (d, slots), in bruck_rounds(p, 2)]
    assert [r.blocks for r in bruck_schedule(p)] == \
        [int(np.count_nonzero(np.arange(1, p) & r.distance)) for r in bruck_schedule(p)]


@pytest.mark.parametrize("p", [3, 5, 8, 17])
def test_the_bruck_reference_traces_the_schedule(p):
    """``reference_actions("ompi_bruck")`` sends, round by round, what ``bruck_schedule`` says: to
    rank + d, its bytes; its formula counts the schedule's blocks."""
    layout, block = Layout(node_of_sizes([p])), 24
    for rank in range(p):
        sent = sends(reference_actions("ompi_bruck", layout, block, rank, ZERO, RefCpu()))
        assert [((peer - rank) % p, nbytes) for _, peer, _, nbytes in sent] == \
            [(r.distance, r.nbytes) for r in bruck_schedule(p, block)]
    f = reference_features("ompi_bruck", 1, p, block)
    assert f["ddt_block"] == sum(r.blocks for r in bruck_schedule(p))
    assert f["beta_copy"] == 2 * p * block + 3 * sum(r.nbytes for r in bruck_schedule(p, block))


@pytest.mark.parametrize("n,g", [(1, 17), (2, 12), (4, 8), (5, 8), (8, 8)])
def test_mpi_alltoall_is_priced_on_the_schedule(n, g):
    """The cost model charges MPI_Alltoall's Bruck the library's CPU once per block of each round
    of ``bruck_schedule``, and the rounds the flat Bruck program's walk prices are the schedule's."""
    p, block = n * g, 8
    assert alltoall_algorithm(p, block) == "bruck"
    ddt = 1e-6
    extra = predict_call(only(mpi_ddt_block=ddt), "alltoall", "plan", n, g, block) - \
        predict_call(ZERO, "alltoall", "plan", n, g, block)
    assert extra == pytest.approx(ddt * sum(r.blocks for r in bruck_schedule(p)), rel=1e-12)
    # The walk of hxmpi's radix-2 Bruck: each round costs one latency (alpha_intra on one node).
    rounds = predict_call(only(alpha_intra=1.0, alpha_inter=1.0), "bruck", "bare", n, g, block)
    assert rounds == len(bruck_schedule(p))


# ------------------------------------------------------------------------- dissemination rounds
@pytest.mark.parametrize("g", range(1, 10))
def test_dissemination_rounds_are_ceil_log2(g):
    assert len(dissemination_distances(g)) == (int(np.ceil(np.log2(g))) if g > 1 else 0)
    assert sum(allgather_blocks(d, g) for d in dissemination_distances(g)) == g - 1


@pytest.mark.parametrize("g", [2, 3, 4, 5, 7, 8])
def test_barrier_rounds_are_what_the_trace_sends_and_the_model_charges(g):
    """A node barrier is ``dissemination_distances``' rounds: in the simulator's barrier trace, in
    every barrier of a shared-memory hier call's trace, and in the walk's price (an intra-node
    latency per round and barrier); the agreement's node Allgather and HAN's too."""
    rounds = len(dissemination_distances(g))
    layout = Layout(node_of_sizes([g, g]))
    assert len(sends(barrier_actions(0, layout))) == rounds
    counts = make_counts(2 * g, 16, False)
    prog = layout.rank_program(0, "hier", counts, "shm")
    barriers = sum(isinstance(st, BarrierStep) for st in program_steps(prog))
    assert barriers >= 2
    tags = range(PHASE_TAG["barrier"] * TAG_STRIDE, (PHASE_TAG["barrier"] + 1) * TAG_STRIDE)
    trace = rank_trace(layout, counts, 0, Call("hier", "plan"), "shm", CostModel())
    assert len(sends(trace, tags)) == barriers * rounds
    # The walk: intra-node latency only from the barriers (the lanes cross nodes, the node phase copies).
    assert layout_price(layout, "hier", node_phase="shm").price(only(alpha_intra=1.0), 1.0) == barriers * rounds
    # The agreement's node Allgather (hier, miss) and HAN's Allgather: one latency per round.
    m = only(alpha_intra=1.0)
    assert predict_agreement(m, 2, g, True) - predict_agreement(m, 2, g, True, miss=False) == rounds
    agree = range(PHASE_TAG["agree"] * TAG_STRIDE, (PHASE_TAG["agree"] + 1) * TAG_STRIDE)
    assert len(sends(rank_trace(layout, counts, 0, Call("hier"), "shm", CostModel()), agree)) == rounds
    assert reference_features("han_alltoall", 2, g, 8)["alpha_intra"] == rounds
    assert len([s for s in sends(reference_actions("han_alltoall", layout, 8, 0, ZERO, RefCpu()))
                if layout.node_of[s[1]] == 0]) == rounds


# ---------------------------------------------------------------------------- the layout rule
LAYOUTS = [[1], [5], [1, 1, 1], [2, 2], [3, 3, 3], [2, 1], [3, 2, 1], [1, 4], [4, 4, 4, 4]]


@pytest.mark.parametrize("sizes", LAYOUTS)
def test_the_hierarchy_rule_is_one_in_sim_and_comm(sizes):
    """The simulator asks ``plan``'s rule (``Layout.hier_possible``, ``has_hierarchy``) and adds
    only the equal node sizes (``Layout.is_regular``) where the coarse replay and HAN need them;
    hier calls run flat exactly where the rule says, in the traces as in the model."""
    layout = Layout(node_of_sizes(sizes))
    hier = has_hierarchy(len(sizes), max(sizes))
    assert layout.hier_possible == hier and layout.is_regular == (len(set(sizes)) == 1)
    assert even_hierarchy(layout) == (hier and len(set(sizes)) == 1)
    p = layout.size
    flat = Exchange("flat", tuple((q, 8) for q in range(1, p)), tuple((q, 8) for q in range(1, p)), "linear")
    assert coarsenable(flat, layout, 0) == even_hierarchy(layout)
    assert runs_as("hier", hier) is (ALGORITHM["hier"] if hier else ALGORITHM["flat"])
    counts = make_counts(p, 8, False)
    ran_flat = rank_schedule(layout, counts, 0, "hier") == rank_schedule(layout, counts, 0, "flat")
    assert ran_flat == (not hier)
    priced = predict_call(CostModel(), "hier", "bare", len(sizes), max(sizes), 8, sizes=sizes)
    assert (priced == predict_call(CostModel(), "flat", "bare", len(sizes), max(sizes), 8, sizes=sizes)) == \
        (not hier)
