"""Compiled parts of a one-shot call's agreement: the count fingerprint and the pattern key.

The fingerprint of a rank is a keyed 64-bit hash H(source, destination, bytes), added over the blocks
it sends and subtracted over the blocks it expects. Summed over every rank (mod 2**64) it is zero
exactly when every sender and its receiver agree on every pair, up to a hash collision; two lanes
with independent keys make that 2**-128. Nothing here communicates.
"""
from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memcmp

import numpy as np


cdef inline uint64_t _mix(uint64_t z) noexcept nogil:
    # splitmix64's finaliser: every input bit reaches every output bit.
    z = (z ^ (z >> 30)) * <uint64_t>0xbf58476d1ce4e5b9
    z = (z ^ (z >> 27)) * <uint64_t>0x94d049bb133111eb
    return z ^ (z >> 31)


cdef inline uint64_t _pair_hash(uint64_t key, uint64_t src, uint64_t dst, uint64_t nbytes) noexcept nogil:
    return _mix(_mix(key ^ (src * <uint64_t>0x9e3779b97f4a7c15 + dst)) ^ (nbytes * <uint64_t>0xd6e8feb86659fd93))


def fingerprint(const int64_t[::1] sent not None, const int64_t[::1] expected not None,
                Py_ssize_t me, uint64_t key_a, uint64_t key_b, uint64_t[::1] out not None,
                Py_ssize_t at):
    """Write this rank's two fingerprint lanes to ``out[at]`` and ``out[at + 1]``.

    ``sent[d]``: bytes this rank (``me``) sends to rank d; ``expected[s]``: bytes it expects from s.
    """
    cdef Py_ssize_t n = sent.shape[0], p
    if expected.shape[0] != n or out.shape[0] < at + 2 or at < 0:
        raise ValueError("fingerprint: sent and expected differ in length, or out is too short")
    cdef uint64_t a = 0, b = 0, m = <uint64_t>me
    with nogil:
        for p in range(n):
            a += _pair_hash(key_a, m, <uint64_t>p, <uint64_t>sent[p])
            a -= _pair_hash(key_a, <uint64_t>p, m, <uint64_t>expected[p])
            b += _pair_hash(key_b, m, <uint64_t>p, <uint64_t>sent[p])
            b -= _pair_hash(key_b, <uint64_t>p, m, <uint64_t>expected[p])
    out[at] = a
    out[at + 1] = b


def pattern_key(tuple parts):
    """A 64-bit hash of several int64 arrays' contents and lengths (the local key of a count pattern)."""
    cdef uint64_t h = 0x2545f4914f6cdd1d
    cdef const int64_t[::1] v
    cdef Py_ssize_t i
    for arr in parts:
        v = arr
        h = _mix(h ^ <uint64_t>v.shape[0])
        with nogil:
            for i in range(v.shape[0]):
                h = _mix(h ^ <uint64_t>v[i])
    return <int64_t>(h >> 1)


def same_arrays(tuple a, tuple b):
    """Whether two tuples of int64 arrays hold the same contents (lengths included)."""
    cdef const int64_t[::1] x
    cdef const int64_t[::1] y
    if len(a) != len(b):
        return False
    for i in range(len(a)):
        x = a[i]
        y = b[i]
        if x.shape[0] != y.shape[0]:
            return False
        if x.shape[0] and memcmp(&x[0], &y[0], x.shape[0] * sizeof(int64_t)) != 0:
            return False
    return True


def buffer_id(const unsigned char[::1] send not None, const unsigned char[::1] recv not None):
    """(send address, send bytes, receive address, receive bytes): what a bound run is tied to."""
    cdef size_t sa = <size_t>&send[0] if send.shape[0] else 0
    cdef size_t ra = <size_t>&recv[0] if recv.shape[0] else 0
    return (sa, send.shape[0], ra, recv.shape[0])
