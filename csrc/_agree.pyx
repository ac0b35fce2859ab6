"""Compiled parts of a one-shot call's agreement: the count fingerprint and the pattern key.

The fingerprint of a rank is a keyed 64-bit hash H(source, destination, bytes), added over the blocks
it sends and subtracted over the blocks it expects. Summed over every rank (mod 2**64) it is zero
exactly when every sender and its receiver agree on every pair, up to a hash collision; two lanes
with independent keys make that 2**-128. Nothing here communicates.
"""
from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memcmp, memset

from enum import IntEnum

cimport numpy as cnp
import numpy as np

cnp.import_array()


include "_record.pxi"


cdef Record _layout
memset(&_layout, 0, sizeof(Record))
cdef Py_ssize_t _WORDS = sizeof(Record) // sizeof(uint64_t)
#: Words in the record.
WORDS = _WORDS
#: Index of each word of the record by name (``Word.BYTES``...), in ``Record``'s field order (a
#: struct converts to a dict of its fields in declaration order).
Word = IntEnum("Word", [(name.upper(), i) for i, name in enumerate(<dict>_layout)], module=__name__)
if len(Word) != WORDS:
    raise ImportError("the agreement record must be uint64 words only")


def pattern_key(tuple parts):
    """A 64-bit hash of several int64 arrays' contents and lengths (the local key of a count pattern)."""
    cdef uint64_t h = PATTERN_SEED
    cdef const int64_t* v
    cdef Py_ssize_t n
    for arr in parts:
        n = _int64_data(arr, &v)
        with nogil:
            h = _hash_array(h, v, n)
    return <int64_t>(h >> 1)


def quarter_log2(double x):
    """round(4 * log2(1 + x)) (ties to even), an int: one coordinate of a pattern class
    (``costmodel.pattern_class``; the compiled miss path computes the same one)."""
    return _quarter_log2(x)


def same_arrays(tuple a, tuple b):
    """Whether two tuples of int64 arrays hold the same contents (lengths included)."""
    cdef const int64_t* x
    cdef const int64_t* y
    cdef Py_ssize_t n
    if len(a) != len(b):
        return False
    for i in range(len(a)):
        n = _int64_data(a[i], &x)
        if _int64_data(b[i], &y) != n:
            return False
        if n and memcmp(x, y, n * sizeof(int64_t)) != 0:
            return False
    return True


def buffer_id(cnp.ndarray send not None, cnp.ndarray recv not None):
    """(send address, send bytes, receive address, receive bytes): what a bound run is tied to."""
    cdef Py_ssize_t sn = cnp.PyArray_NBYTES(send), rn = cnp.PyArray_NBYTES(recv)
    return (<size_t>cnp.PyArray_DATA(send) if sn else 0, sn, <size_t>cnp.PyArray_DATA(recv) if rn else 0, rn)


def fill_record(cnp.ndarray rec not None, bint problem, bint big, int64_t algo, bint validate,
                int64_t kind, int64_t slot, bint same_buffers, bint over_budget, int64_t kib_cap,
                sent, expected, bint fingerprint, Py_ssize_t me, uint64_t key_a, uint64_t key_b):
    """Write one rank's agreement record (``WORDS`` uint64 words, laid out as ``Record``).

    ``sent``/``expected``: this rank's int64 send and receive byte counts (None only on a problem
    rank). From them come the pattern words (send bytes, receive KiB squared, messages to other
    ranks, the pairwise term) and, with ``fingerprint``, the two fingerprint lanes. Arrays are read
    through their data pointers: this is on every call's path.
    """
    cdef Record* r
    cdef const int64_t* s
    cdef const int64_t* e
    cdef Py_ssize_t n
    if rec.dtype != np.uint64 or rec.shape[0] < _WORDS or not cnp.PyArray_IS_C_CONTIGUOUS(rec):
        raise ValueError(f"fill_record: the record must be {WORDS} contiguous uint64")
    r = <Record*>cnp.PyArray_DATA(rec)
    if problem:
        memset(r, 0, sizeof(Record))
        r.flags = 1
        return
    n = _int64_data(sent, &s)
    if _int64_data(expected, &e) != n:
        raise ValueError("fill_record: sent and expected differ in length")
    if not 0 <= me < n:
        raise ValueError(f"fill_record: rank {me} outside the {n} counts")
    with nogil:
        _fill_record(r, big, algo, validate, kind, slot, same_buffers, over_budget, kib_cap, s, e, n, fingerprint,
                     me, key_a, key_b)


cdef Py_ssize_t _int64_data(object arr, const int64_t** out) except -1:
    cdef cnp.ndarray a = <cnp.ndarray?>arr
    if a.dtype != np.int64 or a.ndim != 1 or not cnp.PyArray_IS_C_CONTIGUOUS(a):
        raise ValueError("expected a contiguous 1-D int64 array")
    out[0] = <const int64_t*>cnp.PyArray_DATA(a)
    return a.shape[0]


def verdict(cnp.ndarray sums not None, Py_ssize_t size):
    """The agreement's verdict from the summed record (laid out as ``Record``), as bits:
    PROBLEM (a rank's input is bad), SETTINGS (algorithm, validate or row kind differ), PAIRS (the
    fingerprint is not zero), HIT (every rank is at the same cache slot), ALL_SAME_BUFFERS (every
    cached run is bound to this call's buffers), ANY_OVER_BUDGET, BIG (the large-count path)."""
    if sums.dtype != np.uint64 or sums.shape[0] < _WORDS or not cnp.PyArray_IS_C_CONTIGUOUS(sums):
        raise ValueError(f"verdict: the sums must be {WORDS} contiguous uint64")
    return _verdict(<const Record*>cnp.PyArray_DATA(sums), <uint64_t>size)
