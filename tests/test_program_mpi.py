"""One step program behind every runner and the simulator: the copies and messages the compiled
runner executes (noted by its trace) are the copies and messages ``rank_schedule`` replays, on
regular, 3+3+1, round-robin and 4+1+2 layouts, for every algorithm and both node phases, one-shot
(the compiled miss path and the general path) and persistent; the exchange stays byte-equal to
``comm.Alltoallv``."""
import numpy as np
import pytest
from mpi4py import MPI
from support import layouts

from hxmpi import ExchangeError, HierComm
from hxmpi.comm.plan import (
    ALGORITHMS,
    BarrierStep,
    CopyStep,
    Layout,
    StepProgram,
    WaitStep,
    algorithm_of,
    program_steps,
)
from hxmpi.sim.schedule import (
    Copy,
    Exchange,
    NodeBarrier,
    Wait,
    bruck_steps,
    lane_counts,
    program_schedule,
    rank_schedule,
)

pytestmark = pytest.mark.mpi

LAYOUTS = ("regular", "irregular_3_3_1", "round_robin_3", "shuffled")
RADIX = 3


def _counts(size: int, pattern: str) -> np.ndarray:
    """Elements (float64) src sends dst, the same on every rank."""
    rng = np.random.default_rng(17 + size)
    if pattern == "sparse":
        return rng.integers(1, 9, (size, size)) * (rng.random((size, size)) < 0.3)
    return rng.integers(0, 6, (size, size))


def _world_of(hc, comm_code, peer: int) -> int:
    """World rank of ``peer`` of an exchange's communicator, from the communicators themselves."""
    group = hc._engine.comms[comm_code].Get_group()
    world = hc.comm.Get_group()
    try:
        return MPI.Group.Translate_ranks(group, [peer], world)[0]
    finally:
        group.Free()
        world.Free()


def _executed(hc, layout: Layout, prog: StepProgram, events: np.ndarray, counts: np.ndarray) -> list:
    """What the runner executed, in the simulator's terms: each copy its bytes, each barrier, and
    each exchange the nonzero messages it gave MPI or posted (peers mapped to world ranks; a
    block to itself a copy first; linear exchanges posted together as one, pairwise ones each in
    turn). A Bruck exchange's
    rounds carry others' blocks: noted as run, they are expanded as the simulator does (its
    rounds are ``test_bruck_mpi``'s)."""
    me = hc.comm.rank
    steps, group, by_step = [], [], {}
    for step, peer, sent, received in events.tolist():
        by_step.setdefault(step, []).append((peer, sent, received))
    program = program_steps(prog)
    assert list(events[:, 0]) == sorted(events[:, 0]), "the runner ran the steps in order"
    for i, st in enumerate(program):
        noted = by_step.get(i, [])
        if isinstance(st, CopyStep):
            assert noted == [(-1, st.nbytes, st.nbytes)]
            steps.append(Copy(st.nbytes, st.what))
            continue
        if isinstance(st, BarrierStep):
            assert noted == [(-1, 0, 0)]
            steps.append(NodeBarrier())
            continue
        if isinstance(st, WaitStep):
            steps.append(Wait())
            continue
        if st.rounds == "bruck":
            assert noted == [(-2, int(st.send_counts.sum()), int(st.recv_counts.sum()))]
            members = [_world_of(hc, st.comm, k) for k in range(st.send_counts.shape[0])]
            matrix = counts if st.comm == "world" else lane_counts(layout, counts, st.comm)
            steps += bruck_steps(matrix, members, members.index(me), st.radix, learned=False)
            continue
        sends, recvs = [], []
        for peer, sent, received in noted:
            world = _world_of(hc, st.comm, peer)
            if world == me:
                assert sent == received
                steps.append(Copy(sent, "self"))
                continue
            sends += [(world, sent)] if sent else []
            recvs += [(world, received)] if received else []
        if st.rounds == "pairwise":  # posted round by round; the simulator lists them by peer
            members = [_world_of(hc, st.comm, k) for k in range(st.send_counts.shape[0])]
            sends, recvs = (sorted(pairs, key=lambda m: members.index(m[0])) for pairs in (sends, recvs))
        group.append((sends, recvs, st))
        if st.with_next and st.rounds != "pairwise":  # pairwise exchanges run one after another
            continue
        phase = "flat" if st.comm == "world" else "node" if st.comm == "node" else "lane"
        schedule = "pairwise" if st.rounds == "pairwise" else "" if st.blocking and len(group) == 1 else "linear"
        members = tuple(_world_of(hc, st.comm, k) for k in range(st.send_counts.shape[0])) if len(group) == 1 else ()
        steps.append(Exchange(phase, tuple(m for g in group for m in g[0]), tuple(m for g in group for m in g[1]),
                              schedule, members, st.in_flight))
        group = []
    return [s for s in steps if not isinstance(s, Copy) or s.nbytes]


@pytest.mark.parametrize("node_phase, chunks", [("shm", 1), ("shm", 3), ("mpi", 1)])
@pytest.mark.parametrize("layout_name", LAYOUTS)
def test_the_runner_executes_what_the_simulator_replays(comm, layout_name, node_phase, chunks):
    try:
        # No plan cache: every call is planned and run anew (a cached pattern may run a bound run).
        # Three chunks: "hier"'s pipelined node phase, its lane exchanges in flight beside copies.
        hc = HierComm(comm, node_phase=node_phase, radix=RADIX, cache_entries=0, chunks=chunks,
                      **layouts(comm.size)[layout_name])
    except ExchangeError:
        if node_phase != "shm":
            raise
        pytest.skip("a node's ranks span hosts here, so there is no shared-memory phase")
    if hc._engine.runner is None:
        hc.free()
        pytest.skip("this MPI's handles cannot be passed from compiled code: no compiled runner")
    me, size = comm.rank, comm.size
    layout = Layout(hc.topology.node_of)
    events = np.zeros((64 * size + 64, 4), np.int64)
    for pattern in ("irregular", "sparse"):
        counts = _counts(size, pattern)
        sc, rc = counts[me].astype(np.int64), np.ascontiguousarray(counts[:, me]).astype(np.int64)
        sbuf = np.arange(sc.sum(), dtype=np.float64) + 1000 * me
        ref = np.zeros(rc.sum())
        comm.Alltoallv([sbuf, sc], [ref, rc])
        for algorithm in ALGORITHMS:
            if algorithm_of(algorithm).led and hc.node_phase != "shm":
                continue  # it needs the node window (refused on every rank: tests/test_agreement.py)
            # int64 counts take the compiled miss path (flat ones call MPI there, without the
            # runner); uint64 ones the general path, whose one-shot run the runner runs.
            for dtype in (np.int64, np.uint64):
                out = np.zeros_like(ref)
                hc._engine.runner.trace(events)
                hc.Alltoallv([sbuf, sc.astype(dtype)], [out, rc.astype(dtype)], algorithm=algorithm)
                noted, words = hc._engine.runner.traced, hc._engine.runner.traced_words
                hc._engine.runner.trace(None)
                assert out.tobytes() == ref.tobytes(), (pattern, algorithm, dtype)
                ran = hc.last_stats["algorithm"]
                if words is None:
                    assert dtype is np.int64 and not algorithm_of(ran).hierarchical, (algorithm, ran)
                    continue
                assert noted < events.shape[0]
                # multi-leader's leaders per node, the pipelined node phase's chunks, else the radix
                setting = hc.last_stats.get("leaders", hc.last_stats.get("chunks", RADIX))
                expected = rank_schedule(layout, counts * 8, me, ran, node_phase, setting, learned=False)
                got = _executed(hc, layout, StepProgram(words), events[:noted], counts * 8)
                assert got == expected, (pattern, algorithm, dtype)
            # A persistent request binds the same program (its Bruck lengths learned at the first Start).
            req = hc.Alltoallv_init([sbuf, sc], [out, rc], algorithm=algorithm)
            for _ in range(2):
                out.fill(0)
                req.Start()
                req.Wait()
                assert out.tobytes() == ref.tobytes(), (pattern, algorithm, "persistent")
            ran = hc.last_stats["algorithm"]
            replayed = rank_schedule(layout, counts * 8, me, ran, node_phase,
                                     hc.last_stats.get("leaders", hc.last_stats.get("chunks", RADIX)), learned=True)
            assert program_schedule(req._run.plan, layout, me, counts * 8, learned=True) == replayed
            req.Free()
    hc.free()
