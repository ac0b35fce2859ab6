"""HierComm.Alltoallw: bytes equal comm.Alltoallw on every layout and algorithm, for basic and
derived datatypes (every kind of ``support.datatype_catalogue``), pencil transposes, in place,
every spec form; bad input raises the same ExchangeError on every rank, before data moves.

On one rank the reference is MPI's own packing (``_reference``): Open MPI's single-rank
``MPI_Alltoallw`` (its "self" component) scales the byte displacements by the datatype's extent,
so it writes elsewhere, past the buffer, as soon as a displacement is not 0."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI
from support import assert_exchange_works, datatype_catalogue, free_types, hier_comms

from hxmpi import ExchangeError, ExchangeTypeError

pytestmark = pytest.mark.mpi

LAYOUTS = ("regular", "irregular", "one_per_node", "round_robin", "shuffled")
ALGORITHMS = ("flat", "hier", "auto", "bruck", "hier_pairwise", "hier_bruck")
FILL = 0xA5  # what every receive buffer holds before a call: bytes outside the type maps must keep it


@pytest.fixture(scope="module")
def comms():
    yield from hier_comms(LAYOUTS)


@pytest.fixture(scope="module")
def types():
    made = datatype_catalogue()
    yield made
    free_types(made)


def _place(pairs):
    """(displacements in bytes, buffer bytes) of blocks of (datatype, count) laid one after another,
    each where its data starts at a fresh offset (a gap of 3 bytes between blocks)."""
    displs, at = [], 5
    for t, count in pairs:
        if count == 0 or t.size == 0:
            displs.append(0)
            continue
        low, high = t.true_lb + min(0, (count - 1) * t.extent), t.true_ub + max(0, (count - 1) * t.extent)
        displs.append(at - low)
        at += high - low + 3
    return displs, at


def _case(comm, types, seed, recv_as_bytes=False):
    """Random per-pair datatypes and counts (rank i sends ``count(i, j)`` items of ``kind(i, j)`` to
    j; j receives the same, or the same bytes as MPI.BYTE), random send data, and the specs."""
    names = sorted(types)
    size, me = comm.size, comm.rank

    def kind(i, j):
        return types[names[(seed * 31 + 7 * i + 13 * j) % len(names)]]

    def count(i, j):
        return 0 if (seed + i * 5 + j * 3) % 7 == 0 else 1 + (seed + i + 2 * j) % 3

    send_pairs = [(kind(me, j), count(me, j)) for j in range(size)]
    if recv_as_bytes:
        recv_pairs = [(MPI.BYTE, count(i, me) * kind(i, me).size) for i in range(size)]
    else:
        recv_pairs = [(kind(i, me), count(i, me)) for i in range(size)]
    sd, sbytes = _place(send_pairs)
    rd, rbytes = _place(recv_pairs)
    sbuf = np.random.default_rng(seed * 100 + me).integers(0, 256, sbytes, dtype=np.uint8)
    send = [sbuf, [c for _, c in send_pairs], sd, [t for t, _ in send_pairs]]
    recv = lambda buf: [buf, [c for _, c in recv_pairs], rd, [t for t, _ in recv_pairs]]  # noqa: E731
    return send, recv, rbytes


def _alltoallw(comm, send, recv):
    """``comm.Alltoallw`` of two ``[buf, counts, displs, datatypes]`` specs; on one rank, the same
    through MPI_Pack and MPI_Unpack (see the module docstring)."""
    if comm.size > 1:
        comm.Alltoallw(send, recv)
        return

    def whole(spec):  # the block as one item spanning the buffer
        buf = np.asarray(spec[0]).reshape(-1).view(np.uint8)
        moved = MPI.Datatype.Create_struct([spec[1][0]], [spec[2][0]], [spec[3][0]])
        t = moved.Create_resized(0, max(buf.nbytes, 1)).Commit()
        moved.Free()
        return buf, t

    (sbuf, st), (rbuf, rt) = whole(send), whole(recv)
    packed = np.empty(st.Pack_size(1, MPI.COMM_SELF), dtype=np.uint8)
    end = st.Pack(sbuf, packed, 0, MPI.COMM_SELF)
    rt.Unpack(packed[:end], 0, rbuf, MPI.COMM_SELF)
    st.Free()
    rt.Free()


def _reference(comm, send, recv, rbytes):
    ref = np.full(rbytes, FILL, dtype=np.uint8)
    _alltoallw(comm, send, recv(ref))
    return ref


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_derived_datatypes_equal_comm_alltoallw(comm, comms, types, layout, algorithm):
    """Every kind of datatype, three times on the same specs: parsed, then cached, then run by the
    run bound to them (composed with the type maps), receive bytes outside the maps untouched."""
    hc = comms[layout]
    for seed in range(3):
        send, recv, rbytes = _case(comm, types, seed)
        ref = _reference(comm, send, recv, rbytes)
        out = np.empty(rbytes, dtype=np.uint8)
        for _ in range(3):
            out[:] = FILL
            hc.Alltoallw(send, recv(out), algorithm=algorithm)
            assert out.tobytes() == ref.tobytes()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_received_as_bytes_and_repeated_calls(comm, comms, types, layout):
    """Derived types sent, MPI.BYTE received (a direct receive side); the same specs again hit the
    plan cache and still move the send buffer's current bytes."""
    hc = comms[layout]
    send, recv, rbytes = _case(comm, types, 4, recv_as_bytes=True)
    for trial in range(3):
        send[0][:] = np.random.default_rng(trial + 10 * comm.rank).integers(0, 256, send[0].shape[0])
        ref = _reference(comm, send, recv, rbytes)
        out = np.full(rbytes, FILL, dtype=np.uint8)
        hc.Alltoallw(send, recv(out), algorithm="auto")
        assert out.tobytes() == ref.tobytes()
    assert hc.last_stats["plan_cache"] in ("hit", "hit-rebound")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_basic_types_every_spec_form(comm, comms, layout):
    """Basic datatypes with byte displacements, counts as lists, tuples or arrays, the 3-item
    ``(counts, displs)`` form, and the 2-item form (one item of each type at displacement 0)."""
    hc, size, me = comms[layout], comm.size, comm.rank
    counts = [(me + j) % 3 for j in range(size)]
    rcounts = [(i + me) % 3 for i in range(size)]
    sbuf = np.arange(sum(counts) + 1, dtype=np.float64) + 100 * me
    sd = [8 * (sum(counts[:j]) + 1) for j in range(size)]  # one element of slack at the front
    rd = [8 * sum(rcounts[:i]) for i in range(size)]
    dt = [MPI.DOUBLE] * size
    for form in ("lists", "arrays", "pair"):
        ref = np.full(sum(rcounts), -1.0)
        _alltoallw(comm, [sbuf, counts, sd, dt], [ref, rcounts, rd, dt])
        out = np.full_like(ref, -1.0)
        if form == "lists":
            hc.Alltoallw([sbuf, counts, sd, dt], [out, rcounts, rd, dt])
        elif form == "arrays":
            hc.Alltoallw([sbuf, np.array(counts), np.array(sd), tuple(dt)], [out, np.array(rcounts), np.array(rd), dt])
        else:
            hc.Alltoallw([sbuf, (counts, sd), dt], [out, (rcounts, rd), dt])
        assert out.tobytes() == ref.tobytes()
    # [buf, datatypes]: each peer's datatype picks its own row of a (size, 3) array
    rows = [MPI.INT.Create_subarray([size, 3], [1, 3], [j, 0]).Commit() for j in range(size)]
    try:
        a = np.arange(3 * size, dtype=np.int32).reshape(size, 3) + 1000 * me
        ref, out = np.full_like(a, -1), np.full_like(a, -1)
        _alltoallw(comm, [a, [1] * size, [0] * size, rows], [ref, [1] * size, [0] * size, rows])
        hc.Alltoallw([a, rows], [out, rows])
        assert out.tobytes() == ref.tobytes()
    finally:
        for t in rows:
            t.Free()


def _pencil_types(shape, axis, chunks, dtype):
    """mpi4py-fft's subarray datatypes for one side of a pencil transfer: for each peer, the part
    of a local array of ``shape`` that lies in that peer's chunk along ``axis``."""
    base = MPI._typedict[np.dtype(dtype).char]
    types = []
    for start, n in chunks:
        sub = list(shape)
        sub[axis] = n
        starts = [0] * len(shape)
        starts[axis] = start
        types.append(base.Create_subarray(shape, sub, starts).Commit())
    return types


def _chunks(n, size):
    """(start, length) of each rank's share of ``n`` (the first ``n % size`` get one more)."""
    lengths = [n // size + (r < n % size) for r in range(size)]
    return [(sum(lengths[:r]), lengths[r]) for r in range(size)]


@pytest.mark.parametrize("algorithm", ["flat", "hier", "auto"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_pencil_transpose_equals_comm_alltoallw(comm, comms, layout, algorithm):
    """The FFT pencil transpose (a 3-D complex array distributed along axis 0 redistributed along
    axis 1, uneven shares): interleaved subarrays on both sides, there and back."""
    hc, size, me = comms[layout], comm.size, comm.rank
    shape = (7, 5 + size, 4)
    c0, c1 = _chunks(shape[0], size), _chunks(shape[1], size)
    a_shape = (c0[me][1], shape[1], shape[2])
    b_shape = (shape[0], c1[me][1], shape[2])
    send_t = _pencil_types(a_shape, 1, c1, np.complex128)
    recv_t = _pencil_types(b_shape, 0, c0, np.complex128)
    try:
        rng = np.random.default_rng(me)
        a = rng.standard_normal(a_shape) + 1j * rng.standard_normal(a_shape)
        ones, zeros = [1] * size, [0] * size
        ref = np.zeros(b_shape, complex)
        _alltoallw(comm, [a, ones, zeros, send_t], [ref, ones, zeros, recv_t])
        b = np.zeros(b_shape, complex)
        hc.Alltoallw([a, (ones, zeros), send_t], [b, (ones, zeros), recv_t], algorithm=algorithm)
        assert b.tobytes() == ref.tobytes()
        back = np.zeros(a_shape, complex)
        hc.Alltoallw([b, (ones, zeros), recv_t], [back, (ones, zeros), send_t], algorithm=algorithm)
        assert back.tobytes() == a.tobytes()
    finally:
        for t in send_t + recv_t:
            t.Free()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_in_place(comm, comms, types, layout):
    """MPI.IN_PLACE: what the receive side describes is sent, then overwritten (symmetric pairs);
    called again on the same specs, what the buffer holds at each call."""
    hc, size, me = comms[layout], comm.size, comm.rank
    names = sorted(types)
    pairs = [(types[names[(3 * min(me, j) + 5 * max(me, j)) % len(names)]], 1 + (me + j) % 2) for j in range(size)]
    rd, nbytes = _place(pairs)
    spec = [np.zeros(nbytes, np.uint8), [c for _, c in pairs], rd, [t for t, _ in pairs]]
    for trial in range(4):
        start = np.random.default_rng(trial + 10 * me).integers(0, 256, nbytes, dtype=np.uint8)
        ref = start.copy()
        comm.Alltoallw(MPI.IN_PLACE, [ref, *spec[1:]])
        spec[0][:] = start
        hc.Alltoallw(MPI.IN_PLACE, spec)
        assert spec[0].tobytes() == ref.tobytes()


def _refused(comm, hc, send, recv, match, error=ExchangeError):
    """The call raises ``error`` matching ``match`` on every rank; the receive buffer is untouched."""
    before = np.asarray(recv[0]).copy()
    with pytest.raises(error, match=match):
        hc.Alltoallw(send, recv)
    assert np.asarray(recv[0]).tobytes() == before.tobytes()
    assert_exchange_works(comm, hc)


def _good(comm):
    size = comm.size
    send = [np.ones(2 * size), [2] * size, [16 * j for j in range(size)], [MPI.DOUBLE] * size]
    recv = [np.zeros(2 * size), [2] * size, [16 * j for j in range(size)], [MPI.DOUBLE] * size]
    return send, recv


@pytest.mark.parametrize("layout", LAYOUTS)
def test_mismatched_bytes_raise_on_every_rank(comm, comms, layout):
    """Rank 0 sends one more double to the last rank than that rank expects: named everywhere."""
    send, recv = _good(comm)
    if comm.rank == 0:
        send[0] = np.ones(2 * comm.size + 1)
        send[1] = send[1][:-1] + [3]
    _refused(comm, comms[layout], send, recv, f"rank 0 sends 24 B to rank {comm.size - 1}, which expects 16 B")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_bad_input_on_one_rank_raises_on_every_rank(comm, comms, layout):
    hc, size, last = comms[layout], comm.size, comm.size - 1
    loose = MPI.DOUBLE.Create_vector(2, 1, 2)  # never committed
    folded = MPI.DOUBLE.Create_contiguous(2).Create_resized(0, 8).Commit()  # 2 items of it share 8 bytes
    bad = {
        "negative count": (lambda s, r: s[1].__setitem__(0, -1), r"rank %d: send counts\[0\] = -1 is negative"),
        "past the buffer": (lambda s, r: r[2].__setitem__(last, 16 * size), "outside the buffer"),
        "uncommitted": (lambda s, r: s[3].__setitem__(0, loose), r"send datatypes\[0\]: .*not committed"),
        "null datatype": (lambda s, r: r[3].__setitem__(0, MPI.DATATYPE_NULL), "DATATYPE_NULL"),
        "wrong length": (lambda s, r: s.__setitem__(3, s[3][:-1]), f"datatypes has {size - 1} entries"),
        "overlapping receive items": (lambda s, r: r[3].__setitem__(0, folded), "datatypes overlap"),
        "overlapping receive blocks": (lambda s, r: r.__setitem__(2, [0] * size), "overlap"),
    }
    try:
        for name, (spoil, match) in bad.items():
            send, recv = _good(comm)
            if name.startswith("overlapping") and size == 1:
                continue  # one receive block of 16 B holds no overlap
            if comm.rank == last:
                spoil(send, recv)
            _refused(comm, hc, send, recv, match % last if "%d" in match else match)
        send, recv = _good(comm)
        if comm.rank == last:
            send[3] = ["d"] * size
        _refused(comm, hc, send, recv, "MPI.Datatype objects", ExchangeTypeError)
    finally:
        loose.Free()
        folded.Free()


@pytest.fixture(scope="module")
def mpi_phase():
    yield from hier_comms(("regular", "irregular", "round_robin"), node_phase="mpi")


@pytest.mark.parametrize("phase", ["shm", "mpi"])
@pytest.mark.parametrize("layout", ["regular", "irregular", "round_robin"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_repeated_calls_run_compiled_and_see_new_data(comm, comms, mpi_phase, layout, algorithm, phase):
    """The same specs again (the pencil transpose, derived types both ways, and basic types) run
    in compiled code from the third call on (the plan cache's bound run: a flat one MPI's own
    persistent Alltoallw on the caller's datatypes, the others composed with the type maps),
    moving what the send buffer holds at each call, on either node phase."""
    hc, size, me = (comms if phase == "shm" else mpi_phase)[layout], comm.size, comm.rank
    shape = (3, 2 + size, 2)
    c0, c1 = _chunks(shape[0] * size, size), _chunks(shape[1], size)
    a = np.zeros((c0[me][1], shape[1], shape[2]))
    b = np.zeros((shape[0] * size, c1[me][1], shape[2]))
    send_t = _pencil_types(a.shape, 1, c1, np.float64)
    recv_t = _pencil_types(b.shape, 0, c0, np.float64)
    ones, zeros = [1] * size, [0] * size
    basic_s, basic_r = np.zeros(3 * size), np.zeros(3 * size)
    offsets = np.arange(size, dtype=np.int64) * 24
    cases = [([a, ones, zeros, send_t], [b, ones, zeros, recv_t]),
             ([b, (ones, zeros), recv_t], [a, (ones, zeros), send_t]),
             ([basic_s, np.full(size, 3), offsets, [MPI.DOUBLE] * size],
              [basic_r, np.full(size, 3), offsets, (MPI.DOUBLE,) * size])]
    try:
        for send, recv in cases:
            before = hc._engine.calls.compiled
            for trial in range(5):
                send[0][...] = np.random.default_rng(trial + 7 * me).standard_normal(send[0].shape)
                ref = np.full(recv[0].shape, np.nan)
                four = [send[0], *send[1], send[2]] if len(send) == 3 else send  # the reference's form
                _alltoallw(comm, four, [ref, *(recv[1] if len(recv) == 3 else recv[1:3]), recv[-1]])
                recv[0][...] = np.nan
                hc.Alltoallw(send, recv, algorithm=algorithm)
                assert recv[0].tobytes() == ref.tobytes()
            if size > 1:  # on one rank the receive spec's blocks may be read by the general path
                assert hc._engine.calls.compiled - before >= 3
            bound = [e.run for e in hc.plan_cache.entries.values() if e.run is not None]
            assert bound and all(run.native == (run.stats.algorithm == "flat") for run in bound)
    finally:
        for t in send_t + recv_t:
            t.Free()


def _basic(comm, counts_of, width):
    """Specs of ``counts_of(i, j)`` doubles from rank i to rank j, each peer's block in a slot of
    ``width`` doubles; counts as arrays, displacements as lists (both changed in place below)."""
    size, me = comm.size, comm.rank
    sbuf = np.arange(size * width, dtype=np.float64) + 1000 * me
    send = [sbuf, np.array([counts_of(me, j) for j in range(size)]), [8 * width * j for j in range(size)],
            [MPI.DOUBLE] * size]
    recv = [np.full(size * width, -1.0), np.array([counts_of(i, me) for i in range(size)]),
            [8 * width * i for i in range(size)], [MPI.DOUBLE] * size]
    return send, recv


def _check(comm, hc, send, recv):
    """One call through ``hc`` equals the reference, on a receive buffer that held -1."""
    ref = np.full(recv[0].shape, -1.0)
    _alltoallw(comm, send, [ref, *recv[1:]])
    recv[0][...] = -1.0
    hc.Alltoallw(send, recv)
    assert recv[0].tobytes() == ref.tobytes()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_specs_changed_between_repeated_calls(comm, comms, layout):
    """A kept call never runs stale: counts and displacements changed in place, a datatype
    swapped in the list, a buffer replaced by one of another size, each right after repeated
    calls of the old specs, move what the new specs say."""
    hc, size = comms[layout], comm.size
    # two doubles one apart or two apart (16 B both): a swap keeps the bytes each pair moves
    one, two = MPI.DOUBLE.Create_vector(2, 1, 2).Commit(), MPI.DOUBLE.Create_vector(2, 1, 3).Commit()
    try:
        send, recv = _basic(comm, lambda i, j: 1 + (i + j) % 2, 4)
        for _ in range(3):
            _check(comm, hc, send, recv)
        send[1][:] = 3 - send[1]  # counts in place, both sides alike
        recv[1][:] = 3 - recv[1]
        _check(comm, hc, send, recv)
        send[2][0] = 8  # a displacement in place: rank 0's block starts one double later
        for _ in range(3):
            _check(comm, hc, send, recv)
        send[0] = np.arange(5 * size, dtype=np.float64)  # a larger send buffer in the same list
        send[2] = [40 * j for j in range(size)]
        _check(comm, hc, send, recv)
        # a datatype swapped in place in the list, the bytes each pair moves unchanged
        a = np.arange(6 * size, dtype=np.float64) + 100 * comm.rank
        send = [a, [1] * size, [48 * j for j in range(size)], [one] * size]
        recv = [np.full(2 * size, -1.0), [2] * size, [16 * i for i in range(size)], [MPI.DOUBLE] * size]
        for _ in range(3):
            _check(comm, hc, send, recv)
        send[3][size - 1] = two
        _check(comm, hc, send, recv)
    finally:
        one.Free()
        two.Free()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_spoiled_between_repeated_calls_raises_on_every_rank(comm, comms, layout):
    """After repeated good calls, a spec spoiled on one rank (a count that no longer matches, a
    datatype of another extent, a receive buffer too small or made read-only, a freed datatype,
    overlapping receive runs) raises the same error on every rank, with nothing received."""
    hc, size, last = comms[layout], comm.size, comm.size - 1
    wide = MPI.DOUBLE.Create_contiguous(3).Commit()  # 24 B an item where 16 B were agreed
    folded = MPI.DOUBLE.Create_contiguous(2).Create_resized(0, 8).Commit()
    pair = MPI.DOUBLE.Create_contiguous(2).Commit()  # freed on the last rank below
    sends_24 = f"rank {last} sends 24 B to rank 0, which expects 16 B"
    spoilers = {
        "count": (lambda s, r: s[1].__setitem__(0, 3), sends_24),
        "extent": (lambda s, r: (s[1].__setitem__(0, 1), s[3].__setitem__(0, wide)), sends_24),
        "small": (lambda s, r: r.__setitem__(0, np.zeros(2 * size - 1)), "outside the buffer"),
        "read-only": (lambda s, r: setattr(r[0].flags, "writeable", False), "read-only"),
        "freed": (lambda s, r: pair.Free(), r"datatypes\[0\]: .*DATATYPE_NULL"),
        "overlap": (lambda s, r: r[3].__setitem__(0, folded), "datatypes overlap"),
    }
    try:
        for name, (spoil, match) in spoilers.items():
            send = [np.ones(3 * size), [2] * size, [24 * j for j in range(size)], [MPI.DOUBLE] * size]
            recv = [np.zeros(2 * size + 1), [2] * size, [16 * j for j in range(size)], [MPI.DOUBLE] * size]
            if name == "freed":
                send[1], send[3] = [1] * size, [pair] * size
            for _ in range(3):
                hc.Alltoallw(send, recv)
            if comm.rank == last:
                spoil(send, recv)
            _refused(comm, hc, send, recv, match)
    finally:
        for t in (wide, folded, pair):
            if t != MPI.DATATYPE_NULL:
                t.Free()
