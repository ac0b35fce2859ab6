"""Communicators made from a HierComm stay hierarchical: ``Dup``, ``Split``, ``Split_type``,
``Create_cart`` (and ``Sub`` on it), ``Create_group`` return HierComms over the same ranks, in the
same order, as the plain mpi4py call makes, with the parent's settings and each rank on the node
its process had in the parent; their Alltoallv, Alltoall and Alltoallw equal the plain derived
communicator's byte for byte, on every layout. Ranks the MPI call leaves out get ``COMM_NULL``;
a bad argument raises the same ``TopologyError`` on every rank."""
from __future__ import annotations

import mpi4py
import numpy as np
import pytest
from mpi4py import MPI
from support import assert_exchange_works, exchange_case, hier_comms, layouts, node_of, random_data

from hxmpi import CartHierComm, HierComm, TopologyError

pytestmark = pytest.mark.mpi

#: the parents: virtual nodes of 2 and 3 ranks (the last smaller), of 1, uneven ones, interleaved
LAYOUTS = ("regular", "irregular", "one_per_node", "irregular_3_3_1", "round_robin", "shuffled")
#: the layout every derivation runs on (4+1+2 ranks at 7), and those the rest run on every layout
ALL_WAYS_ON = "shuffled"
EVERY_LAYOUT = ("split_parity_keys_reversed", "cart_columns", "group_every_other_reversed")
#: settings unlike the defaults, which every derived communicator must carry
SETTINGS = {"algorithm": "hier", "radix": 3, "cache_entries": 5, "cache_bytes": 1 << 20}


@pytest.fixture(scope="module")
def parents():
    yield from hier_comms(LAYOUTS, **SETTINGS)


def _cart(c, periods=None, reorder=False):
    return c.Create_cart(MPI.Compute_dims(c.size, 2), periods=periods, reorder=reorder)


def _sub(keep):
    """A row or column of the 2-D grid, as ``Create_cart`` then ``Sub`` (the grid freed)."""
    def make(c):
        cart = _cart(c)
        try:
            return cart.Sub(keep)
        finally:
            cart.Free()
    return make


def _group(c):
    """Every other rank, from the last down, as ``Create_group`` (ranks outside it call too)."""
    whole = c.Get_group()
    part = whole.Incl(list(range(c.size))[::-2])
    try:
        return c.Create_group(part, tag=3)
    finally:
        part.Free()
        whole.Free()


def _create_halves(c):
    """The ranks of this rank's parity but the last, as ``Create`` with disjoint groups (the last
    rank passes the empty group, and gets COMM_NULL)."""
    whole = c.Get_group()
    last = c.size - 1
    mine = whole.Incl(list(range(c.rank % 2, last, 2))) if c.rank < last else MPI.GROUP_EMPTY
    try:
        return c.Create(mine)
    finally:
        if mine != MPI.GROUP_EMPTY:
            mine.Free()
        whole.Free()


#: ways to derive a communicator, each applied to a HierComm and to the plain communicator alike
DERIVE = {
    "split_parity_keys_reversed": lambda c: c.Split(c.rank % 2, c.size - c.rank),
    "split_thirds": lambda c: c.Split(c.rank // 3),
    "split_all_keys_reversed": lambda c: c.Split(0, -c.rank),
    "split_first_undefined": lambda c: c.Split(MPI.UNDEFINED if c.rank == 0 else 4, -c.rank),
    "dup": lambda c: c.Dup(),
    "clone": lambda c: c.Clone(),
    "split_type_shared": lambda c: c.Split_type(MPI.COMM_TYPE_SHARED, key=-c.rank),
    "split_type_odd_undefined": lambda c: c.Split_type(MPI.UNDEFINED if c.rank % 2 else MPI.COMM_TYPE_SHARED),
    "cart": _cart,
    "cart_periodic_reordered": lambda c: _cart(c, periods=[True, False], reorder=True),
    "cart_rows": _sub([False, True]),
    "cart_columns": _sub([True, False]),
    "cart_last_outside": lambda c: c.Create_cart([max(1, c.size - 1)]),
    "group_every_other_reversed": _group,
    "create_halves": _create_halves,
}


def _dense(ids) -> list:
    """Node ids renumbered 0.. in order of each node's lowest rank (as ``Topology`` does)."""
    order = {}
    return [order.setdefault(i, len(order)) for i in ids]


def _assert_exact(child: HierComm, seed: int) -> None:
    """Alltoallv (the inherited "hier", which runs hierarchical where the child's nodes allow, and
    "hier_bruck") and Alltoall through ``child`` equal the plain ``MPI_Alltoallv`` of its
    communicator, byte for byte."""
    comm = child.comm
    rng = np.random.default_rng(seed + 97 * comm.rank)
    sc, rc, sbuf, ref = exchange_case(comm, rng, np.float64)
    for algorithm in (None, "hier_bruck"):  # the inherited "hier", and the Bruck rounds on lanes
        out = np.full_like(ref, np.nan)
        child.Alltoallv([sbuf, sc], [out, rc], algorithm=algorithm)
        assert out.tobytes() == ref.tobytes(), algorithm
        if algorithm is None:
            assert child.last_stats["algorithm"] == ("hier" if child.layout.hier_possible else "flat")
    block = 3
    send = random_data(np.int32, block * comm.size, rng)
    ref = np.zeros_like(send)
    comm.Alltoallv([send, np.full(comm.size, block)], [ref, np.full(comm.size, block)])
    out = np.zeros_like(send)
    child.Alltoall(send, out)
    assert out.tobytes() == ref.tobytes()


@pytest.mark.parametrize("layout, how", [(ALL_WAYS_ON, how) for how in DERIVE]
                         + [(layout, how) for layout in LAYOUTS if layout != ALL_WAYS_ON for how in EVERY_LAYOUT])
def test_derived_communicator_is_a_hiercomm_with_the_parents_settings_and_nodes(parents, comm, layout, how):
    hc = parents[layout]
    child, plain = DERIVE[how](hc), DERIVE[how](comm)
    try:
        assert (plain == MPI.COMM_NULL) == (not isinstance(child, HierComm))
        if plain == MPI.COMM_NULL:  # MPI leaves this rank out: so does the HierComm's call
            assert child == MPI.COMM_NULL
            return
        assert isinstance(child, CartHierComm) == (plain.Get_topology() == MPI.CART)
        mine, theirs = child.Get_group(), plain.Get_group()
        assert MPI.Group.Compare(mine, theirs) == MPI.IDENT  # the same ranks in the same order
        mine.Free()
        theirs.Free()
        assert {k: v for k, v in child._settings.items() if k != "node_of"} == \
            {k: v for k, v in hc._settings.items() if k != "node_of"}
        assert (child.algorithm, child.radix, child.node_phase) == (SETTINGS["algorithm"], SETTINGS["radix"],
                                                                    hc.node_phase)
        assert (child.plan_cache.max_entries, child.plan_cache.max_bytes) == (SETTINGS["cache_entries"],
                                                                              SETTINGS["cache_bytes"])
        world_ranks = child.comm.allgather(comm.rank)
        parent_nodes = node_of(layouts(comm.size)[layout], comm.size)
        assert list(child.topology.node_of) == _dense([parent_nodes[r] for r in world_ranks])
        _assert_exact(child, seed=len(how))
    finally:
        for c in (child, plain):
            if c != MPI.COMM_NULL:
                c.Free()


def test_cartesian_hiercomm_answers_as_the_cartcomm(parents, comm):
    hc = parents["irregular"]
    cart, plain = _cart(hc, periods=[True, False]), _cart(comm, periods=[True, False])
    try:
        assert (cart.dims, cart.periods, cart.coords, cart.ndim, cart.topo) == \
            (plain.dims, plain.periods, plain.coords, plain.ndim, plain.topo)
        assert [cart.Get_coords(r) for r in range(comm.size)] == [plain.Get_coords(r) for r in range(comm.size)]
        assert cart.Get_cart_rank(plain.coords) == comm.rank
        assert [cart.Shift(d, s) for d in (0, 1) for s in (-1, 1)] == \
            [plain.Shift(d, s) for d in (0, 1) for s in (-1, 1)]
        again = cart.Dup()  # a duplicate of a grid is a grid, as mpi4py's Cartcomm.Dup
        wrapped = HierComm(plain, ranks_per_node=3)  # a HierComm made over a grid is one too
        rewrapped = HierComm(cart, algorithm="flat")  # and over a CartHierComm, which stands for its grid
        try:
            assert isinstance(again, CartHierComm) and isinstance(wrapped, CartHierComm)
            assert isinstance(rewrapped, CartHierComm) and rewrapped.algorithm == "flat"
            assert type(rewrapped.comm) is MPI.Cartcomm and rewrapped.coords == plain.coords
            _assert_exact(rewrapped, seed=5)
            rows = wrapped.Sub([False, True])
            assert isinstance(rows, CartHierComm) and rows.size == plain.dims[1]
            rows.Free()
        finally:
            for c in (again, wrapped, rewrapped):
                c.Free()
    finally:
        cart.Free()
        plain.Free()
    assert not isinstance(hc, CartHierComm) and not hasattr(hc, "Sub")


def test_free_releases_the_derived_communicators(parents):
    child = parents["regular"].Split(0, 0)
    held = [child.comm, child.topology.intra, *(c for _, c in child.topology.served_lanes)]
    child.Free()
    assert all(c == MPI.COMM_NULL for c in held)


def _raises_everywhere(comm, call, text: str) -> None:
    """``call`` raises a TopologyError naming ``text`` with the same message on every rank of ``comm``."""
    with pytest.raises(TopologyError) as caught:
        call()
    message = str(caught.value)
    assert text in message, message
    assert comm.allgather(message) == [message] * comm.size


def test_a_bad_argument_raises_the_same_error_on_every_rank(parents, comm, monkeypatch):
    hc = parents["irregular"]
    size, last = comm.size, comm.size - 1
    odd = comm.rank == last
    _raises_everywhere(comm, lambda: hc.Split(-5 if odd else 0),
                       f"rank {last}: color must be an integer >= 0 or MPI.UNDEFINED, got -5")
    _raises_everywhere(comm, lambda: hc.Split(0, "x" if odd else 0), f"rank {last}: key must be an integer, got 'x'")
    _raises_everywhere(comm, lambda: hc.Split_type("shared" if odd else MPI.COMM_TYPE_SHARED),
                       f"rank {last}: split_type must be an MPI.COMM_TYPE_* constant")
    _raises_everywhere(comm, lambda: hc.Dup(info="hints"), "info must be an MPI.Info or None, got 'hints'")
    _raises_everywhere(comm, lambda: hc.Create_cart([size + 1]),
                       f"the grid [{size + 1}] has {size + 1} ranks, more than the communicator's {size}")
    _raises_everywhere(comm, lambda: hc.Create_cart([size, 0]), "dims must be positive")
    _raises_everywhere(comm, lambda: hc.Create_cart([1, 1], periods=[True]), "periods has 1 entries but dims has 2")
    if size > 1:  # arguments that must agree, but differ
        _raises_everywhere(comm, lambda: hc.Create_cart([1] if odd else [size]),
                           f"rank {last}: dims, periods and reorder ([1], [False], False) differ from rank 0's")
        _raises_everywhere(comm, lambda: hc.Split_type(MPI.COMM_TYPE_HW_UNGUIDED if odd else MPI.COMM_TYPE_SHARED),
                           f"rank {last}: split_type")
    _raises_everywhere(comm, lambda: hc.Create("x" if odd else MPI.GROUP_EMPTY),
                       f"rank {last}: group must be an MPI.Group, got 'x'")
    cart = hc.Create_cart([size])
    try:
        _raises_everywhere(comm, lambda: cart.Sub([True, False]), "remain_dims has 2 entries but the grid has 1")
    finally:
        cart.Free()
    # Create_group is collective over the group alone: a bad argument is the passing rank's alone,
    # raised there (no communication) where the communicator returns errors by the user's choice
    # (``errors.returns_errors``; else the job ends: tests/test_faults_calls.py).
    monkeypatch.setattr(mpi4py.rc, "errors", "default")
    assert hc.comm.Get_errhandler() == MPI.ERRORS_RETURN
    _raises_everywhere(comm, lambda: hc.Create_group("everyone"), "group must be an MPI.Group, got 'everyone'")
    half = hc.Split(comm.rank % 2)
    whole = comm.Get_group()
    try:
        if size > 1:
            _raises_everywhere(half, lambda: half.Create_group(whole), "are not processes of this communicator")
        _raises_everywhere(half, lambda: half.Create_group(whole, tag=-1), "tag must be an integer")
    finally:
        whole.Free()
        half.Free()
    assert_exchange_works(comm, hc)  # nothing was left half-done


def _blocks(n: int, parts: int) -> list:
    """(start, stop) of each of ``parts`` near-equal blocks of ``n``."""
    return [(n * i // parts, n * (i + 1) // parts) for i in range(parts)]


def _subarrays(shape, axis: int, parts: int) -> list:
    """A double subarray type per peer: its block of ``shape`` along ``axis``."""
    types = []
    for lo, hi in _blocks(shape[axis], parts):
        sub, start = list(shape), [0] * len(shape)
        sub[axis], start[axis] = hi - lo, lo
        types.append(MPI.DOUBLE.Create_subarray(list(shape), sub, start).Commit())
    return types


def _transpose(sub, exchange) -> np.ndarray:
    """A pencil transpose over ``sub`` (the global 11 x 13 array along axis 0 to along axis 1, by
    subarray types, as mpi4py-fft's transfers); ``exchange`` is the Alltoallw that moves it."""
    n0, n1, p, me = 11, 13, sub.size, sub.rank
    (a0, a1), (b0, b1) = _blocks(n0, p)[me], _blocks(n1, p)[me]
    a = np.random.default_rng(MPI.COMM_WORLD.rank).standard_normal((a1 - a0, n1))
    b = np.full((n0, b1 - b0), np.nan)
    stypes, rtypes = _subarrays(a.shape, 1, p), _subarrays(b.shape, 0, p)
    ones, zeros = [1] * p, [0] * p
    try:
        exchange([a, ones, zeros, stypes], [b, ones, zeros, rtypes])
    finally:
        for t in stypes + rtypes:
            t.Free()
    return b


def test_mpi4py_fft_style_grid_stays_on_hiercomm(parents, comm):
    """As mpi4py-fft's ``Subcomm`` builds its pencils' communicators (``Create_cart``, one ``Sub``
    per axis, the grid freed), every one is a HierComm whose Alltoallw (blocking and not) and
    Alltoallv are exact."""
    hc = parents["regular"]
    for dims in (2, 3):
        cart = hc.Create_cart(MPI.Compute_dims(comm.size, [0] * dims))
        subs = [cart.Sub([axis == d for d in range(dims)]) for axis in range(dims)]
        cart.Free()
        try:
            for sub in subs:
                assert isinstance(sub, HierComm) and sub.algorithm == "hier"
                want = _transpose(sub, sub.comm.Alltoallw).tobytes()
                assert _transpose(sub, sub.Alltoallw).tobytes() == want
                assert _transpose(sub, lambda s, r: sub.Ialltoallw(s, r).Wait()).tobytes() == want
                _assert_exact(sub, seed=dims)
        finally:
            for sub in subs:
                sub.Free()
