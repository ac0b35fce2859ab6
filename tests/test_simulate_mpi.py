"""The replayed traces carry exactly the messages and bytes HierComm's last_stats reports for the same call."""
import numpy as np
import pytest
from mpi4py import MPI

from hxmpi import HierComm
from hxmpi.comm.costmodel import CostModel
from hxmpi.comm.plan import Layout
from hxmpi.sim.schedule import Copy, rank_schedule
from hxmpi.sim.calls import make_counts
from hxmpi.sim.trace import rank_trace, trace_stats

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("uneven", [False, True])
@pytest.mark.parametrize("node_phase", ["shm", "mpi"], ids=["shm-phase", "mp-phase"])  # no "mpi" id: a marker
@pytest.mark.parametrize("algorithm", ["flat", "hier"])
def test_trace_matches_last_stats(algorithm, node_phase, uneven):
    """Nodes of 2 ranks: 2x2 at 4 ranks, 2+2+1 at 5, 3x2 at 6; any size runs (1 node: flat)."""
    comm = MPI.COMM_WORLD
    node_of = [r // 2 for r in range(comm.size)]
    hc = HierComm(comm, node_of=node_of, algorithm=algorithm, node_phase=node_phase)
    counts = make_counts(comm.size, 40, uneven, seed=7)
    sc, rc = counts[comm.rank], np.ascontiguousarray(counts[:, comm.rank])
    sbuf = np.arange(int(sc.sum()), dtype=np.int64).astype(np.uint8)
    rbuf = np.empty(int(rc.sum()), np.uint8)
    hc.Alltoallv([sbuf, sc, MPI.BYTE], [rbuf, rc, MPI.BYTE])
    stats = hc.last_stats
    layout = Layout(node_of)
    got = trace_stats(rank_trace(layout, counts, comm.rank, algorithm, node_phase, CostModel()))
    none = {"messages": 0, "bytes": 0}
    if stats["algorithm"] == "flat":
        assert got.get("flat", none) == stats["flat"]
        assert set(got) <= {"flat"}
    else:
        assert stats["node_phase"] == node_phase
        assert got.get("lane", none) == stats["inter"]
        assert got.get("node", none) == stats["intra"]
        copies = sum(s.nbytes for s in rank_schedule(layout, counts, comm.rank, algorithm, node_phase)
                     if isinstance(s, Copy))
        assert copies == stats["copy_bytes"]
    hc.free()
