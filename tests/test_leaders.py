"""Multi-leader's planner alone (no MPI): its programs, run by a numpy stand-in for the runner on
every rank of a layout, move every byte where a flat all-to-all does, on any layout and leader count."""
import numpy as np
import pytest
from support import VIRTUAL_LAYOUTS, layouts, node_of

from hxmpi.comm.plan import (ALGORITHM, NODE_PHASES, BarrierStep, CopyStep, ExchangeStep, Layout, check_leaders,
                             exclusive_cumsum, program, program_steps)

LEADERS = ALGORITHM["hier_leaders"]


def _counts(p, seed):
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 40, (p, p))
    counts[rng.random((p, p)) < 0.3] = 0
    return counts.astype(np.int64)


def _programs(layout, counts, leaders):
    out = {}
    for rank in range(layout.size):
        sc, rc = counts[rank].copy(), np.ascontiguousarray(counts[:, rank])
        out[rank] = program(LEADERS, (sc, exclusive_cumsum(sc), rc, exclusive_cumsum(rc)),
                            layout.planner_for(rank, LEADERS, leaders), NODE_PHASES["shm"],
                            layout.node_counts(LEADERS, counts, rank), leaders).detach()
    return out


def _run(layout, counts, leaders):
    """Every rank's program, step by step in lockstep between the node barriers, on one window per
    node; returns each rank's receive buffer."""
    p = layout.size
    send = {r: np.random.default_rng(r).integers(0, 256, int(counts[r].sum()), dtype=np.uint8) for r in range(p)}
    recv = {r: np.zeros(int(counts[:, r].sum()), dtype=np.uint8) for r in range(p)}
    progs = _programs(layout, counts, leaders)
    steps = {r: list(program_steps(progs[r])) for r in range(p)}
    window = [np.zeros(max(progs[int(m[0])].stage_bytes, 1), dtype=np.uint8) for m in layout.members]
    sizes = {progs[int(r)].stage_bytes for m in layout.members for r in m}
    assert len({progs[r].stage_bytes for r in layout.members[0]}) == 1 and sizes
    bufs = lambda r, name: {"send": send[r], "recv": recv[r], "stage": window[layout.node_of[r]]}[name]  # noqa: E731
    at = {r: 0 for r in range(p)}
    while any(at[r] < len(steps[r]) for r in range(p)):
        posted = {}
        for r in range(p):  # each rank up to its next barrier
            while at[r] < len(steps[r]) and not isinstance(steps[r][at[r]], BarrierStep):
                st = steps[r][at[r]]
                if isinstance(st, CopyStep):
                    src, dst = bufs(r, st.src), bufs(r, st.dst)
                    for a, b, n in zip(st.src_off, st.dst_off, st.length):
                        dst[b:b + n] = src[a:a + n]
                else:
                    assert isinstance(st, ExchangeStep) and st.comm == int(layout.local_of[r]) < leaders
                    posted[r] = st
                at[r] += 1
            at[r] += 1  # the barrier
        for r, st in posted.items():  # the leaders' exchanges: lane l's member on node m is position m
            lane = int(layout.local_of[r])
            for m in range(layout.num_nodes):
                peer = int(layout.members[m][lane])
                pst = posted[peer]
                me = int(layout.node_of[r])
                n, off = int(st.recv_counts[m]), int(st.recv_displs[m])
                assert int(pst.send_counts[me]) == n
                src = bufs(peer, pst.src)
                snap = src[int(pst.send_displs[me]):int(pst.send_displs[me]) + n].copy()
                bufs(r, st.dst)[off:off + n] = snap
    return send, recv


def _flat(counts, send):
    p = counts.shape[0]
    out = {}
    for d in range(p):
        parts = []
        for s in range(p):
            start = int(counts[s, :d].sum())
            parts.append(send[s][start:start + int(counts[s, d])])
        out[d] = np.concatenate(parts) if parts else np.zeros(0, np.uint8)
    return out


@pytest.mark.parametrize("size", (4, 7, 8))
@pytest.mark.parametrize("name", VIRTUAL_LAYOUTS)
def test_every_leader_count_moves_what_flat_moves(name, size):
    layout = Layout(node_of(layouts(size)[name], size))
    if not layout.hier_possible:
        pytest.skip("no hierarchy: multi-leader runs flat")
    counts = _counts(layout.size, size)
    for k in range(1, layout.max_leaders + 1):
        send, recv = _run(layout, counts, k)
        want = _flat(counts, send)
        for r in range(layout.size):
            assert np.array_equal(recv[r], want[r]), (name, size, k, r)


def test_a_node_sends_one_message_per_leader_and_node():
    layout = Layout(np.repeat(np.arange(3), 4))
    counts = _counts(12, 1) + 1
    for k in (1, 2, 4):
        progs = _programs(layout, counts, k)
        for r in range(12):
            xs = [st for st in program_steps(progs[r]) if isinstance(st, ExchangeStep)]
            barriers = sum(isinstance(st, BarrierStep) for st in program_steps(progs[r]))
            assert barriers == 3
            if layout.local_of[r] < k:
                assert len(xs) == 1 and xs[0].src == xs[0].dst == "stage"
                assert np.count_nonzero(xs[0].send_counts) == 2  # the two other nodes
            else:
                assert xs == []


def test_bad_leader_counts():
    layout = Layout([0, 0, 1, 1, 1])
    assert check_leaders(5, layout.max_leaders) == 2  # above the smallest node acts as it
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="leaders must be an integer >= 1"):
            check_leaders(bad, 2)
    pl = layout.planner_for(0, LEADERS, 2)
    ones = np.ones(5, dtype=np.int64)
    with pytest.raises(ValueError, match="node counts must be"):
        pl.plan(NODE_PHASES["shm"], ones, ones, ones, ones, np.ones((2, 5), dtype=np.int64))
    with pytest.raises(ValueError, match="MODE_SHM only"):
        pl.plan(NODE_PHASES["mpi"], ones, ones, ones, ones, np.ones((2, 10), dtype=np.int64))
