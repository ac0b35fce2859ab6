# The hierarchical planner: ``HierPlanner`` writes one rank's program of a call on the lanes, its
# ``plan`` one ``noexcept nogil`` helper per sub-job over a ``HierCall`` on the stack (the pack
# list, phase 1's segments with MODE_SHM's node phase, the lanes' vectors, MODE_MPI's node phase,
# the steps). Included by ``_plan.pyx`` after ``_step_program.pxi``.
from libc.stdint cimport int64_t

cimport numpy as cnp


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
    int64_t chunks             # the pipelined node phase's chunks (1: none)
    int64_t* clw               # chunk k's lane li vectors from word 4 * n * (k * nl + li) on
    int64_t* cout              # chunk k's out list (p blocks) from word 3 * p * k on
    int64_t* cpack             # chunk k's pack list (p blocks) from word 3 * p * k on
    const int64_t* lane        # each world rank's local rank in its node: the lane it sends on
    const int64_t* served      # the lanes this rank serves (``nl``), its own first
    bint direct                # linear lanes and the shm node phase: a lane may receive into the receive buffer


cdef inline int64_t _first_in_place(HierCall* c, int64_t lo, int64_t hi) noexcept nogil:
    """Where the blocks ``lo`` to ``hi`` of the pack order start in the send buffer, when they lie
    there one after another (``_pack_list``): the first non-empty one's displacement, or 0."""
    cdef int64_t i
    for i in range(lo, hi):
        if c.pk[2 * c.p + i] > 0:
            return c.pk[i]
    return 0


cdef inline bint _pack_list(HierCall* c, int64_t* packed) noexcept nogil:
    """The pack list: this rank's blocks for other nodes, in (node, local rank) order, and the send
    side of its own lane (``served[0]``): its node segments, packed. ``packed``: their bytes.
    Returns whether each node's blocks already lie one after another in the send buffer, in that
    order: phase 1 then sends in place, from where the send vectors say."""
    cdef int64_t p = c.p, n = c.n, pos = 0, i, m, d, at
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
            pos += pk_l[i]
        nb[m] = pos - nd[m]
        at = -1  # where the node's next block must start to lie in place (-1: no block yet)
        for i in range(c.nstart[m], c.nstart[m + 1]):
            if pk_l[i] > 0:
                grouped = grouped and (at < 0 or pk_s[i] == at)
                at = pk_s[i] + pk_l[i]
    packed[0] = pos
    if grouped:  # in place: each node's segment from its first block on
        for m in range(n):
            nd[m] = _first_in_place(c, c.nstart[m], c.nstart[m + 1])
    return grouped


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


cdef inline void _lane_vectors(HierCall* c) noexcept nogil:
    """Every served lane's exchange vectors. Receive sides: from each other node, the segment of
    the source that sends on the lane there (into the receive buffer where ``_direct``). Send
    sides: this rank's own lane sends its node segments (``_pack_list``; from the send buffer
    itself where they are grouped there), a lane it stands in for sends nothing."""
    cdef int64_t n = c.n, li, m, k, s
    cdef int64_t* lw = c.lw
    cdef int64_t* nd = c.lw + n
    cdef bint direct
    for li in range(c.nl):  # -- the receive sides
        direct = c.chunks == 1 and _direct(c, c.served[li], 0)
        for m in range(n):
            s = c.lane_src[li * n + m]
            if s < 0 or c.seg[s] < 0:
                lw[li * 4 * n + 2 * n + m], lw[li * 4 * n + 3 * n + m] = 0, 0
            else:
                lw[li * 4 * n + 2 * n + m] = 0
                for k in range(c.g):
                    lw[li * 4 * n + 2 * n + m] += c.rc_node[k * c.p + s]
                lw[li * 4 * n + 3 * n + m] = c.seg[s]
                if direct:  # into the receive buffer: nothing to copy out
                    lw[li * 4 * n + 3 * n + m] = c.rd[s]
                    c.out[2 * c.p + s] = 0
    for li in range(1, c.nl):  # -- the send sides
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


cdef inline int64_t _group_start(int64_t q, int64_t size, int64_t chunks) noexcept nogil:
    """The first local rank of group ``q`` when a node of ``size`` ranks is cut into ``chunks``
    near-equal groups of consecutive local ranks (local rank r is in group ``_group_of(r)``; a
    group is empty where chunks > size), computed alike by a segment's sender and receiver."""
    return (q * size + chunks - 1) // chunks


cdef inline int64_t _group_of(int64_t r, int64_t size, int64_t chunks) noexcept nogil:
    """The group of local rank ``r`` (``_group_start``'s cut)."""
    return r * chunks // size


cdef inline int64_t _chunk_group(int64_t lane, int64_t k, int64_t chunks) noexcept nogil:
    """The group of the receiving node's ranks whose blocks chunk ``k`` of ``lane`` carries: the
    lanes rotate through the groups, so in every chunk each rank of the node gets blocks from as
    many lanes as the others, and copies out as much; in the last chunk a lane carries its own
    local rank's group (``_direct``)."""
    return (lane + k + 1) % chunks


cdef inline bint _direct(HierCall* c, int64_t lane, int64_t k) noexcept nogil:
    """Whether chunk ``k`` of ``lane`` (0 of 1 without a pipeline) lands straight in this rank's
    receive buffer, with no copy out of the window: linear lanes with the shm node phase, a lane
    this rank serves, whose chunk carries blocks for this rank alone (on a node of one rank,
    always; with one chunk per rank of the node, the last chunk of the rank's own lane)."""
    cdef int64_t q, lo, hi, li
    if not c.direct:
        return False
    q = _chunk_group(lane, k, c.chunks)
    lo, hi = _group_start(q, c.g, c.chunks), _group_start(q + 1, c.g, c.chunks)
    if lo != c.local or hi != lo + 1:
        return False
    for li in range(c.nl):
        if c.served[li] == lane:
            return True
    return False


cdef inline void _chunk_sends(HierCall* c, bint in_place) noexcept nogil:
    """Each chunk's send vectors on this rank's own lane and, where the blocks must be packed
    (not ``in_place``), its pack list: chunk k to node m is the blocks for m's group
    ``_chunk_group(local, k)``, whole and consecutive in the pack order (``_pack_list``), so they
    go from the send buffer itself where the blocks are grouped by node there (``in_place``), else
    from the scratch buffer, each chunk packed just before it is sent."""
    cdef int64_t p = c.p, n = c.n, nl = c.nl, k, m, i, q, lo, hi, size
    cdef int64_t* pk_s = c.pk
    cdef int64_t* pk_d = pk_s + p
    cdef int64_t* pk_l = pk_d + p
    cdef int64_t* q_s
    cdef int64_t* v
    for k in range(c.chunks):
        q_s = c.cpack + 3 * p * k
        v = c.clw + 4 * n * (k * nl)  # this rank's own lane: the first served
        q = _chunk_group(c.local, k, c.chunks)
        for i in range(p):
            q_s[i], q_s[p + i], q_s[2 * p + i] = pk_s[i], pk_d[i], 0
        for m in range(n):
            size = c.nstart[m + 1] - c.nstart[m]
            lo = c.nstart[m] + _group_start(q, size, c.chunks)
            hi = c.nstart[m] + _group_start(q + 1, size, c.chunks)
            v[m] = 0
            v[n + m] = _first_in_place(c, lo, hi) if in_place else (pk_d[lo] if lo < hi else 0)
            for i in range(lo, hi):
                v[m] += pk_l[i]
                q_s[2 * p + i] = pk_l[i]


cdef inline void _chunk_receives(HierCall* c) noexcept nogil:
    """Each chunk's lane vectors besides the own lane's sends: every served lane receives, in
    chunk k, the part of each other node's segment that holds the blocks for this node's group
    ``_chunk_group(lane, k)``, in its place in the window (segments keep the one-chunk layout),
    or where ``_direct`` in its place in the receive buffer; a lane it stands in for sends nothing."""
    cdef int64_t p = c.p, n = c.n, nl = c.nl, g = c.g, k, li, m, s, q, r, at, lo, hi
    cdef int64_t* v
    for li in range(nl):
        for m in range(n):
            s = c.lane_src[li * n + m]
            for k in range(c.chunks):
                v = c.clw + 4 * n * (k * nl + li)
                if li > 0:
                    v[m], v[n + m] = 0, 0
                v[2 * n + m], v[3 * n + m] = 0, 0
                if s < 0 or c.seg[s] < 0:
                    continue
                q = _chunk_group(c.lane[s], k, c.chunks)
                lo, hi = _group_start(q, g, c.chunks), _group_start(q + 1, g, c.chunks)
                at = c.seg[s]
                for r in range(lo):
                    at += c.rc_node[r * p + s]
                v[3 * n + m] = c.rd[s] if _direct(c, c.served[li], k) else at
                for r in range(lo, hi):
                    v[2 * n + m] += c.rc_node[r * p + s]


cdef inline void _chunk_out(HierCall* c) noexcept nogil:
    """Each chunk's out list: this rank's whole block of each segment whose chunk k carries this
    rank's group, from the window to its place in the receive buffer (each block in one chunk;
    none where the chunk landed there, ``_direct``); in chunk 0 also the blocks the node's other
    ranks wrote to their own regions for it (no lane carries those)."""
    cdef int64_t p = c.p, k, s, mine
    cdef int64_t* o_s = c.out
    cdef int64_t* o_d = o_s + p
    cdef int64_t* o_l = o_d + p
    cdef int64_t* q_s
    mine = _group_of(c.local, c.g, c.chunks)
    for s in range(p):
        for k in range(c.chunks):
            q_s = c.cout + 3 * p * k
            q_s[s], q_s[p + s], q_s[2 * p + s] = 0, 0, 0
            if (k == 0 if c.seg[s] < 0 else _chunk_group(c.lane[s], k, c.chunks) == mine
                                                and not _direct(c, c.lane[s], k)):
                q_s[s], q_s[p + s], q_s[2 * p + s] = o_s[s], o_d[s], o_l[s]


#: The most chunks a pipelined node phase is cut into.
MAX_CHUNKS = 8


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
    # The pipelined program (``plan`` with chunks > 1): rows for ``MAX_CHUNKS`` chunks, the same
    # lists as the program's above (moved by ``_shift``), then the chunks' lane vectors and out
    # lists; made at its first use.
    cdef readonly StepProgram pipelined
    cdef int64_t _shift, _at_clanes, _at_cout, _at_cpack, _cwords
    #: the most ranks a node of the layout has: no more chunks run (``plan.chunks_run``; the
    #: rest would be empty on every lane, ``_group_start``, each costing a wait and a barrier)
    cdef readonly int64_t max_node_size
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
    cdef const int64_t* _lane
    cdef readonly object lane_of  # each world rank's local rank in its node: the lane it sends on

    def __init__(self, int64_t me, int64_t node, int64_t local, members, dest_order, node_start,
                 srv_sources, srv_ptr, lane_src, served, local_of):
        """``members``: world ranks of this node (local order); ``dest_order``: world ranks grouped by
        node, ``node_start`` its node boundaries (N+1); ``srv_sources``/``srv_ptr``: every source rank
        grouped by the local rank of this node that receives its phase-1 segment, in (lane, node)
        order; ``lane_src``: (served lanes x N) world rank sending on that lane from each node, -1 where
        none (this node included: own blocks never travel in phase 1); ``served``: the lanes this
        rank serves, ascending (``Layout.served_lanes``); ``local_of``: every world rank's local rank
        in its node, the lane it sends on (``Layout.local_of``)."""
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
        self.max_node_size = int(np.max(np.diff(self.node_start)))
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
        self.pipelined = None
        # Rows: self, two packs, chunk 0's lanes, own, then per chunk a wait, the next chunk's
        # lanes, a barrier, an out list and a pack; a last barrier.
        self._shift = (MAX_CHUNKS * (nl + 4) + nl + 8) * ROW_WORDS - (nl + 8) * ROW_WORDS
        self._at_clanes = self._words + self._shift
        self._at_cout = self._at_clanes + MAX_CHUNKS * 4 * n * nl
        self._at_cpack = self._at_cout + MAX_CHUNKS * 3 * p
        self._cwords = self._at_cpack + MAX_CHUNKS * 3 * p
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
        self.lane_of = np.ascontiguousarray(local_of, dtype=i64)
        if self.lane_of.shape[0] != p:
            raise ValueError("HierPlanner: local_of must give every world rank's local rank")
        self._lane = <int64_t*>cnp.PyArray_DATA(self.lane_of)

    def plan(self, int mode, cnp.ndarray send_counts, cnp.ndarray send_displs, cnp.ndarray recv_counts,
             cnp.ndarray recv_displs, cnp.ndarray node_counts, int rounds=ROUNDS_LINEAR, int radix=2):
        """Write this rank's program for one call (bytes) and return it (``program``, or
        ``pipelined`` for a pipelined one).

        ``mode``: the node phase (``MODE_SHM``, ``MODE_MPI``); ``rounds`` and ``radix``: how the
        lanes' exchanges run (``Rounds``). The caller's blocks go from the send buffer itself
        when they are already grouped by node (phase 1 sends in place), else packed into the
        scratch buffer first; the stage buffer is the node's window (shm, sized for the whole
        node) or private (mpi). Linear lanes with the shared-memory node phase carry their chunk
        count in ``radix`` (1 to ``MAX_CHUNKS``; 0 or 1: one chunk; at most ``max_node_size``
        run, as a chunk is a group of a node's ranks): with more than one, the lanes move their
        segments in chunks, each chunk left in flight while the node copies the one before it out
        of the window (``_write_pipelined``).
        """
        cdef HierCall c
        cdef bint in_place
        cdef int64_t p = self.size, g = self.g, packed = 0, nrep = 0, p2tot = 0, words = self._words
        cdef int64_t shift = 0
        cdef int64_t* w = self._w
        cdef StepProgram out = self.program
        c.chunks = radix if rounds == ROUNDS_LINEAR and mode == _SHM and radix > 1 else 1
        if c.chunks > MAX_CHUNKS:
            raise ValueError(f"HierPlanner.plan: at most {MAX_CHUNKS} chunks, got {c.chunks}")
        c.chunks = min(c.chunks, self.max_node_size)
        if c.chunks > 1:
            if self.pipelined is None:
                self.pipelined = StepProgram(np.zeros(self._cwords, dtype=np.int64))
            out, shift, words = self.pipelined, self._shift, self._cwords
            w = <int64_t*>cnp.PyArray_DATA(out.words)
            c.clw, c.cout, c.cpack = w + self._at_clanes, w + self._at_cout, w + self._at_cpack
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
        c.lane_src, c.seg, c.rstart, c.lane = self._lane_src, self._seg, self._rstart, self._lane
        c.served, c.direct = self._served, mode == _SHM and rounds == ROUNDS_LINEAR
        w += shift  # the lists lie after the rows: ``shift`` words further in the pipelined program
        c.pk, c.ow, c.out, c.rp, c.unp = w + self._at_pack, w + self._at_own, w + self._at_out, w + self._at_rep, \
            w + self._at_unp
        c.lw, c.nv = w + self._at_lanes, w + self._at_node
        w -= shift
        with nogil:
            in_place = _pack_list(&c, &packed)
            _phase1_segments(&c)
            _lane_vectors(&c)
            if mode == _MPI:
                nrep = _mpi_repack(&c, &p2tot)
                _mpi_unpack(&c)
            w[shift + self._at_self], w[shift + self._at_self + 1], w[shift + self._at_self + 2] = \
                c.sd[c.me], c.rd[c.me], c.sc[c.me]
            if c.chunks > 1:
                _chunk_sends(&c, in_place)
                _chunk_receives(&c)
                _chunk_out(&c)
                self._write_pipelined(&c, w, in_place)
            else:
                self._write_steps(&c, rounds, radix, in_place, nrep)
            _finish(w, packed if not in_place and packed > p2tot else p2tot, c.rstart[g], words)
        return out

    cdef void _write_pipelined(self, HierCall* c, int64_t* w, bint in_place) noexcept nogil:
        """The pipelined program's steps (linear lanes, shared-memory node phase, ``c.chunks``
        chunks): chunk 0 is started on every served lane, then this rank's own blocks for its node
        go to the window; then, for each chunk k, wait for it, start chunk k + 1, a node barrier
        (every server's chunk k is in the window) and copy this rank's blocks in chunk k out
        while chunk k + 1 is on the wire; a last barrier frees the window. Where the blocks must
        be packed (not ``in_place``), each chunk is packed before it is started: chunks 0 and 1
        first, chunk k + 2 after chunk k's out list, beside the wire."""
        cdef int64_t p = c.p, g = c.g, k, s = self._shift
        cdef int64_t send_buf = BUF_SEND if in_place else BUF_SCRATCH
        _start(w, self._pool + s, STAGE_SHARED)
        _copy_step(w, COPY_SELF, BUF_SEND, BUF_RECV, s + self._at_self, 1, 1)
        if not in_place:
            _copy_step(w, COPY_PACK, BUF_SEND, BUF_SCRATCH, self._at_cpack, p, p)
        self._chunk_lanes(c, w, 0, send_buf)
        _copy_step(w, COPY_OWN, BUF_SEND, BUF_STAGE, s + self._at_own, g, g)
        if not in_place:
            _copy_step(w, COPY_PACK, BUF_SEND, BUF_SCRATCH, self._at_cpack + 3 * p, p, p)
        for k in range(c.chunks):
            _emit(w, STEP_WAIT, 0, 0, 0)
            if k + 1 < c.chunks:
                self._chunk_lanes(c, w, k + 1, send_buf)
            _emit(w, STEP_BARRIER, 0, 0, 0)   # every server's chunk k (and every own block) is in place
            _copy_step(w, COPY_OUT, BUF_STAGE, BUF_RECV, self._at_cout + 3 * p * k, p, p)
            if k + 2 < c.chunks and not in_place:
                _copy_step(w, COPY_PACK, BUF_SEND, BUF_SCRATCH, self._at_cpack + 3 * p * (k + 2), p, p)
        _emit(w, STEP_BARRIER, 0, 0, 0)       # nobody reads the window any more: the next call may write it

    cdef void _chunk_lanes(self, HierCall* c, int64_t* w, int64_t k, int64_t send_buf) noexcept nogil:
        """Chunk ``k`` of every served lane, sent from ``send_buf``, posted together and left in flight."""
        cdef int64_t li, n = c.n, nl = c.nl
        for li in range(nl):
            _exchange_step(w, self._served[li], ROUNDS_LINEAR, 0, WITH_NEXT if li + 1 < nl else IN_FLIGHT,
                           send_buf, BUF_RECV if _direct(c, self._served[li], k) else BUF_STAGE,
                           self._at_clanes + 4 * n * (k * nl + li), n)

    cdef void _write_steps(self, HierCall* c, int64_t rounds, int64_t radix, bint in_place, int64_t nrep) noexcept nogil:
        """The program's steps, in the order every runner takes them (phase 1 from the send buffer
        where ``in_place``, else from the pack; ``nrep``: the repack list's blocks)."""
        cdef int64_t* w = self._w
        cdef int64_t p = c.p, n = c.n, g = c.g, nl = c.nl, li, send_buf, flags
        _start(w, self._pool, STAGE_SHARED if c.mode == _SHM else 0)
        send_buf = BUF_SEND if in_place else BUF_SCRATCH
        if not in_place:
            _copy_step(w, COPY_PACK, BUF_SEND, BUF_SCRATCH, self._at_pack, p, p)
        _copy_step(w, COPY_SELF, BUF_SEND, BUF_RECV, self._at_self, 1, 1)
        if c.mode == _SHM:
            _copy_step(w, COPY_OWN, BUF_SEND, BUF_STAGE, self._at_own, g, g)
        # Every served lane at once (always nonblocking: a rank serving two lanes starts both,
        # and MPI never matches a blocking collective with a nonblocking one); round-based
        # lanes run one after another, in ascending lane order, which cannot deadlock.
        for li in range(nl):
            flags = WITH_NEXT if li + 1 < nl else 0
            _exchange_step(w, self._served[li], rounds, radix, flags, send_buf,
                           BUF_RECV if _direct(c, self._served[li], 0) else BUF_STAGE,
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
