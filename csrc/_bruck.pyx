"""Kernels of a radix-k Bruck all-to-all's first run (``hxmpi.comm.bruck``): pack a round's
message, take a received one apart, copy the final blocks out. Later runs are a compiled
``Program`` (``csrc/_call.pyx``) built from what the first run learned.

A rank holds P slots; slot i lives in the send view (``where[i] == 0``) or in the receive arena
(``where[i] == 1``) at byte offset ``off[i]``, ``length[i]`` bytes long. A round message carries
the slots of one list after a header of their lengths (int64 each). All offsets and
lengths are int64 bytes. Loops run without the GIL; bounds are checked before any byte moves.
"""
from libc.stdint cimport int64_t
from libc.string cimport memcpy


cdef inline bint _outside(int64_t off, int64_t n, int64_t size) nogil:
    return n < 0 or (n > 0 and (off < 0 or off > size - n))


def round_bytes(const int64_t[::1] length not None, const int64_t[::1] slots not None):
    """Bytes of the message carrying ``slots`` (their data, plus 8 per slot for the header)."""
    cdef Py_ssize_t j
    cdef int64_t total = 8 * slots.shape[0]
    with nogil:
        for j in range(slots.shape[0]):
            total += length[slots[j]]
    return total


def pack_round(const unsigned char[::1] sview not None, const unsigned char[::1] arena not None,
               const signed char[::1] where not None, const int64_t[::1] off not None,
               const int64_t[::1] length not None, const int64_t[::1] slots not None,
               unsigned char[::1] out not None, int64_t out_off):
    """Write the message of ``slots`` into ``out[out_off:]``, header first. Returns its bytes."""
    cdef Py_ssize_t n = slots.shape[0], j
    cdef int64_t i, pos = out_off, bad = -1, need = 8 * n
    cdef int64_t slen = sview.shape[0], alen = arena.shape[0]
    with nogil:
        for j in range(n):
            i = slots[j]
            need += length[i]
            if _outside(off[i], length[i], slen if where[i] == 0 else alen):
                bad = i
                break
    if bad >= 0:
        raise ValueError(f"bruck pack: slot {bad} (offset {off[bad]}, {length[bad]} B) is outside its buffer")
    if _outside(out_off, need, out.shape[0]):
        raise ValueError(f"bruck pack: {need} B at {out_off} do not fit the send buffer ({out.shape[0]} B)")
    cdef unsigned char* d = &out[0] if out.shape[0] else NULL
    cdef const unsigned char* s = &sview[0] if slen else NULL
    cdef const unsigned char* a = &arena[0] if alen else NULL
    with nogil:
        for j in range(n):
            memcpy(d + pos, &length[slots[j]], 8)
            pos += 8
        for j in range(n):
            i = slots[j]
            if length[i] > 0:
                memcpy(d + pos, (s if where[i] == 0 else a) + off[i], <size_t>length[i])
                pos += length[i]
    return pos - out_off


def take_round(const unsigned char[::1] arena not None, int64_t base, int64_t nbytes,
               const int64_t[::1] slots not None, signed char[::1] where not None,
               int64_t[::1] off not None, int64_t[::1] length not None,
               int64_t[::1] learned not None):
    """Point ``slots`` at the message received at ``arena[base:base+nbytes]``.

    The lengths are read from the message's header and stored in ``learned`` (one per slot).
    Raises if they do not add up.
    """
    cdef Py_ssize_t n = slots.shape[0], j
    cdef int64_t pos, v, total = 0
    if learned.shape[0] != n:
        raise ValueError("bruck take: learned must hold one length per slot")
    if _outside(base, nbytes, arena.shape[0]) or nbytes < 8 * n:
        raise ValueError(f"bruck take: message of {nbytes} B at {base} is outside the arena or too short")
    cdef const unsigned char* a = &arena[0] if arena.shape[0] else NULL
    with nogil:
        for j in range(n):
            memcpy(&v, a + base + 8 * j, 8)
            learned[j] = v
        for j in range(n):
            if learned[j] < 0:
                total = -1
                break
            total += learned[j]
    expect = nbytes - 8 * n
    if total != expect:
        raise ValueError(f"bruck take: slot lengths add up to {total} B, the message carries {expect} B")
    pos = base + 8 * n
    with nogil:
        for j in range(n):
            where[slots[j]] = 1
            off[slots[j]] = pos
            length[slots[j]] = learned[j]
            pos += learned[j]


def finish(const unsigned char[::1] sview not None, const unsigned char[::1] arena not None,
           const signed char[::1] where not None, const int64_t[::1] off not None,
           const int64_t[::1] length not None, unsigned char[::1] rview not None,
           const int64_t[::1] rc not None, const int64_t[::1] rd not None, const int64_t[::1] source not None):
    """Copy slot i (from rank ``source[i]``) to ``rview[rd[source[i]]:]``; its length must be ``rc[source[i]]``.

    Returns -1 when every slot fits, else the first rank whose block arrived with another length
    than ``rc`` says (the caller names it; no byte has moved then).
    """
    cdef Py_ssize_t p = source.shape[0], i
    cdef int64_t src, bad = -1, slen = sview.shape[0], alen = arena.shape[0], rlen = rview.shape[0]
    with nogil:
        for i in range(p):
            src = source[i]
            if length[i] != rc[src] or _outside(rd[src], rc[src], rlen) or \
                    _outside(off[i], length[i], slen if where[i] == 0 else alen):
                bad = src
                break
    if bad >= 0:
        return bad
    cdef unsigned char* d = &rview[0] if rlen else NULL
    cdef const unsigned char* s = &sview[0] if slen else NULL
    cdef const unsigned char* a = &arena[0] if alen else NULL
    with nogil:
        for i in range(p):
            if length[i] > 0:
                memcpy(d + rd[source[i]], (s if where[i] == 0 else a) + off[i], <size_t>length[i])
    return -1
