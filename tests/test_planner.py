"""The planner alone (no MPI): every phase's messages pair up, and bytes are conserved, on any layout."""
import numpy as np
import pytest
from support import VIRTUAL_LAYOUTS, layouts, node_of

from hxmpi.comm.plan import Layout
from hxmpi.sim.schedule import Copy, Exchange, NodeBarrier, rank_schedule

SIZES = (4, 7, 8)  # world sizes the planner is checked at: even, odd with a small node, past 7


def _counts(p, seed):
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 50, (p, p))
    counts[rng.random((p, p)) < 0.3] = 0
    return counts


@pytest.mark.parametrize("node_phase", ["shm", "mpi"])
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", VIRTUAL_LAYOUTS)
def test_messages_pair_up_and_carry_every_remote_byte(name, size, node_phase):
    layout = Layout(node_of(layouts(size)[name], size))
    p = layout.size
    counts = _counts(p, 3)
    sent, received = {}, {}
    lane_bytes = 0
    for rank in range(p):
        for step in rank_schedule(layout, counts, rank, "hier", node_phase):
            if isinstance(step, Exchange):
                for peer, nbytes in step.sends:
                    sent[step.phase, rank, peer] = sent.get((step.phase, rank, peer), 0) + nbytes
                    crosses = layout.node_of[rank] != layout.node_of[peer]
                    lane_bytes += nbytes if step.phase == "lane" or (step.phase == "flat" and crosses) else 0
                for peer, nbytes in step.recvs:
                    received[step.phase, peer, rank] = received.get((step.phase, peer, rank), 0) + nbytes
    assert sent == received
    remote = sum(int(counts[s, d]) for s in range(p) for d in range(p)
                 if layout.node_of[s] != layout.node_of[d])
    assert lane_bytes == remote  # every byte crossing a node boundary crosses it exactly once
    if layout.hier_possible:  # one lane message per other node at most
        for rank in range(p):
            lane = [s for s in rank_schedule(layout, counts, rank, "hier", node_phase)
                    if isinstance(s, Exchange) and s.phase == "lane"]
            assert len(lane) == 1 and len(lane[0].sends) <= layout.num_nodes - 1


def test_shm_phase_copies_every_received_byte_once():
    layout = Layout(node_of(layouts(7)["irregular_3_3_1"], 7))
    counts = _counts(7, 4)
    for rank in range(7):
        steps = rank_schedule(layout, counts, rank, "hier", "shm")
        out = sum(s.nbytes for s in steps if isinstance(s, Copy) and s.what in ("out", "self"))
        assert out == counts[:, rank].sum()
        assert sum(isinstance(s, NodeBarrier) for s in steps) == 2
        assert not any(isinstance(s, Exchange) and s.phase == "node" for s in steps)


def test_flat_and_degenerate_layouts():
    counts = _counts(4, 5)
    flat = rank_schedule(Layout([0, 0, 1, 1]), counts, 1, "flat")
    assert [type(s) for s in flat][0] is Exchange and flat[0].phase == "flat"
    assert flat[0].sends == tuple((d, int(counts[1, d])) for d in range(4) if d != 1 and counts[1, d])
    for ids in ([0] * 4, [0, 1, 2, 3]):
        assert all(not isinstance(s, Exchange) or s.phase == "flat"
                   for s in rank_schedule(Layout(ids), counts, 0, "hier"))


def test_bad_arguments():
    layout = Layout([0, 0, 1, 1])
    with pytest.raises(ValueError, match="shape"):
        rank_schedule(layout, np.zeros((3, 3)), 0)
    with pytest.raises(ValueError, match="algorithm"):
        rank_schedule(layout, np.zeros((4, 4)), 0, "ring")


def test_planner_refuses_arrays_that_do_not_fit_the_layout():
    """The planner reads its inputs through pointers: a wrong dtype, length or shape raises, never
    reads past an array."""
    pl = Layout([0, 0, 1, 1]).planner(0)
    c, node = np.full(4, 8, np.int64), np.full((2, 4), 8, np.int64)
    for bad, what in [((c.astype(np.int32), c, c, c, node), "send counts"), ((c, c[:3], c, c, node), "send displs"),
                      ((c, c, c, np.full(8, 8, np.int64)[::2], node), "receive displs"),
                      ((c, c, c, c, node[:1]), "node counts"), ((c, c, c, c, node.T.copy()), "do not match")]:
        with pytest.raises(ValueError, match=what):
            pl.plan(0, *bad)
