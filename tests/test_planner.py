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
    """Every byte a rank receives is copied once into its receive buffer, but on a node of one
    rank, whose lanes receive there themselves (its own block is still copied)."""
    layout = Layout(node_of(layouts(7)["irregular_3_3_1"], 7))
    counts = _counts(7, 4)
    for rank in range(7):
        steps = rank_schedule(layout, counts, rank, "hier", "shm")
        out = sum(s.nbytes for s in steps if isinstance(s, Copy) and s.what in ("out", "self"))
        alone = len(layout.members[layout.node_of[rank]]) == 1
        assert out == (counts[rank, rank] if alone else counts[:, rank].sum())
        assert sum(isinstance(s, NodeBarrier) for s in steps) == 2
        assert not any(isinstance(s, Exchange) and s.phase == "node" for s in steps)


def test_flat_and_degenerate_layouts():
    counts = _counts(4, 5)
    flat = rank_schedule(Layout([0, 0, 1, 1]), counts, 1, "flat")
    assert counts[1, 1] and flat[0] == Copy(int(counts[1, 1]), "self")  # MPI copies a rank's own block first
    assert [type(s) for s in flat[1:]] == [Exchange] and flat[1].phase == "flat"
    assert flat[1].sends == tuple((d, int(counts[1, d])) for d in range(4) if d != 1 and counts[1, d])
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


def _program_of(layout, counts, rank, algorithm, node_phase, radix=2):
    from hxmpi.comm.plan import ALGORITHM, NODE_PHASES, exclusive_cumsum, program
    sc, rc = counts[rank].astype(np.int64), np.ascontiguousarray(counts[:, rank]).astype(np.int64)
    members = layout.members[layout.node_of[rank]]
    return program(ALGORITHM[algorithm], (sc, exclusive_cumsum(sc), rc, exclusive_cumsum(rc)), layout.planner(rank),
                   NODE_PHASES[node_phase], np.ascontiguousarray(counts[:, members].T).astype(np.int64), radix)


def _same_steps(a, b) -> bool:
    from dataclasses import fields
    return len(a) == len(b) and all(
        type(x) is type(y) and all(np.array_equal(getattr(x, f.name), getattr(y, f.name)) for f in fields(x))
        for x, y in zip(a, b))


@pytest.mark.parametrize("node_phase", ["shm", "mpi"])
@pytest.mark.parametrize("name", VIRTUAL_LAYOUTS)
def test_hierarchical_programs_take_the_steps_in_one_order(name, node_phase):
    """Every rank's program: pack (only where its blocks are not grouped by node), its own block,
    then with shm its blocks for its node into the window, every served lane's exchange posted
    together (its own lane sends, lanes it stands in for only receive), barrier, copy out,
    barrier; with mpi the lanes, repack, own blocks, copy out, the node's exchange, unpack. The
    copies move what ``copied`` says, and a detached program is the same program."""
    from hxmpi.comm.plan import BarrierStep, CopyStep, ExchangeStep, StepProgram, program_steps
    layout = Layout(node_of(layouts(7)[name], 7))
    if not layout.hier_possible:
        pytest.skip("no hierarchy: hier runs flat")
    counts = _counts(7, 9)
    for rank in range(7):
        prog = _program_of(layout, counts, rank, "hier_pairwise", node_phase)
        steps = program_steps(prog)
        kinds = [s.what if isinstance(s, CopyStep) else "barrier" if isinstance(s, BarrierStep) else s.comm
                 for s in steps]
        if kinds[0] == "pack":
            kinds = kinds[1:]
        lanes = layout.served_lanes(rank)
        if node_phase == "shm":
            assert kinds == ["self", "own", *lanes, "barrier", "out", "barrier"]
        else:
            assert kinds == ["self", *lanes, "repack", "own", "out", "node", "unpack"]
        exchanges = [s for s in steps if isinstance(s, ExchangeStep)]
        assert [s.with_next for s in exchanges if s.comm != "node"] == [True] * (len(lanes) - 1) + [False]
        assert all(s.rounds == "pairwise" and not s.blocking for s in exchanges[:len(lanes)])
        assert all(not s.send_counts.any() for s in exchanges[1:len(lanes)])  # stand-ins only receive
        assert sum(s.nbytes for s in steps if isinstance(s, CopyStep)) == prog.copied
        kept, snapshot = prog.detach(), program_steps(StepProgram(prog.words.copy()))
        assert _same_steps(program_steps(kept), steps) and kept.nbytes <= prog.nbytes
        _program_of(layout, counts + 1, rank, "hier_pairwise", node_phase)  # the planner's next plan
        assert _same_steps(program_steps(kept), snapshot) and not _same_steps(program_steps(prog), snapshot)


def test_every_algorithm_is_a_planner_and_rounds():
    """The ``Algorithm`` of each name: its agreed code, planner, rounds; unknown names refused."""
    from hxmpi.comm.plan import ALGORITHM, ALGORITHM_CHOICES, ALGORITHMS, algorithm_of
    assert ALGORITHMS == ("flat", "bruck", "hier", "hier_pairwise", "hier_bruck", "hier_leaders")
    assert [ALGORITHM[a].code for a in ALGORITHMS] == [ALGORITHM_CHOICES.index(a) for a in ALGORITHMS]
    assert [a for a in ALGORITHMS if ALGORITHM[a].hierarchical] == ["hier", "hier_pairwise", "hier_bruck",
                                                                     "hier_leaders"]
    assert [a for a in ALGORITHMS if ALGORITHM[a].radixed] == ["bruck", "hier_bruck"]
    assert [a for a in ALGORITHMS if ALGORITHM[a].led] == ["hier_leaders"]
    assert ALGORITHM["hier_leaders"].planner == "leaders" and ALGORITHM["hier_leaders"].cpu_key == "hier"
    assert algorithm_of("hier") is ALGORITHM["hier"] and str(ALGORITHM["hier"]) == "hier"
    with pytest.raises(ValueError, match="algorithm must be one of"):
        algorithm_of("ring")


def test_flat_programs_and_the_simulators_phases():
    """A flat program is one blocking exchange on the world; the simulator posts a flat call as
    MPI decides, hxmpi's nonblocking lane and node phases linear, pairwise lanes by rounds."""
    from hxmpi.comm.plan import ExchangeStep, program_steps
    layout = Layout([0, 0, 1, 1])
    counts = _counts(4, 5)
    prog = _program_of(layout, counts, 1, "bruck", "shm", radix=3)
    (step,) = program_steps(prog)
    assert isinstance(step, ExchangeStep) and step.comm == "world" and step.rounds == "bruck" and step.radix == 3
    assert step.blocking and np.array_equal(step.send_counts, counts[1])
    schedules = {(s.phase, s.schedule) for algorithm in ("flat", "hier", "hier_pairwise")
                 for s in rank_schedule(layout, counts, 1, algorithm, "mpi") if isinstance(s, Exchange)}
    assert schedules == {("flat", ""), ("lane", "linear"), ("node", "linear"), ("lane", "pairwise")}


def test_a_degenerate_layout_runs_flat_by_one_rule():
    """``runs_as``: the hierarchical algorithms run flat without a hierarchy; the flat ones as
    themselves. The communicator, the model and the simulator all ask it (``Layout.runs``)."""
    from hxmpi.comm.plan import ALGORITHM, has_hierarchy, runs_as
    assert not has_hierarchy(1, 8) and not has_hierarchy(8, 1) and has_hierarchy(2, 2)
    for name, algo in ALGORITHM.items():
        assert runs_as(name, True) is algo
        assert runs_as(algo, False) is (ALGORITHM["flat"] if algo.hierarchical else algo)
    assert Layout([0, 0, 0]).runs("hier_bruck") is ALGORITHM["flat"]
    assert Layout([0, 0, 1, 1]).runs("hier_bruck") is ALGORITHM["hier_bruck"]
    with pytest.raises(ValueError, match="algorithm must be one of"):
        runs_as("ring", True)


def _execute(layout: Layout, counts: np.ndarray, programs: dict) -> dict:
    """Run every rank's step program on numpy buffers, as MPI would, in the most eager order the
    steps allow: a rank runs its copies and starts its exchanges at once, passes a node barrier
    once every rank of its node reached it, and a wait once every peer of its exchanges in flight
    started theirs, which is when their bytes land. A window byte read before it was written is
    caught: the window starts poisoned. Returns each rank's receive buffer."""
    from hxmpi.comm.plan import BarrierStep, CopyStep, ExchangeStep, WaitStep, program_steps
    p = layout.size
    rng = np.random.default_rng(11)
    send = {r: rng.integers(0, 256, int(counts[r].sum()), dtype=np.uint8) for r in range(p)}
    recv = {r: np.full(int(counts[:, r].sum()), 0xEE, np.uint8) for r in range(p)}
    window = {m: np.full(max(programs[int(layout.members[m][0])].stage_bytes, 1), 0xEE, np.uint8)
              for m in range(layout.num_nodes)}
    scratch = {r: np.zeros(max(programs[r].scratch_bytes, 1), np.uint8) for r in range(p)}
    bufs = lambda r, name: {"send": send[r], "recv": recv[r], "stage": window[int(layout.node_of[r])],  # noqa: E731
                            "scratch": scratch[r]}[name]
    steps = {r: program_steps(programs[r]) for r in range(p)}
    at, started, flying, barriers = dict.fromkeys(range(p), 0), {}, {r: [] for r in range(p)}, dict.fromkeys(range(p), 0)
    posted = dict.fromkeys(range(p), -1)  # the step each rank last started

    def peers_of(r, st):  # world ranks of an exchange's communicator, in its rank order
        return [int(x) for x in layout.comm_members(r, st.comm)]

    def land(r, st, k):  # the k-th exchange of r on st's communicator: every peer's bytes for r
        members = peers_of(r, st)
        me = members.index(r)
        for pos, peer in enumerate(members):
            pst = started[peer, st.comm, k]
            n, off = int(st.recv_counts[pos]), int(st.recv_displs[pos])
            a = int(pst.send_displs[me])
            bufs(r, st.dst)[off:off + n] = bufs(peer, pst.src)[a:a + n]

    def step(r) -> bool:
        st = steps[r][at[r]]
        if isinstance(st, CopyStep):
            src, dst = bufs(r, st.src), bufs(r, st.dst)
            for a, b, n in zip(st.src_off, st.dst_off, st.length):
                dst[b:b + n] = src[a:a + n]
        elif isinstance(st, ExchangeStep):
            if posted[r] != at[r]:  # started once, however often its wait is tried
                k = sum(1 for key in started if key[0] == r and key[1] == st.comm)
                started[r, st.comm, k] = st
                flying[r].append((st, k))
                posted[r] = at[r]
            if not st.in_flight and not st.with_next:  # waited for at once
                return step_wait(r)
        elif isinstance(st, WaitStep):
            return step_wait(r)
        else:  # a barrier: every rank of the node there
            node = layout.members[int(layout.node_of[r])]
            ready = all(at[q] < len(steps[q]) and isinstance(steps[q][at[q]], BarrierStep)
                        and barriers[q] == barriers[r] for q in node)
            if not ready:
                return False
            for q in node:
                barriers[q] += 1
                at[q] += 1
            return True
        at[r] += 1
        return True

    def step_wait(r) -> bool:
        if any((peer, st.comm, k) not in started for st, k in flying[r] for peer in peers_of(r, st)):
            return False
        for st, k in flying[r]:
            land(r, st, k)
        flying[r] = []
        at[r] += 1
        return True

    while any(at[r] < len(steps[r]) for r in range(p)):
        moved = False
        for r in range(p):
            while at[r] < len(steps[r]) and step(r):
                moved = True
        assert moved, "the programs deadlock"
    return recv


def _flat_reference(counts: np.ndarray, send_of) -> dict:
    p = counts.shape[0]
    sd = np.concatenate([np.zeros((p, 1), np.int64), np.cumsum(counts, axis=1)[:, :-1]], axis=1)
    return {d: np.concatenate([send_of(s)[sd[s, d]:sd[s, d] + counts[s, d]] for s in range(p)]) for d in range(p)}


@pytest.mark.parametrize("chunks", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", VIRTUAL_LAYOUTS)
def test_pipelined_node_phase_delivers_every_byte(name, size, chunks):
    """The pipelined node phase (linear lanes in chunks, each left in flight while the node copies
    the chunk before it out of the window): run on numpy buffers in the most eager order its steps
    allow, every rank's receive buffer equals the flat exchange's, with uneven and zero counts,
    one rank per node and one node; no rank reads a window byte before it landed."""
    from hxmpi.comm.plan import ExchangeStep, WaitStep, program_steps
    layout = Layout(node_of(layouts(size)[name], size))
    counts = _counts(layout.size, 21 + chunks)
    counts[:, 0] = 0  # a rank that receives nothing
    algo = "hier"
    programs = {r: layout.rank_program(r, algo, counts, "shm", chunks).detach() for r in range(layout.size)}
    got = _execute(layout, counts, programs)
    rng = np.random.default_rng(11)
    sends = [rng.integers(0, 256, int(counts[r].sum()), dtype=np.uint8) for r in range(layout.size)]
    want = _flat_reference(counts, lambda s: sends[s])
    for r in range(layout.size):
        assert got[r].tobytes() == want[r].tobytes(), f"rank {r}"
    if layout.hier_possible:
        steps = program_steps(programs[0])
        waits = sum(isinstance(st, WaitStep) for st in steps)
        flying = sum(isinstance(st, ExchangeStep) and st.in_flight for st in steps)
        runs = min(chunks, layout.max_node_size)  # a chunk is a group of a node's ranks
        assert waits == flying == (runs if runs > 1 else 0)


@pytest.mark.parametrize("nodes", [[0, 0, 1, 1, 2], [0, 0, 0, 1, 1, 1, 2], [0, 1, 1, 1, 1]])
def test_no_more_chunks_run_than_the_largest_node_has_ranks(nodes):
    """Chunks beyond the largest node's ranks would be empty on every lane and still cost a wait
    and a node barrier each: every rank's program for more chunks is the one for as many chunks
    as the largest node has ranks, and the cost model offers no more."""
    from hxmpi.comm.costmodel import settings_of
    from hxmpi.comm.plan import WaitStep, program_steps
    layout = Layout(nodes)
    gmax = layout.max_node_size
    counts = _counts(layout.size, 5)
    for r in range(layout.size):
        capped = layout.rank_program(r, "hier", counts, "shm", gmax).detach()
        for chunks in range(gmax + 1, 9):
            asked = layout.rank_program(r, "hier", counts, "shm", chunks).detach()
            assert np.array_equal(asked.words, capped.words), (r, chunks)
        assert sum(isinstance(st, WaitStep) for st in program_steps(capped)) == gmax
    assert max(settings_of("hier", layout.node_sizes)) == gmax


@pytest.mark.parametrize("chunks", [1, 4])
@pytest.mark.parametrize("shape", [(4, 4), (3, 5)])
def test_blocks_grouped_by_node_are_sent_in_place(shape, chunks):
    """Where a rank's blocks for each other node lie one after another in its send buffer (nodes
    of consecutive ranks, an inner node's own blocks between them), the lanes send them from there:
    no pack, and each byte is copied once on each side of the window (self block, own node's
    blocks into it, every block out of it, but those a lane received into the receive buffer
    itself). Where they do not (ranks dealt round-robin to nodes), they are packed first: one more
    copy of every byte for another node."""
    from hxmpi.comm.plan import CopyStep, ExchangeStep, program_steps
    n, g = shape
    p, b = n * g, 24
    counts = np.full((p, p), b, dtype=np.int64)
    for nodes, packs in ((np.repeat(np.arange(n), g), False), (np.arange(p) % n, True)):
        layout = Layout(nodes)
        for r in range(p):
            steps = program_steps(layout.rank_program(r, "hier", counts, "shm", chunks).detach())
            packed = [st for st in steps if isinstance(st, CopyStep) and st.what == "pack" and st.nbytes]
            assert bool(packed) == packs, (r, nodes)
            copied = sum(st.nbytes for st in steps if isinstance(st, CopyStep))
            direct = sum(int(st.recv_counts.sum()) for st in steps if isinstance(st, ExchangeStep) and st.dst == "recv")
            assert copied + direct == b * (p + g - 1) + (b * (p - g) if packs else 0), (r, nodes)


@pytest.mark.parametrize("chunks", [1, 3])
def test_a_node_of_one_rank_receives_into_the_receive_buffer(chunks):
    """A node of one rank receives its lanes' segments straight into its receive buffer: only its
    own block is copied."""
    from hxmpi.comm.plan import CopyStep, ExchangeStep, program_steps
    layout = Layout([0, 0, 0, 1, 2, 2])
    counts = np.full((6, 6), 40, dtype=np.int64)
    steps = program_steps(layout.rank_program(3, "hier", counts, "shm", chunks).detach())
    assert sum(int(st.recv_counts.sum()) for st in steps if isinstance(st, ExchangeStep) and st.dst == "recv") == 40 * 5
    assert sum(st.nbytes for st in steps if isinstance(st, CopyStep)) == 40


@pytest.mark.parametrize("shape", [(4, 4), (3, 2)])
def test_with_a_chunk_per_rank_the_last_chunk_lands_in_the_receive_buffer(shape):
    """With one chunk per rank of the node, each rank's own lane carries its blocks alone in the
    last chunk and receives them straight into the receive buffer: the last chunk leaves nothing
    to copy out of the window, so nothing trails the wire."""
    from hxmpi.comm.plan import CopyStep, ExchangeStep, program_steps
    n, g = shape
    layout = Layout(np.repeat(np.arange(n), g))
    counts = np.full((n * g, n * g), 40, dtype=np.int64)
    for r in range(n * g):
        steps = program_steps(layout.rank_program(r, "hier", counts, "shm", g).detach())
        direct = [st for st in steps if isinstance(st, ExchangeStep) and st.dst == "recv"]
        assert sum(int(st.recv_counts.sum()) for st in direct) == 40 * (n - 1), r
        assert [st for st in steps if isinstance(st, CopyStep) and st.what == "out"][-1].nbytes == 0, r
