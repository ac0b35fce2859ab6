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

import numpy as np

cdef enum:
    _SHM = 0
    _MPI = 1

MODE_SHM = _SHM
MODE_MPI = _MPI


cdef class HierPlanner:
    """Planner of one rank (static layout in, per-call copy lists and phase vectors out)."""

    cdef readonly int64_t size, num_nodes, node, local, me, g, num_lanes
    cdef readonly object members, dest_order, node_start, srv_sources, srv_ptr, lane_src
    cdef readonly object pack_src, pack_dst, pack_len, node_bytes, node_displs
    cdef readonly object p1_rc, p1_rd, own_src, own_dst, own_len
    cdef readonly object out_src, out_dst, out_len, rep_src, rep_dst, rep_len
    cdef readonly object unp_src, unp_dst, unp_len, seg_off, p2_sc, p2_sd, p2_rc, p2_rd
    cdef readonly object region_start

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

    def plan(self, int mode, const int64_t[::1] sc, const int64_t[::1] sd, const int64_t[::1] rc,
             const int64_t[::1] rd, const int64_t[:, ::1] rc_node):
        """Fill the copy lists and phase vectors for one call (bytes).

        Returns (send_base, pack_bytes, buffer_bytes, p2_send_bytes, rep_count, copied_bytes): ``send_base`` >= 0
        when the caller's blocks are already grouped by node (phase 1 sends in place from that
        offset, no pack), else -1; ``buffer_bytes`` is the window size (MODE_SHM, whole node) or the
        private phase buffer size (MODE_MPI); ``copied_bytes`` is what the call's copies move.
        """
        cdef int64_t p = self.size, n = self.num_nodes, g = self.g, local = self.local, me = self.me
        cdef int64_t nl = self.num_lanes, mynode = self.node
        cdef const int64_t[::1] members = self.members, dest = self.dest_order, nstart = self.node_start
        cdef const int64_t[::1] srv = self.srv_sources, sptr = self.srv_ptr
        cdef const int64_t[:, ::1] lane_src = self.lane_src
        cdef int64_t[::1] pk_s = self.pack_src, pk_d = self.pack_dst, pk_l = self.pack_len
        cdef int64_t[::1] nb = self.node_bytes, nd = self.node_displs
        cdef int64_t[:, ::1] p1_rc = self.p1_rc, p1_rd = self.p1_rd
        cdef int64_t[::1] ow_s = self.own_src, ow_d = self.own_dst, ow_l = self.own_len
        cdef int64_t[::1] o_s = self.out_src, o_d = self.out_dst, o_l = self.out_len
        cdef int64_t[::1] rp_s = self.rep_src, rp_d = self.rep_dst, rp_l = self.rep_len
        cdef int64_t[::1] u_s = self.unp_src, u_d = self.unp_dst, u_l = self.unp_len
        cdef int64_t[::1] seg = self.seg_off, rstart = self.region_start
        cdef int64_t[::1] p2sc = self.p2_sc, p2sd = self.p2_sd, p2rc = self.p2_rc, p2rd = self.p2_rd
        cdef int64_t pos = 0, base = -1, i, j, k, m, d, s, idx, li, b, cur, nrep = 0, p2tot = 0, copied
        cdef bint grouped = True
        if rc_node.shape[0] != g or rc_node.shape[1] != p or sc.shape[0] != p or rd.shape[0] != p:
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
                        b = rc_node[k, members[j]]
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
                        cur += rc_node[k, s]
            rstart[g] = cur
            for li in range(nl):
                for m in range(n):
                    s = lane_src[li, m]
                    if s < 0 or seg[s] < 0:
                        p1_rc[li, m], p1_rd[li, m] = 0, 0
                    else:
                        p1_rc[li, m] = 0
                        for k in range(g):
                            p1_rc[li, m] += rc_node[k, s]
                        p1_rd[li, m] = seg[s]

            if mode == _MPI:
                # -- repack: peer k's phase-2 block holds (k, s) for every source s this rank serves
                for k in range(g):
                    p2sd[k] = p2tot
                    if k != local:
                        for idx in range(sptr[local], sptr[local + 1]):
                            s = srv[idx]
                            b = rc_node[k, s]
                            if s == me:  # this rank's own block for k comes from the send buffer
                                ow_s[k], ow_d[k], ow_l[k] = sd[members[k]], p2tot, b
                            else:
                                rp_s[nrep] = seg[s]
                                for i in range(k):
                                    rp_s[nrep] += rc_node[i, s]
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
                            o_s[s] += rc_node[i, s]
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
