"""Multi-leader ("hier_leaders") under MPI: byte for byte what comm.Alltoallv gives, at every leader
count and on every layout, one-shot, cached and persistent; each leader sends one message per other
node, the other ranks none."""
import numpy as np
import pytest
from support import VIRTUAL_LAYOUTS, exchange_case, layouts

from hxmpi import ExchangeError, HierComm

pytestmark = pytest.mark.mpi


def _made(comm, name, leaders):
    try:
        return HierComm(comm, **layouts(comm.size)[name], node_phase="shm", leaders=leaders)
    except ExchangeError:  # a node's ranks span hosts (the emulated cluster): no window, refused alike
        pytest.skip("a node's ranks span hosts here, so there is no shared-memory phase")


@pytest.mark.parametrize("leaders", [1, 2, 3, 64])
@pytest.mark.parametrize("name", VIRTUAL_LAYOUTS)
def test_every_leader_count_equals_alltoallv(comm, name, leaders):
    hc = _made(comm, name, leaders)
    rng = np.random.default_rng(100 + comm.rank)
    t = hc.topology
    for dtype in (np.float64, np.int8):
        sc, rc, sbuf, ref = exchange_case(comm, rng, dtype)
        for _ in range(3):  # a miss, a rebound hit, then a bound (persistent) run on these buffers
            out = np.zeros_like(ref)
            hc.Alltoallv([sbuf, sc], [out, rc], algorithm="hier_leaders")
            assert out.tobytes() == ref.tobytes(), (name, leaders, dtype)
        stats = hc.last_stats
        if not hc.layout.hier_possible:
            assert stats["algorithm"] == "flat"
            continue
        k = min(leaders, min(hc.layout.node_sizes))
        assert stats["algorithm"] == "hier_leaders" and stats["leaders"] == k
        sent = stats["inter"]["messages"]
        assert sent <= t.num_nodes - 1 if t.local_rank < k else sent == 0, stats
    req = hc.Alltoallv_init([sbuf, sc], [out, rc], algorithm="hier_leaders")
    for _ in range(2):
        out.fill(0)
        req.Start()
        req.Wait()
        assert out.tobytes() == ref.tobytes()
    req.Free()
    hc.free()


def test_bad_leader_counts_are_refused_on_every_rank(comm):
    bad = 0 if comm.rank == comm.size - 1 else 2  # one rank's alone
    with pytest.raises(ExchangeError, match="leaders must be an integer >= 1, got 0"):
        HierComm(comm, ranks_per_node=2, leaders=bad)
    if comm.size > 1:
        with pytest.raises(ExchangeError, match="leaders 3 or chunks 1 differs between ranks|leaders 2 or chunks 1 differs between ranks"):
            HierComm(comm, ranks_per_node=2, leaders=3 if comm.rank == 0 else 2)
