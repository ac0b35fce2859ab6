"""HierComm: every result equals flat comm.Alltoallv byte for byte; bad input raises on every rank."""
import json
import os
import re

import numpy as np
import pytest
from mpi4py import MPI
from support import (
    LAYOUT_NAMES,
    assert_exchange_works,
    auto_expected,
    exchange_case,
    hier_comms,
    mpi_type,
    ran,
)

import hxmpi.comm.transfer as transfer
from hxmpi import ExchangeError, HierComm

pytestmark = pytest.mark.mpi

STRUCT = np.dtype([("id", np.int32), ("w", np.float64), ("tag", "S3")])
DTYPES = [np.float64, np.int32, np.uint8, np.complex128, STRUCT]


@pytest.fixture(scope="module")
def hcs():
    yield from hier_comms()


@pytest.mark.parametrize("algorithm", ["flat", "hier", "auto"])
@pytest.mark.parametrize("layout", LAYOUT_NAMES)
def test_random_counts_all_layouts(comm, hcs, layout, algorithm):
    hc = hcs[layout]
    for trial, dtype in enumerate(DTYPES):
        rng = np.random.default_rng(1000 * trial + comm.rank)
        sc, rc, sbuf, ref = exchange_case(comm, rng, dtype)
        out = np.zeros_like(ref)
        t = mpi_type(dtype)
        hc.Alltoallv([sbuf, (sc, None), t], [out, (rc, None), t], algorithm=algorithm)
        assert out.tobytes() == ref.tobytes(), (layout, algorithm, dtype)
        if algorithm == "auto":  # the cost model's pick for the whole call's pattern
            assert ran(hc) == auto_expected(comm, hc, sc * np.dtype(dtype).itemsize), (layout, dtype)
    t = hc.topology
    possible = t.num_nodes > 1 and t.max_node_size > 1
    if algorithm != "auto":
        assert hc.last_stats["algorithm"] == (algorithm if possible else "flat")


@pytest.mark.parametrize("layout", ["irregular_3_3_1", "round_robin"])
def test_custom_displacements_with_gaps(comm, hcs, layout, agreement):
    """Blocks in reverse order with gaps on both sides; gap bytes of the receive buffer stay untouched."""
    hc, size = hcs[layout], comm.size
    rng = np.random.default_rng(7 + comm.rank)
    sc = rng.integers(0, 5, size).astype(np.int64)
    rc = np.empty(size, np.int64)
    comm.Alltoall(sc, rc)
    sd = np.zeros(size, np.int64)
    pos = 3
    for d in reversed(range(size)):
        sd[d] = pos
        pos += int(sc[d]) + 2
    rd = np.zeros(size, np.int64)
    pos = 1
    for s in reversed(range(size)):
        rd[s] = pos
        pos += int(rc[s]) + 3
    sbuf = rng.standard_normal(int(sd.max() + sc.max() + 4))
    ref = np.full(pos + 2, -1.0)
    out = ref.copy()
    comm.Alltoallv([sbuf, (sc, sd), MPI.DOUBLE], [ref, (rc, rd), MPI.DOUBLE])
    hc.Alltoallv([sbuf, (sc, sd), MPI.DOUBLE], [out, (rc, rd), MPI.DOUBLE], algorithm="hier")
    assert out.tobytes() == ref.tobytes()


@pytest.mark.parametrize("layout", ["regular", "irregular_3_3_1", "round_robin_3"])
def test_alltoallv_rows(comm, hcs, layout):
    hc, size = hcs[layout], comm.size
    rng = np.random.default_rng(11 + comm.rank)
    counts = rng.integers(0, 4, size)
    rows = rng.standard_normal((int(counts.sum()), 3, 2)).astype(np.float32)
    out, rcounts = hc.alltoallv(rows, counts, algorithm="hier")
    rc = np.empty(size, np.int64)
    comm.Alltoall(counts.astype(np.int64), rc)
    ref = np.zeros((int(rc.sum()), 3, 2), np.float32)
    comm.Alltoallv([rows, counts * 6, MPI.FLOAT], [ref, rc * 6, MPI.FLOAT])
    assert rcounts.tolist() == rc.tolist()
    assert out.shape == ref.shape and out.tobytes() == ref.tobytes()


@pytest.mark.parametrize("layout", ["regular", "irregular"])
def test_alltoall_uniform(comm, hcs, layout):
    hc, size = hcs[layout], comm.size
    sbuf = (np.arange(size * 5, dtype=np.int64) + 1000 * comm.rank)
    ref, out, out2 = (np.zeros(size * 5, np.int64) for _ in range(3))
    comm.Alltoall(sbuf, ref)
    hc.Alltoall(sbuf, out, algorithm="hier")
    hc.Alltoall([sbuf, 5, MPI.INT64_T], [out2, 5, MPI.INT64_T], algorithm="hier")
    assert out.tobytes() == ref.tobytes() and out2.tobytes() == ref.tobytes()


def test_read_only_send_buffer(comm, hcs):
    hc = hcs["irregular_3_3_1"]
    rng = np.random.default_rng(comm.rank)
    sc, rc, sbuf, ref = exchange_case(comm, rng, np.float64)
    sbuf.flags.writeable = False
    out = np.zeros_like(ref)
    hc.Alltoallv([sbuf, sc], [out, rc], algorithm="hier")
    assert out.tobytes() == ref.tobytes()


def test_repeated_calls_reuse_buffers(comm, hcs):
    """Growing then shrinking sizes: correct every time, and no new scratch buffer when shrinking."""
    hc = hcs["irregular"]
    for scale in (1, 8, 64, 8, 1):
        rng = np.random.default_rng(scale * 31 + comm.rank)
        sc, rc, sbuf, ref = exchange_case(comm, rng, np.float64, max_count=scale * 4, zero_frac=0.1)
        before = {k: id(v) for k, v in hc._engine.scratch.buffers.items()}
        out = np.zeros_like(ref)
        hc.Alltoallv([sbuf, sc], [out, rc], algorithm="hier")
        assert out.tobytes() == ref.tobytes()
        if scale == 64:
            peak = {k: id(v) for k, v in hc._engine.scratch.buffers.items()}
        if scale < 64 and "peak" in locals():
            assert {k: id(v) for k, v in hc._engine.scratch.buffers.items()} == peak == {**before, **peak}


def test_scratch_memory_bound(comm):
    """Balanced traffic on a regular layout: scratch buffers stay within 2x the send bytes.

    (On an irregular layout a rank serving k lanes receives k lanes' share in phase 1.)
    """
    even = 2 * (comm.size // 2)
    if even < 4:
        pytest.skip("needs a regular layout of at least 2 nodes x 2 ranks")
    sub = comm.Split(0 if comm.rank < even else MPI.UNDEFINED, comm.rank)
    if sub == MPI.COMM_NULL:
        return
    hc = HierComm(sub, ranks_per_node=2)
    n = 1000
    sbuf = np.random.default_rng(comm.rank).standard_normal(n * sub.size)
    out = np.zeros_like(sbuf)
    hc.Alltoall(sbuf, out, algorithm="hier")
    assert hc.last_stats["algorithm"] == "hier"
    assert 0 < hc.scratch_bytes <= 2 * sbuf.nbytes
    hc.free()
    sub.Free()


def test_big_message_path(comm, hcs, large_count_path):
    """Counts/displacements past the int limit go through struct datatypes (limit lowered here)."""
    for layout in ("irregular_3_3_1", "one_node"):
        for algorithm in ("flat", "hier"):
            rng = np.random.default_rng(5 + comm.rank)
            sc, rc, sbuf, ref = exchange_case(comm, rng, np.float64, max_count=12, zero_frac=0.2)
            out = np.zeros_like(ref)
            hcs[layout].Alltoallv([sbuf, sc, MPI.DOUBLE], [out, rc, MPI.DOUBLE], algorithm=algorithm)
            assert out.tobytes() == ref.tobytes()


def test_last_stats_counts_inter_node_messages(comm, hcs):
    hc, size = hcs["regular"], comm.size
    topo = hc.topology
    sbuf = np.ones(size * 4, np.float64)
    out = np.zeros_like(sbuf)
    hc.Alltoall(sbuf, out, algorithm="flat")
    remote = sum(1 for r in range(size) if topo.node_of[r] != topo.node)
    assert hc.last_stats["inter_node"] == {"messages": remote, "bytes": remote * 32}
    hc.Alltoall(sbuf, out, algorithm="hier")
    # Forced hier runs hier wherever the layout has one: more than one node, one with two ranks.
    expect = "hier" if topo.num_nodes > 1 and max(topo.node_sizes) > 1 else "flat"
    assert hc.last_stats["algorithm"] == expect
    if expect == "hier":  # one lane message per other node, carrying all of that node's blocks
        assert hc.last_stats["inter"] == {"messages": topo.num_nodes - 1, "bytes": remote * 32}
    else:
        assert hc.last_stats["inter_node"] == {"messages": remote, "bytes": remote * 32}


# ---------------------------------------------------------------- bad input, raised on every rank
def _bad_case(comm, case):
    size, me = comm.size, comm.rank
    sc = np.full(size, 2, np.int64)
    rc = np.full(size, 2, np.int64)
    sbuf, rbuf = np.zeros(2 * size), np.zeros(2 * size)
    culprit = size - 1
    send, recv = [sbuf, sc, MPI.DOUBLE], [rbuf, rc, MPI.DOUBLE]
    if me == culprit:
        if case == "negative_count":
            sc[0] = -1
        elif case == "wrong_length":
            send = [sbuf, sc[:-1] if size > 1 else np.zeros(2, np.int64), MPI.DOUBLE]
        elif case == "count_past_buffer":
            send = [sbuf[:-1], sc, MPI.DOUBLE]
        elif case == "displ_past_buffer":
            recv = [rbuf, (rc, np.arange(size) * 2 + 1), MPI.DOUBLE]
        elif case == "overlapping_recv":
            recv = [np.zeros(2 * size + 2), (rc, np.zeros(size, np.int64)), MPI.DOUBLE] if size > 1 \
                else [rbuf, (rc, [-3]), MPI.DOUBLE]
        elif case == "pair_mismatch":
            rc[0] = 1
        elif case == "read_only_recv":
            rbuf.flags.writeable = False
        elif case == "noncontiguous_type":
            send = [sbuf, sc, MPI.DOUBLE.Create_vector(1, 1, 2).Create_resized(0, 16).Commit()]
        elif case == "float_counts":
            send = [sbuf, sc.astype(float) + 0.5, MPI.DOUBLE]
        elif case == "datatype_mismatch":
            send = [sbuf, sc, MPI.FLOAT]
    return send, recv, culprit


BAD_CASES = {
    "negative_count": "negative",
    "wrong_length": "entries",
    "count_past_buffer": "past the buffer",
    "displ_past_buffer": "past the buffer",
    "overlapping_recv": "overlap|negative",
    "pair_mismatch": "expects",
    "read_only_recv": "read-only",
    "noncontiguous_type": "not contiguous",
    "float_counts": "integers",
    "datatype_mismatch": "expects",
}


@pytest.fixture(params=["cache-on", "cache-off"])
def agreement(request, monkeypatch, hcs):
    """With the agreed plan cache on and off."""
    for hc in hcs.values():
        monkeypatch.setattr(hc.plan_cache, "max_entries", 0 if request.param == "cache-off" else 16)
    return request.param


@pytest.mark.parametrize("layout", ["regular", "irregular_3_3_1"])
@pytest.mark.parametrize("case", list(BAD_CASES))
def test_bad_input_raises_on_every_rank(comm, hcs, case, layout, agreement):
    send, recv, culprit = _bad_case(comm, case)
    with pytest.raises(ExchangeError, match=BAD_CASES[case]) as info:
        hcs[layout].Alltoallv(send, recv, algorithm="hier")
    # The message names the culprit: as the failing rank, or as one side of a mismatched pair.
    if case in ("pair_mismatch", "datatype_mismatch"):
        assert re.search(rf"rank {culprit}\b", str(info.value))
    else:
        assert f"rank {culprit}:" in str(info.value)
    assert_exchange_works(comm, hcs[layout])  # nothing is left half-done


def test_rows_shape_mismatch_raises_on_every_rank(comm, hcs):
    if comm.size == 1:
        pytest.skip("needs two ranks")
    hc = hcs["regular"]
    width = 3 if comm.rank == 0 else 4
    rows = np.zeros((comm.size, width))
    with pytest.raises(ExchangeError, match="row shape"):
        hc.alltoallv(rows, np.ones(comm.size, np.int64))


def test_rows_count_sum_mismatch(comm, hcs):
    hc = hcs["regular"]
    with pytest.raises(ExchangeError, match="counts sum"):
        hc.alltoallv(np.zeros((1, 2)), np.full(comm.size, 2))


def test_bad_algorithm_name(hcs):
    with pytest.raises(ValueError, match="algorithm"):
        hcs["regular"].Alltoall(np.zeros(MPI.COMM_WORLD.size), np.zeros(MPI.COMM_WORLD.size),
                                algorithm="ring")


def _stamps(big: int) -> list[tuple[int, bytes]]:
    """(offset, 8 bytes) marks naming their position: every 64 MiB, on both sides of every 1 GiB
    (the big-message chunk) and at the end of a big block. Sparse, because numpy backs large
    arrays with 2 MiB huge pages, so each mark costs the sender a huge page."""
    offsets = sorted(set(range(0, big - 8, 1 << 26)) | {k * (1 << 30) + d for k in range(1, (big >> 30) + 1)
                                                       for d in (-8, 0)} | {big - 8})
    return [(o, (o // 8 + 0x0101010101010101).to_bytes(8, "little")) for o in offsets]


@pytest.mark.watchdog(900)
def test_message_over_2GiB(comm):
    """A real block of more than 2**31 bytes, at -n 2 flat, at -n 3 hierarchical (nodes 2+1).

    It goes from rank 0 to the last rank: at -n 2 between two one-rank nodes (flat), at -n 3
    across the node boundary through both hierarchical phases. Memory: the block is zeros (pages
    never written cost nothing) with 8 nonzero bytes per MiB naming their position, so the sender
    touches a few MiB; the receiver checks every mark and that no other byte is nonzero, which
    is the same as comparing with the whole expected block, without a 2 GiB reference.
    """
    size, me = comm.size, comm.rank
    if size not in (2, 3):
        pytest.skip("memory: run at -n 2 (flat) and -n 3 (hierarchical, nodes 2+1) only")
    big = 2**31 + 2**20 + 7
    target = size - 1
    sc = np.full(size, 5, np.int64)
    rc = np.full(size, 5, np.int64)
    if me == 0:
        sc[target] = big
    if me == target:
        rc[0] = big
    sbuf = np.zeros(int(sc.sum()), np.uint8)  # calloc: untouched pages stay unallocated
    start = 5 * target  # where rank 0's big block starts in its send buffer
    if me == 0:
        sbuf[:start] = 7  # the small blocks; the big one stays zero...
    else:
        sbuf[:] = 7 + me
    marks = _stamps(big)
    if me == 0:
        for off, mark in marks:                # ...but for its marks
            sbuf[start + off:start + off + 8] = np.frombuffer(mark, np.uint8)
    node_of = [0, 0, 1] if size == 3 else [0, 1]
    hc = HierComm(comm, node_of=node_of)
    out = np.zeros(int(rc.sum()), np.uint8)
    algorithm = "hier" if size == 3 else "flat"
    hc.Alltoallv([sbuf, sc], [out, rc], algorithm=algorithm)  # mpi4py alone cannot pass counts > 2**31
    assert hc.last_stats["algorithm"] == algorithm
    small = out[rc[0]:] if me == target else out
    small_from = np.repeat(np.arange(size)[rc != big], 5)
    assert np.array_equal(small, (7 + small_from).astype(np.uint8))
    if me == target:
        block = out[:big]
        for off, mark in marks:
            assert block[off:off + 8].tobytes() == mark, f"mark at byte {off}"
        expected_nonzero = sum(len(m) - m.count(0) for _, m in marks)
        assert np.count_nonzero(block) == expected_nonzero  # every other byte is zero, as sent
    del sbuf, out
    hc.free()


def test_big_path_chosen_by_one_rank_only(comm, hcs, monkeypatch):
    """Only rank 0 has a block past the (lowered) int limit: every rank must still agree on the path."""
    monkeypatch.setattr(transfer, "INT_LIMIT", 100)
    monkeypatch.setattr(transfer, "CHUNK_BYTES", 32)
    size, me = comm.size, comm.rank
    sc = np.ones(size, np.int64)
    if me == 0:
        sc[size - 1] = 40  # 320 B to the last rank
    rc = np.empty(size, np.int64)
    comm.Alltoall(sc, rc)
    sbuf = np.arange(sc.sum(), dtype=np.float64) + 100 * me
    ref = np.zeros(int(rc.sum()))
    comm.Alltoallv([sbuf, sc], [ref, rc])
    for algorithm in ("flat", "hier"):
        out = np.zeros_like(ref)
        hcs["irregular"].Alltoallv([sbuf, sc], [out, rc], algorithm=algorithm)
        assert out.tobytes() == ref.tobytes()


_FAVOURED = {  # per family: a calibration file, and the CPU-per-path keys that cost nothing (the
    # others cost 1 s), which make it far cheaper than the others
    "flat": ({}, ("flat",)),
    "hier": ({}, ("hier", "hier_pairwise", "hier_bruck")),
    "bruck": (dict(msg_overhead=1e-3, alpha_inter=0.0, alpha_intra=0.0), ("bruck",)),
    # latency and message costs balanced: a radix above 2 at 3, 6 and 7 ranks (the radix is the model's too)
    "bruck3": (dict(msg_overhead=1e-3, alpha_inter=3e-3, alpha_intra=3e-3), ("bruck",)),
    # a node's NIC at 10,000 messages/s: fewest inter-node messages win (one leader per node)
    "leaders": (dict(nic_msg_rate=1e4), ("hier",)),
}


def _favour_files(comm, tmp_path_factory, favour) -> tuple[str, str]:
    """(tuning file, CPU file) of ``_FAVOURED[favour]``, written by rank 0, paths on every rank."""
    from hxmpi.comm.costmodel import CPU_KEYS, CostModel
    tmp = comm.bcast(str(tmp_path_factory.mktemp("tune")) if comm.rank == 0 else None)
    model, free = _FAVOURED[favour]
    if comm.rank == 0:
        CostModel(**model).save(f"{tmp}/t.json")
        cpu = {k: 0.0 if k.replace("_hit", "").replace("_plan", "") in free else 1.0 for k in CPU_KEYS}
        with open(f"{tmp}/cpu.json", "w") as fh:
            json.dump({"cpu_s_per_call": cpu}, fh)
    comm.Barrier()
    return f"{tmp}/t.json", f"{tmp}/cpu.json"


@pytest.mark.parametrize("favour", sorted(_FAVOURED))
def test_auto_follows_the_tuning_file(comm, favour, tmp_path_factory):
    """A calibration file and a CPU-per-path file decide "auto" on every rank: it runs the cost
    model's pick for the call (algorithm and Bruck radix), each path priced with the file's CPU, and
    the family the files favour where the layout allows it."""
    tuning, overhead = _favour_files(comm, tmp_path_factory, favour)
    hc = HierComm(comm, ranks_per_node=2, tuning=tuning, overhead=overhead)
    assert hc.cpu_times.source == overhead and hc.cpu_times("flat") == (0.0 if favour == "flat" else 1.0)
    size = comm.size
    sbuf = np.arange(4 * size, dtype=np.float64)
    counts = np.full(size, 4, np.int64)
    out, ref = np.zeros_like(sbuf), np.zeros_like(sbuf)
    comm.Alltoall(sbuf, ref)
    hc.Alltoallv([sbuf, counts], [out, counts])  # an Alltoallv: MPI_Alltoall is not a candidate
    assert out.tobytes() == ref.tobytes()
    assert ran(hc) == auto_expected(comm, hc, counts * 8)
    hier = hc.topology.num_nodes > 1 and hc.topology.max_node_size > 1
    if (favour == "hier" and hier) or favour in ("flat", "bruck"):
        family = {"flat": ("flat",), "hier": ("hier", "hier_pairwise", "hier_bruck"), "bruck": ("bruck",)}
        assert hc.last_stats["algorithm"] in family[favour], hc.last_stats
    if favour == "leaders" and hier and hc.node_phase == "shm":  # with "mpi", multi-leader is never a candidate
        assert ran(hc) == ("hier_leaders", 1), hc.last_stats
        assert hc.last_stats["inter"]["messages"] == (hc.topology.num_nodes - 1 if hc.topology.local_rank == 0 else 0)
    if favour == "bruck3" and size in (3, 6, 7):  # latency dear: fewer rounds than radix 2's (3, or all in one at 6)
        assert ran(hc)[0] == "bruck" and ran(hc)[1] >= 3, hc.last_stats
    # New patterns of the same class (receive blocks further in) reuse that pick, and their misses
    # run on the compiled miss path whichever family it is.
    picked, before = ran(hc), hc._engine.calls.compiled_misses
    for shift in (1, 2, 3):
        out, ref = np.zeros(sbuf.size + shift), np.zeros(sbuf.size + shift)
        displs = np.arange(size, dtype=np.int64) * 4 + shift
        comm.Alltoallv([sbuf, counts], [ref, (counts, displs)])
        hc.Alltoallv([sbuf, counts], [out, (counts, displs)])
        assert out.tobytes() == ref.tobytes() and hc.last_stats["plan_cache"] == "miss"
        assert ran(hc) == picked, hc.last_stats
    assert hc._engine.calls.compiled_misses - before == 3
    hc.free()


@pytest.mark.parametrize("bad", ["missing", "malformed", "other_numbers"])
def test_pricing_files_are_agreed(comm, bad, tmp_path_factory):
    """A CPU file that one rank cannot read, or whose numbers differ from the other ranks', raises
    ExchangeError on every rank, naming the file (one rank raising alone would hang the others)."""
    from hxmpi.comm.costmodel import CPU_KEYS
    tmp = comm.bcast(str(tmp_path_factory.mktemp("cpu")) if comm.rank == 0 else None)
    good, odd = f"{tmp}/good.json", f"{tmp}/odd.json"
    if comm.rank == 0:
        with open(good, "w") as fh:
            json.dump({"cpu_s_per_call": dict.fromkeys(CPU_KEYS, 1e-6)}, fh)
        with open(odd, "w") as fh:
            fh.write({"missing": "", "malformed": '{"cpu_s_per_call": {"flat": 1e-6}}',
                      "other_numbers": json.dumps({"cpu_s_per_call": dict.fromkeys(CPU_KEYS, 2e-6)})}[bad])
        if bad == "missing":
            os.remove(odd)
    comm.Barrier()
    last = comm.rank == comm.size - 1
    if bad == "other_numbers" and comm.size == 1:
        pytest.skip("needs two ranks")
    want = {"missing": rf"rank {comm.size - 1}: CPU file {re.escape(odd)}: cannot read it",
            "malformed": rf"rank {comm.size - 1}: CPU file {re.escape(odd)}: cpu_s_per_call lacks flat_hit",
            "other_numbers": "CPU per path differs between ranks"}[bad]
    with pytest.raises(ExchangeError, match=want):
        HierComm(comm, ranks_per_node=2, overhead=odd if last else good)
    hc = HierComm(comm, ranks_per_node=2, overhead=good)  # the refused construction left nothing behind
    assert_exchange_works(comm, hc)
    hc.free()


@pytest.mark.parametrize("chunks", [2, 3, 8])
@pytest.mark.parametrize("node_phase", ["shm", "mpi"])
@pytest.mark.parametrize("layout", ["regular", "irregular_3_3_1", "round_robin_3", "one_per_node", "one_node"])
def test_pipelined_node_phase_equals_flat(comm, layout, node_phase, chunks):
    """An explicit "hier" with its node phase in chunks (each chunk on the wire while the node
    copies the one before out of the window): byte-exact as a miss, a cached hit, a hit on new
    buffers and a persistent request, with uneven and zero counts; the stats name the chunks (the
    message-passing node phase does not pipeline: one chunk)."""
    from support import layouts
    try:
        hc = HierComm(comm, **layouts(comm.size)[layout], node_phase=node_phase, chunks=chunks)
    except ExchangeError:
        pytest.skip("the ranks of a node share no memory here")
    try:
        for trial in range(3):
            rng = np.random.default_rng(77 * trial + comm.rank)
            sc, rc, sbuf, ref = exchange_case(comm, rng, np.float64, max_count=40)
            for call in range(3):
                out = np.full_like(ref, np.nan)
                hc.Alltoallv([sbuf, sc], [out, rc], algorithm="hier")
                assert out.tobytes() == ref.tobytes(), (trial, call)
            stats = hc.last_stats
            if hc.layout.hier_possible:
                # no more chunks than the largest node has ranks (a chunk is a group of them)
                runs = min(chunks, hc.layout.max_node_size) if hc.node_phase == "shm" else 1
                assert stats["algorithm"] == "hier" and stats["chunks"] == runs
            out = np.full_like(ref, np.nan)
            with hc.Alltoallv_init([sbuf, sc], [out, rc], algorithm="hier") as req:
                for _ in range(2):
                    out[:] = np.nan
                    req.Start()
                    req.Wait()
                    assert out.tobytes() == ref.tobytes()
    finally:
        hc.free()


def test_a_bad_chunk_count_raises_on_every_rank(comm):
    with pytest.raises(ExchangeError, match="chunks must be an integer from 1 to 8"):
        HierComm(comm, ranks_per_node=2, chunks=9 if comm.rank == 0 else 2)
