"""Planning pass of the hierarchical exchange: every byte offset of one call, in one compiled pass.

A rank's plan is a set of copy lists (source offset, destination offset, length; int64 bytes) and the
count/displacement vectors of its MPI phases. It depends only on the static layout (who serves which
lane, see ``hxmpi/comm/plan.py``), the rank's own send/receive counts and displacements, and ``rc_node``:
what every rank of its node receives from every source. Nothing here allocates per call: the outputs
are arrays owned by the planner and overwritten by each ``plan`` call.

Node phases:
  MODE_SHM  phase 1 receives into a node-shared window; after a node barrier each rank copies its
            blocks straight out of the window (no repack, no intra-node messages, no unpack).
  MODE_MPI  phase 1 receives into a private buffer; repack by destination local rank; phase 2 is an
            Alltoallv on the node; unpack.
"""
from libc.stdint cimport int64_t

cimport numpy as cnp
import numpy as np

cnp.import_array()

cdef enum:
    _SHM = 0
    _MPI = 1

MODE_SHM = _SHM
MODE_MPI = _MPI


cdef int64_t _EMPTY = 0  # what an empty array's pointer stands for

cdef inline int64_t* _data(object arr):
    """The data pointer of a contiguous int64 array the planner owns."""
    return <int64_t*>cnp.PyArray_DATA(<cnp.ndarray>arr)


cdef const int64_t* _vector(cnp.ndarray a, int64_t n, str name) except NULL:
    """The data of a contiguous int64 array of ``n`` items; ValueError naming ``name`` otherwise."""
    if a is None or cnp.PyArray_TYPE(a) != cnp.NPY_INT64 or not cnp.PyArray_IS_C_CONTIGUOUS(a) \
            or cnp.PyArray_SIZE(a) != n:
        raise ValueError(f"HierPlanner.plan: {name} must be a contiguous int64 array of {n} items (the layout's)")
    return <const int64_t*>cnp.PyArray_DATA(a) if n else <const int64_t*>&_EMPTY


cdef class HierPlanner:
    """Planner of one rank (static layout in, per-call copy lists and phase vectors out)."""

    cdef readonly int64_t size, num_nodes, node, local, me, g, num_lanes
    cdef readonly object members, dest_order, node_start, srv_sources, srv_ptr, lane_src
    cdef readonly object pack_src, pack_dst, pack_len, node_bytes, node_displs
    cdef readonly object p1_rc, p1_rd, own_src, own_dst, own_len
    cdef readonly object out_src, out_dst, out_len, rep_src, rep_dst, rep_len
    cdef readonly object unp_src, unp_dst, unp_len, seg_off, p2_sc, p2_sd, p2_rc, p2_rd
    cdef readonly object region_start
    # The arrays above through their data pointers: they are never reallocated, and acquiring ~30
    # typed memoryviews per call cost more than the planning itself.
    cdef const int64_t* _members
    cdef const int64_t* _dest
    cdef const int64_t* _nstart
    cdef const int64_t* _srv
    cdef const int64_t* _sptr
    cdef const int64_t* _lane_src
    cdef int64_t* _pk_s
    cdef int64_t* _pk_d
    cdef int64_t* _pk_l
    cdef int64_t* _nb
    cdef int64_t* _nd
    cdef int64_t* _p1_rc
    cdef int64_t* _p1_rd
    cdef int64_t* _ow_s
    cdef int64_t* _ow_d
    cdef int64_t* _ow_l
    cdef int64_t* _o_s
    cdef int64_t* _o_d
    cdef int64_t* _o_l
    cdef int64_t* _rp_s
    cdef int64_t* _rp_d
    cdef int64_t* _rp_l
    cdef int64_t* _u_s
    cdef int64_t* _u_d
    cdef int64_t* _u_l
    cdef int64_t* _seg
    cdef int64_t* _p2sc
    cdef int64_t* _p2sd
    cdef int64_t* _p2rc
    cdef int64_t* _p2rd
    cdef int64_t* _rstart

    def __init__(self, int64_t me, int64_t node, int64_t local, members, dest_order, node_start,
                 srv_sources, srv_ptr, lane_src):
        """``members``: world ranks of this node (local order); ``dest_order``: world ranks grouped by
        node, ``node_start`` its node boundaries (N+1); ``srv_sources``/``srv_ptr``: every source rank
        grouped by the local rank of this node that receives its phase-1 segment, in (lane, node)
        order; ``lane_src``: (served lanes x N) world rank sending on that lane from each node, -1 where
        none (this node included: own blocks never travel in phase 1)."""
        i64 = np.int64
        self.members = np.ascontiguousarray(members, dtype=i64)
        self.dest_order = np.ascontiguousarray(dest_order, dtype=i64)
        self.node_start = np.ascontiguousarray(node_start, dtype=i64)
        self.srv_sources = np.ascontiguousarray(srv_sources, dtype=i64)
        self.srv_ptr = np.ascontiguousarray(srv_ptr, dtype=i64)
        self.lane_src = np.ascontiguousarray(lane_src, dtype=i64)
        self.me, self.node, self.local = me, node, local
        self.size = self.dest_order.shape[0]
        self.num_nodes = self.node_start.shape[0] - 1
        self.g = self.members.shape[0]
        self.num_lanes = self.lane_src.shape[0]
        p, n, g = self.size, self.num_nodes, self.g
        z = lambda *shape: np.zeros(shape, dtype=i64)
        self.pack_src, self.pack_dst, self.pack_len = z(p), z(p), z(p)
        self.node_bytes, self.node_displs = z(n), z(n)
        self.p1_rc, self.p1_rd = z(self.num_lanes, n), z(self.num_lanes, n)
        self.own_src, self.own_dst, self.own_len = z(g), z(g), z(g)
        self.out_src, self.out_dst, self.out_len = z(p), z(p), z(p)
        self.rep_src, self.rep_dst, self.rep_len = z(g * p), z(g * p), z(g * p)
        self.unp_src, self.unp_dst, self.unp_len = z(p), z(p), z(p)
        self.seg_off = z(p)
        self.p2_sc, self.p2_sd, self.p2_rc, self.p2_rd = z(g), z(g), z(g), z(g)
        self.region_start = z(g + 1)
        self._members, self._dest, self._nstart = _data(self.members), _data(self.dest_order), _data(self.node_start)
        self._srv, self._sptr, self._lane_src = _data(self.srv_sources), _data(self.srv_ptr), _data(self.lane_src)
        self._pk_s, self._pk_d, self._pk_l = _data(self.pack_src), _data(self.pack_dst), _data(self.pack_len)
        self._nb, self._nd = _data(self.node_bytes), _data(self.node_displs)
        self._p1_rc, self._p1_rd = _data(self.p1_rc), _data(self.p1_rd)
        self._ow_s, self._ow_d, self._ow_l = _data(self.own_src), _data(self.own_dst), _data(self.own_len)
        self._o_s, self._o_d, self._o_l = _data(self.out_src), _data(self.out_dst), _data(self.out_len)
        self._rp_s, self._rp_d, self._rp_l = _data(self.rep_src), _data(self.rep_dst), _data(self.rep_len)
        self._u_s, self._u_d, self._u_l = _data(self.unp_src), _data(self.unp_dst), _data(self.unp_len)
        self._seg, self._rstart = _data(self.seg_off), _data(self.region_start)
        self._p2sc, self._p2sd = _data(self.p2_sc), _data(self.p2_sd)
        self._p2rc, self._p2rd = _data(self.p2_rc), _data(self.p2_rd)

    def plan(self, int mode, cnp.ndarray send_counts, cnp.ndarray send_displs, cnp.ndarray recv_counts,
             cnp.ndarray recv_displs, cnp.ndarray node_counts):
        """Fill the copy lists and phase vectors for one call (bytes).

        Returns (send_base, pack_bytes, buffer_bytes, p2_send_bytes, rep_count, copied_bytes): ``send_base`` >= 0
        when the caller's blocks are already grouped by node (phase 1 sends in place from that
        offset, no pack), else -1; ``buffer_bytes`` is the window size (MODE_SHM, whole node) or the
        private phase buffer size (MODE_MPI); ``copied_bytes`` is what the call's copies move.
        """
        cdef int64_t p = self.size, n = self.num_nodes, g = self.g, local = self.local, me = self.me
        cdef int64_t nl = self.num_lanes, mynode = self.node
        cdef const int64_t* sc = _vector(send_counts, p, "send counts")
        cdef const int64_t* sd = _vector(send_displs, p, "send displs")
        cdef const int64_t* rc = _vector(recv_counts, p, "receive counts")
        cdef const int64_t* rd = _vector(recv_displs, p, "receive displs")
        cdef const int64_t* rc_node = _vector(node_counts, g * p, "node counts")
        cdef const int64_t* members = self._members
        cdef const int64_t* dest = self._dest
        cdef const int64_t* nstart = self._nstart
        cdef const int64_t* srv = self._srv
        cdef const int64_t* sptr = self._sptr
        cdef const int64_t* lane_src = self._lane_src
        cdef int64_t* pk_s = self._pk_s
        cdef int64_t* pk_d = self._pk_d
        cdef int64_t* pk_l = self._pk_l
        cdef int64_t* nb = self._nb
        cdef int64_t* nd = self._nd
        cdef int64_t* p1_rc = self._p1_rc
        cdef int64_t* p1_rd = self._p1_rd
        cdef int64_t* ow_s = self._ow_s
        cdef int64_t* ow_d = self._ow_d
        cdef int64_t* ow_l = self._ow_l
        cdef int64_t* o_s = self._o_s
        cdef int64_t* o_d = self._o_d
        cdef int64_t* o_l = self._o_l
        cdef int64_t* rp_s = self._rp_s
        cdef int64_t* rp_d = self._rp_d
        cdef int64_t* rp_l = self._rp_l
        cdef int64_t* u_s = self._u_s
        cdef int64_t* u_d = self._u_d
        cdef int64_t* u_l = self._u_l
        cdef int64_t* seg = self._seg
        cdef int64_t* rstart = self._rstart
        cdef int64_t* p2sc = self._p2sc
        cdef int64_t* p2sd = self._p2sd
        cdef int64_t* p2rc = self._p2rc
        cdef int64_t* p2rd = self._p2rd
        cdef int64_t pos = 0, base = -1, i, j, k, m, d, s, idx, li, b, cur, nrep = 0, p2tot = 0, copied
        cdef bint grouped = True
        if node_counts.ndim != 2 or node_counts.shape[0] != g:
            raise ValueError("HierPlanner.plan: counts do not match the layout")
        with nogil:
            # -- pack: this rank's blocks for other nodes, in (node, local rank) order
            for m in range(n):
                nd[m] = pos
                for i in range(nstart[m], nstart[m + 1]):
                    d = dest[i]
                    pk_s[i] = sd[d]
                    pk_d[i] = pos
                    pk_l[i] = 0 if m == mynode else sc[d]
                    if pk_l[i] > 0:
                        if base < 0 and grouped:
                            base = sd[d] - pos
                            grouped = base >= 0
                        elif sd[d] - pos != base:
                            grouped = False
                    pos += pk_l[i]
                nb[m] = pos - nd[m]
            if not grouped:
                base = -1
            elif base < 0:
                base = 0  # nothing to send: in place trivially
            for i in range(p):
                o_l[i] = 0
                u_l[i] = 0

            # -- phase-1 segments: source s's segment holds its blocks for every local rank k
            for k in range(g):
                ow_l[k] = 0
            cur = 0
            for j in range(g):
                if mode == _MPI and j != local:
                    continue  # only this rank's own private phase buffer
                rstart[j] = cur
                if mode == _SHM:
                    # rank j's blocks for the other ranks of this node, written there by j itself
                    for k in range(g):
                        if k == j:
                            continue
                        b = rc_node[k * p + members[j]]
                        if j == local:
                            ow_s[k], ow_d[k], ow_l[k] = sd[members[k]], cur, b
                        if k == local:
                            s = members[j]
                            o_s[s], o_d[s], o_l[s] = cur, rd[s], rc[s]
                        cur += b
                for idx in range(sptr[j], sptr[j + 1]):
                    s = srv[idx]
                    if s == members[j]:
                        seg[s] = -1  # the server's own blocks: never in phase 1
                        continue
                    seg[s] = cur
                    for k in range(g):
                        if k == local and mode == _SHM:
                            o_s[s], o_d[s], o_l[s] = cur, rd[s], rc[s]
                        cur += rc_node[k * p + s]
            rstart[g] = cur
            for li in range(nl):
                for m in range(n):
                    s = lane_src[li * n + m]
                    if s < 0 or seg[s] < 0:
                        p1_rc[li * n + m], p1_rd[li * n + m] = 0, 0
                    else:
                        p1_rc[li * n + m] = 0
                        for k in range(g):
                            p1_rc[li * n + m] += rc_node[k * p + s]
                        p1_rd[li * n + m] = seg[s]

            if mode == _MPI:
                # -- repack: peer k's phase-2 block holds (k, s) for every source s this rank serves
                for k in range(g):
                    p2sd[k] = p2tot
                    if k != local:
                        for idx in range(sptr[local], sptr[local + 1]):
                            s = srv[idx]
                            b = rc_node[k * p + s]
                            if s == me:  # this rank's own block for k comes from the send buffer
                                ow_s[k], ow_d[k], ow_l[k] = sd[members[k]], p2tot, b
                            else:
                                rp_s[nrep] = seg[s]
                                for i in range(k):
                                    rp_s[nrep] += rc_node[i * p + s]
                                rp_d[nrep], rp_l[nrep] = p2tot, b
                                nrep += 1
                            p2tot += b
                    p2sc[k] = p2tot - p2sd[k]
                # blocks for this rank among its own served sources go straight to the receive buffer
                for idx in range(sptr[local], sptr[local + 1]):
                    s = srv[idx]
                    if s != me:
                        o_s[s] = seg[s]
                        for i in range(local):
                            o_s[s] += rc_node[i * p + s]
                        o_d[s], o_l[s] = rd[s], rc[s]
                # phase 2 receives from each other local rank j the blocks of the sources j serves
                cur = 0
                for j in range(g):
                    p2rd[j] = cur
                    if j != local:
                        for idx in range(sptr[j], sptr[j + 1]):
                            s = srv[idx]
                            u_s[s], u_d[s], u_l[s] = cur, rd[s], rc[s]
                            cur += rc[s]
                    p2rc[j] = cur - p2rd[j]
                if cur > rstart[g]:
                    rstart[g] = cur  # the private buffer holds phase 1, then phase 2
            # bytes this call moves with copy_blocks (for last_stats): no reductions in Python later
            copied = (pos if base < 0 else 0) + sc[me]
            for k in range(g):
                copied += ow_l[k]
            for i in range(p):
                copied += o_l[i] + (u_l[i] if mode == _MPI else 0)
            for i in range(nrep):
                copied += rp_l[i]
        return base, pos, rstart[g], p2tot, nrep, copied

