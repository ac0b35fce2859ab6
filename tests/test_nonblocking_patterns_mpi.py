"""Nonblocking calls as MPI's (request mode): the call is local, any Test/Wait moves every request of
the process, threads on different requests are safe, and a run handed to a request is its own
until it completes. Each pattern is a valid MPI program that plain mpi4py completes; here the
bytes must equal the flat reference, and a hang is a failure (the watchdog ends it)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from mpi4py import MPI
from support import exchange_case, layouts

import hxmpi
from hxmpi import ExchangeError, HierComm
from hxmpi.comm.plan import ALGORITHMS
from hxmpi.errors import PlanStateError

pytestmark = [pytest.mark.mpi, pytest.mark.watchdog(120)]

# Every algorithm a nonblocking call runs (multi-leader needs the shared window: refused, below).
NONBLOCKING = [a for a in ALGORITHMS if a != "hier_leaders"] + ["auto"]


def _case(comm, seed, max_count=9):
    return exchange_case(comm, np.random.default_rng(seed * 7919 + comm.rank), np.float64, max_count=max_count)


def _test_until_done(requests) -> None:
    """Complete ``requests`` by Test() calls alone, round robin."""
    pending = list(requests)
    while pending:
        pending = [r for r in pending if not r.Test()]


@pytest.fixture(scope="module")
def hc():
    world = MPI.COMM_WORLD
    h = HierComm(world, **layouts(world.size)["regular"])
    yield h
    h.free()


@pytest.mark.parametrize("algorithm", NONBLOCKING)
def test_the_call_waits_for_no_other_rank(comm, hc, algorithm):
    """Rank 0 starts the call, then sends to rank 1; rank 1 receives first, then starts the call."""
    if comm.size < 2:
        pytest.skip("needs two ranks")
    sc, rc, sbuf, ref = _case(comm, 1)
    out = np.full_like(ref, np.nan)
    token = np.zeros(1)
    if comm.rank == 1:
        comm.Recv(token, source=0, tag=77)
    req = hc.Ialltoallv([sbuf, sc], [out, rc], algorithm=algorithm)
    if comm.rank == 0:
        comm.Send(np.ones(1), dest=1, tag=77)
    req.Wait()
    assert out.tobytes() == ref.tobytes()
    assert comm.rank != 1 or token[0] == 1.0


@pytest.mark.parametrize("algorithm", NONBLOCKING)
def test_two_hiercomms_started_in_opposite_orders_complete_by_test_alone(comm, hc, algorithm):
    """Even ranks start on A then B, odd ranks on B then A; only Test() completes them."""
    other = HierComm(comm, **layouts(comm.size)["irregular"])
    try:
        cases = [_case(comm, 10 + k) for k in range(2)]
        outs = [np.full_like(ref, np.nan) for _, _, _, ref in cases]
        starts = [lambda: hc.Ialltoallv([cases[0][2], cases[0][0]], [outs[0], cases[0][1]], algorithm=algorithm),
                  lambda: other.Ialltoallv([cases[1][2], cases[1][0]], [outs[1], cases[1][1]], algorithm=algorithm)]
        order = (0, 1) if comm.rank % 2 == 0 else (1, 0)
        reqs = [starts[i]() for i in order]
        _test_until_done(reqs[::-1])
        for (_, _, _, ref), out in zip(cases, outs):
            assert out.tobytes() == ref.tobytes()
    finally:
        other.free()


@pytest.mark.parametrize("algorithm", ["flat", "hier", "bruck", "hier_bruck", "auto"])
def test_two_threads_each_testing_its_own_request(comm, hc, algorithm):
    """Two requests on one HierComm, each completed by its own thread's Test() loop."""
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        pytest.skip("needs MPI_THREAD_MULTIPLE")
    cases = [_case(comm, 20 + k) for k in range(2)]
    outs = [np.full_like(ref, np.nan) for _, _, _, ref in cases]
    reqs = [hc.Ialltoallv([sbuf, sc], [out, rc], algorithm=algorithm) for (sc, rc, sbuf, _), out in zip(cases, outs)]
    errors = []

    def drive(req):
        try:
            _test_until_done([req])
        except BaseException as exc:  # noqa: BLE001 - reported below, on the main thread
            errors.append(exc)

    threads = [threading.Thread(target=drive, args=(r,)) for r in reqs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for (_, _, _, ref), out in zip(cases, outs):
        assert out.tobytes() == ref.tobytes()


def test_two_threads_on_one_request_get_a_clear_error(comm, hc):
    """A second thread entering Test/Wait of a request another thread waits on is refused."""
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        pytest.skip("needs MPI_THREAD_MULTIPLE")
    if comm.size < 2:
        pytest.skip("needs a rank to wait for")
    sc, rc, sbuf, ref = _case(comm, 30)
    out = np.full_like(ref, np.nan)
    late = comm.size - 1
    if comm.rank == late:
        time.sleep(1.0)  # the others' requests cannot complete before this rank starts its own
    req = hc.Ialltoallv([sbuf, sc], [out, rc], algorithm="flat")
    waiter = threading.Thread(target=req.Wait)
    waiter.start()
    if comm.rank != late:
        time.sleep(0.2)  # the waiter is inside Wait, for the late rank
        with pytest.raises(PlanStateError, match="another thread is in Test/Wait/Free of this request"):
            req.Test()
    waiter.join()
    assert out.tobytes() == ref.tobytes()
    assert req.Test() is True  # completed: inactive, as MPI's null request


@pytest.mark.parametrize("algorithm", NONBLOCKING)
def test_rebind_and_evict_while_queued(comm, algorithm):
    """A request holding a cached run stays right while later calls rebind its pattern to other
    buffers and evict it (a cache of two entries), all queued before any completes."""
    hc = HierComm(comm, **layouts(comm.size)["regular"], cache_entries=2)
    try:
        sc, rc, sbuf, ref = _case(comm, 40)
        first, second = np.full_like(ref, np.nan), np.full_like(ref, np.nan)
        for _ in range(2):  # a miss, then a hit that binds the entry's run to ``first``
            hc.Ialltoallv([sbuf, sc], [first, rc], algorithm=algorithm).Wait()
        first[:] = np.nan
        held = hc.Ialltoallv([sbuf, sc], [first, rc], algorithm=algorithm)  # handed the bound run
        rebound = hc.Ialltoallv([sbuf, sc], [second, rc], algorithm=algorithm)  # the entry rebound
        others = [_case(comm, 41 + k) for k in range(3)]  # new patterns: the entry evicted
        outs = [np.full_like(r, np.nan) for _, _, _, r in others]
        evicting = [hc.Ialltoallv([s, c], [o, r], algorithm=algorithm) for (c, r, s, _), o in zip(others, outs)]
        hxmpi.waitall([*evicting[::-1], rebound, held])
        assert first.tobytes() == ref.tobytes() and second.tobytes() == ref.tobytes()
        for (_, _, _, r), o in zip(others, outs):
            assert o.tobytes() == r.tobytes()
    finally:
        hc.free()


def test_a_bad_spec_raises_at_its_own_wait_on_every_rank(comm, hc):
    """The bad call's error comes at its Wait, on every rank; the calls around it are unharmed."""
    cases = [_case(comm, 50 + k) for k in range(3)]
    outs = [np.full_like(ref, np.nan) for _, _, _, ref in cases]
    bad_rc = cases[1][1].copy()
    if comm.rank == 0:
        bad_rc[0] += 1  # rank 0 expects a block one item longer than rank 0 sends it
    reqs = [hc.Ialltoallv([cases[0][2], cases[0][0]], [outs[0], cases[0][1]]),
            hc.Ialltoallv([cases[1][2], cases[1][0]], [np.zeros(int(bad_rc.sum())), bad_rc]),
            hc.Ialltoallv([cases[2][2], cases[2][0]], [outs[2], cases[2][1]])]
    reqs[2].Wait()
    reqs[0].Wait()
    with pytest.raises(ExchangeError, match="rank 0 sends .* B to rank 0, which expects .* B"):
        reqs[1].Wait()
    for k in (0, 2):
        assert outs[k].tobytes() == cases[k][3].tobytes()


def test_a_freed_request_is_refused(comm, hc):
    """Free completes the request; using it afterwards raises a clear error."""
    sc, rc, sbuf, ref = _case(comm, 60)
    out = np.full_like(ref, np.nan)
    req = hc.Ialltoallv([sbuf, sc], [out, rc])
    req.Free()
    assert out.tobytes() == ref.tobytes()
    for use in (req.Wait, req.Test, req.Free):
        with pytest.raises(PlanStateError, match="this request was freed"):
            use()


def test_multi_leader_is_refused_at_wait_on_every_rank(comm):
    """hier_leaders needs the shared window, which a nonblocking call cannot use: an agreed error."""
    h = HierComm(comm, **layouts(comm.size)["regular"])
    try:
        sc, rc, sbuf, ref = _case(comm, 70)
        req = h.Ialltoallv([sbuf, sc], [np.full_like(ref, np.nan), rc], algorithm="hier_leaders")
        if h.layout.hier_possible:
            with pytest.raises(ExchangeError, match="needs the shared-memory node phase"):
                req.Wait()
        else:
            req.Wait()
    finally:
        h.free()
