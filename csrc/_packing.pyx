"""Block copy kernels for the hierarchical exchange: gather blocks into a phase layout, scatter back.

All offsets and lengths are int64 byte counts. The copy loop runs without the GIL and does no
Python-object work per block; bounds are checked once per call, before any byte moves.
"""
from libc.stdint cimport int64_t
from libc.string cimport memcpy


def copy_blocks(const unsigned char[::1] src not None, const int64_t[::1] src_off not None,
                unsigned char[::1] dst not None, const int64_t[::1] dst_off not None,
                const int64_t[::1] length not None):
    """Copy block i: length[i] bytes from src[src_off[i]:] to dst[dst_off[i]:]. Returns bytes copied."""
    cdef Py_ssize_t n = length.shape[0]
    if src_off.shape[0] != n or dst_off.shape[0] != n:
        raise ValueError("copy_blocks: src_off, dst_off and length must have the same length")
    cdef int64_t src_len = src.shape[0], dst_len = dst.shape[0], total = 0
    cdef Py_ssize_t i
    cdef int64_t bad = -1
    with nogil:
        # One pass of checks first: a bookkeeping bug must raise, never overrun memory.
        for i in range(n):
            if length[i] < 0 or (length[i] > 0 and (
                    src_off[i] < 0 or dst_off[i] < 0
                    or src_off[i] > src_len - length[i] or dst_off[i] > dst_len - length[i])):
                bad = i
                break
            total += length[i]
    if bad >= 0:
        raise ValueError(
            f"copy_blocks: block {bad} (src_off={src_off[bad]}, dst_off={dst_off[bad]}, "
            f"length={length[bad]}) exceeds src ({src_len} B) or dst ({dst_len} B)")
    if total == 0:
        return 0
    cdef const unsigned char* s = &src[0]
    cdef unsigned char* d = &dst[0]
    with nogil:
        for i in range(n):
            if length[i] > 0:
                memcpy(d + dst_off[i], s + src_off[i], <size_t>length[i])
    return total
