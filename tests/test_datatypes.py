"""MPI datatypes as byte runs (hxmpi.comm.datatypes), on COMM_SELF: what MPI itself packs, every kind."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI
from support import datatype_catalogue, free_types

from hxmpi.comm.datatypes import TypeCache, flatten, probe_runs
from hxmpi.errors import ExchangeTypeError

CATALOGUE = tuple(datatype_catalogue())  # names; each test builds its own types


@pytest.fixture(scope="module")
def types():
    made = datatype_catalogue()
    yield made
    free_types(made)


@pytest.mark.parametrize("name", CATALOGUE)
@pytest.mark.parametrize("count", [1, 3])
def test_runs_gather_what_mpi_packs(types, name, count):
    """``count`` items gathered along the runs equal MPI_Pack of them, byte for byte (the runs come
    from the type's construction, the reference from MPI's own packing of random bytes)."""
    t = types[name]
    runs = flatten(t)
    low, high = runs.span(count)
    start = max(0, -low)  # where the message starts in the buffer, so that every byte lies inside
    buf = np.random.default_rng(7).integers(0, 256, start + max(high, 0) + 8, dtype=np.uint8)
    # One item spanning the whole buffer, so that Datatype.Pack (which counts items by extent) packs it once.
    moved = MPI.Datatype.Create_struct([count], [start], [t])
    whole = moved.Create_resized(0, buf.nbytes).Commit()
    moved.Free()
    packed = np.empty(whole.Pack_size(1, MPI.COMM_SELF), dtype=np.uint8)
    try:
        end = whole.Pack(buf, packed, 0, MPI.COMM_SELF)
    finally:
        whole.Free()
    offsets, lengths = runs.repeated(count, start)
    gathered = b"".join(buf[o:o + n].tobytes() for o, n in zip(offsets.tolist(), lengths.tolist()))
    order = np.argsort(offsets)
    assert (offsets[order][1:] >= (offsets + lengths)[order][:-1]).all()  # receivable: no byte twice
    assert end == count * t.size == len(gathered)
    assert gathered == packed[:end].tobytes()


@pytest.mark.parametrize("name", CATALOGUE)
def test_construction_and_packing_probe_agree(types, name):
    """The runs read from the type's construction equal the ones read by packing a probe."""
    runs = flatten(types[name])
    offsets, lengths = probe_runs(types[name])
    assert runs.offsets.tolist() == offsets.tolist()
    assert runs.lengths.tolist() == lengths.tolist()
    assert int(runs.lengths.sum()) == types[name].size


def test_subarray_of_a_large_array_costs_its_rows():
    """A pencil's subarray of 256 x 256 x 256 doubles flattens to one run per row it takes,
    without touching the array's elements (the probe would need 128 MiB)."""
    t = MPI.DOUBLE.Create_subarray([256, 256, 256], [256, 64, 256], [0, 64, 0]).Commit()
    try:
        runs = flatten(t)
    finally:
        t.Free()
    assert runs.lengths.shape[0] == 256 and set(runs.lengths.tolist()) == {64 * 256 * 8}
    assert runs.offsets[1] - runs.offsets[0] == 256 * 256 * 8


def test_cache_refuses_bad_datatypes_and_forgets_freed_ones():
    cache = TypeCache()
    loose = MPI.DOUBLE.Create_vector(2, 1, 2)
    runs, problem = cache.runs(loose)
    assert runs is None and "not committed" in problem
    loose.Commit()
    runs, problem = cache.runs(loose)
    assert problem is None and runs.size == 16
    assert cache.runs(loose)[0] is runs  # flattened once
    loose.Free()
    runs, problem = cache.runs(loose)
    assert runs is None and "DATATYPE_NULL" in problem
    for bad in ("d", 8, None):
        runs, problem = cache.runs(bad)
        assert runs is None and problem.error is ExchangeTypeError and "MPI.Datatype" in problem
    assert cache.runs(MPI.DOUBLE)[0].dense
