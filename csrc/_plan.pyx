"""The planners: every byte offset of one call, in one compiled pass, written as a step program.

A rank's program (``csrc/_steps.pxi``; what it is and who runs it: ``hxmpi/comm/plan.py``) is a
list of steps over four buffers (send, receive, scratch, stage): copy lists (source offset,
destination offset, length; int64 bytes), exchanges on one communicator with their per-peer
counts and displacements, and node barriers. ``HierPlanner`` makes the hierarchical one from the
static layout (who serves which lane, see ``hxmpi/comm/plan.py``), the rank's own send/receive
counts and displacements, and ``rc_node``: what every rank of its node receives from every source.
Nothing here allocates per call: a planner's program is one array it owns, overwritten by each
``plan`` call (``StepProgram.detach`` copies it).

Node phases:
  MODE_SHM  phase 1 receives into a node-shared window; after a node barrier each rank copies its
            blocks straight out of the window (no repack, no intra-node messages, no unpack).
  MODE_MPI  phase 1 receives into a private buffer; repack by destination local rank; phase 2 is an
            Alltoallv on the node; unpack.
"""
from libc.stdint cimport int64_t
from libc.string cimport memcpy, memset

from enum import IntEnum

cimport numpy as cnp
import numpy as np

cnp.import_array()

include "_steps.pxi"

cdef enum:
    _SHM = 0
    _MPI = 1

MODE_SHM = _SHM
MODE_MPI = _MPI

# Python's names of a program's words, in the structs' field order (a struct converts to a dict of
# its fields in declaration order), so that the layout is written once.
cdef Header _header_layout
cdef Row _row_layout
memset(&_header_layout, 0, sizeof(Header))
memset(&_row_layout, 0, sizeof(Row))
#: Index of each header word by name (``HeaderWord.ROWS``...).
HeaderWord = IntEnum("HeaderWord", [(name.upper(), i) for i, name in enumerate(<dict>_header_layout)],
                     module=__name__)
#: Index of each word of a row by name (``RowWord.KIND``...), from the row's start.
RowWord = IntEnum("RowWord", [(name.upper(), i) for i, name in enumerate(<dict>_row_layout)], module=__name__)
#: Words of the header, and of one row.
HEADER_SIZE, ROW_SIZE = <Py_ssize_t>HEADER_WORDS, <Py_ssize_t>ROW_WORDS
if len(HeaderWord) != HEADER_SIZE or len(RowWord) != ROW_SIZE:
    raise ImportError("a step program's header and rows must be int64 words only")


cdef int64_t _EMPTY = 0  # what an empty array's pointer stands for


cdef const int64_t* _vector(cnp.ndarray a, int64_t n, str name) except NULL:
    """The data of a contiguous int64 array of ``n`` items; ValueError naming ``name`` otherwise."""
    if a is None or cnp.PyArray_TYPE(a) != cnp.NPY_INT64 or not cnp.PyArray_IS_C_CONTIGUOUS(a) \
            or cnp.PyArray_SIZE(a) != n:
        raise ValueError(f"HierPlanner.plan: {name} must be a contiguous int64 array of {n} items (the layout's)")
    return <const int64_t*>cnp.PyArray_DATA(a) if n else <const int64_t*>&_EMPTY


# -------------------------------------------------------------------------- writing a program
cdef inline void _start(int64_t* w, int64_t pool, int64_t flags) noexcept nogil:
    """Begin a program in ``w`` (its pool at word ``pool``): no rows yet."""
    cdef Header* h = _header(w)
    h.rows, h.pool, h.scratch_bytes, h.stage_bytes, h.copied, h.flags = 0, pool, 0, 0, 0, flags


cdef inline Row* _emit(int64_t* w, int64_t kind, int64_t src, int64_t dst, int64_t n) noexcept nogil:
    """Append a row (the caller has room for it); its other words zero."""
    cdef Header* h = _header(w)
    cdef Row* r = _rows(w) + h.rows
    h.rows += 1
    memset(r, 0, sizeof(Row))
    r.kind, r.src, r.dst, r.n = kind, src, dst, n
    return r


cdef inline void _copy_step(int64_t* w, int64_t what, int64_t src, int64_t dst, int64_t at, int64_t stride,
                            int64_t n) noexcept nogil:
    """A copy of the first ``n`` blocks of the lists at pool word ``at`` (source offsets, then
    destination offsets, then lengths, ``stride`` words apart)."""
    cdef Row* r = _emit(w, STEP_COPY, src, dst, n)
    r.what, r.v0, r.v1, r.v2 = what, at, at + stride, at + 2 * stride


cdef inline void _exchange_step(int64_t* w, int64_t comm, int64_t rounds, int64_t radix, int64_t flags,
                                int64_t src, int64_t dst, int64_t at, int64_t n) noexcept nogil:
    """An exchange of ``n`` peers whose send counts, send displacements, receive counts and
    receive displacements are the ``n``-word vectors from pool word ``at`` on."""
    cdef Row* r = _emit(w, STEP_EXCHANGE, src, dst, n)
    r.comm, r.rounds, r.radix, r.flags = comm, rounds, radix, flags
    r.v0, r.v1, r.v2, r.v3 = at, at + n, at + 2 * n, at + 3 * n


cdef void _finish(int64_t* w, int64_t scratch_bytes, int64_t stage_bytes, int64_t words) noexcept nogil:
    """Close a program: its buffers' sizes, the words in use, and what its copies move."""
    cdef Header* h = _header(w)
    cdef Row* r
    cdef int64_t i, k, copied = 0
    h.scratch_bytes, h.stage_bytes, h.words = scratch_bytes, stage_bytes, words
    for i in range(h.rows):
        r = _rows(w) + i
        if r.kind == STEP_COPY:
            for k in range(r.n):
                copied += w[r.v2 + k]
    h.copied = copied


cdef class StepProgram:
    """One call's steps on one rank (bytes), as a planner wrote them: ``words``, one int64 array
    (``csrc/_steps.pxi``). A planner's own program is overwritten by its next plan; ``detach``
    gives one that lasts. ``hxmpi.comm.plan.program_steps`` reads it as typed steps."""
    cdef readonly cnp.ndarray words

    def __cinit__(self, cnp.ndarray words not None):
        if cnp.PyArray_TYPE(words) != cnp.NPY_INT64 or words.ndim != 1 or not cnp.PyArray_IS_C_CONTIGUOUS(words) \
                or words.shape[0] < HEADER_WORDS:
            raise ValueError("StepProgram: words must be a contiguous 1-D int64 array holding a header")
        self.words = words

    cdef inline Header* _h(self) noexcept:
        return _header(<int64_t*>cnp.PyArray_DATA(self.words))

    @property
    def rows(self):
        """Steps."""
        return self._h().rows

    @property
    def scratch_bytes(self):
        """Bytes of the private scratch buffer it needs."""
        return self._h().scratch_bytes

    @property
    def stage_bytes(self):
        """Bytes of the stage buffer it needs (with ``stage_shared``, the node's whole window)."""
        return self._h().stage_bytes

    @property
    def stage_shared(self):
        """Whether the stage buffer is the node's shared window (every rank of the node runs its
        copies and barriers with it)."""
        return bool(self._h().flags & STAGE_SHARED)

    @property
    def copied(self):
        """Bytes its copy steps move."""
        return self._h().copied

    @property
    def nbytes(self):
        """Bytes of its array."""
        return self.words.nbytes

    def detach(self):
        """A copy that owns its words: the header, the rows and only the vectors they name."""
        cdef int64_t* w = <int64_t*>cnp.PyArray_DATA(self.words)
        cdef Header* h = _header(w)
        cdef Row* r
        cdef int64_t i, k, used = 0, at
        cdef int64_t* out
        cdef int64_t* v
        for i in range(h.rows):
            r = _rows(w) + i
            used += r.n * (3 if r.kind == STEP_COPY else 4 if r.kind == STEP_EXCHANGE else 0)
        at = HEADER_WORDS + h.rows * ROW_WORDS
        copy = np.empty(at + used, np.int64)
        out = <int64_t*>cnp.PyArray_DATA(copy)
        with nogil:
            memcpy(out, w, at * sizeof(int64_t))
            _header(out).pool = at
            for i in range(h.rows):
                r = _rows(out) + i
                for k in range(3 if r.kind == STEP_COPY else 4 if r.kind == STEP_EXCHANGE else 0):
                    v = &r.v0 + k
                    memcpy(out + at, w + v[0], r.n * sizeof(int64_t))
                    v[0] = at
                    at += r.n
            _header(out).words = at
        return StepProgram(copy)


def flat_program(int rounds, int radix, bint uniform, cnp.ndarray send_counts, cnp.ndarray send_displs,
                 cnp.ndarray recv_counts, cnp.ndarray recv_displs):
    """The program of a flat exchange (bytes): one all-to-all on the world of the send buffer to
    the receive buffer, run whole; ``rounds`` (``Rounds``) and ``radix`` say how; ``uniform``:
    equal blocks back to back (MPI_Alltoall)."""
    cdef int64_t p = send_counts.shape[0], pool = HEADER_WORDS + ROW_WORDS
    cdef Py_ssize_t i
    cdef const int64_t* v
    words = np.empty(pool + 4 * p, np.int64)
    cdef int64_t* w = <int64_t*>cnp.PyArray_DATA(words)
    for i, (side, name) in enumerate(((send_counts, "send counts"), (send_displs, "send displs"),
                                      (recv_counts, "receive counts"), (recv_displs, "receive displs"))):
        v = _vector(side, p, name)
        memcpy(w + pool + i * p, v, p * sizeof(int64_t))
    _start(w, pool, 0)
    _exchange_step(w, COMM_WORLD, rounds, radix, BLOCKING | (UNIFORM if uniform else 0), BUF_SEND, BUF_RECV, pool, p)
    _finish(w, 0, 0, pool + 4 * p)
    return StepProgram(words)


# ------------------------------------------------------------ planning one hierarchical call
cdef struct HierCall:
    # One ``HierPlanner.plan`` call as its helpers read it, on the stack (nothing is allocated per
    # call): the sizes, the rank's own sides and its node's receive counts (the caller's arrays),
    # the layout and the planner's scratch (the planner's arrays), and where each of the program's
    # lists lies in its words (each list's source offsets, destination offsets and lengths, one
    # after the other; the exchanges' four vectors likewise).
    int64_t p, n, g, local, me, node, nl, mode
    const int64_t* sc
    const int64_t* sd
    const int64_t* rc
    const int64_t* rd
    const int64_t* rc_node     # (g x p) what every rank of the node receives from every source
    const int64_t* members
    const int64_t* dest
    const int64_t* nstart
    const int64_t* srv
    const int64_t* sptr
    const int64_t* lane_src
    int64_t* seg               # each source's phase-1 segment in the stage buffer (-1: none)
    int64_t* rstart            # each local rank's region of the stage buffer, and its end
    int64_t* pk                # pack list (p blocks)
    int64_t* ow                # own list (g blocks)
    int64_t* out               # out list (p blocks)
    int64_t* rp                # repack list (up to g * p blocks)
    int64_t* unp               # unpack list (p blocks)
    int64_t* lw                # lane li's exchange vectors (n each) from word 4 * n * li on
    int64_t* nv                # the node phase's exchange vectors (g each)


cdef inline int64_t _pack_list(HierCall* c, int64_t* packed) noexcept nogil:
    """The pack list: this rank's blocks for other nodes, in (node, local rank) order, and the send
    side of its own lane (``served[0]``): its node segments, packed. ``packed``: their bytes.
    Returns where they start in the send buffer when they already lie there in that order (phase
    1 then sends in place), else -1."""
    cdef int64_t p = c.p, n = c.n, pos = 0, base = -1, i, m, d
    cdef int64_t* pk_s = c.pk
    cdef int64_t* pk_d = pk_s + p
    cdef int64_t* pk_l = pk_d + p
    cdef int64_t* nb = c.lw                 # this rank's own lane (``served[0]``) sends its node segments
    cdef int64_t* nd = c.lw + n
    cdef bint grouped = True
    for m in range(n):
        nd[m] = pos
        for i in range(c.nstart[m], c.nstart[m + 1]):
            d = c.dest[i]
            pk_s[i] = c.sd[d]
            pk_d[i] = pos
            pk_l[i] = 0 if m == c.node else c.sc[d]
            if pk_l[i] > 0:
                if base < 0 and grouped:
                    base = c.sd[d] - pos
                    grouped = base >= 0
                elif c.sd[d] - pos != base:
                    grouped = False
            pos += pk_l[i]
        nb[m] = pos - nd[m]
    packed[0] = pos
    if not grouped:
        base = -1
    elif base < 0:
        base = 0  # nothing to send: in place trivially
    return base


cdef inline int64_t _shm_own_region(HierCall* c, int64_t j, int64_t cur) noexcept nogil:
    """MODE_SHM's node phase for local rank j's region of the window, from byte ``cur`` on: first
    rank j's blocks for the other ranks of this node, written there by j itself (this rank's own
    list when j is this rank; its out list's entry for j's block to it). The byte after them."""
    cdef int64_t p = c.p, g = c.g, local = c.local, k, b, s
    cdef int64_t* ow_s = c.ow
    cdef int64_t* ow_d = ow_s + g
    cdef int64_t* ow_l = ow_d + g
    cdef int64_t* o_s = c.out
    cdef int64_t* o_d = o_s + p
    cdef int64_t* o_l = o_d + p
    for k in range(g):
        if k == j:
            continue
        b = c.rc_node[k * p + c.members[j]]
        if j == local:
            ow_s[k], ow_d[k], ow_l[k] = c.sd[c.members[k]], cur, b
        if k == local:
            s = c.members[j]
            o_s[s], o_d[s], o_l[s] = cur, c.rd[s], c.rc[s]
        cur += b
    return cur


cdef inline int64_t _served_segments(HierCall* c, int64_t j, int64_t cur) noexcept nogil:
    """The phase-1 segments of the sources local rank j serves, from byte ``cur`` on (``seg``);
    MODE_SHM: this rank's out list takes its block of each from the window. The byte after them."""
    cdef int64_t p = c.p, g = c.g, local = c.local, idx, k, s
    cdef int64_t* o_s = c.out
    cdef int64_t* o_d = o_s + p
    cdef int64_t* o_l = o_d + p
    for idx in range(c.sptr[j], c.sptr[j + 1]):
        s = c.srv[idx]
        if s == c.members[j]:
            c.seg[s] = -1  # the server's own blocks: never in phase 1
            continue
        c.seg[s] = cur
        for k in range(g):
            if k == local and c.mode == _SHM:
                o_s[s], o_d[s], o_l[s] = cur, c.rd[s], c.rc[s]
            cur += c.rc_node[k * p + s]
    return cur


cdef inline void _phase1_segments(HierCall* c) noexcept nogil:
    """Where phase 1 lands in the stage buffer (``rstart``, ``seg``): source s's segment holds its
    blocks for every local rank k; each local rank's region holds the segments of the sources it
    serves (MODE_MPI: this rank's region only, its private buffer; MODE_SHM: the whole window,
    each region after the rank's own blocks for its node). Empties the out, unpack and own lists
    first: the node phase fills them in part."""
    cdef int64_t p = c.p, g = c.g, i, j, k, cur = 0
    for i in range(p):
        c.out[2 * p + i] = 0
        c.unp[2 * p + i] = 0
    for k in range(g):
        c.ow[2 * g + k] = 0
    for j in range(g):
        if c.mode == _MPI and j != c.local:
            continue  # only this rank's own private phase buffer
        c.rstart[j] = cur
        if c.mode == _SHM:
            cur = _shm_own_region(c, j, cur)
        cur = _served_segments(c, j, cur)
    c.rstart[g] = cur


cdef inline void _lane_vectors(HierCall* c, int64_t base) noexcept nogil:
    """Every served lane's exchange vectors. Receive sides: from each other node, the segment of
    the source that sends on the lane there. Send sides: this rank's own lane sends its node
    segments (``_pack_list``; from the send buffer itself, from ``base`` on, where they are grouped
    there), a lane it stands in for sends nothing."""
    cdef int64_t n = c.n, li, m, k, s
    cdef int64_t* lw = c.lw
    cdef int64_t* nd = c.lw + n
    for li in range(c.nl):  # -- the receive sides
        for m in range(n):
            s = c.lane_src[li * n + m]
            if s < 0 or c.seg[s] < 0:
                lw[li * 4 * n + 2 * n + m], lw[li * 4 * n + 3 * n + m] = 0, 0
            else:
                lw[li * 4 * n + 2 * n + m] = 0
                for k in range(c.g):
                    lw[li * 4 * n + 2 * n + m] += c.rc_node[k * c.p + s]
                lw[li * 4 * n + 3 * n + m] = c.seg[s]
    if base >= 0:  # -- the send sides
        for m in range(n):
            nd[m] += base
    for li in range(1, c.nl):
        for m in range(2 * n):
            lw[li * 4 * n + m] = 0


cdef inline int64_t _mpi_repack(HierCall* c, int64_t* p2tot) noexcept nogil:
    """MODE_MPI's node phase, send side: the repack list (peer k's phase-2 block holds (k, s) for
    every source s this rank serves), the own list (this rank's own block for k comes from the
    send buffer) and the node exchange's send vectors. ``p2tot``: the bytes this rank sends in
    phase 2; returns the repack list's blocks."""
    cdef int64_t p = c.p, g = c.g, local = c.local, nrep = 0, tot = 0, i, k, s, b, idx
    cdef int64_t* ow_s = c.ow
    cdef int64_t* ow_d = ow_s + g
    cdef int64_t* ow_l = ow_d + g
    cdef int64_t* rp_s = c.rp
    cdef int64_t* rp_d = rp_s + g * p
    cdef int64_t* rp_l = rp_d + g * p
    cdef int64_t* p2sc = c.nv
    cdef int64_t* p2sd = p2sc + g
    for k in range(g):
        p2sd[k] = tot
        if k != local:
            for idx in range(c.sptr[local], c.sptr[local + 1]):
                s = c.srv[idx]
                b = c.rc_node[k * p + s]
                if s == c.me:  # this rank's own block for k comes from the send buffer
                    ow_s[k], ow_d[k], ow_l[k] = c.sd[c.members[k]], tot, b
                else:
                    rp_s[nrep] = c.seg[s]
                    for i in range(k):
                        rp_s[nrep] += c.rc_node[i * p + s]
                    rp_d[nrep], rp_l[nrep] = tot, b
                    nrep += 1
                tot += b
        p2sc[k] = tot - p2sd[k]
    p2tot[0] = tot
    return nrep


cdef inline void _mpi_unpack(HierCall* c) noexcept nogil:
    """MODE_MPI's node phase, receive side: the out list's blocks for this rank among its own served
    sources (straight from phase 1 to the receive buffer), the unpack list and the node exchange's
    receive vectors; the private buffer grows to hold phase 2's receives (after phase 1's)."""
    cdef int64_t p = c.p, g = c.g, local = c.local, cur = 0, i, j, s, idx
    cdef int64_t* o_s = c.out
    cdef int64_t* o_d = o_s + p
    cdef int64_t* o_l = o_d + p
    cdef int64_t* u_s = c.unp
    cdef int64_t* u_d = u_s + p
    cdef int64_t* u_l = u_d + p
    cdef int64_t* p2rc = c.nv + 2 * g
    cdef int64_t* p2rd = p2rc + g
    # blocks for this rank among its own served sources go straight to the receive buffer
    for idx in range(c.sptr[local], c.sptr[local + 1]):
        s = c.srv[idx]
        if s != c.me:
            o_s[s] = c.seg[s]
            for i in range(local):
                o_s[s] += c.rc_node[i * p + s]
            o_d[s], o_l[s] = c.rd[s], c.rc[s]
    # phase 2 receives from each other local rank j the blocks of the sources j serves
    for j in range(g):
        p2rd[j] = cur
        if j != local:
            for idx in range(c.sptr[j], c.sptr[j + 1]):
                s = c.srv[idx]
                u_s[s], u_d[s], u_l[s] = cur, c.rd[s], c.rc[s]
                cur += c.rc[s]
        p2rc[j] = cur - p2rd[j]
    if cur > c.rstart[g]:
        c.rstart[g] = cur  # the private buffer holds phase 1, then phase 2


cdef class HierPlanner:
    """Planner of one rank's hierarchical exchange (static layout in, per-call program out)."""

    cdef readonly int64_t size, num_nodes, node, local, me, g, num_lanes
    cdef readonly object members, dest_order, node_start, srv_sources, srv_ptr, lane_src, served
    #: the program ``plan`` writes (this planner's: overwritten by its next ``plan``)
    cdef readonly StepProgram program
    cdef readonly object seg_off, region_start
    cdef int64_t* _w
    # Where the program's vectors lie (pool words): copy lists of pack, self, own, out, repack,
    # unpack; each served lane's four exchange vectors, then the node phase's.
    cdef int64_t _pool, _at_pack, _at_self, _at_own, _at_out, _at_rep, _at_unp, _at_lanes, _at_node, _words
    # The layout's arrays and the planner's scratch through their data pointers: they are never
    # reallocated, and acquiring typed memoryviews per call cost more than the planning itself.
    cdef const int64_t* _members
    cdef const int64_t* _dest
    cdef const int64_t* _nstart
    cdef const int64_t* _srv
    cdef const int64_t* _sptr
    cdef const int64_t* _lane_src
    cdef const int64_t* _served
    cdef int64_t* _seg
    cdef int64_t* _rstart

    def __init__(self, int64_t me, int64_t node, int64_t local, members, dest_order, node_start,
                 srv_sources, srv_ptr, lane_src, served):
        """``members``: world ranks of this node (local order); ``dest_order``: world ranks grouped by
        node, ``node_start`` its node boundaries (N+1); ``srv_sources``/``srv_ptr``: every source rank
        grouped by the local rank of this node that receives its phase-1 segment, in (lane, node)
        order; ``lane_src``: (served lanes x N) world rank sending on that lane from each node, -1 where
        none (this node included: own blocks never travel in phase 1); ``served``: the lanes this
        rank serves, ascending (``Layout.served_lanes``)."""
        i64 = np.int64
        self.members = np.ascontiguousarray(members, dtype=i64)
        self.dest_order = np.ascontiguousarray(dest_order, dtype=i64)
        self.node_start = np.ascontiguousarray(node_start, dtype=i64)
        self.srv_sources = np.ascontiguousarray(srv_sources, dtype=i64)
        self.srv_ptr = np.ascontiguousarray(srv_ptr, dtype=i64)
        self.lane_src = np.ascontiguousarray(lane_src, dtype=i64)
        self.served = np.ascontiguousarray(served, dtype=i64)
        self.me, self.node, self.local = me, node, local
        self.size = self.dest_order.shape[0]
        self.num_nodes = self.node_start.shape[0] - 1
        self.g = self.members.shape[0]
        self.num_lanes = self.lane_src.shape[0]
        if self.served.shape[0] != self.num_lanes or self.num_lanes == 0 or self.served[0] != local:
            raise ValueError("HierPlanner: served must list the lanes of lane_src's rows, this rank's own first")
        p, n, g, nl = self.size, self.num_nodes, self.g, self.num_lanes
        # Rows: pack, self, own or repack, the lanes, barrier or own, out, barrier or the node phase, unpack.
        self._pool = HEADER_WORDS + (nl + 8) * ROW_WORDS
        self._at_pack = self._pool
        self._at_self = self._at_pack + 3 * p
        self._at_own = self._at_self + 3
        self._at_out = self._at_own + 3 * g
        self._at_rep = self._at_out + 3 * p
        self._at_unp = self._at_rep + 3 * g * p
        self._at_lanes = self._at_unp + 3 * p
        self._at_node = self._at_lanes + 4 * n * nl
        self._words = self._at_node + 4 * g
        self.program = StepProgram(np.zeros(self._words, dtype=i64))
        self._w = <int64_t*>cnp.PyArray_DATA(self.program.words)
        self.seg_off = np.zeros(p, dtype=i64)
        self.region_start = np.zeros(g + 1, dtype=i64)
        self._members = <int64_t*>cnp.PyArray_DATA(self.members)
        self._dest = <int64_t*>cnp.PyArray_DATA(self.dest_order)
        self._nstart = <int64_t*>cnp.PyArray_DATA(self.node_start)
        self._srv = <int64_t*>cnp.PyArray_DATA(self.srv_sources)
        self._sptr = <int64_t*>cnp.PyArray_DATA(self.srv_ptr)
        self._lane_src = <int64_t*>cnp.PyArray_DATA(self.lane_src)
        self._served = <int64_t*>cnp.PyArray_DATA(self.served)
        self._seg = <int64_t*>cnp.PyArray_DATA(self.seg_off)
        self._rstart = <int64_t*>cnp.PyArray_DATA(self.region_start)

    def plan(self, int mode, cnp.ndarray send_counts, cnp.ndarray send_displs, cnp.ndarray recv_counts,
             cnp.ndarray recv_displs, cnp.ndarray node_counts, int rounds=ROUNDS_LINEAR, int radix=2):
        """Write this rank's program for one call (bytes) and return it (``program``).

        ``mode``: the node phase (``MODE_SHM``, ``MODE_MPI``); ``rounds`` and ``radix``: how the
        lanes' exchanges run (``Rounds``). The caller's blocks go from the send buffer itself
        when they are already grouped by node (phase 1 sends in place), else packed into the
        scratch buffer first; the stage buffer is the node's window (shm, sized for the whole
        node) or private (mpi).
        """
        cdef HierCall c
        cdef int64_t p = self.size, g = self.g, base, packed = 0, nrep = 0, p2tot = 0
        cdef int64_t* w = self._w
        c.sc = _vector(send_counts, p, "send counts")
        c.sd = _vector(send_displs, p, "send displs")
        c.rc = _vector(recv_counts, p, "receive counts")
        c.rd = _vector(recv_displs, p, "receive displs")
        c.rc_node = _vector(node_counts, g * p, "node counts")
        if node_counts.ndim != 2 or node_counts.shape[0] != g:
            raise ValueError("HierPlanner.plan: counts do not match the layout")
        c.p, c.n, c.g, c.local, c.me, c.node, c.nl, c.mode = p, self.num_nodes, g, self.local, self.me, self.node, \
            self.num_lanes, mode
        c.members, c.dest, c.nstart, c.srv, c.sptr = self._members, self._dest, self._nstart, self._srv, self._sptr
        c.lane_src, c.seg, c.rstart = self._lane_src, self._seg, self._rstart
        c.pk, c.ow, c.out, c.rp, c.unp = w + self._at_pack, w + self._at_own, w + self._at_out, w + self._at_rep, \
            w + self._at_unp
        c.lw, c.nv = w + self._at_lanes, w + self._at_node
        with nogil:
            base = _pack_list(&c, &packed)
            _phase1_segments(&c)
            _lane_vectors(&c, base)
            if mode == _MPI:
                nrep = _mpi_repack(&c, &p2tot)
                _mpi_unpack(&c)
            w[self._at_self], w[self._at_self + 1], w[self._at_self + 2] = c.sd[c.me], c.rd[c.me], c.sc[c.me]
            self._write_steps(&c, rounds, radix, base, nrep)
            _finish(w, packed if base < 0 and packed > p2tot else p2tot, c.rstart[g], self._words)
        return self.program

    cdef void _write_steps(self, HierCall* c, int64_t rounds, int64_t radix, int64_t base, int64_t nrep) noexcept nogil:
        """The program's steps, in the order every runner takes them (phase 1 from the send buffer
        where ``base`` >= 0, else from the pack; ``nrep``: the repack list's blocks)."""
        cdef int64_t* w = self._w
        cdef int64_t p = c.p, n = c.n, g = c.g, nl = c.nl, li, send_buf, flags
        _start(w, self._pool, STAGE_SHARED if c.mode == _SHM else 0)
        send_buf = BUF_SEND if base >= 0 else BUF_SCRATCH
        if base < 0:
            _copy_step(w, COPY_PACK, BUF_SEND, BUF_SCRATCH, self._at_pack, p, p)
        _copy_step(w, COPY_SELF, BUF_SEND, BUF_RECV, self._at_self, 1, 1)
        if c.mode == _SHM:
            _copy_step(w, COPY_OWN, BUF_SEND, BUF_STAGE, self._at_own, g, g)
        # Every served lane at once (always nonblocking: a rank serving two lanes starts both,
        # and MPI never matches a blocking collective with a nonblocking one); round-based
        # lanes run one after another, in ascending lane order, which cannot deadlock.
        for li in range(nl):
            flags = WITH_NEXT if li + 1 < nl else 0
            _exchange_step(w, self._served[li], rounds, radix, flags, send_buf, BUF_STAGE,
                           self._at_lanes + 4 * n * li, n)
        if c.mode == _SHM:
            _emit(w, STEP_BARRIER, 0, 0, 0)   # every rank's own blocks and phase-1 segments are in place
            _copy_step(w, COPY_OUT, BUF_STAGE, BUF_RECV, self._at_out, p, p)
            _emit(w, STEP_BARRIER, 0, 0, 0)   # nobody reads the window any more: the next call may write it
        else:
            _copy_step(w, COPY_REPACK, BUF_STAGE, BUF_SCRATCH, self._at_rep, g * p, nrep)
            _copy_step(w, COPY_OWN, BUF_SEND, BUF_SCRATCH, self._at_own, g, g)
            _copy_step(w, COPY_OUT, BUF_STAGE, BUF_RECV, self._at_out, p, p)
            _exchange_step(w, COMM_NODE, ROUNDS_LINEAR, 2, 0, BUF_SCRATCH, BUF_STAGE, self._at_node, g)
            _copy_step(w, COPY_UNPACK, BUF_STAGE, BUF_RECV, self._at_unp, p, p)


cdef class LeaderPlanner:
    """Planner of one rank's multi-leader exchange: ``leaders`` ranks of each node carry its
    inter-node traffic (static layout in, per-call program out; the node phase is the node window).

    Leader j (local rank j < k) speaks for its group, the local ranks j, j + k, j + 2k, ...: every
    rank writes its blocks for each other node into the window, where its group's blocks for that
    node lie back to back; after a barrier, leader j sends each other node's leader j that segment
    (one message per node pair and leader, on lane j), from the window into the window; after a
    second barrier every rank copies its blocks out (its node peers' from the window's own region),
    and a third frees the window for the next call. A rank that leads nothing has no exchange.
    """

    cdef readonly int64_t size, num_nodes, node, local, me, g, leaders
    cdef readonly object members, dest_order, node_start
    #: the program ``plan`` writes (this planner's: overwritten by its next ``plan``)
    cdef readonly StepProgram program
    cdef int64_t* _w
    cdef const int64_t* _members
    cdef const int64_t* _dest
    cdef const int64_t* _nstart
    # Where the program's vectors lie (pool words): copy lists of self, own, pack, out; the exchange's.
    cdef int64_t _pool, _at_self, _at_own, _at_pack, _at_out, _at_x, _words

    def __init__(self, int64_t me, int64_t node, int64_t local, members, dest_order, node_start, int64_t leaders):
        """``members``: world ranks of this node (local order); ``dest_order``: world ranks grouped by
        node in local order, ``node_start`` its node boundaries (N+1); ``leaders``: k, at most the
        smallest node's size."""
        i64 = np.int64
        self.members = np.ascontiguousarray(members, dtype=i64)
        self.dest_order = np.ascontiguousarray(dest_order, dtype=i64)
        self.node_start = np.ascontiguousarray(node_start, dtype=i64)
        self.me, self.node, self.local, self.leaders = me, node, local, leaders
        self.size = self.dest_order.shape[0]
        self.num_nodes = self.node_start.shape[0] - 1
        self.g = self.members.shape[0]
        smallest = int(np.diff(self.node_start).min()) if self.num_nodes else 0
        if leaders < 1 or leaders > smallest:
            raise ValueError(f"LeaderPlanner: leaders must be 1 to the smallest node's size ({smallest}), "
                             f"got {leaders}")
        p, n, g = self.size, self.num_nodes, self.g
        self._pool = HEADER_WORDS + 8 * ROW_WORDS  # self, own, pack, 3 barriers, the exchange, out
        self._at_self = self._pool
        self._at_own = self._at_self + 3
        self._at_pack = self._at_own + 3 * g
        self._at_out = self._at_pack + 3 * p
        self._at_x = self._at_out + 3 * p
        self._words = self._at_x + 4 * n
        self.program = StepProgram(np.zeros(self._words, dtype=i64))
        self._w = <int64_t*>cnp.PyArray_DATA(self.program.words)
        self._members = <int64_t*>cnp.PyArray_DATA(self.members)
        self._dest = <int64_t*>cnp.PyArray_DATA(self.dest_order)
        self._nstart = <int64_t*>cnp.PyArray_DATA(self.node_start)

    def plan(self, int mode, cnp.ndarray send_counts, cnp.ndarray send_displs, cnp.ndarray recv_counts,
             cnp.ndarray recv_displs, cnp.ndarray node_counts, int rounds=ROUNDS_LINEAR, int radix=0):
        """Write this rank's program for one call (bytes) and return it (``program``).

        ``node_counts``: (node size, 2 x world size) int64, row t the send counts then the receive
        counts of the node's local rank t (one ``Allgather`` of both sides). ``mode`` must be
        ``MODE_SHM`` (the groups meet in the node window); ``rounds`` and ``radix`` are taken for
        the planners' common signature: the leaders' exchange is one ``MPI_Alltoallv`` on the lane.
        """
        cdef int64_t p = self.size, n = self.num_nodes, g = self.g, k = self.leaders, local = self.local
        cdef int64_t me = self.me, mynode = self.node
        if mode != _SHM:
            raise ValueError("LeaderPlanner.plan: the leaders' groups meet in the node window (MODE_SHM only)")
        if node_counts.ndim != 2 or node_counts.shape[0] != g or node_counts.shape[1] != 2 * p:
            raise ValueError("LeaderPlanner.plan: node counts must be (node size, 2 x world size)")
        cdef const int64_t* sc = _vector(send_counts, p, "send counts")
        cdef const int64_t* sd = _vector(send_displs, p, "send displs")
        cdef const int64_t* rc = _vector(recv_counts, p, "receive counts")
        cdef const int64_t* rd = _vector(recv_displs, p, "receive displs")
        cdef const int64_t* nc = _vector(node_counts, g * 2 * p, "node counts")
        cdef const int64_t* members = self._members
        cdef const int64_t* dest = self._dest
        cdef const int64_t* nstart = self._nstart
        cdef int64_t* w = self._w
        cdef int64_t* ow_s = w + self._at_own
        cdef int64_t* ow_d = ow_s + g
        cdef int64_t* ow_l = ow_d + g
        cdef int64_t* pk_s = w + self._at_pack
        cdef int64_t* pk_d = pk_s + p
        cdef int64_t* pk_l = pk_d + p
        cdef int64_t* o_s = w + self._at_out
        cdef int64_t* o_d = o_s + p
        cdef int64_t* o_l = o_d + p
        cdef int64_t* xsc = w + self._at_x
        cdef int64_t* xsd = xsc + n
        cdef int64_t* xrc = xsd + n
        cdef int64_t* xrd = xrc + n
        # Byte 0 stays unused: the leaders' exchange sends from above it (``_call._apart``).
        cdef int64_t cur = 1, t, u, j, m, i, s, d, b, start, nm, lead = local < k
        with nogil:
            for i in range(p):
                pk_s[i], pk_d[i], pk_l[i] = 0, 0, 0
                o_s[i], o_d[i], o_l[i] = 0, 0, 0
            for m in range(n):
                xsc[m], xsd[m], xrc[m], xrd[m] = 0, 0, 0, 0
            # -- own region: local rank t's blocks for its node peers u, in (t, u) order
            for t in range(g):
                for u in range(g):
                    if u == t:
                        continue
                    b = nc[t * 2 * p + members[u]]
                    if t == local:
                        ow_s[u], ow_d[u], ow_l[u] = sd[members[u]], cur, sc[members[u]]
                    if u == local:
                        s = members[t]
                        o_s[s], o_d[s], o_l[s] = cur, rd[s], rc[s]
                    cur += b
            ow_s[local], ow_d[local], ow_l[local] = 0, 0, 0
            # -- send region: leader j's segment for node m holds its group's blocks for m's ranks
            for j in range(k):
                for m in range(n):
                    if m == mynode:
                        continue
                    start = cur
                    t = j
                    while t < g:
                        for i in range(nstart[m], nstart[m + 1]):
                            d = dest[i]
                            if t == local:
                                pk_s[d], pk_d[d], pk_l[d] = sd[d], cur, sc[d]
                            cur += nc[t * 2 * p + d]
                        t += k
                    if j == local:
                        xsd[m], xsc[m] = start, cur - start
            # -- receive region: from node m's leader j, its group's blocks for this node's ranks
            for j in range(k):
                for m in range(n):
                    if m == mynode:
                        continue
                    start = cur
                    nm = nstart[m + 1] - nstart[m]
                    t = j
                    while t < nm:
                        s = dest[nstart[m] + t]
                        for u in range(g):
                            if u == local:
                                o_s[s], o_d[s], o_l[s] = cur, rd[s], rc[s]
                            cur += nc[u * 2 * p + p + s]
                        t += k
                    if j == local:
                        xrd[m], xrc[m] = start, cur - start
            w[self._at_self], w[self._at_self + 1], w[self._at_self + 2] = sd[me], rd[me], sc[me]

            # -- the steps, in the order every runner takes them
            _start(w, self._pool, STAGE_SHARED)
            _copy_step(w, COPY_SELF, BUF_SEND, BUF_RECV, self._at_self, 1, 1)
            _copy_step(w, COPY_OWN, BUF_SEND, BUF_STAGE, self._at_own, g, g)
            _copy_step(w, COPY_PACK, BUF_SEND, BUF_STAGE, self._at_pack, p, p)
            _emit(w, STEP_BARRIER, 0, 0, 0)   # every rank's blocks are in the window
            if lead:
                _exchange_step(w, local, ROUNDS_LINEAR, 0, BLOCKING, BUF_STAGE, BUF_STAGE, self._at_x, n)
            _emit(w, STEP_BARRIER, 0, 0, 0)   # every leader's segments have arrived
            _copy_step(w, COPY_OUT, BUF_STAGE, BUF_RECV, self._at_out, p, p)
            _emit(w, STEP_BARRIER, 0, 0, 0)   # nobody reads the window any more: the next call may write it
            _finish(w, 0, cur, self._words)
        return self.program
