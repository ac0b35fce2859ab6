"""Message specs (hxmpi.comm.msgspec) alone: every form mpi4py accepts, and mpi4py's error types for bad ones."""
from __future__ import annotations

import array

import numpy as np
import pytest
from mpi4py import MPI
from support import DLPackOnly

from hxmpi.comm.msgspec import (
    parse_alltoall,
    parse_alltoallv,
    parse_uniform,
    parse_vector,
)
from hxmpi.errors import ExchangeError, ExchangeKeyError, ExchangeTypeError


def elems(side, elem):
    return (side.counts // elem).tolist(), (side.displs // elem).tolist()


class CudaOnly:
    __cuda_array_interface__ = {"version": 3, "shape": (4,), "typestr": "<i4", "data": (0, False)}


VECTOR_FORMS = {
    "bare buffer": (lambda b: b, [2, 2, 2], [0, 2, 4]),
    "[buf, typecode]": (lambda b: [b, "i"], [2, 2, 2], [0, 2, 4]),
    "[buf, datatype]": (lambda b: [b, MPI.INT], [2, 2, 2], [0, 2, 4]),
    "[buf, int count]": (lambda b: [b, 1], [1, 1, 1], [0, 1, 2]),
    "[buf, counts list]": (lambda b: [b, [1, 2, 3]], [1, 2, 3], [0, 1, 3]),
    "[buf, (int, stride)]": (lambda b: [b, (1, 2)], [1, 1, 1], [0, 2, 4]),
    "[buf, (counts, displs)]": (lambda b: [b, ([1, 1, 1], [5, 3, 0])], [1, 1, 1], [5, 3, 0]),
    "[buf, counts, None-type]": (lambda b: [b, [2, 2, 2], None], [2, 2, 2], [0, 2, 4]),
    "[buf, (counts, None), type]": (lambda b: [b, ([2, 1, 0], None), MPI.INT], [2, 1, 0], [0, 2, 3]),
    "[buf, counts, displs, typecode]": (lambda b: [b, 2, 2, "i"], [2, 2, 2], [0, 2, 4]),
    "[buf, None, displs, type]": (lambda b: [b, None, [4, 2, 0], "i"], [2, 2, 2], [4, 2, 0]),
    "numpy count scalars": (lambda b: [b, (np.int32(1), np.array(2))], [1, 1, 1], [0, 2, 4]),
}


@pytest.mark.parametrize("form", list(VECTOR_FORMS))
def test_vector_forms(form):
    make, counts, displs = VECTOR_FORMS[form]
    buf = np.arange(6, dtype=np.int32)
    side, problem = parse_vector(make(buf), 3, True, "recv")
    assert problem is None
    assert elems(side, 4) == (counts, displs)


def test_counts_default_to_an_even_split():
    side, problem = parse_vector(np.zeros(7, np.int16), 3, False, "send")
    assert problem is None and elems(side, 2) == ([3, 2, 2], [0, 3, 5])


@pytest.mark.parametrize("make", [
    lambda: np.zeros((3, 4), order="F"),
    lambda: array.array("d", [0.0] * 12),
    lambda: bytearray(96),
    lambda: DLPackOnly(np.zeros(12)),
    lambda: DLPackOnly(np.zeros((4, 3), order="F"), v0=True),
], ids=["fortran", "array.array", "bytearray", "dlpack", "dlpack0-fortran"])
def test_buffer_kinds_are_written_in_memory_order(make):
    buf = make()
    side, problem = parse_vector([buf, MPI.DOUBLE], 3, True, "recv")
    assert problem is None and side.total == 96
    side.view[:] = np.arange(96, dtype=np.uint8)  # the view aliases the caller's memory
    target = buf.arr if isinstance(buf, DLPackOnly) else buf
    assert bytes(np.asarray(memoryview(target)).tobytes(order="A")) == bytes(range(96))


def test_none_and_bottom_with_zero_counts():
    for buf in (None, MPI.BOTTOM):
        for spec in ([buf, "B"], [buf, 0, "B"], [buf, 0, [0, 0], "B"]):
            side, problem = parse_vector(spec, 2, True, "recv")
            assert problem is None and side.total == 0
        side, problem = parse_uniform([buf, MPI.INT], 2, True, "recv")
        assert problem is None and side.total == 0
    _, problem = parse_vector([None, 1, "B"], 2, True, "recv")
    assert problem.error is ExchangeError and "zero counts only" in problem


def test_uniform_forms():
    buf = np.arange(12, dtype=np.int32)
    for spec, count, start in [(buf, 4, 0), ([buf, "i"], 4, 0), ([buf, 2, MPI.INT], 2, 0),
                               ([buf, (2, 3), "i"], 2, 3), ([buf, [1, 6]], 1, 6), ([buf, 3, 1, "i"], 3, 1)]:
        side, problem = parse_uniform(spec, 3, True, "recv")
        assert problem is None
        assert elems(side, 4) == ([count] * 3, [start + i * count for i in range(3)])


def test_in_place_sends_a_copy_of_the_receive_blocks():
    rbuf = np.arange(8, dtype=np.float64)
    s, r, problem = parse_alltoallv(MPI.IN_PLACE, [rbuf, ([1, 2], [4, 0]), "d"], 2)
    assert problem is None
    assert s.counts.tolist() == r.counts.tolist() and s.displs.tolist() == r.displs.tolist()
    assert not np.shares_memory(s.view, rbuf)
    rbuf[:] = -1  # MPI overwrites the receive buffer while the copy still holds what is to be sent
    assert np.frombuffer(s.view, np.float64).tolist() == [0, 1, 2, 3, 4]
    s, r, problem = parse_alltoall(MPI.IN_PLACE, np.zeros(4), 2)
    assert problem is None and s.total == r.total == 32


# mpi4py's own classification of bad specs (its test_msgspec), and ours where mpi4py has none.
BAD = {
    "five items": ([bytearray(5), 0, [0], "i", None], ExchangeError, "2 to 4"),
    "unknown typecode": ([bytearray(5), 0, [0], "\0"], ExchangeKeyError, "typecode"),
    "null datatype": ([bytearray(5), None, [0], MPI.DATATYPE_NULL], ExchangeError, "DATATYPE_NULL"),
    "length not a multiple": ([bytearray(5), None, [0], "i"], ExchangeError, "not a multiple"),
    "negative extent": ([bytearray(8), None, [0], MPI.INT.Create_resized(0, -4).Commit()], ExchangeError,
                        "not contiguous"),
    "list buffer": ([[1, 2, 3, 4], 0, 0, "i"], ExchangeTypeError, "does not expose a buffer"),
    "dict buffer": ([{1: 2}, 0, 0, "i"], ExchangeTypeError, "does not expose a buffer"),
    "class as spec": (object, ExchangeTypeError, "buffer or a list/tuple"),
    "float counts": ([bytearray(4), np.array([3.1])], ExchangeTypeError, "integers"),
    "float displ": ([bytearray(4), (3, [np.float64(1.1)])], ExchangeTypeError, "integer"),
    "0-d float count": ([bytearray(4), np.array(3.0)], ExchangeTypeError, "integer"),
    "wrong length": ([bytearray(4), [1, 1]], ExchangeError, "2 entries, expected 1"),
    "cuda only": ([CudaOnly(), "i"], ExchangeTypeError, "cuda_array_interface.*host memory only"),
    "read-only receive": ([b"abcd", "B"], ExchangeError, "read-only"),
    "strided": ([np.zeros(8)[::2], "d"], ExchangeError, "not contiguous"),
    "in-place as receive": (MPI.IN_PLACE, ExchangeError, "only as the send buffer"),
    "negative count": ([bytearray(4), -1], ExchangeError, "negative"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_specs_carry_mpi4pys_error_type(case):
    spec, error, pattern = BAD[case]
    _, problem = parse_vector(spec, 1, True, "recv")
    assert problem is not None and problem.error is error
    assert problem.startswith("recv")
    with pytest.raises(error, match=pattern):
        raise problem.error(problem)
    assert issubclass(error, ExchangeError)


def test_error_types_are_mpi4pys():
    assert issubclass(ExchangeTypeError, TypeError) and issubclass(ExchangeKeyError, KeyError)
    assert issubclass(ExchangeError, ValueError)
    assert str(ExchangeKeyError("rank 0: x")) == "rank 0: x"  # not KeyError's quoted repr


def test_common_form_shortcut_equals_the_general_reader():
    """``[ndarray, counts(, displs)(, datatype)]`` with int64 or C int arrays skips the general
    reader (the compiled miss path reads the same form): same sides, same problems."""
    from hxmpi.comm import msgspec
    rng = np.random.default_rng(0)
    shortcut_taken = 0
    for trial in range(900):
        size = int(rng.integers(1, 6))
        datatype = [MPI.BYTE, MPI.DOUBLE, MPI.INT][trial % 3]
        dtype = [np.uint8, np.float64, np.intc][trial % 3]  # the buffer's items, for specs without a datatype
        counts = rng.integers(-1 if trial % 17 == 0 else 0, 5, size).astype([np.int64, np.intc][trial % 2])
        n = int(max(counts.sum(), 0) + rng.integers(0, 3))
        buf = np.zeros(n + (trial % 13 == 0), dtype) if trial % 6 >= 4 else \
            np.zeros(n * datatype.size + (trial % 13 == 0), np.uint8)
        displs = (np.cumsum(counts) - counts)[::-1].copy()
        forms = [[buf, (counts, None), datatype], [buf, (counts, displs), datatype], [buf, counts, datatype],
                 (buf, counts, displs, datatype), [buf, counts], [buf, (counts, displs)]]
        spec = forms[trial % 6]
        for writable in (False, True):
            fast, fast_problem = msgspec.parse_vector(spec, size, writable, "x")
            slow, slow_problem = msgspec._parse_vector(spec, size, writable, "x")
            shortcut_taken += msgspec._common_vector(spec, size, writable) is not None
            assert str(fast_problem) == str(slow_problem)
            if fast_problem is None:
                assert fast.view.tobytes() == slow.view.tobytes() and fast.elem == slow.elem
                assert fast.counts.tolist() == slow.counts.tolist() and fast.displs.tolist() == slow.displs.tolist()
    assert shortcut_taken > 900  # the shortcut did serve most of them


def test_alltoall_common_form_shortcut_equals_the_general_reader():
    """An ndarray, or ``[ndarray, datatype]``, in equal blocks skips the general reader (the compiled
    miss path reads the same form): same sides, same problems."""
    from hxmpi.comm import msgspec
    rng = np.random.default_rng(1)
    shortcut_taken = 0
    for trial in range(400):
        size = int(rng.integers(1, 6))
        dtype = [np.uint8, np.float64, np.intc, np.complex128][trial % 4]
        buf = np.zeros(int(rng.integers(0, 4)) * size + (trial % 7 == 0), dtype)
        spec = [buf, (buf, MPI.BYTE), [buf, MPI.DOUBLE], (buf, MPI.INT)][trial % 4]
        for writable in (False, True):
            fast, fast_problem = msgspec.parse_uniform(spec, size, writable, "x")
            slow, slow_problem = msgspec._parse_uniform(spec, size, writable, "x")
            shortcut_taken += msgspec.common_block(spec, size, writable, msgspec.PREDEFINED, MPI.Datatype) is not None
            assert str(fast_problem) == str(slow_problem), (spec, size)
            if fast_problem is None:
                assert fast.view.tobytes() == slow.view.tobytes() and fast.elem == slow.elem
                assert fast.counts.tolist() == slow.counts.tolist() and fast.displs.tolist() == slow.displs.tolist()
                assert fast.total == slow.total
    assert shortcut_taken > 300


def test_count_lists_take_the_shortcut_with_the_general_readers_result():
    """Counts and displacements as lists of integers are read as arrays by the compiled shortcut;
    lists of anything else (floats, bools, integers past 64 bits, a wrong length, a negative count)
    give the general reader's result and problem."""
    from hxmpi.comm import msgspec
    buf = np.zeros(64, np.uint8)
    lists = [[8, 8], [8, 0], [0, 8], [8.0, 8], [True, 8], [2**70, 8], [8], [-1, 8], [np.int32(8), 8], []]
    taken = 0
    for counts in lists:
        for displs in ([0, 16], [16, 0], [0.5, 8], None):
            for spec in ([buf, (counts, displs), MPI.BYTE], [buf, counts, displs, MPI.BYTE], [buf, (counts, displs)],
                         [buf, counts]):
                for writable in (False, True):
                    fast, fast_problem = msgspec.parse_vector(spec, 2, writable, "x")
                    slow, slow_problem = msgspec._parse_vector(spec, 2, writable, "x")
                    assert str(fast_problem) == str(slow_problem), spec
                    assert type(fast_problem) is type(slow_problem) and getattr(fast_problem, "error", None) is \
                        getattr(slow_problem, "error", None)
                    if fast_problem is None:
                        taken += msgspec._common_vector(spec, 2, writable) is not None
                        assert fast.counts.tolist() == slow.counts.tolist() and fast.displs.tolist() == slow.displs.tolist()
                        assert fast.view.tobytes() == slow.view.tobytes() and fast.elem == slow.elem
    assert taken > 100  # of 130 good specs (the rest have receive blocks out of order)
