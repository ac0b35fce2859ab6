"""One-shot calls: the one-Allreduce agreement and the agreed plan cache, against comm.Alltoallv."""
import sys

import numpy as np
import pytest
from mpi4py import MPI
from support import layouts

from hxmpi import ExchangeError, HierComm
from hxmpi.comm.msgspec import Side
from hxmpi.comm.plan import ALGORITHM, ALGORITHMS, exclusive_cumsum, program

pytestmark = pytest.mark.mpi

LAYOUTS = ["regular", "irregular", "round_robin", "irregular_3_3_1", "round_robin_3", "one_node", "real"]


@pytest.fixture(scope="module")
def cached():
    """HierComms per (layout, node phase) with a small plan cache (4 entries), so eviction is exercised."""
    comm = MPI.COMM_WORLD
    made = {}
    for name in LAYOUTS:
        for phase in ("shm", "mpi"):
            try:
                made[name, phase] = HierComm(comm, **layouts(comm.size)[name], node_phase=phase, cache_entries=4)
            except ExchangeError:  # shm where a node spans hosts: refused on every rank alike
                made[name, phase] = None
    yield made
    for hc in made.values():
        if hc is not None:
            hc.free()


def _made(comm, node_phase, **kw):
    """A HierComm of ``node_phase``; the test is skipped where "shm" is refused (a node's ranks
    span hosts, on the emulated cluster: refused on every rank alike)."""
    try:
        return HierComm(comm, node_phase=node_phase, **kw)
    except ExchangeError:
        if node_phase != "shm":
            raise
        pytest.skip("a node's ranks span hosts here, so there is no shared-memory phase")


def _hc(cached, layout, phase):
    hc = cached[layout, phase]
    if hc is None:
        pytest.skip("the ranks of a node share no memory here")
    return hc


def _case(comm, rng, dtype=np.float64):
    """Random counts of at least one element per pair, rank-dependent data, and the flat reference."""
    sc = rng.integers(1, 7, comm.size).astype(np.int64)
    rc = np.empty_like(sc)
    comm.Alltoall(sc, rc)
    sbuf = (rng.random(int(sc.sum())) * 1000).astype(dtype)
    ref = np.zeros(int(rc.sum()), dtype)
    comm.Alltoallv([sbuf, sc], [ref, rc])
    return sc, rc, sbuf, ref


def _mismatch(comm, case):
    """Counts where sender and receiver disagree (``case``), with the pair the error must name."""
    size, me = comm.size, comm.rank
    sc = np.full(size, 3, np.int64)
    rc = np.full(size, 3, np.int64)
    if case == "one_byte":          # rank 1 expects one byte more from rank 0
        if me == 1 % size:
            rc[0] += 1
        pair = (0, 1 % size)
    elif case == "cancelling":      # rank 0 sends one more to rank 1 and one less to rank 2
        if me == 0:
            sc[1 % size] += 1
            sc[2 % size] -= 1
        pair = (0, 1 % size)
    else:                           # "all_zeros": the last rank expects nothing from anyone
        if me == size - 1:
            rc[:] = 0
        pair = (0, size - 1)
    return sc, rc, pair


@pytest.mark.parametrize("case", ["one_byte", "cancelling", "all_zeros"])
@pytest.mark.parametrize("algorithm", ["flat", "hier"])
def test_count_mismatch_caught_on_every_rank(comm, cached, case, algorithm):
    if case == "cancelling" and comm.size < 3:
        pytest.skip("two pairs need three ranks")
    hc = _hc(cached, "irregular", "mpi")
    sc, rc, (src, dst) = _mismatch(comm, case)
    send = np.zeros(int(sc.sum()), np.uint8)
    recv = np.zeros(int(rc.sum()), np.uint8)
    for attempt in range(2):  # the second time a good call of the same shape came first (a cached slot)
        with pytest.raises(ExchangeError, match=rf"rank {src} sends \d+ B to rank {dst}, which expects \d+ B"):
            hc.Alltoallv([send, sc], [recv, rc], algorithm=algorithm)
        good = np.full(comm.size, 3, np.int64)
        hc.Alltoallv([np.zeros(3 * comm.size, np.uint8), good], [np.zeros(3 * comm.size, np.uint8), good],
                     algorithm=algorithm)


def test_validate_false_skips_only_the_pairwise_check(comm, cached):
    """validate=False still agrees on settings and local problems (so nothing hangs)."""
    hc = _hc(cached, "regular", "mpi")
    counts = np.full(comm.size, 2, np.int64)
    bad = counts.copy()
    if comm.rank == 0:
        bad[0] = -1
    with pytest.raises(ExchangeError, match="rank 0: .*negative"):
        hc.Alltoallv([np.zeros(2 * comm.size, np.uint8), bad], [np.zeros(2 * comm.size, np.uint8), counts],
                     validate=False)
    if comm.size > 1:
        with pytest.raises(ExchangeError, match="validate differs"):
            hc.Alltoallv([np.zeros(2 * comm.size, np.uint8), counts],
                         [np.zeros(2 * comm.size, np.uint8), counts], validate=comm.rank != 0)


@pytest.mark.parametrize("phase", ["shm", "mpi"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_one_shot_cached_and_persistent_are_byte_exact(comm, cached, layout, phase):
    hc = _hc(cached, layout, phase)
    rng = np.random.default_rng(11 + comm.rank)
    sc, rc, sbuf, ref = _case(comm, rng)
    out = np.full_like(ref, np.nan)
    states = []
    for call in range(4):  # miss, hit on new buffers, then the persistent run twice
        out.fill(np.nan)
        hc.Alltoallv([sbuf, sc], [out, rc], algorithm="hier")
        assert out.tobytes() == ref.tobytes(), f"call {call}"
        states.append(hc.last_stats["plan_cache"])
    possible = hc.topology.num_nodes > 1 and hc.topology.max_node_size > 1
    assert hc.last_stats["algorithm"] == ("hier" if possible else "flat")
    assert states[0] == "miss" and states[-1] == "hit", states
    other = np.full_like(ref, np.nan)  # the same counts into another buffer: the plan, bound anew
    hc.Alltoallv([sbuf, sc], [other, rc], algorithm="hier")
    assert other.tobytes() == ref.tobytes()
    assert hc.last_stats["plan_cache"] == "hit-rebound"
    with hc.Alltoallv_init([sbuf, sc], [out, rc], algorithm="hier") as req:
        for _ in range(2):
            out.fill(np.nan)
            req.Start()
            req.Wait()
            assert out.tobytes() == ref.tobytes()
        assert req._run.program() is not None  # Start and Wait ran the compiled program's two parts


@pytest.mark.parametrize("algorithm", ["flat", "hier", "bruck", "hier_pairwise", "hier_bruck"])
@pytest.mark.parametrize("phase", ["shm", "mpi"])
@pytest.mark.parametrize("layout", ["irregular", "round_robin_3", "one_node"])
def test_repeated_calls_run_the_compiled_path(comm, cached, layout, phase, algorithm):
    """Two patterns in turn, each on its own buffers: from each one's third call on, the compiled
    path (``csrc/_call.pyx``) finishes the call, byte-exact; Alltoall too."""
    hc = _hc(cached, layout, phase)
    rng = np.random.default_rng(21 + comm.rank)
    cases = [_case(comm, rng), _case(comm, rng, np.int32)]
    outs = [np.zeros_like(ref) for _, _, _, ref in cases]
    before = hc._engine.calls.compiled
    for call in range(5):
        for (sc, rc, sbuf, ref), out in zip(cases, outs):
            out.fill(0)
            hc.Alltoallv([sbuf, (sc, None)], [out, (rc, None)], algorithm=algorithm)
            assert out.tobytes() == ref.tobytes(), f"call {call}"
    assert hc._engine.calls.compiled - before == 2 * 3
    assert hc.last_stats["plan_cache"] == "hit"
    bound = [e.run for e in hc.plan_cache.entries.values() if e.run is not None]
    assert len(bound) >= 2 and all(run.program() is not None for run in bound)  # no Python between MPI calls
    send = np.arange(2 * comm.size, dtype=np.int64) + 100 * comm.rank
    recv, ref = np.zeros_like(send), np.zeros_like(send)
    comm.Alltoall(send, ref)
    before = hc._engine.calls.compiled
    for _ in range(4):
        recv.fill(0)
        hc.Alltoall(send, recv, algorithm=algorithm)
        assert recv.tobytes() == ref.tobytes()
    assert hc._engine.calls.compiled - before == 2


@pytest.mark.parametrize("algorithm", ["flat", "hier", "bruck", "hier_pairwise", "hier_bruck", "auto"])
@pytest.mark.parametrize("layout", ["irregular", "round_robin_3", "one_node"])
@pytest.mark.parametrize("node_phase", ["mpi", "shm"])
def test_new_patterns_run_the_compiled_miss_path(comm, layout, algorithm, node_phase):
    """A new count pattern every call, in every spec form the miss path reads (int64 and C int
    arrays, with and without a datatype): parsed, agreed and run in compiled code wherever the
    call runs flat or hier, byte-exact; a pattern that comes back still hits the plan cache."""
    hc = _made(comm, node_phase, **layouts(comm.size)[layout], cache_entries=4, radix=3)
    size, me = comm.size, comm.rank
    runs_here = algorithm != "auto"
    ran = "flat" if algorithm == "auto" or (algorithm.startswith("hier") and not hc.layout.hier_possible) else algorithm
    sbuf = np.arange(4 * size, dtype=np.float64) + 100 * me
    forms = [lambda b, c, d: [b, c], lambda b, c, d: [b, (c, d)], lambda b, c, d: [b, (c, d), MPI.DOUBLE],
             lambda b, c, d: (b, c.astype(np.intc), d.astype(np.intc), MPI.DOUBLE)]
    for call in range(8):
        counts = np.full(size, 2 + call % 3, np.int64)
        shift = 7 * call + 1  # receive blocks start further in: a pattern of its own
        out, ref = np.zeros(shift + counts.sum()), np.zeros(shift + counts.sum())
        displs = np.arange(size, dtype=np.int64) * counts[0]
        form = forms[call % 4]
        comm.Alltoallv(form(sbuf, counts, displs), form(ref, counts, displs + shift))
        specs = form(sbuf, counts, displs), form(out, counts, displs + shift)
        frames = _python_frames(lambda: hc.Alltoallv(*specs, algorithm=algorithm))
        assert out.tobytes() == ref.tobytes(), f"call {call}"
        assert hc.last_stats["plan_cache"] == "miss"
        if runs_here:  # kept by the cache (its first 2 x 4 misses) from what the compiled path read
            assert "keep_miss" in frames and not any(name.startswith("parse") for name in frames), frames
    if runs_here:
        assert hc._engine.calls.compiled_misses == 8 and hc.last_stats["algorithm"] == ran
        assert hc.last_stats.get("radix", 0) == (hc.radix if ran.endswith("bruck") else 0)
        # A miss past the ones the cache keeps (its first 2 x 4) runs with no Python frame but the entry's.
        late, late_ref = np.zeros(counts.sum() + 99), np.zeros(counts.sum() + 99)
        specs = [sbuf, counts], [late, (counts, displs + 99)]
        comm.Alltoallv(*specs[:1], [late_ref, (counts, displs + 99)])
        frames = _python_frames(lambda: hc.Alltoallv(*specs, algorithm=algorithm))
        assert frames == ["<lambda>", "Alltoallv"] and late.tobytes() == late_ref.tobytes()
        assert hc._engine.calls.compiled_misses == 9
        if not ran.startswith("hier"):
            assert hc.last_stats["flat"]["bytes"] == 8 * (2 + 7 % 3) * (size - 1)
        else:  # what crosses node boundaries: this rank's blocks to every rank of another node
            off = int(np.count_nonzero(hc._engine.node_of != hc._engine.node_of[me]))
            assert hc.last_stats["inter_node"]["bytes"] == 8 * (2 + 7 % 3) * off
        if ran.endswith("bruck") and size > 1:  # the compiled Bruck runs' arenas are counted
            held = hc.scratch_bytes
            assert held > 0
            wider = np.zeros(out.shape[0] + 1)
            hc.Alltoallv(form(sbuf, counts, displs), form(wider, counts, displs + shift + 1), algorithm=algorithm)
            assert hc.scratch_bytes == held  # a call of the same size reuses them
    out.fill(0)
    hc.Alltoallv([sbuf, counts], [out, (counts, displs + shift)], algorithm=algorithm)  # the last pattern again
    assert out.tobytes() == ref.tobytes() and hc.plan_cache.hits == 1
    hc.free()


@pytest.mark.parametrize("algorithm", ["flat", "hier", "bruck", "hier_pairwise", "hier_bruck"])
@pytest.mark.parametrize("node_phase", ["mpi", "shm"])
def test_a_rank_on_the_python_miss_path_matches_the_compiled_ones(comm, algorithm, node_phase):
    """Rank 0 passes its counts as int16 arrays, a form only the general reader takes, so its
    misses run in Python while the others' run compiled: the MPI calls of the two paths match (a
    miss of new patterns, byte-exact), and a kept pattern is then a hit everywhere."""
    hc = _made(comm, node_phase, ranks_per_node=2, cache_entries=4)
    size, me = comm.size, comm.rank
    sbuf = np.arange(3 * size, dtype=np.int32) + 1000 * me
    for call in range(5):
        counts = np.full(size, 1 + call % 3, np.int64)
        displs = np.arange(size, dtype=np.int64) * counts[0]
        out, ref = np.zeros(call + 3 * size, np.int32), np.zeros(call + 3 * size, np.int32)
        comm.Alltoallv([sbuf, counts, displs, MPI.INT], [ref, counts, displs + call, MPI.INT])
        if me == 0:
            spec = ([sbuf, counts.astype(np.int16), displs.astype(np.int16), MPI.INT],
                    [out, counts.astype(np.int16), (displs + call).astype(np.int16), MPI.INT])
        else:
            spec = ([sbuf, counts, displs, MPI.INT], [out, counts, displs + call, MPI.INT])
        hc.Alltoallv(*spec, algorithm=algorithm)
        assert out.tobytes() == ref.tobytes(), f"call {call}"
    assert hc._engine.calls.compiled_misses == (0 if me == 0 else 5)
    hc.Alltoallv(*spec, algorithm=algorithm)  # the last pattern, kept by every rank
    assert out.tobytes() == ref.tobytes() and hc.plan_cache.hits == 1
    hc.free()


@pytest.mark.parametrize("algorithm", ["flat", "hier", "bruck"])
def test_counts_given_as_lists_run_the_compiled_paths(comm, algorithm):
    """Counts and displacements given as Python lists of integers are read as int64 arrays by the
    compiled paths: new patterns are compiled misses, byte-exact; the same lists again hit the
    plan cache; a list that is no integer list still gets the general reader's error everywhere."""
    hc = HierComm(comm, ranks_per_node=2, cache_entries=4)
    size = comm.size
    sbuf = np.arange(3 * size, dtype=np.int32) + 1000 * comm.rank
    for call in range(4):
        counts = [1 + call % 3] * size
        displs = [i * counts[0] for i in range(size)]
        out, ref = np.zeros(call + 3 * size, np.int32), np.zeros(call + 3 * size, np.int32)
        comm.Alltoallv([sbuf, counts, displs, MPI.INT], [ref, counts, [d + call for d in displs], MPI.INT])
        specs = [sbuf, (counts, displs)], [out, (counts, [d + call for d in displs])]
        frames = _python_frames(lambda: hc.Alltoallv(*specs, algorithm=algorithm))
        assert out.tobytes() == ref.tobytes(), f"call {call}"
        assert "count_arrays" not in frames, frames  # the compiled reader takes the lists itself
    assert hc._engine.calls.compiled_misses == 4
    # Lists of numpy integers: made int64 arrays in Python, then offered to the compiled path again.
    numpy_ints = [np.int64(2)] * size  # a pattern not seen above (packed blocks of 2)
    one, one_ref = np.zeros(2 * size, np.int32), np.zeros(2 * size, np.int32)
    comm.Alltoallv([sbuf, [2] * size], [one_ref, [2] * size])
    frames = _python_frames(lambda: hc.Alltoallv([sbuf, numpy_ints], [one, numpy_ints], algorithm=algorithm))
    assert one.tobytes() == one_ref.tobytes() and "count_arrays" in frames
    assert hc._engine.calls.compiled_misses == 5
    out.fill(0)
    hc.Alltoallv([sbuf, (counts, displs)], [out, (counts, [d + call for d in displs])], algorithm=algorithm)
    assert out.tobytes() == ref.tobytes() and hc.plan_cache.hits == 1
    with pytest.raises(ExchangeError, match="rank 0: send counts"):
        hc.Alltoallv([sbuf, [1.5] * size if comm.rank == 0 else [1] * size], [out, [1] * size], algorithm=algorithm)
    with pytest.raises(ExchangeError, match="rank 0: send counts"):  # past int64: not read as a count
        hc.Alltoallv([sbuf, [2 ** 70] * size if comm.rank == 0 else [1] * size], [out, [1] * size],
                     algorithm=algorithm)
    hc.free()


@pytest.mark.parametrize("node_phase", ["mpi", "shm"])
def test_the_compiled_runner_refuses_buffers_its_program_does_not_fit(comm, node_phase):
    """``Runner.run`` checks every step against its buffers and communicators, and the buffers'
    type, before any MPI call: a receive buffer one byte short, a non-byte buffer, or an exchange
    on a communicator of another size raises ValueError on the rank that has it (here every
    rank), and nothing was sent."""
    hc = _made(comm, node_phase, ranks_per_node=2)
    if not hc.layout.hier_possible:
        hc.free()
        pytest.skip("one node, or one rank per node: nothing runs hierarchically")
    sc, rc, sbuf, ref = _case(comm, np.random.default_rng(11 + comm.rank))
    send = Side(np.frombuffer(sbuf, np.uint8), sc * 8, exclusive_cumsum(sc) * 8)
    recv = Side(np.zeros(ref.nbytes, np.uint8), rc * 8, exclusive_cumsum(rc) * 8)
    plan = hc._engine.hier_plan(send, recv, ALGORITHM["hier"], 2).detach()
    a, buf = np.zeros(plan.scratch_bytes, np.uint8), np.zeros(plan.stage_bytes, np.uint8)
    runner = hc._engine.runner
    with pytest.raises(ValueError, match="lies outside its buffers"):
        runner.run(plan, send.view, recv.view[:-1], a, buf)
    with pytest.raises(ValueError, match="contiguous uint8"):
        runner.run(plan, send.view, recv.view.view(np.int8), a, buf)
    wider = np.zeros(comm.size + 1, np.int64)
    with pytest.raises(ValueError, match=f"which has not {comm.size + 1} ranks"):
        runner.run(program(ALGORITHM["flat"], (wider,) * 4), send.view, recv.view, a, buf)
    if node_phase == "mpi":  # the window is the node's, and only the window holds an shm program's run
        runner.run(plan, send.view, recv.view, a, buf)  # the same buffers whole: it runs, byte-exact
        assert recv.view.tobytes() == ref.tobytes()
    hc.free()


@pytest.mark.parametrize("algorithm", ["flat", "auto"])
def test_new_alltoall_blocks_run_the_compiled_miss_path(comm, algorithm):
    """Alltoall with a new block size every call, a plain array or ``[array, datatype]``: parsed,
    agreed and run as ``MPI_Alltoall`` in compiled code, byte-exact."""
    hc = HierComm(comm, node_phase="mpi", cache_entries=4)
    for call in range(6):
        block = 1 + call
        send = np.arange(block * comm.size, dtype=np.float64) + 1000 * comm.rank
        out, ref = np.zeros_like(send), np.zeros_like(send)
        comm.Alltoall(send, ref)
        if call % 2:
            hc.Alltoall([send, MPI.DOUBLE], [out, MPI.DOUBLE], algorithm=algorithm)
        else:
            hc.Alltoall(send, out, algorithm=algorithm)
        assert out.tobytes() == ref.tobytes(), f"call {call}"
    if algorithm == "flat":
        assert hc._engine.calls.compiled_misses == 6
    assert hc.last_stats["plan_cache"] == "miss"
    hc.free()


def _python_frames(call) -> list:
    """The names of the Python functions that run during ``call()`` (``sys.setprofile``'s "call"
    events: compiled code and builtins make none). A public call's frame routes its own errors
    (``errors.route_error``: an error one rank alone meets ends the job), with no guard frame."""
    names = []

    def seen(frame, event, arg):
        if event == "call":
            names.append(frame.f_code.co_name)

    sys.setprofile(seen)
    try:
        call()
    finally:
        sys.setprofile(None)
    return names


@pytest.mark.parametrize("layout,algorithm,node_phase",
                         [("irregular", a, p) for a in ALGORITHMS for p in ("mpi", "shm")
                          if not (ALGORITHM[a].led and p == "mpi")]
                         + [("one_node", "flat", "mpi")])
def test_new_buffers_of_a_cached_pattern_run_compiled(comm, layout, algorithm, node_phase):
    """One pattern on new arrays every call (a training loop's fresh activations): a hit of its
    entry, rebound, runs in compiled code (its kept plan for the hierarchical ones), byte-exact,
    with no Python frame but the entry's; the same buffers twice then bind a persistent run,
    which the compiled hit path runs."""
    hc = _made(comm, node_phase, **layouts(comm.size)[layout], cache_entries=4)
    rng = np.random.default_rng(5 + comm.rank)
    sc, rc, sbuf, ref = _case(comm, rng)
    keep = []  # every array stays alive, so no two calls share an address by chance
    for call in range(7):
        send, out = sbuf.copy(), np.zeros_like(ref)
        keep += [send, out]

        def one():
            hc.Alltoallv([send, sc], [out, rc], algorithm=algorithm)

        frames = _python_frames(one) if call == 6 else one()
        assert out.tobytes() == ref.tobytes(), f"call {call}"
        assert hc.last_stats["plan_cache"] == ("miss" if call == 0 else "hit-rebound")
    assert frames == ["one", "Alltoallv"], f"Python frames of a rebound hit: {frames}"
    ran = hc.last_stats["algorithm"]  # a hierarchical one runs flat where the layout has no hierarchy
    assert ran == ("flat" if algorithm.startswith("hier") and not hc.layout.hier_possible else algorithm)
    assert hc._engine.calls.compiled_misses == 1 and hc._engine.calls.compiled_rebound == 6 and hc.plan_cache.hits == 6
    before = hc._engine.calls.compiled
    for call in range(4):
        out.fill(0)
        frames = _python_frames(one) if call == 3 else one()
        assert out.tobytes() == ref.tobytes() and hc.last_stats["plan_cache"] == "hit"
        assert hc.last_stats["algorithm"] == ran
    # The last call above left its entry on these buffers: the first call here binds the
    # persistent run (the general path, which lets the compiled path recognise the specs), the
    # other three run compiled.
    assert hc._engine.calls.compiled - before == 3
    assert frames == ["one", "Alltoallv"], f"Python frames of a hit: {frames}"
    # Two receive arrays in turn, one of which had the bound run: the first call frees it (in
    # Python), every later one is a rebound hit in compiled code, also where a slot recognises
    # the specs but holds no run bound to them.
    rebound, second = hc._engine.calls.compiled_rebound, np.zeros_like(ref)
    for call in range(6):
        target = out if call % 2 else second
        target.fill(0)
        hc.Alltoallv([send, sc], [target, rc], algorithm=algorithm)
        assert target.tobytes() == ref.tobytes() and hc.last_stats["plan_cache"] == "hit-rebound"
    assert hc._engine.calls.compiled_rebound - rebound == 5
    hc.free()


def test_count_mismatch_on_the_compiled_miss_path_fails_everywhere(comm, cached):
    """A pair whose counts disagree, in a spec form the compiled miss path reads: the same error
    on every rank, and the next good call runs."""
    if comm.size < 2:
        pytest.skip("a pair needs two ranks")
    hc = _hc(cached, "one_node", "mpi")
    sc, rc, _ = _mismatch(comm, "one_byte")
    before = hc._engine.calls.compiled_misses
    with pytest.raises(ExchangeError, match=r"rank 0 sends 3 B to rank 1, which expects 4 B"):
        hc.Alltoallv([np.zeros(int(sc.sum()), np.uint8), sc], [np.zeros(int(rc.sum()), np.uint8), rc],
                     algorithm="flat")
    good = np.full(comm.size, 5, np.int64)
    send, out, ref = np.full(5 * comm.size, comm.rank, np.uint8), np.zeros(5 * comm.size, np.uint8), np.zeros(5 * comm.size, np.uint8)
    hc.Alltoallv([send, good], [out, good], algorithm="flat")
    comm.Alltoallv([send, good], [ref, good])
    assert out.tobytes() == ref.tobytes() and hc._engine.calls.compiled_misses == before + 1


def test_specs_rebuilt_every_call_are_recognised_by_content(comm, cached):
    """Counts made anew every call (a new array, a list): recognised by their contents, so the
    compiled path runs; the same values in another dtype are parsed anew, and stay exact."""
    hc = _hc(cached, "irregular", "mpi")
    rng = np.random.default_rng(13 + comm.rank)
    sc, rc, sbuf, ref = _case(comm, rng)
    out = np.zeros_like(ref)
    before = hc._engine.calls.compiled
    for _ in range(4):
        out.fill(0)
        hc.Alltoallv([sbuf, (np.array(sc), None)], [out, np.array(rc)])
        assert out.tobytes() == ref.tobytes()
    assert hc._engine.calls.compiled - before == 2
    out.fill(0)
    hc.Alltoallv([sbuf, (sc.astype(np.int32), None)], [out, rc.astype(np.int32)])
    assert out.tobytes() == ref.tobytes() and hc._engine.calls.compiled - before == 2


def test_compiled_path_sees_counts_changed_in_place(comm, cached):
    """Counts edited in the same array between calls: recognised no more, planned anew, exact."""
    hc = _hc(cached, "irregular", "mpi")
    size = comm.size
    counts = np.full(size, 4, np.int64)
    sbuf = np.arange(8 * size, dtype=np.uint8) + comm.rank
    rbuf = np.zeros(8 * size, np.uint8)
    for _ in range(3):
        hc.Alltoallv([sbuf, counts], [rbuf, counts])
    assert hc.last_stats["plan_cache"] == "hit"
    counts[:] = 8
    rbuf.fill(0)
    hc.Alltoallv([sbuf, counts], [rbuf, counts])
    ref = np.zeros_like(rbuf)
    comm.Alltoallv([sbuf, counts], [ref, counts])
    assert rbuf.tobytes() == ref.tobytes()
    assert hc.last_stats["plan_cache"] == "miss"


def test_buffer_resized_in_place_is_not_written_through_a_stale_slot(comm, cached):
    """The receive array reallocated under the same object (``resize``): the compiled path must
    not write through the run bound to its old memory."""
    hc = _hc(cached, "regular", "mpi")
    rng = np.random.default_rng(9 + comm.rank)
    sc, rc, sbuf, ref = _case(comm, rng)
    out = np.zeros(ref.shape[0], ref.dtype)
    spec = [out, rc]
    for _ in range(3):
        hc.Alltoallv([sbuf, sc], spec)
    assert hc.last_stats["plan_cache"] == "hit"
    before = hc._engine.calls.compiled
    out.resize(ref.shape[0] + (1 << 16), refcheck=False)  # moves the data: far larger
    out.fill(0)
    hc.Alltoallv([sbuf, sc], spec)
    assert out[:ref.shape[0]].tobytes() == ref.tobytes()
    assert hc._engine.calls.compiled == before


def test_changed_pattern_on_one_rank_misses_everywhere(comm, cached):
    hc = _hc(cached, "irregular", "mpi")
    size = comm.size
    counts = np.full(size, 4, np.int64)
    sbuf = np.arange(4 * size, dtype=np.uint8) + comm.rank
    rbuf = np.zeros(4 * size + 8, np.uint8)
    displs = np.arange(size, dtype=np.int64) * 4
    for _ in range(3):
        hc.Alltoallv([sbuf, (counts, displs)], [rbuf, (counts, displs)], algorithm="hier")
    assert hc.last_stats["plan_cache"] == "hit"
    # The last rank alone shifts its receive blocks: every rank must miss, and the data land right.
    moved = displs + (8 if comm.rank == size - 1 else 0)
    rbuf.fill(0)
    hc.Alltoallv([sbuf, (counts, displs)], [rbuf, (counts, moved)], algorithm="hier")
    states = comm.allgather(hc.last_stats["plan_cache"])
    assert states == ["miss"] * size
    want = np.concatenate([np.arange(4 * comm.rank, 4 * comm.rank + 4, dtype=np.uint8) + src for src in range(size)])
    assert rbuf[moved[0]:moved[0] + 4 * size].tobytes() == want.tobytes()


def test_moved_buffer_is_never_written_through_a_stale_plan(comm, cached):
    """Same counts, buffers replaced between calls: only the new buffer receives."""
    hc = _hc(cached, "regular", "shm" if cached["regular", "shm"] is not None else "mpi")
    rng = np.random.default_rng(5 + comm.rank)
    sc, rc, sbuf, ref = _case(comm, rng, np.int32)
    old = np.zeros_like(ref)
    for _ in range(3):  # bind a persistent run to ``old``
        hc.Alltoallv([sbuf, sc], [old, rc])
    assert hc.last_stats["plan_cache"] == "hit"
    old.fill(-7)
    new = np.zeros_like(ref)
    send2 = sbuf.copy()
    hc.Alltoallv([send2, sc], [new, rc])
    assert new.tobytes() == ref.tobytes()
    assert (old == -7).all()  # the stale binding never ran
    assert hc.last_stats["plan_cache"] == "hit-rebound"


def test_eviction_under_many_patterns_keeps_ranks_in_step(comm, cached):
    """More patterns than cache entries, in an order that differs per rank count: every call exact,
    every rank with the same slots and the same hit or miss."""
    hc = _hc(cached, "round_robin", "mpi")
    size = comm.size
    sbuf = (np.arange(64 * size) % 251).astype(np.uint8)
    rbuf = np.zeros(64 * size, np.uint8)
    rng = np.random.default_rng(99)  # the same sequence on every rank
    seen = []
    for step in range(40):
        pattern = int(rng.integers(0, 7))  # 7 patterns, 4 entries: evictions all the time
        counts = np.full(size, 1 + pattern, np.int64)
        rbuf.fill(0)
        hc.Alltoallv([sbuf, counts], [rbuf, counts], algorithm="auto")
        ref = np.zeros_like(rbuf)
        comm.Alltoallv([sbuf, counts], [ref, counts])
        assert rbuf.tobytes() == ref.tobytes(), f"step {step}"
        seen.append(hc.last_stats["plan_cache"])
    slots = sorted(hc.plan_cache.entries)
    assert comm.allgather(slots) == [slots] * size
    assert comm.allgather(seen) == [seen] * size
    assert len(slots) <= 4 and "miss" in seen and any(s.startswith("hit") for s in seen)


def test_count_exchange_of_alltoallv_rows(comm, cached):
    """alltoallv learns its receive counts from the senders; a repeated call hits the plan cache."""
    hc = _hc(cached, "irregular_3_3_1", "mpi")
    size = comm.size
    counts = (np.arange(size) + comm.rank) % 3
    rows = np.repeat(np.arange(counts.sum(), dtype=np.float64)[:, None] + comm.rank * 100, 2, axis=1)
    for _ in range(2):
        out, rcounts = hc.alltoallv(rows, counts)
        assert rcounts.tolist() == [(comm.rank + src) % 3 for src in range(size)]
        ref = np.zeros((int(rcounts.sum()), 2))
        comm.Alltoallv([rows, counts * 2], [ref, rcounts * 2])
        assert out.tobytes() == ref.tobytes()
    assert hc.last_stats["plan_cache"] in ("hit-rebound", "hit")


def test_cache_bound_and_off(comm):
    hc = HierComm(comm, ranks_per_node=2, cache_entries=0)
    counts = np.full(comm.size, 2, np.int64)
    buf = np.zeros(2 * comm.size, np.uint8)
    hc.Alltoallv([buf, counts], [buf.copy(), counts])
    assert hc.last_stats["plan_cache"] == "off" and not hc.plan_cache.entries
    hc.free()
    # A byte budget below one bound run: once the run pins the buffers (second call), the next call
    # finds the cache over budget and drops the entry after running it, on every rank alike.
    hc = HierComm(comm, ranks_per_node=2, cache_bytes=1)
    send, recv = np.zeros(2 * comm.size, np.uint8), np.zeros(2 * comm.size, np.uint8)
    states = []
    for _ in range(4):
        hc.Alltoallv([send, counts], [recv, counts], algorithm="flat")
        states.append(hc.last_stats["plan_cache"])
        if len(states) == 3:
            assert not hc.plan_cache.entries
    assert states == ["miss", "hit", "hit", "miss"]
    hc.free()
    with pytest.raises(ExchangeError, match="cache_entries and cache_bytes"):
        HierComm(comm, cache_entries=-1 if comm.rank == 0 else 4)


def test_uniform_alltoall_runs_mpi_alltoall(comm, cached):
    hc = _hc(cached, "one_node", "mpi")
    size = comm.size
    send = np.arange(3 * size, dtype=np.int16) + 10 * comm.rank
    recv = np.zeros_like(send)
    for _ in range(3):
        hc.Alltoall(send, recv, algorithm="flat")
        ref = np.zeros_like(send)
        comm.Alltoall(send, ref)
        assert recv.tobytes() == ref.tobytes()
    assert hc.last_stats["algorithm"] == "flat"


@pytest.fixture(params=["int", "large-count"])
def count_path(request):
    """Both count paths: C ints, and (small buffers made to take it) the large-count Alltoallw path."""
    if request.param == "large-count":
        request.getfixturevalue("large_count_path")
    return request.param


@pytest.mark.parametrize("phase", ["shm", "mpi"])
@pytest.mark.parametrize("algorithm", ["bruck", "hier_pairwise", "hier_bruck"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_log_round_algorithms_one_shot_cached_and_persistent(comm, layout, algorithm, phase, count_path):
    """The log-round algorithms through HierComm on every layout (missing lanes included), both node
    phases and both count paths: one-shot (miss, then cached), persistent, byte-exact; zero blocks too."""
    try:
        hc = HierComm(comm, **layouts(comm.size)[layout], node_phase=phase, radix=3)
    except ExchangeError:
        pytest.skip("the ranks of a node share no memory here")
    rng = np.random.default_rng(3 + comm.rank)
    sc = rng.integers(0, 7, comm.size).astype(np.int64)
    sc[rng.random(comm.size) < 0.3] = 0
    rc = np.empty_like(sc)
    comm.Alltoall(sc, rc)
    sbuf = rng.random(int(sc.sum()))
    ref = np.zeros(int(rc.sum()))
    comm.Alltoallv([sbuf, sc], [ref, rc])
    out = np.full_like(ref, np.nan)
    for _ in range(3):
        out.fill(np.nan)
        hc.Alltoallv([sbuf, sc], [out, rc], algorithm=algorithm)
        assert out.tobytes() == ref.tobytes()
    possible = hc.topology.num_nodes > 1 and hc.topology.max_node_size > 1
    want = algorithm if algorithm == "bruck" or possible else "flat"
    assert hc.last_stats["algorithm"] == want and hc.last_stats["plan_cache"] == "hit"
    assert hc.last_stats.get("radix") == (3 if "bruck" in want else None)
    with hc.Alltoallv_init([sbuf, sc], [out, rc], algorithm=algorithm) as req:
        for start in range(3):  # the first run learns the lengths; later ones run compiled rounds
            out.fill(np.nan)
            req.Start()
            req.Wait()
            assert out.tobytes() == ref.tobytes() and req.algorithm == want, f"start {start}"
        if count_path == "int":  # (log-round phases on the large-count path run a plain Alltoallw)
            assert req._run.program() is not None
    hc.free()


def test_radix_must_match_on_every_rank(comm):
    with pytest.raises(ExchangeError, match="radix"):
        HierComm(comm, radix=2 + (comm.rank == 0 and comm.size > 1) if comm.size > 1 else 1)


def test_alltoall_on_one_rank_and_alltoallv_on_another_fails_everywhere(comm, cached):
    """Flat Alltoall runs as MPI_Alltoall: a rank calling Alltoallv with the same bytes must not hang."""
    if comm.size == 1:
        pytest.skip("needs two ranks")
    hc = _hc(cached, "one_node", "mpi")
    send = np.zeros(2 * comm.size, np.uint8)
    recv = np.zeros_like(send)
    with pytest.raises(ExchangeError, match="rank 1 calls Alltoallv but rank 0 calls Alltoall"):
        if comm.rank == 0:
            hc.Alltoall(send, recv, algorithm="flat")
        else:
            hc.Alltoallv([send, np.full(comm.size, 2, np.int64)], [recv, np.full(comm.size, 2, np.int64)],
                         algorithm="flat")


@pytest.mark.parametrize("leaders", [1, 2])
def test_multi_leader_needs_the_window(comm, leaders):
    """Multi-leader's groups meet in the node window: with the "mpi" node phase an explicit call
    raises the same error on every rank (no data moves), and "auto" never picks it."""
    hc = _made(comm, "mpi", **layouts(comm.size)["irregular"], leaders=leaders)
    sc, rc, sbuf, ref = _case(comm, np.random.default_rng(comm.rank))
    out = np.zeros_like(ref)
    if hc.layout.hier_possible:
        with pytest.raises(ExchangeError, match="needs the shared-memory node phase"):
            hc.Alltoallv([sbuf, sc], [out, rc], algorithm="hier_leaders")
        assert not out.any()
    hc.Alltoallv([sbuf, sc], [out, rc], algorithm="auto")
    assert out.tobytes() == ref.tobytes() and hc.last_stats["algorithm"] != "hier_leaders"
    hc.free()
