# The agreement record and its verdict: included by ``_agree.pyx`` (the record's writer and Python's
# reader) and ``_call.pyx`` (the compiled hit path), so that both compile the one definition.
from libc.stdint cimport uint64_t


cdef struct Record:
    # The agreement record, one uint64 word each, summed over ranks: its one definition. The compiled
    # code reads and writes it as this struct; Python reads it by ``Word`` (below), made from it.
    # ``hxmpi/comm/agreement.py``'s docstring says what each word holds.
    uint64_t flags          # ranks with a bad spec, plus 2**32 per rank on the large-count path
    uint64_t validate
    uint64_t algo           # each setting is followed by its square
    uint64_t algo_sq
    uint64_t kind
    uint64_t kind_sq
    uint64_t slot
    uint64_t slot_sq
    uint64_t same_buffers
    uint64_t over_budget
    uint64_t bytes
    uint64_t recv_kib_sq
    uint64_t messages
    uint64_t pairwise
    uint64_t fp_a
    uint64_t fp_b


cdef extern from *:
    """
    typedef unsigned __int128 hx_u128;
    """
    ctypedef unsigned long long hx_u128  # 128 bits in C: P * sum(x^2) may pass 2**64


cpdef enum Verdict:
    # Bits of ``verdict``: the first three mean the call must fail.
    PROBLEM = 1
    SETTINGS = 2
    PAIRS = 4
    HIT = 8
    ALL_SAME_BUFFERS = 16
    ANY_OVER_BUDGET = 32
    BIG = 64


cdef inline bint _all_same(uint64_t total, uint64_t squares, uint64_t size) noexcept nogil:
    return <hx_u128>size * <hx_u128>squares == <hx_u128>total * <hx_u128>total


cdef inline int _verdict(const Record* t, uint64_t p) noexcept nogil:
    """The verdict bits of the summed record ``t`` over ``p`` ranks (see ``verdict``)."""
    cdef int out = 0
    if t.flags & <uint64_t>0xFFFFFFFF:
        out |= PROBLEM
    if t.flags >> 32:
        out |= BIG
    if not (t.validate == 0 or t.validate == p) or not _all_same(t.algo, t.algo_sq, p) \
            or not _all_same(t.kind, t.kind_sq, p):
        out |= SETTINGS
    if t.fp_a or t.fp_b:
        out |= PAIRS
    if t.slot > 0 and _all_same(t.slot, t.slot_sq, p):
        out |= HIT
        if t.same_buffers == p:
            out |= ALL_SAME_BUFFERS
    if t.over_budget:
        out |= ANY_OVER_BUDGET
    return out
