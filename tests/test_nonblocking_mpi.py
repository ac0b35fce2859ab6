"""Nonblocking all-to-alls (HierComm.Ialltoallv/Ialltoall/Ialltoallw), in both progress modes
(driven by the request, or by a thread): bytes equal the flat reference, the data moves with only
Test() called (or, on a thread, none), several requests in flight, waited in any order, and mixed
with mpi4py's, errors raised by Wait on every rank, mpi4py's request semantics."""
from __future__ import annotations

import time

import numpy as np
import pytest
from mpi4py import MPI
from support import assert_exchange_works, exchange_case, hier_comms

import hxmpi
from hxmpi import ExchangeError, HierComm
from hxmpi.comm.nonblocking import PROGRESS_MODES
from hxmpi.errors import PlanStateError

pytestmark = pytest.mark.mpi

LAYOUTS = ("regular", "irregular", "one_per_node", "shuffled")


@pytest.fixture(scope="module", params=PROGRESS_MODES)
def comms(request):
    yield from hier_comms(LAYOUTS, progress=request.param)


@pytest.mark.parametrize("algorithm", ["flat", "hier", "auto", "bruck"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_requests_in_flight_equal_the_flat_exchange(comm, comms, layout, algorithm):
    """Three Ialltoallv of different patterns in flight at once, completed by waitall in reverse."""
    hc = comms[layout]
    cases = [exchange_case(comm, np.random.default_rng(31 * k + comm.rank), np.float64, max_count=9)
             for k in range(3)]
    outs = [np.full_like(ref, np.nan) for _, _, _, ref in cases]
    reqs = [hc.Ialltoallv([sbuf, sc], [out, rc], algorithm=algorithm)
            for (sc, rc, sbuf, _), out in zip(cases, outs)]
    assert hxmpi.waitall(reqs[::-1]) is True
    for (_, _, _, ref), out in zip(cases, outs):
        assert out.tobytes() == ref.tobytes()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_ialltoall_and_ialltoallw(comm, comms, layout):
    hc, size = comms[layout], comm.size
    send = np.arange(3 * size, dtype=np.int32) + 100 * comm.rank
    ref, out = np.empty_like(send), np.full_like(send, -1)
    comm.Alltoall(send, ref)
    req = hc.Ialltoall(send, out)
    assert req.Wait() is True
    assert out.tobytes() == ref.tobytes()
    # Alltoallw of strided rows: element j of every row goes to rank j
    rows = np.arange(4 * size, dtype=np.float64).reshape(4, size) + 1000 * comm.rank
    column = [MPI.DOUBLE.Create_vector(4, 1, size).Commit()] * size
    got = np.full((size, 4), -1.0)
    try:
        req = hc.Ialltoallw([rows, [1] * size, [8 * j for j in range(size)], column],
                            [got, [4] * size, [32 * i for i in range(size)], [MPI.DOUBLE] * size])
        req.Wait()
    finally:
        column[0].Free()
    everyone = np.array(comm.allgather(rows))
    assert got.tobytes() == everyone[:, :, comm.rank].tobytes()


def test_data_moves_while_the_caller_only_tests(comm, comms):
    """After Ialltoallv every rank only sleeps and looks at Test() (which moves a request-driven
    exchange on, and only reads a thread's flag): the exchange completes without a Wait."""
    hc = comms["regular"]
    sc, rc, sbuf, ref = exchange_case(comm, np.random.default_rng(5 + comm.rank), np.float64, max_count=2000)
    out = np.full_like(ref, np.nan)
    req = hc.Ialltoallv([sbuf, sc], [out, rc])
    deadline = time.monotonic() + 60
    while not req.Test() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert req.Test() is True  # completed without a Wait
    assert out.tobytes() == ref.tobytes()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_bad_input_raises_at_wait_on_every_rank(comm, comms, layout):
    """A negative count on the last rank: every rank's call returns a request, every rank's Wait
    raises the agreed error naming it; the next nonblocking and blocking calls work."""
    hc, last = comms[layout], comm.size - 1
    sc, rc, sbuf, ref = exchange_case(comm, np.random.default_rng(comm.rank), np.float64)
    bad = sc.copy()
    if comm.rank == last:
        bad[0] = -1
    req = hc.Ialltoallv([sbuf, bad], [np.zeros_like(ref), rc])
    with pytest.raises(ExchangeError, match=rf"rank {last}: send counts\[0\] = -1 is negative"):
        req.Wait()
    assert req.Wait() is True  # the error is raised once; the request is then inactive
    out = np.zeros_like(ref)
    hc.Ialltoallv([sbuf, sc], [out, rc]).Wait()
    assert out.tobytes() == ref.tobytes()
    assert_exchange_works(comm, hc)


def test_request_semantics_of_mpi4py(comm, comms):
    """Wait and Test return True once done, and again after (an inactive request, as MPI's null
    request); Free waits for an active exchange, and a freed request is refused; Cancel is refused
    (MPI cancels no collective)."""
    hc = comms["irregular"]
    sc, rc, sbuf, ref = exchange_case(comm, np.random.default_rng(9 + comm.rank), np.int64)
    out = np.zeros_like(ref)
    req = hc.Ialltoallv([sbuf, sc], [out, rc])
    with pytest.raises(PlanStateError, match="cannot be cancelled"):
        req.Cancel()
    req.Free()  # waits first
    assert out.tobytes() == ref.tobytes()
    with pytest.raises(PlanStateError, match="this request was freed"):
        req.Test()
    out[:] = 0
    req = hc.Ialltoallv([sbuf, sc], [out, rc])
    assert req.Wait() is True and req.Wait() is True and req.Test() is True and out.tobytes() == ref.tobytes()


def test_waitall_mixes_hxmpi_and_mpi4py_requests(comm, comms):
    """A ring of mpi4py Isend/Irecv beside two hxmpi exchanges, completed by one waitall (and by
    HierRequest.Waitall/Testall)."""
    hc, size, me = comms["one_per_node"], comm.size, comm.rank
    cases = [exchange_case(comm, np.random.default_rng(k * 7 + me), np.float32) for k in range(2)]
    outs = [np.zeros_like(ref) for *_, ref in cases]
    token, got = np.array([me], np.int64), np.array([-1], np.int64)
    ours = [hc.Ialltoallv([sbuf, sc], [out, rc]) for (sc, rc, sbuf, _), out in zip(cases, outs)]
    theirs = [comm.Irecv(got, source=(me - 1) % size, tag=77), comm.Isend(token, dest=(me + 1) % size, tag=77)]
    hxmpi.waitall([ours[0], theirs[0], ours[1], theirs[1]])
    assert got[0] == (me - 1) % size
    assert all(out.tobytes() == ref.tobytes() for out, (*_, ref) in zip(outs, cases))
    again = hc.Ialltoallv([cases[0][2], cases[0][0]], [outs[0], cases[0][1]])
    assert hxmpi.HierRequest.Waitall([again]) is True and hxmpi.HierRequest.Testall([again, MPI.REQUEST_NULL])


def test_blocking_calls_beside_one_in_flight(comm, comms):
    """The caller's own blocking Alltoallv and Allreduce run while an Ialltoallv is in flight."""
    hc = comms["regular"]
    a = exchange_case(comm, np.random.default_rng(3 + comm.rank), np.float64, max_count=500)
    b = exchange_case(comm, np.random.default_rng(4 + comm.rank), np.float64)
    out_a, out_b = np.zeros_like(a[3]), np.zeros_like(b[3])
    req = hc.Ialltoallv([a[2], a[0]], [out_a, a[1]])
    hc.Alltoallv([b[2], b[0]], [out_b, b[1]])
    assert hc.allreduce(1) == comm.size
    req.Wait()
    assert out_a.tobytes() == a[3].tobytes() and out_b.tobytes() == b[3].tobytes()


def test_free_completes_what_is_queued(comm):
    hc = HierComm(comm, ranks_per_node=2)
    sc, rc, sbuf, ref = exchange_case(comm, np.random.default_rng(comm.rank), np.float64)
    outs = [np.zeros_like(ref) for _ in range(3)]
    reqs = [hc.Ialltoallv([sbuf, sc], [out, rc]) for out in outs]
    hc.free()
    assert all(r.Test() for r in reqs)
    assert all(out.tobytes() == ref.tobytes() for out in outs)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_ranks_wait_in_different_orders(comm, comms, layout):
    """Four requests of different patterns and algorithms in flight; even ranks wait newest first,
    odd ranks test the last one and then wait oldest first: every rank moves them in call order, so
    the bytes equal the flat exchange whatever order each rank waits in."""
    hc = comms[layout]
    algorithms = ("hier", "flat", "bruck", "hier_pairwise")
    cases = [exchange_case(comm, np.random.default_rng(97 * k + comm.rank), np.int32, max_count=300)
             for k in range(len(algorithms))]
    outs = [np.full_like(ref, -7) for *_, ref in cases]
    reqs = [hc.Ialltoallv([sbuf, sc], [out, rc], algorithm=a)
            for (sc, rc, sbuf, _), out, a in zip(cases, outs, algorithms)]
    if comm.rank % 2:
        reqs[-1].Test()
        for r in reqs:
            r.Wait()
    else:
        for r in reversed(reqs):
            r.Wait()
    for (*_, ref), out in zip(cases, outs):
        assert out.tobytes() == ref.tobytes()


def test_a_receive_buffer_in_flight_is_refused_on_every_rank(comm, comms):
    """A second call receiving into the buffer of a request still in flight (request mode) is a
    bad spec: its Wait raises on every rank alike (it is agreed: a rank whose first request had
    already completed agrees to the others' refusal), and the first request completes correctly."""
    hc = comms["regular"]
    if hc.progress != "request" or comm.size == 1:
        pytest.skip("a thread runs calls one after another, and one rank's call completes at once (all local)")
    sc, rc, sbuf, ref = exchange_case(comm, np.random.default_rng(41 + comm.rank), np.float64, max_count=3000)
    out = np.zeros_like(ref)
    first = hc.Ialltoallv([sbuf, sc], [out, rc], algorithm="hier")
    second = hc.Ialltoallv([sbuf, sc], [out, rc], algorithm="hier")
    raised = None
    try:
        second.Wait()
    except ExchangeError as exc:
        raised = str(exc)
    first.Wait()
    assert out.tobytes() == ref.tobytes()
    views = comm.allgather(raised)
    assert len(set(views)) == 1, views  # the same outcome, the same message, on every rank
    if raised is not None:
        assert "overlaps that of a nonblocking all-to-all still in flight" in raised


def test_repeated_calls_with_one_pattern_reuse_their_run(comm, comms):
    """The pipelined pattern: the same buffers again and again, each request completed by Test
    alone; every round's bytes are right (the run bound to them is reused, not rebuilt), and in
    request mode, from the third call on, each runs whole as one compiled program."""
    hc = comms["irregular"]
    sc, rc, sbuf, ref = exchange_case(comm, np.random.default_rng(13 + comm.rank), np.float64, max_count=40)
    out = np.zeros_like(ref)
    for k in range(6):
        sbuf += 1.0
        expected = np.empty_like(ref)
        comm.Alltoallv([sbuf, sc], [expected, rc])
        req = hc.Ialltoallv([sbuf, sc], [out, rc])
        while not req.Test():
            pass
        assert out.tobytes() == expected.tobytes(), k
        if hc.progress == "request" and k == 2:
            before, begun = hc._requests.compiled, hc._requests.lane.begun
    if hc.progress == "request":
        assert hc._requests.compiled - before == 3
        # from the fourth call on, each was begun at its call by the hit lane (the third made its program)
        assert hc._requests.lane.begun - begun >= 2


def _repeat_then(comm, hc, last_counts=None, last_shift=0):
    """Three rounds of one pattern on the same buffers (the last begun by the hit lane on every
    rank), then a fourth where the last rank sends with ``last_counts(sc)`` (where given) and
    receives ``last_shift`` elements further into a larger buffer (a new pattern there: a miss),
    the others as before (their hit, begun compiled, is diverted by the agreement). The fourth
    round's request, its receive view and the expected bytes."""
    sc, rc, sbuf, ref = exchange_case(comm, np.random.default_rng(71 + comm.rank), np.float64, max_count=30)
    out = np.zeros(ref.size + last_shift)
    view = out[:ref.size]  # one object: the specs are recognised by their buffers' identity
    for _ in range(3):
        hc.Ialltoallv([sbuf, sc], [view, rc]).Wait()
    assert view.tobytes() == ref.tobytes()
    mine = comm.rank == comm.size - 1
    out[:] = 0
    if mine:
        displs = np.concatenate([[0], np.cumsum(rc)[:-1]]).astype(np.int64) + last_shift
        counts = last_counts(sc) if last_counts else sc
        return hc.Ialltoallv([sbuf, counts], [out, (rc, displs)]), out[last_shift:], ref
    return hc.Ialltoallv([sbuf, sc], [view, rc]), view, ref


def test_a_hit_that_another_rank_misses_is_diverted_and_delivers(comm):
    """The other ranks' repeated call is begun compiled, but the last rank receives at new
    displacements (a miss there): the agreement diverts their hit, which goes on staged from the
    verdict, and every rank gets the flat exchange's bytes; the next rounds hit again."""
    hc = HierComm(comm, ranks_per_node=2, progress="request")
    try:
        req, out, ref = _repeat_then(comm, hc, last_shift=1)
        assert req.Wait() is True
        right = out.tobytes() == ref.tobytes()
        lane = type(req).__name__ == "HitRequest"
        diverted = lane and req.fallback is not None
        views = comm.allgather((right, lane, diverted))
        assert all(v[0] for v in views), views
        if comm.size > 1:  # every other rank began it compiled, and was diverted
            assert all(v[1] and v[2] for v in views[:-1]), views
        req2, out2, ref2 = _repeat_then(comm, hc)  # a new pattern, every rank alike
        assert req2.Wait() is True and out2.tobytes() == ref2.tobytes()
    finally:
        hc.free()


def test_a_bad_spec_beside_other_ranks_hits_raises_on_every_rank(comm):
    """The other ranks' repeated call is begun compiled; the last rank's counts overrun its send
    buffer: the same ExchangeError is raised by the Wait of every rank, and the next round runs."""
    hc = HierComm(comm, ranks_per_node=2, progress="request")
    try:
        req, out, ref = _repeat_then(comm, hc, last_counts=lambda sc: np.asarray(sc) + 1000)
        with pytest.raises(ExchangeError) as info:
            req.Wait()
        assert len(set(comm.allgather(str(info.value)))) == 1
        assert str(info.value).startswith(f"rank {comm.size - 1}: send block for rank 0 (displ 0, count 10")
        assert "past the buffer's" in str(info.value)
        req2, out2, ref2 = _repeat_then(comm, hc)
        assert req2.Wait() is True and out2.tobytes() == ref2.tobytes()
    finally:
        hc.free()


def test_mpi4py_waitall_refuses_hxmpi_requests(comm, comms):
    """mpi4py's own Waitall takes mpi4py requests only: it raises TypeError (it cannot move an
    hxmpi request); hxmpi.waitall takes both."""
    hc = comms["regular"]
    sc, rc, sbuf, ref = exchange_case(comm, np.random.default_rng(comm.rank), np.float64)
    out = np.zeros_like(ref)
    req = hc.Ialltoallv([sbuf, sc], [out, rc])
    with pytest.raises(TypeError):
        MPI.Request.Waitall([req, MPI.REQUEST_NULL])
    hxmpi.waitall([req, MPI.REQUEST_NULL])
    assert out.tobytes() == ref.tobytes()


def test_a_bad_progress_mode_raises_on_every_rank(comm):
    with pytest.raises(ExchangeError, match="progress must be one of"):
        HierComm(comm, progress="polling" if comm.rank == comm.size - 1 else "request")
    if comm.size > 1:
        with pytest.raises(ExchangeError, match="progress 'thread' differs between ranks|progress 'request' differs"):
            HierComm(comm, progress="thread" if comm.rank == 0 else "request")


def test_requests_of_two_hiercomms_waited_in_opposite_orders(comm):
    """Two request-driven HierComms, a hierarchical request in flight on each; even ranks wait for
    the first one first, odd ranks for the second: a Wait polls the other HierComm's request too,
    so neither rank holds back the phase the other waits for."""
    pair = [HierComm(comm, ranks_per_node=2, progress="request") for _ in range(2)]
    try:
        cases = [exchange_case(comm, np.random.default_rng(7 * k + comm.rank), np.float64, max_count=800)
                 for k in range(2)]
        outs = [np.zeros_like(ref) for *_, ref in cases]
        reqs = [hc.Ialltoallv([sbuf, sc], [out, rc], algorithm="hier")
                for hc, (sc, rc, sbuf, _), out in zip(pair, cases, outs)]
        for r in (reqs if comm.rank % 2 == 0 else reqs[::-1]):
            r.Wait()
        for (*_, ref), out in zip(cases, outs):
            assert out.tobytes() == ref.tobytes()
    finally:
        for hc in pair:
            hc.free()


def test_repeated_ialltoallw_of_strided_types(comm, comms):
    """An FFT code's pattern: the same strided (packed) Alltoallw specs again and again, two
    requests in flight on two receive buffers, waited newest first; every round's bytes are the
    transpose, whichever path (a compiled hit, a composed run, a packed one) each request took."""
    hc, size = comms["regular"], comm.size
    column = MPI.DOUBLE.Create_vector(4, 1, size).Commit()
    rows = np.empty((4, size))
    outs = [np.full((size, 4), -1.0) for _ in range(2)]
    specs = [[rows, [1] * size, [8 * j for j in range(size)], [column] * size],
             [[out, [4] * size, [32 * i for i in range(size)], [MPI.DOUBLE] * size] for out in outs]]
    try:
        for k in range(4):
            rows[:] = np.arange(4 * size).reshape(4, size) + 1000 * comm.rank + k
            everyone = np.array(comm.allgather(rows.copy()))
            reqs = [hc.Ialltoallw(specs[0], recv) for recv in specs[1]]
            for r in reversed(reqs):
                r.Wait()
            for out in outs:
                assert out.tobytes() == everyone[:, :, comm.rank].tobytes(), k
    finally:
        column.Free()
