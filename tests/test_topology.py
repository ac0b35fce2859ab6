"""Topology: exact fields on every rank for every layout, and errors raised on every rank."""
import os

import pytest
from mpi4py import MPI

import hxmpi
from hxmpi import Topology, TopologyError

pytestmark = pytest.mark.mpi


def expected(node_of):
    """Reference topology from a node id list, computed independently of hxmpi."""
    order = []
    for n in node_of:
        if n not in order:
            order.append(n)
    dense = [order.index(n) for n in node_of]
    sizes = [dense.count(n) for n in range(len(order))]
    local = [dense[:r].count(dense[r]) for r in range(len(dense))]
    return dense, sizes, local


def layouts(size):
    return {
        "regular": {"ranks_per_node": 2},
        "irregular_last_small": {"ranks_per_node": 3},
        "round_robin": {"node_of": [r % 2 for r in range(size)]},
        "one_rank_per_node": {"node_of": list(range(size))},
        "one_node": {"node_of": [7] * size},
        "irregular_explicit": {"node_of": [min(r // 3, 2) for r in range(size)]},
        "sparse_ids": {"node_of": [100 * (r % 3) for r in range(size)]},
    }


@pytest.mark.parametrize("name", list(layouts(1)))
def test_layout_fields(comm, name):
    size, rank = comm.size, comm.rank
    kw = layouts(size)[name]
    node_of = kw.get("node_of") or [r // kw["ranks_per_node"] for r in range(size)]
    dense, sizes, local = expected(node_of)
    topo = Topology(comm, **kw)
    assert topo.node == dense[rank]
    assert topo.local_rank == local[rank]
    assert topo.num_nodes == len(sizes)
    assert topo.node_sizes == tuple(sizes)
    assert topo.is_regular == (len(set(sizes)) == 1)
    assert topo.intra.size == sizes[dense[rank]]
    assert topo.intra.rank == local[rank]
    # The lane has one member per node, in node order; small nodes serve missing lanes (l % G).
    assert topo.inter.size == len(sizes)
    assert topo.inter.rank == dense[rank]
    assert topo.lane is topo.inter
    gmax = max(sizes)
    served = [lane for lane in range(gmax) if lane % sizes[dense[rank]] == local[rank]]
    assert [lane for lane, _ in topo.served_lanes] == served
    for lane, lc in topo.served_lanes:
        members = lc.allgather(rank)
        want = [[r for r in range(size) if dense[r] == n][lane % sizes[n]] for n in range(len(sizes))]
        assert members == want
    topo.free()


def test_default_layout_is_found(comm):
    """Default nodes are shared-memory domains: one node on one host, the real hosts on a cluster."""
    expect = os.environ.get("HXMPI_EXPECT_NODE_SIZES")  # set by the emulated-cluster tier
    topo = Topology(comm)
    if os.environ.get("HXMPI_RANKS_PER_NODE"):
        pytest.skip("HXMPI_RANKS_PER_NODE overrides the default")
    sizes = tuple(int(s) for s in expect.split(",")) if expect else (comm.size,)
    assert topo.node_sizes == sizes
    assert topo.inter.size == len(sizes)
    assert topo.intra.size == sizes[topo.node]
    topo.free()


def test_env_ranks_per_node(comm, monkeypatch):
    monkeypatch.setenv("HXMPI_RANKS_PER_NODE", "2")
    topo = Topology(comm)
    assert topo.node_sizes == tuple(expected([r // 2 for r in range(comm.size)])[1])
    topo.free()


BAD = {
    "wrong_length": ({"node_of": [0, 0, 0, 0, 0, 0, 0, 0, 0]}, "shape"),
    "negative": ({"node_of": "neg"}, "negative"),
    "zero_ranks_per_node": ({"ranks_per_node": 0}, "positive integer"),
    "bad_ranks_per_node": ({"ranks_per_node": "two"}, "positive integer"),
    "both": ({"ranks_per_node": 1, "node_of": "ok"}, "not both"),
    "not_integers": ({"node_of": "float"}, "integers"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_layout_raises_on_every_rank(comm, case):
    kw, match = BAD[case]
    kw = dict(kw)
    size = comm.size
    if kw.get("node_of") == "neg":
        kw["node_of"] = [-1] + [0] * (size - 1)
    elif kw.get("node_of") == "ok":
        kw["node_of"] = [0] * size
    elif kw.get("node_of") == "float":
        kw["node_of"] = [0.5] * size
    elif "node_of" in kw and len(kw["node_of"]) == size:
        kw["node_of"] = kw["node_of"] + [0]
    with pytest.raises(TopologyError, match=match):
        Topology(comm, **kw)


def test_disagreeing_layout_raises_on_every_rank(comm):
    if comm.size == 1:
        pytest.skip("needs two ranks to disagree")
    node_of = [0] * comm.size if comm.rank == 0 else list(range(comm.size))
    with pytest.raises(TopologyError, match="differs from rank 0"):
        Topology(comm, node_of=node_of)


def test_error_names_the_rank(comm):
    if comm.size == 1:
        pytest.skip("needs two ranks")
    rpn = 0 if comm.rank == comm.size - 1 else 1
    with pytest.raises(TopologyError, match=f"rank {comm.size - 1}:"):
        Topology(comm, ranks_per_node=rpn)


def test_public_names():
    assert hxmpi.Topology is Topology and hxmpi.__version__
    assert MPI.Is_initialized()
