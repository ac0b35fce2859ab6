# Copy lists: block i is length[i] bytes from src + src_off[i] to dst + dst_off[i]. Included by
# ``_packing.pyx`` (``copy_blocks``) and ``_call.pyx`` (a compiled run's copy steps), so that both
# compile the one loop and the one bounds check.
from libc.stdint cimport int64_t
from libc.string cimport memcpy


cdef inline Py_ssize_t _first_outside(const int64_t* so, const int64_t* do, const int64_t* ln, Py_ssize_t n,
                                      int64_t src_len, int64_t dst_len, int64_t* total) noexcept nogil:
    """The first block that lies outside ``src_len`` or ``dst_len`` bytes (or has a negative length),
    or -1; ``total`` receives the bytes of the blocks before it."""
    cdef Py_ssize_t i
    total[0] = 0
    for i in range(n):
        if ln[i] < 0 or (ln[i] > 0 and (so[i] < 0 or do[i] < 0 or so[i] > src_len - ln[i] or do[i] > dst_len - ln[i])):
            return i
        total[0] += ln[i]
    return -1


cdef inline void _copy_list(unsigned char* d, const unsigned char* s, const int64_t* so, const int64_t* do,
                            const int64_t* ln, Py_ssize_t n) noexcept nogil:
    """Copy every block of a checked list."""
    cdef Py_ssize_t i
    for i in range(n):
        if ln[i] > 0:
            memcpy(d + do[i], s + so[i], <size_t>ln[i])
