# The multi-leader planner: ``LeaderPlanner`` writes one rank's program of a call whose inter-node
# traffic ``leaders`` ranks of each node carry. Included by ``_plan.pyx`` after
# ``_step_program.pxi``.
from libc.stdint cimport int64_t

cimport numpy as cnp


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
