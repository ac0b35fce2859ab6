"""HierComm stands in for its communicator: a public attribute it lacks falls through to ``comm``."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from hxmpi import HierComm

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def hc():
    made = HierComm(MPI.COMM_WORLD, ranks_per_node=2)
    yield made
    made.free()


def test_communicator_methods_fall_through(comm, hc):
    size, me = comm.size, comm.rank
    assert (hc.Get_size(), hc.Get_rank(), hc.size, hc.rank) == (size, me, size, me)
    total = np.zeros(1)
    hc.Allreduce(np.ones(1), total)
    assert total[0] == size and hc.allreduce(me) == size * (size - 1) // 2
    hc.Barrier()
    got = np.full(1, -1)
    hc.Sendrecv(np.array([me]), dest=(me + 1) % size, recvbuf=got, source=(me - 1) % size)
    assert got[0] == (me - 1) % size
    assert hc.Get_topology() == MPI.UNDEFINED and hc.Is_intra()
    assert hc.bcast("x" if me == 0 else None) == "x"


def test_unknown_and_private_names_still_raise_naming_hiercomm(hc):
    with pytest.raises(AttributeError, match="'HierComm' object has no attribute 'Alltoall_nope'"):
        hc.Alltoall_nope
    with pytest.raises(AttributeError, match="'HierComm' object has no attribute '_secret'"):
        hc._secret
    assert not hasattr(hc, "__array__")


def test_free_under_the_communicator_name_frees_the_hiercomm(comm):
    hc = HierComm(comm)
    hc.Free()
    assert hc.comm == MPI.COMM_NULL
