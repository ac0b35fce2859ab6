"""Bruck (every radix) and pairwise byte all-to-alls: bytes equal comm.Alltoallv's, on the world and on
sub-communicators, irregular counts, zeros, repeated runs (learned lengths) and the large-count path."""
import numpy as np
import pytest
from mpi4py import MPI

from hxmpi.comm.bruck import Bruck, Pairwise, bruck_rounds, check_radix
from hxmpi.comm.msgspec import Side

pytestmark = pytest.mark.mpi

PATTERNS = ("irregular", "zeros", "one_sender", "uniform", "sparse")


def count_matrix(size: int, pattern: str, seed: int = 0) -> np.ndarray:
    """counts[src, dst] in bytes, the same on every rank."""
    rng = np.random.default_rng(seed + size)
    if pattern == "irregular":
        return rng.integers(0, 40, size=(size, size)).astype(np.int64)
    if pattern == "zeros":
        return np.zeros((size, size), dtype=np.int64)
    if pattern == "one_sender":
        m = np.zeros((size, size), dtype=np.int64)
        m[size - 1] = 1 + np.arange(size)
        return m
    if pattern == "uniform":
        return np.full((size, size), 8, dtype=np.int64)
    m = rng.integers(1, 300, size=(size, size)).astype(np.int64)
    return m * (rng.random((size, size)) < 0.3)


def buffers(comm, counts: np.ndarray, salt: int = 0):
    """Send view filled with bytes naming (src, dst, offset), gaps between blocks, and receive views."""
    q = comm.rank
    sc, rc = counts[q].copy(), np.ascontiguousarray(counts[:, q])
    sd = np.concatenate([[0], np.cumsum(sc + 3)[:-1]]).astype(np.int64)  # 3-byte gaps
    rd = np.concatenate([[0], np.cumsum(rc[::-1])[:-1]]).astype(np.int64)[::-1].copy()  # reversed order
    sview = np.full(int(sd[-1] + sc[-1] + 3) if len(sc) else 1, 0xEE, dtype=np.uint8)
    for dst in range(comm.size):
        sview[sd[dst]:sd[dst] + sc[dst]] = (q * 31 + dst * 7 + salt + np.arange(sc[dst])) % 251
    nr = int(rc.sum()) + 5
    return sview, sc, sd, np.zeros(nr, np.uint8), rc, rd, np.zeros(nr, np.uint8)


def reference(comm, sview, sc, sd, ref, rc, rd):
    comm.Alltoallv([sview, (sc.astype(np.intc), sd.astype(np.intc)), MPI.BYTE],
                   [ref, (rc.astype(np.intc), rd.astype(np.intc)), MPI.BYTE])


@pytest.mark.parametrize("pattern", PATTERNS)
def test_every_radix_equals_alltoallv(comm, pattern):
    counts = count_matrix(comm.size, pattern)
    for radix in list(range(2, comm.size + 1)) + [comm.size + 3]:
        for cls in (Bruck, Pairwise):
            sview, sc, sd, rview, rc, rd, ref = buffers(comm, counts)
            ex = cls(comm, Side(sview, sc, sd), Side(rview, rc, rd), False, radix=radix)
            ex.run()
            reference(comm, sview, sc, sd, ref, rc, rd)
            assert np.array_equal(rview, ref), (cls.__name__, radix)
            ex.free()


def test_repeated_runs_use_learned_lengths_and_fresh_data(comm):
    """Second and third runs send no headers; they must still carry the buffers' current bytes."""
    counts = count_matrix(comm.size, "irregular", seed=5)
    sview, sc, sd, rview, rc, rd, ref = buffers(comm, counts)
    ex = Bruck(comm, Side(sview, sc, sd), Side(rview, rc, rd), radix=2)
    for salt in (0, 17, 99):
        sview[:] = buffers(comm, counts, salt)[0]
        assert ex.start() == MPI.REQUEST_NULL
        reference(comm, sview, sc, sd, ref, rc, rd)
        assert np.array_equal(rview, ref), salt
        assert ex.learned
    ex.free()


@pytest.mark.parametrize("radix", [2, 3, 4])
def test_sub_communicators_like_lanes(comm, radix):
    """Two interleaved sub-communicators run one after another (as a rank serving two lanes would)."""
    subs = [comm.Split(comm.rank % 2, comm.rank), comm.Split(0, comm.rank)]
    for sub in subs:
        counts = count_matrix(sub.size, "sparse", seed=radix)
        sview, sc, sd, rview, rc, rd, ref = buffers(sub, counts)
        ex = Bruck(sub, Side(sview, sc, sd), Side(rview, rc, rd), radix=radix)
        ex.start().Wait()
        reference(sub, sview, sc, sd, ref, rc, rd)
        assert np.array_equal(rview, ref)
        ex.free()
    for sub in subs:
        sub.Free()


def test_large_count_path_falls_back_to_alltoallw(comm, large_count_path):
    counts = count_matrix(comm.size, "sparse", seed=2)
    for cls in (Bruck, Pairwise):
        sview, sc, sd, rview, rc, rd, ref = buffers(comm, counts)
        ex = cls(comm, Side(sview, sc, sd), Side(rview, rc, rd), True, radix=2)
        assert ex.fallback is not None and ex.init() is None
        ex.start().Wait()
        reference(comm, sview, sc, sd, ref, rc, rd)
        assert np.array_equal(rview, ref)
        ex.free()


def test_bad_radix_fails_on_every_rank(comm):
    sview, sc, sd, rview, rc, rd, _ = buffers(comm, count_matrix(comm.size, "uniform"))
    for bad in (1, 0, 2.5, True, "2"):
        with pytest.raises(ValueError, match="radix must be an integer >= 2"):
            Bruck(comm, Side(sview, sc, sd), Side(rview, rc, rd), radix=bad)


def test_receive_count_that_disagrees_is_named(comm):
    """The last rank expects one byte more from rank 0 than rank 0 sends: it raises naming both."""
    if comm.size < 2:
        pytest.skip("needs two ranks")
    counts = count_matrix(comm.size, "uniform")
    sview, sc, sd, rview, rc, rd, _ = buffers(comm, counts)
    last = comm.size - 1
    if comm.rank == last:
        rc = rc.copy()
        rc[0] += 1
        rd = np.concatenate([[0], np.cumsum(rc)[:-1]]).astype(np.int64)
        rview = np.zeros(int(rc.sum()), np.uint8)
    ex = Bruck(comm, Side(sview, sc, sd), Side(rview, rc, rd), radix=2)
    if comm.rank == last:
        with pytest.raises(ValueError, match=f"rank {last} expects 9 B from rank 0, which sent 8 B"):
            ex.run()
    else:
        ex.run()
    ex.free()


def test_rounds_cover_every_slot_digit():
    """Pure: slot i moves once per non-zero base-k digit; distances are distinct and below P."""
    for p in (1, 2, 5, 8, 13):
        for k in range(2, p + 2):
            rounds = bruck_rounds(p, k)
            moves = np.zeros(p, dtype=int)
            dists = [d for group in rounds for d, _ in group]
            assert len(set(dists)) == len(dists) and all(0 < d < p for d in dists)
            for group in rounds:
                for _, slots in group:
                    moves[slots] += 1
            kk = check_radix(k, p)
            expect = [sum(1 for x in range(8) if (i // kk ** x) % kk) for i in range(p)]
            assert moves.tolist() == expect, (p, k)


LAYOUTS = {  # virtual nodes of the world, regular and not (missing lanes, round-robin)
    "regular": lambda p: [r // 2 for r in range(p)],
    "irregular_3_3_1": lambda p: [min(r // 3, 2) for r in range(p)],
    "round_robin_3": lambda p: [(r * 7) % 3 for r in range(p)],
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("node_phase", ["shm", "mpi"], ids=["shm-phase", "mp-phase"])
def test_programs_with_round_based_exchanges_in_every_runner(comm, layout, node_phase):
    """Hierarchical programs with Bruck (radix 2 and 3) and pairwise lanes, and flat programs of
    Bruck and pairwise rounds, equal Alltoallv: run by the compiled runner, walked in Python, and
    persistent (three Starts with fresh data)."""
    from hxmpi import HierComm
    from hxmpi.comm.plan import Algorithm, Rounds, program
    from hxmpi.comm.runs import NodeWindow, Run, Scratch

    hc = HierComm(comm, node_of=LAYOUTS[layout](comm.size), node_phase=node_phase)
    counts = count_matrix(comm.size, "irregular", seed=11)
    rc_node = np.ascontiguousarray(counts[:, hc._engine.members].T)
    kinds = [(Rounds.ROUNDS_BRUCK, 2), (Rounds.ROUNDS_BRUCK, 3), (Rounds.ROUNDS_PAIRWISE, 0)]
    for persistent, runner in ((False, hc._engine.runner), (False, None), (True, None)):
        for rounds, radix in kinds:
            for planner in ("lanes", "flat"):
                if planner == "lanes" and not hc._engine.hier_possible:
                    continue
                algorithm = Algorithm(f"{planner}_{int(rounds)}", planner, rounds)
                sview, sc, sd, rview, rc, rd, ref = buffers(comm, counts)
                s, r = Side(sview, sc, sd), Side(rview, rc, rd)
                prog = program(algorithm, (sc, sd, rc, rd), hc._engine.planner, hc._engine.mode, rc_node, radix)
                scratch, window = hc._engine.scratch, hc._engine.window
                if persistent:  # a persistent run owns its program, scratch and window
                    prog, scratch = prog.detach(), Scratch()
                    window = NodeWindow(hc.topology.intra) if hc._engine.window else None
                run = Run(prog, algorithm, radix, s, r, False, hc._engine.comms, scratch, window, persistent, runner)
                for salt in ((0, 5, 9) if persistent else (0,)):
                    sview[:] = buffers(comm, counts, salt)[0]
                    if persistent:
                        run.start()
                        run.wait()
                    else:
                        run.run()
                    reference(comm, sview, sc, sd, ref, rc, rd)
                    assert np.array_equal(rview, ref), (algorithm, persistent, runner, salt)
                run.free()
                if persistent and window is not None:
                    window.free()
    hc.free()


@pytest.mark.parametrize("radix", [2, 3, 5])
def test_planned_rounds_are_the_rounds_sent(comm, radix):
    """hxmpi.comm.plan.bruck_messages (what the simulator replays) names the peers and bytes Bruck moves."""
    from hxmpi.sim.schedule import bruck_messages
    counts = count_matrix(comm.size, "irregular", seed=radix)
    sview, sc, sd, rview, rc, rd, _ = buffers(comm, counts)
    ex = Bruck(comm, Side(sview, sc, sd), Side(rview, rc, rd), radix=radix)
    ex.run()
    planned = bruck_messages(counts, comm.rank, radix, header=False)
    once, bounds = ex.once, ex.once.round_start
    got = [[(int(once.dest[m]), int(once.src[m]), int(once.nbytes[m])) for m in range(bounds[x], bounds[x + 1])]
           for x in range(bounds.shape[0] - 1)]
    assert got == [[(to, frm, recv) for to, frm, _, recv in group] for group in planned]
    ex.free()


def test_compiled_first_run_refuses_bad_buffers_before_sending(comm):
    """``BruckOnce.run`` checks its buffers' type and its sides' arrays before any message: a
    non-byte receive buffer or counts of the wrong length raise ValueError naming the problem
    (on every rank here, so nobody waits), and a good run after them is byte-exact."""
    counts = count_matrix(comm.size, "irregular", seed=3)
    sview, sc, sd, rview, rc, rd, ref = buffers(comm, counts)
    ex = Bruck(comm, Side(sview, sc, sd), Side(rview, rc, rd), radix=2)
    with pytest.raises(ValueError, match="contiguous uint8"):
        ex.once.run(sview, rview.view(np.int8), sc, sd, rc, rd)
    with pytest.raises(ValueError, match=f"send counts must be a contiguous int64 array of {comm.size} items"):
        ex.once.run(sview, rview, sc[:-1], sd, rc, rd)
    ex.run()
    reference(comm, sview, sc, sd, ref, rc, rd)
    assert np.array_equal(rview, ref)
    ex.free()
