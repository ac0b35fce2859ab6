# The agreement record, its writer and its verdict, and the pattern key's hash: included by
# ``_agree.pyx`` (Python's writer and reader) and ``_call.pyx`` (the compiled call path), so that
# both compile the one definition.
from libc.math cimport log2, rint
from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memset


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


cdef inline uint64_t _mix(uint64_t z) noexcept nogil:
    # splitmix64's finaliser: every input bit reaches every output bit.
    z = (z ^ (z >> 30)) * <uint64_t>0xbf58476d1ce4e5b9
    z = (z ^ (z >> 27)) * <uint64_t>0x94d049bb133111eb
    return z ^ (z >> 31)


cdef inline uint64_t _pair_hash(uint64_t key, uint64_t src, uint64_t dst, uint64_t nbytes) noexcept nogil:
    return _mix(_mix(key ^ (src * <uint64_t>0x9e3779b97f4a7c15 + dst)) ^ (nbytes * <uint64_t>0xd6e8feb86659fd93))


cdef enum:
    PATTERN_SEED = 0x2545f4914f6cdd1d   # the pattern key's starting state


cdef inline uint64_t _hash_array(uint64_t h, const int64_t* v, Py_ssize_t n) noexcept nogil:
    """The pattern key's state after one int64 array (its length, then its items)."""
    cdef Py_ssize_t i
    h = _mix(h ^ <uint64_t>n)
    for i in range(n):
        h = _mix(h ^ <uint64_t>v[i])
    return h


cdef inline long _quarter_log2(double x) noexcept nogil:
    """round(4 * log2(1 + x)), ties to even as Python's ``round``: a pattern class coordinate."""
    return <long>rint(4.0 * log2(1.0 + x))


cdef void _fill_record(Record* r, bint big, int64_t algo, bint validate, int64_t kind, int64_t slot,
                       bint same_buffers, bint over_budget, int64_t kib_cap, const int64_t* s, const int64_t* e,
                       Py_ssize_t n, bint fingerprint, Py_ssize_t me, uint64_t key_a, uint64_t key_b) noexcept nogil:
    """One rank's record without a problem (``_agree.fill_record`` says what each word holds):
    ``s``/``e`` its ``n`` send and receive byte counts, ``0 <= me < n``."""
    cdef Py_ssize_t p, d
    cdef uint64_t a = 0, b = 0, m = <uint64_t>me
    cdef int64_t total = 0, received = 0, messages = 0, pairwise = 0, kib
    memset(r, 0, sizeof(Record))
    for p in range(n):
        total += s[p]
        received += e[p]
        if p != me and s[p] > 0:
            messages += 1
    for p in range(1, n):  # pairwise round p: send to me + p, receive from me - p
        d = (me - p + n) % n
        pairwise += s[(me + p) % n] if s[(me + p) % n] > e[d] else e[d]
    if fingerprint:
        for p in range(n):
            a += _pair_hash(key_a, m, <uint64_t>p, <uint64_t>s[p])
            a -= _pair_hash(key_a, <uint64_t>p, m, <uint64_t>e[p])
            b += _pair_hash(key_b, m, <uint64_t>p, <uint64_t>s[p])
            b -= _pair_hash(key_b, <uint64_t>p, m, <uint64_t>e[p])
    kib = received >> 10
    if kib > kib_cap:
        kib = kib_cap
    r.flags = (<uint64_t>big) << 32  # the problem count is the low half
    r.validate = validate  # 0 or 1: the same everywhere exactly when the sum is 0 or P
    r.algo, r.algo_sq = <uint64_t>algo, <uint64_t>(algo * algo)  # (x, x^2): all ranks alike?
    r.kind, r.kind_sq = <uint64_t>kind, <uint64_t>(kind * kind)
    r.slot, r.slot_sq = <uint64_t>slot, <uint64_t>(slot * slot)
    r.same_buffers = same_buffers
    r.over_budget = over_budget
    r.bytes = <uint64_t>total
    r.recv_kib_sq = <uint64_t>(kib * kib)
    r.messages = <uint64_t>messages
    r.pairwise = <uint64_t>pairwise
    r.fp_a = a
    r.fp_b = b
