"""Topology: exact fields on every rank for every layout, and errors raised on every rank."""
import os

import pytest
from support import VIRTUAL_LAYOUTS, layouts, node_of

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


@pytest.mark.parametrize("name", VIRTUAL_LAYOUTS)
def test_layout_fields(comm, name):
    size, rank = comm.size, comm.rank
    kw = layouts(size)[name]
    dense, sizes, local = expected(node_of(kw, size))
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
    """The names ARCHITECTURE.md's public API promises, documented, and the installed version."""
    from importlib.metadata import version
    promised = {"Topology", "HierComm", "ExchangeError", "ExchangeTypeError", "ExchangeKeyError",
                "TopologyError", "HxmpiError", "__version__"}
    assert promised <= set(hxmpi.__all__)
    assert all(getattr(hxmpi, name).__doc__ for name in promised - {"__version__"})
    assert hxmpi.__version__ == version("hxmpi")
    assert all(issubclass(getattr(hxmpi, name), hxmpi.HxmpiError) for name in promised if name.endswith("Error"))
