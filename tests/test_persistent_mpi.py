"""Persistent requests, both node phases and agreed settings: bytes equal comm.Alltoallv, errors everywhere."""
import numpy as np
import pytest
from mpi4py import MPI
from support import assert_exchange_works, exchange_case, layouts

from hxmpi import ExchangeError, HierComm
from hxmpi.errors import PlanStateError

pytestmark = pytest.mark.mpi

LAYOUTS = ["regular", "irregular", "round_robin", "irregular_3_3_1", "round_robin_3", "one_node"]


def _shared_everywhere(comm, **layout) -> bool:
    """Whether every virtual node's ranks share memory (not so for a node spanning two hosts)."""
    from hxmpi import Topology
    t = Topology(comm, **layout)
    probe = t.intra.Split_type(MPI.COMM_TYPE_SHARED)
    shared = comm.allreduce(probe.size == t.intra.size, op=MPI.LAND)
    probe.Free()
    t.free()
    return shared


@pytest.fixture(scope="module")
def phased():
    """A HierComm per (layout, node phase); "shm" is None where a node's ranks share no memory."""
    comm = MPI.COMM_WORLD
    made = {}
    for name in LAYOUTS:
        kw = layouts(comm.size)[name]
        shared = _shared_everywhere(comm, **kw)
        for phase in ("shm", "mpi"):
            made[name, phase] = HierComm(comm, **kw, node_phase=phase) if shared or phase == "mpi" else None
    yield _Available(made)
    for hc in made.values():
        if hc is not None:
            hc.free()


class _Available(dict):
    def __getitem__(self, key):
        hc = super().__getitem__(key)
        if hc is None:
            pytest.skip(f"{key[0]}: a node's ranks span hosts here, so there is no shared-memory phase")
        return hc


def test_forced_shm_without_shared_memory_fails_everywhere(comm):
    """Round-robin virtual nodes across real hosts (the emulated cluster): "shm" cannot work there."""
    kw = layouts(comm.size)["round_robin"]
    if _shared_everywhere(comm, **kw):
        pytest.skip("every virtual node shares memory here (one host)")
    with pytest.raises(ExchangeError, match="do not all share memory"):
        HierComm(comm, **kw, node_phase="shm")
    hc = HierComm(comm, **kw)  # auto falls back to the message-passing node phase
    assert hc.node_phase == "mpi"
    hc.free()


@pytest.fixture(params=["cache-on", "cache-off"])
def agreement(request, monkeypatch, phased):
    """With the agreed plan cache on and off."""
    for hc in filter(None, phased.values()):
        monkeypatch.setattr(hc.plan_cache, "max_entries", 0 if request.param == "cache-off" else 16)
    return request.param


@pytest.mark.parametrize("phase", ["shm", "mpi"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_one_shot_both_node_phases(comm, phased, layout, phase):
    hc = phased[layout, phase]
    for trial in range(3):
        rng = np.random.default_rng(77 * trial + comm.rank)
        sc, rc, sbuf, ref = exchange_case(comm, rng, np.float64, max_count=9)
        out = np.full_like(ref, np.nan)
        hc.Alltoallv([sbuf, sc], [out, rc], algorithm="hier")
        assert out.tobytes() == ref.tobytes()
    t = hc.topology
    if t.num_nodes > 1 and t.max_node_size > 1:
        assert hc.last_stats["node_phase"] == phase
        if phase == "shm":
            assert hc.last_stats["intra"] == {"messages": 0, "bytes": 0}


@pytest.mark.parametrize("phase", ["shm", "mpi"])
def test_request_reports_its_stats_and_frees_only_its_own_window(comm, phased, phase):
    """A completed request's stats are the HierComm's last_stats ("request"); Free releases the
    request's node window, not the one one-shot calls share, which then still work."""
    hc = phased["regular", phase]
    rng = np.random.default_rng(11 + comm.rank)
    sc, rc, sbuf, ref = exchange_case(comm, rng, np.int32)
    out = np.zeros(int(rc.sum()), np.int32)
    req = hc.Alltoallv_init([sbuf, sc, MPI.INT], [out, rc, MPI.INT], algorithm="hier")
    own = req._window
    assert (own is not None) == (phase == "shm" and hc.layout.hier_possible)
    assert own is None or own is not hc._engine.window
    hc.Alltoallv([sbuf, sc, MPI.INT], [out, rc, MPI.INT], algorithm="flat")
    assert hc.last_stats["plan_cache"] != "request"
    req.Start()
    req.Wait()
    assert out.tobytes() == ref.tobytes()
    assert hc.last_stats["plan_cache"] == "request" and hc.last_stats["algorithm"] == req.algorithm
    req.Free()
    if own is not None:
        assert own.win is None  # released with the request
    assert_exchange_works(comm, hc)


@pytest.mark.parametrize("algorithm", ["flat", "hier", "auto"])
@pytest.mark.parametrize("phase", ["shm", "mpi"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_persistent_moves_current_contents(comm, phased, layout, phase, algorithm):
    """One plan, several Starts, the send buffer refilled in place between them."""
    hc = phased[layout, phase]
    rng = np.random.default_rng(5 + comm.rank)
    sc, rc, sbuf, _ = exchange_case(comm, rng, np.int32, max_count=7)
    out = np.zeros(int(rc.sum()), np.int32)
    with hc.Alltoallv_init([sbuf, sc, MPI.INT], [out, rc, MPI.INT], algorithm=algorithm) as req:
        for start in range(3):
            sbuf[:] = np.random.default_rng(start * 1000 + comm.rank).integers(-2**31, 2**31 - 1, sbuf.size)
            ref = np.zeros_like(out)
            comm.Alltoallv([sbuf, sc, MPI.INT], [ref, rc, MPI.INT])
            out[:] = -1
            req.Start()
            req.Wait()
            assert out.tobytes() == ref.tobytes(), (layout, phase, algorithm, start)


def test_persistent_alltoall_and_overlap(comm, phased):
    """Alltoall_init; two requests in flight at once, started and waited in the same order everywhere."""
    hc = phased["irregular_3_3_1", "shm"]
    size = comm.size
    a = np.arange(size * 3, dtype=np.float64) + 100 * comm.rank
    b = -a
    out_a, out_b = np.zeros_like(a), np.zeros_like(b)
    ref_a, ref_b = np.zeros_like(a), np.zeros_like(b)
    comm.Alltoall(a, ref_a)
    comm.Alltoall(b, ref_b)
    req_a = hc.Alltoall_init(a, out_a, algorithm="hier")
    req_b = hc.Alltoall_init([b, MPI.DOUBLE], [out_b, MPI.DOUBLE], algorithm="flat")
    req_a.Start()
    req_b.Start()
    req_a.Wait()
    req_b.Wait()
    assert out_a.tobytes() == ref_a.tobytes() and out_b.tobytes() == ref_b.tobytes()
    assert req_a.algorithm == ("hier" if hc.topology.num_nodes > 1 and hc.topology.max_node_size > 1
                               else "flat")
    req_a.Free()
    req_b.Free()


def test_persistent_large_count_path(comm, phased, large_count_path):
    """The Alltoallw path (limit lowered) as a persistent request, both node phases."""
    for phase in ("shm", "mpi"):
        for algorithm in ("flat", "hier"):
            rng = np.random.default_rng(9 + comm.rank)
            sc, rc, sbuf, ref = exchange_case(comm, rng, np.float64, max_count=12, zero_frac=0.2)
            out = np.zeros_like(ref)
            with phased["irregular_3_3_1", phase].Alltoallv_init([sbuf, sc], [out, rc], algorithm=algorithm) as req:
                for _ in range(2):
                    out[:] = 0
                    req.Start()
                    req.Wait()
                    assert out.tobytes() == ref.tobytes(), (phase, algorithm)


def test_request_misuse_is_refused(comm, phased):
    hc = phased["regular", "shm"]
    buf, out = np.ones(comm.size), np.zeros(comm.size)
    req = hc.Alltoall_init(buf, out)
    with pytest.raises(PlanStateError, match="without Start"):
        req.Wait()
    req.Start()
    with pytest.raises(PlanStateError, match="twice"):
        req.Start()
    req.Wait()
    req.Free()
    for call in (req.Start, req.Wait):
        with pytest.raises(PlanStateError, match="freed"):
            call()
    req.Free()  # freeing twice is harmless
    assert out.tolist() == [1.0] * comm.size


def _odd_one(comm, good, bad):
    return bad if comm.rank == comm.size - 1 else good


@pytest.mark.parametrize("setting", ["unknown_algorithm", "other_algorithm", "validate"])
def test_one_rank_with_another_setting_fails_everywhere(comm, phased, setting, agreement):
    if comm.size == 1 and setting != "unknown_algorithm":
        pytest.skip("needs two ranks to disagree")
    hc = phased["regular", "shm"]
    buf, out = np.ones(comm.size), np.zeros(comm.size)
    kwargs = {"unknown_algorithm": {"algorithm": _odd_one(comm, "flat", "bogus")},
              "other_algorithm": {"algorithm": _odd_one(comm, "flat", "hier")},
              "validate": {"validate": _odd_one(comm, True, False)}}[setting]
    expected = {"unknown_algorithm": rf"rank {comm.size - 1}: algorithm must be one of",
                "other_algorithm": "algorithm differs between ranks",
                "validate": "validate differs between ranks"}[setting]
    with pytest.raises(ExchangeError, match=expected):
        hc.Alltoall(buf, out, **kwargs)
    if "algorithm" in kwargs:  # the persistent form agrees on the algorithm too
        with pytest.raises(ExchangeError, match=expected):
            hc.Alltoall_init(buf, out, **kwargs)
    assert_exchange_works(comm, hc)  # nothing left half-done


def test_rows_of_another_dtype_fail_everywhere(comm, phased, agreement):
    if comm.size == 1:
        pytest.skip("needs two ranks")
    hc = phased["regular", "shm"]
    dtype = np.int64 if comm.rank == 1 else np.float64
    with pytest.raises(ExchangeError, match=r"rank 1 .*(int|<i8)|dtype and row shape"):
        hc.alltoallv(np.zeros((comm.size, 2), dtype), np.ones(comm.size, np.int64))
    rows, counts = hc.alltoallv(np.full((comm.size, 2), comm.rank, np.float32), np.ones(comm.size, np.int64))
    assert rows.dtype == np.float32 and counts.tolist() == [1] * comm.size
    assert rows[:, 0].tolist() == list(range(comm.size))


def test_bad_algorithm_at_construction_fails_everywhere(comm):
    """One rank's unknown default algorithm: every rank raises (it used to leave the others waiting)."""
    with pytest.raises(ExchangeError, match=rf"rank {comm.size - 1}: algorithm must be one of"):
        HierComm(comm, ranks_per_node=2, algorithm=_odd_one(comm, "auto", "ring"))
    hc = HierComm(comm, ranks_per_node=2)  # the refused construction left nothing behind
    assert_exchange_works(comm, hc)
    hc.free()


def test_node_phase_must_agree(comm):
    if comm.size == 1:
        pytest.skip("needs two ranks")
    with pytest.raises(ExchangeError, match="node_phase"):
        HierComm(comm, ranks_per_node=2, node_phase=_odd_one(comm, "mpi", "bogus"))
    with pytest.raises(ExchangeError, match="differs between ranks"):
        HierComm(comm, ranks_per_node=2, node_phase=_odd_one(comm, "mpi", "shm"))
