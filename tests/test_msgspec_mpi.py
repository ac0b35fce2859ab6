"""The mpi4py spec forms through the whole exchange: results equal MPI's, errors carry mpi4py's types."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI
from support import DLPackOnly, assert_exchange_works, hier_comms

from hxmpi import ExchangeKeyError, ExchangeTypeError

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def hcs():
    yield from hier_comms(("regular", "round_robin"))


def _counts(comm):
    """Irregular counts: rank s sends (s + 2 d) % 3 + 1 doubles to rank d."""
    size, me = comm.size, comm.rank
    sc = np.array([(me + 2 * d) % 3 + 1 for d in range(size)])
    rc = np.array([(s + 2 * me) % 3 + 1 for s in range(size)])
    return sc, rc


@pytest.mark.parametrize("algorithm", ["flat", "hier"])
@pytest.mark.parametrize("layout", ["regular", "round_robin"])
def test_in_place_alltoallv_equals_mpi(comm, hcs, layout, algorithm):
    size, me = comm.size, comm.rank
    # In place, send and receive counts are the same array, so the pattern must be symmetric.
    counts = np.array([(me + d) % 3 + 1 for d in range(size)])
    displs = np.arange(size) * 4 + 1  # gaps and an offset: only the blocks may move
    init = np.arange(4 * size + 1, dtype=np.float64) + 100 * me
    ref, out = init.copy(), init.copy()
    comm.Alltoallv(MPI.IN_PLACE, [ref, (counts, displs), MPI.DOUBLE])
    hcs[layout].Alltoallv(MPI.IN_PLACE, [out, (counts, displs), "d"], algorithm=algorithm)
    assert np.array_equal(out, ref)


@pytest.mark.parametrize("algorithm", ["flat", "hier"])
def test_dlpack_and_fortran_buffers_equal_mpi(comm, hcs, algorithm):
    sc, rc = _counts(comm)
    send = np.asfortranarray(np.arange(sc.sum(), dtype=np.float64).reshape(-1, 1) + 1000 * comm.rank)
    ref = np.zeros(rc.sum())
    comm.Alltoallv([send, sc, MPI.DOUBLE], [ref, rc, MPI.DOUBLE])
    out = np.zeros(rc.sum())
    hcs["regular"].Alltoallv([DLPackOnly(send), sc], [DLPackOnly(out), (rc, None), "d"], algorithm=algorithm)
    assert np.array_equal(out, ref)


def test_typecodes_and_integer_counts(comm, hcs):
    size = comm.size
    sbuf = np.arange(3 * size, dtype=np.int32) + 10 * comm.rank
    ref, out = np.zeros_like(sbuf), np.zeros_like(sbuf)
    comm.Alltoallv([sbuf, 3, "i"], [ref, (3, 3), "i"])
    hcs["round_robin"].Alltoallv([sbuf, 3, "i"], [out, (3, 3), "i"], algorithm="hier")
    assert np.array_equal(out, ref)
    hcs["regular"].Alltoall([None, 0, "i"], [None, 0, "i"])  # empty messages are fine
    assert hcs["regular"].last_stats["copy_bytes"] == 0


def test_bad_specs_raise_mpi4pys_types_on_every_rank(comm, hcs):
    culprit = comm.size - 1
    buf = np.zeros(comm.size)
    bad_type = [buf, "\0"] if comm.rank == culprit else [buf, "d"]
    with pytest.raises(ExchangeKeyError, match=f"rank {culprit}: send: cannot map typecode"):
        hcs["regular"].Alltoallv(bad_type, [np.zeros(comm.size), "d"])
    bad_counts = [buf, np.full(comm.size, 1.5)] if comm.rank == culprit else [buf, 1]
    with pytest.raises(ExchangeTypeError, match=f"rank {culprit}: send counts must hold integers"):
        hcs["regular"].Alltoallv(bad_counts, [np.zeros(comm.size), 1])
    assert_exchange_works(comm, hcs["regular"])  # nothing left half-done


def test_in_place_persistent_request_sends_what_the_buffer_holds_at_start(comm, hcs):
    """In place, each Start sends the receive buffer's contents at that moment, not at init."""
    size = comm.size
    out = np.zeros(2 * size)
    with hcs["regular"].Alltoallv_init(MPI.IN_PLACE, [out, 2, "d"], algorithm="hier") as req:
        for start in range(3):
            out[:] = np.arange(2 * size) + 1000 * comm.rank + 100 * start
            ref = out.copy()
            comm.Alltoall(MPI.IN_PLACE, ref)
            req.Start()
            req.Wait()
            assert out.tobytes() == ref.tobytes(), start
