# The compiled runner: ``Runner`` runs a step program (``_steps.pxi``; the planners of
# ``_plan.pyx`` write them) in one C loop over its steps, with its Bruck exchanges through
# ``BruckOnce`` (``_bruck_once.pxi``). Included by ``_call.pyx`` after ``_mpi.pxi``, ``_copy.pxi``,
# ``_steps.pxi`` and ``_bruck_once.pxi``.
from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

cimport numpy as cnp


cdef int _apart(const int* counts, int* displs, Py_ssize_t n) noexcept nogil:
    """An exchange within one buffer (multi-leader's, in the node window) passes MPI a send buffer
    that starts higher than the receive buffer: libnbc takes equal starts for ``MPI_IN_PLACE`` and
    MPICH refuses them as aliased. Moves ``displs`` down by the first byte sent (at least 1: the
    planner leaves byte 0 unused) and returns that shift; an unsent peer's displacement is 0."""
    cdef Py_ssize_t k
    cdef int shift = -1
    for k in range(n):
        if counts[k] > 0 and (shift < 0 or displs[k] < shift):
            shift = displs[k]
    if shift < 1:
        shift = 1
    for k in range(n):
        displs[k] = displs[k] - shift if counts[k] > 0 else 0
    return shift


cdef inline int64_t _total(const int64_t* v, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t k
    cdef int64_t t = 0
    for k in range(n):
        t += v[k]
    return t


cdef struct Buffers:
    # A program's four buffers (``Buffer``'s order) and their bytes.
    unsigned char* data[4]
    int64_t nbytes[4]


cdef struct Peers:
    # An exchange's communicator as the runner calls it.
    uint64_t comm
    int64_t rank
    int64_t size


_BUFFER_NAMES = ("send", "receive", "scratch", "stage")


cdef class Runner:
    """Step programs (``hxmpi.comm.plan``) run compiled on one ``HierComm``'s communicators: one
    C loop over the steps, without the GIL (but to grow a Bruck exchange's scratch) and with no
    Python between them. ``Run.run`` uses it for a one-shot run off the large-count path, and
    ``CallTable`` for a miss or a rebound hit it runs hierarchically.

    Copies are the steps' block lists; a linear exchange is one ``MPI_Ialltoallv`` (those posted
    together all started, then all waited for, or, marked ``IN_FLIGHT``, left in flight up to the
    next ``STEP_WAIT`` while the steps between run), or, marked blocking and alone, one
    ``MPI_Alltoallv`` (``MPI_Alltoall`` for uniform blocks); pairwise rounds are ``MPI_Irecv`` and
    ``MPI_Isend`` per round, waited for; Bruck rounds are a ``BruckOnce`` per communicator and
    radix (made at its first use, kept); the barrier is ``MPI_Barrier`` on the node between
    memory fences. These are the MPI calls ``Run``'s Python walk makes, so a rank that walks a
    program matches one that runs it here.

    ``world``, ``intra``: the world's and the node's communicators; ``served_lanes``:
    ``Topology.served_lanes``; ``byte``: ``MPI.BYTE``; ``tag``: the round-based exchanges' message
    tag; ``rounds_of(size, radix)``: the Bruck rounds of a communicator's size
    (``hxmpi.comm.plan.bruck_rounds``).
    """
    cdef Peers world_peers, node_peers
    cdef Py_ssize_t nlanes          # lanes numbered below this have a slot in ``lane_peers``
    cdef Peers* lane_peers          # by lane number (``comm`` 0: not served here)
    cdef uint64_t byte
    cdef int tag
    cdef dict brucks                # (communicator code, radix) -> BruckOnce
    cdef object comms, rounds_of
    cdef int* ints
    cdef Py_ssize_t ints_cap
    cdef uint64_t* requests
    cdef Py_ssize_t requests_cap
    # A group of exchanges left in flight (``IN_FLIGHT``) until the program's next ``STEP_WAIT``:
    # its requests (from ``requests[0]`` on) and count arrays (from ``ints[0]`` on) stay in use, so
    # a group posted meanwhile takes the second half of each.
    cdef Py_ssize_t in_flight
    cdef char status[STATUS_BYTES]
    cdef cnp.ndarray _events        # where traced runs note what they execute (``trace``), or None
    cdef int64_t* _log
    cdef Py_ssize_t _logged, _log_cap
    #: a copy of the words of the last program run while tracing (``trace``), or None
    cdef readonly object traced_words

    def __cinit__(self, world, intra, served_lanes, byte, int tag, rounds_of):
        cdef Py_ssize_t i
        if _handle_bytes == 0 or _mpi_ialltoallv == NULL or _mpi_alltoallv == NULL or _mpi_alltoall == NULL \
                or _mpi_barrier == NULL or _mpi_isend == NULL or _mpi_irecv == NULL:
            raise NotImplementedError("Runner: this MPI's handles cannot be passed from compiled code")
        self.byte, self.tag, self.rounds_of = <uint64_t>byte.handle, tag, rounds_of
        self.brucks = {}
        self.comms = {COMM_WORLD: world, COMM_NODE: intra, **dict(served_lanes)}
        self.world_peers.comm, self.world_peers.rank, self.world_peers.size = <uint64_t>world.handle, world.rank, world.size
        self.node_peers.comm, self.node_peers.rank, self.node_peers.size = <uint64_t>intra.handle, intra.rank, intra.size
        self.nlanes = max([lane + 1 for lane, _ in served_lanes] + [0])
        self.lane_peers = <Peers*>malloc(max(self.nlanes, 1) * sizeof(Peers))
        if self.lane_peers == NULL:
            raise MemoryError()
        for i in range(self.nlanes):
            self.lane_peers[i].comm = 0
        for lane, comm in served_lanes:
            self.lane_peers[lane].comm, self.lane_peers[lane].rank = <uint64_t>comm.handle, comm.rank
            self.lane_peers[lane].size = comm.size

    def __dealloc__(self):
        free(self.lane_peers)
        free(self.ints)
        free(self.requests)

    @property
    def scratch_bytes(self):
        """Scratch its Bruck exchanges hold (bytes; the others hold none beyond the caller's)."""
        return sum([(<BruckOnce>b).scratch_bytes for b in self.brucks.values()])

    def bruck_once(self, int64_t comm, int64_t radix):
        """The ``BruckOnce`` of communicator ``comm`` (``Comm`` or a lane number) at ``radix``,
        made at its first use and kept (with its scratch) for every later run."""
        once = self.brucks.get((comm, radix))
        if once is None:
            group = self.comms[comm]
            once = self.brucks[(comm, radix)] = BruckOnce(group, self.rounds_of(group.size, radix), self.tag, MPI.BYTE)
        return once

    def trace(self, cnp.ndarray events=None):
        """Note what the runs from now on execute in ``events`` (an (k, 4) int64 array, filled
        from its first row until it is full; None stops), and keep a copy of each run's program
        (``traced_words``): for tests. One row per event, (step, peer, bytes sent, bytes
        received): a copy (peer -1, its bytes both ways), a barrier (-1, 0, 0), every peer of a
        linear exchange (the counts MPI is given), every message a pairwise exchange posts (its
        block to itself as both), a Bruck exchange (-2, the bytes of its sides)."""
        if events is not None and (events.dtype != np.int64 or events.ndim != 2 or events.shape[1] != 4
                                   or not cnp.PyArray_IS_C_CONTIGUOUS(events)):
            raise ValueError("Runner.trace: events must be a contiguous (k, 4) int64 array")
        self._events, self._logged, self.traced_words = events, 0, None
        self._log = <int64_t*>cnp.PyArray_DATA(events) if events is not None else NULL
        self._log_cap = events.shape[0] if events is not None else 0

    @property
    def traced(self):
        """Events noted since ``trace``."""
        return self._logged

    cdef inline void _note(self, Py_ssize_t step, int64_t peer, int64_t sent, int64_t received) noexcept nogil:
        cdef int64_t* e
        if self._log != NULL and self._logged < self._log_cap:
            e = self._log + 4 * self._logged
            e[0], e[1], e[2], e[3] = step, peer, sent, received
            self._logged += 1

    cdef const Peers* _peers(self, int64_t comm) noexcept nogil:
        """The communicator of an exchange, or NULL where this rank is not in it."""
        if comm == COMM_WORLD:
            return &self.world_peers
        if comm == COMM_NODE:
            return &self.node_peers
        if 0 <= comm < self.nlanes and self.lane_peers[comm].comm != 0:
            return &self.lane_peers[comm]
        return NULL

    def run(self, program, cnp.ndarray send not None, cnp.ndarray recv not None, cnp.ndarray scratch not None,
            cnp.ndarray stage not None):
        """Run ``program`` (a ``StepProgram``) once on these buffers (contiguous uint8: the
        caller's send and receive views, the scratch and the stage buffer, the last three
        writable)."""
        for arr, writable in ((send, False), (recv, True), (scratch, True), (stage, True)):
            if cnp.PyArray_TYPE(arr) != cnp.NPY_UINT8 or not cnp.PyArray_IS_C_CONTIGUOUS(arr) \
                    or (writable and not cnp.PyArray_ISWRITEABLE(arr)):
                raise ValueError("Runner.run: buffers must be contiguous uint8 (the targets writable)")
        self.run_program(program.words, send, recv, scratch, stage)

    cdef int run_program(self, cnp.ndarray words, cnp.ndarray send, cnp.ndarray recv, cnp.ndarray scratch,
                         cnp.ndarray stage) except -1:
        """``run`` of a program's words on C-contiguous arrays of any item type (``recv``
        writable; ``scratch`` and ``stage`` uint8), their types unchecked: the buffers a call's
        specs name. Every step is checked against its buffers and communicators before the first
        one runs."""
        cdef int64_t* w = <int64_t*>cnp.PyArray_DATA(words)
        cdef Buffers b
        cdef Py_ssize_t i = 0, nrows
        cdef Row* r
        cdef int err
        b.data[<int>BUF_SEND], b.nbytes[<int>BUF_SEND] = <unsigned char*>cnp.PyArray_DATA(send), cnp.PyArray_NBYTES(send)
        b.data[<int>BUF_RECV], b.nbytes[<int>BUF_RECV] = <unsigned char*>cnp.PyArray_DATA(recv), cnp.PyArray_NBYTES(recv)
        b.data[<int>BUF_SCRATCH], b.nbytes[<int>BUF_SCRATCH] = <unsigned char*>cnp.PyArray_DATA(scratch), cnp.PyArray_NBYTES(scratch)
        b.data[<int>BUF_STAGE], b.nbytes[<int>BUF_STAGE] = <unsigned char*>cnp.PyArray_DATA(stage), cnp.PyArray_NBYTES(stage)
        self._check(w, cnp.PyArray_SIZE(words), &b)
        self.in_flight = 0
        if self._log != NULL:
            self.traced_words = words.copy()
        nrows = _header(w).rows
        while i < nrows:
            with nogil:
                err = self._run_until_bruck(w, &i, &b)
            if err:
                raise MPI.Exception(err)
            if i < nrows:  # a Bruck exchange: its first run may grow its scratch (the GIL)
                r = _rows(w) + i
                (<BruckOnce>self.brucks[(r.comm, r.radix)]).exchange(
                    b.data[r.src], b.nbytes[r.src], b.data[r.dst], b.nbytes[r.dst], w + r.v0, w + r.v1, w + r.v2,
                    w + r.v3)
                if self._log != NULL:
                    self._note(i, -2, _total(w + r.v0, r.n), _total(w + r.v2, r.n))
                i += 1
        return 0

    cdef int _check(self, int64_t* w, int64_t nwords, Buffers* b) except -1:
        """ValueError unless every step fits its buffers and this rank's communicators; make the
        Bruck exchanges and grow the count and request scratch the steps need."""
        cdef Header* h = _header(w)
        cdef Row* r
        cdef const Peers* peers
        cdef Py_ssize_t i, bad, need_ints = 0, need_requests = 2, group_ints = 0, group = 0
        cdef int64_t total, k, v
        cdef bint in_flight
        if h.rows < 0 or HEADER_WORDS + h.rows * ROW_WORDS > nwords:
            raise ValueError("Runner: the program's rows lie outside its words")
        in_flight = False
        for i in range(h.rows):
            r = _rows(w) + i
            if r.kind == STEP_BARRIER:
                continue
            if r.kind == STEP_WAIT:
                if not in_flight:
                    raise ValueError(f"Runner: step {i} waits with no exchange in flight")
                in_flight = False
                continue
            if r.kind not in (STEP_COPY, STEP_EXCHANGE) or not (0 <= r.src < 4 and 0 <= r.dst < 4) or r.n < 0:
                raise ValueError(f"Runner: step {i} is not a step of a program")
            for k in range(3 if r.kind == STEP_COPY else 4):
                v = (&r.v0)[k]
                if v < HEADER_WORDS or v > nwords - r.n:
                    raise ValueError(f"Runner: step {i}'s vectors lie outside the program's words")
            if r.kind == STEP_COPY:
                bad = _first_outside(w + r.v0, w + r.v1, w + r.v2, r.n, b.nbytes[r.src], b.nbytes[r.dst], &total)
                if bad >= 0:
                    raise ValueError(f"Runner: step {i}, block {bad} ({w[r.v2 + bad]} B from {w[r.v0 + bad]} to "
                                     f"{w[r.v1 + bad]}) lies outside its buffers ({_BUFFER_NAMES[r.src]} "
                                     f"{b.nbytes[r.src]} B, {_BUFFER_NAMES[r.dst]} {b.nbytes[r.dst]} B)")
                continue
            peers = self._peers(r.comm)
            if peers == NULL or peers.size != r.n:
                raise ValueError(f"Runner: step {i} exchanges on communicator {r.comm}, which this rank is not in "
                                 f"or which has not {r.n} ranks")
            bad = _first_outside(w + r.v1, w + r.v1, w + r.v0, r.n, b.nbytes[r.src], b.nbytes[r.src], &total)
            if bad < 0:
                bad = _first_outside(w + r.v3, w + r.v3, w + r.v2, r.n, b.nbytes[r.dst], b.nbytes[r.dst], &total)
            if bad >= 0:
                raise ValueError(f"Runner: step {i}, peer {bad}'s block lies outside its buffers "
                                 f"({_BUFFER_NAMES[r.src]} {b.nbytes[r.src]} B, {_BUFFER_NAMES[r.dst]} "
                                 f"{b.nbytes[r.dst]} B)")
            if r.rounds == ROUNDS_LINEAR:
                group_ints += 4 * r.n
                group += 1
                if r.flags & WITH_NEXT and (i + 1 >= h.rows or (_rows(w) + i + 1).kind != STEP_EXCHANGE
                                            or (_rows(w) + i + 1).rounds != ROUNDS_LINEAR):
                    raise ValueError(f"Runner: step {i} is posted with a next step that is not a linear exchange")
                if not r.flags & WITH_NEXT:
                    if r.flags & IN_FLIGHT:
                        if in_flight:
                            raise ValueError(f"Runner: step {i} leaves a second group of exchanges in flight")
                        in_flight = True
                    # Room for a group in flight and the next one beside it.
                    need_ints, need_requests = max(need_ints, 2 * group_ints), max(need_requests, 2 * group)
                    group_ints = group = 0
            elif r.rounds == ROUNDS_PAIRWISE:
                if w[r.v0 + peers.rank] != w[r.v2 + peers.rank]:
                    raise ValueError(f"pairwise: rank {peers.rank} sends itself {w[r.v0 + peers.rank]} B but "
                                     f"expects {w[r.v2 + peers.rank]} B")
            elif r.rounds == ROUNDS_BRUCK:
                if (r.comm, r.radix) not in self.brucks:
                    self.bruck_once(r.comm, r.radix)
            else:
                raise ValueError(f"Runner: step {i} has no rounds {r.rounds}")
            if r.flags & IN_FLIGHT and r.rounds != ROUNDS_LINEAR:
                raise ValueError(f"Runner: step {i} leaves a round-based exchange in flight")
        if in_flight:
            raise ValueError("Runner: the program ends with exchanges in flight")
        if need_ints > self.ints_cap:
            free(self.ints)
            self.ints, self.ints_cap = <int*>malloc(need_ints * sizeof(int)), need_ints
        if need_requests > self.requests_cap:
            free(self.requests)
            self.requests, self.requests_cap = <uint64_t*>malloc(need_requests * sizeof(uint64_t)), need_requests
        if self.ints == NULL and self.ints_cap or self.requests == NULL:
            self.ints_cap = self.requests_cap = 0
            raise MemoryError()
        return 0

    cdef int _run_until_bruck(self, int64_t* w, Py_ssize_t* at, Buffers* b) noexcept nogil:
        """Run the steps from ``at[0]`` on, up to a Bruck exchange or the end (``at[0]`` is left
        there); the first MPI error code, or 0."""
        cdef Py_ssize_t i = at[0], j, nrows = _header(w).rows, nr, first
        cdef Row* r
        cdef const Peers* peers
        cdef int* ints
        cdef int err = 0
        while i < nrows:
            r = _rows(w) + i
            if r.kind == STEP_COPY:
                _copy_list(b.data[r.dst], b.data[r.src], w + r.v0, w + r.v1, w + r.v2, r.n)
                if self._log != NULL:
                    self._note(i, -1, _total(w + r.v2, r.n), _total(w + r.v2, r.n))
            elif r.kind == STEP_WAIT:
                self._note(i, -1, 0, 0)
                for j in range(self.in_flight):
                    err = _mpi_wait(&self.requests[j], self.status)
                    if err:
                        break
                self.in_flight = 0
            elif r.kind == STEP_BARRIER:
                self._note(i, -1, 0, 0)
                # The node window's barrier: MPI_Win_sync on a shared-memory window is a full memory
                # fence in both families; the fences order this rank's window writes before the
                # barrier and the others' reads after it.
                hx_fence()
                err = _barrier(self.node_peers.comm)
                hx_fence()
            elif r.rounds == ROUNDS_BRUCK:
                break
            elif r.rounds == ROUNDS_PAIRWISE:
                peers = self._peers(r.comm)
                err = self._pairwise(i, peers, w + r.v0, w + r.v1, w + r.v2, w + r.v3, b.data[r.src],
                                     b.data[r.dst])
            elif r.flags & BLOCKING and not r.flags & WITH_NEXT:
                err = self._blocking(i, r, w, b)
            else:  # linear exchanges posted together: every one started, then every one waited for
                # (or left in flight); beside a group in flight, in the second half of the scratch
                nr, first, ints = 0, self.in_flight, self.ints + (self.ints_cap // 2 if self.in_flight else 0)
                j = i
                while True:
                    r = _rows(w) + j
                    err = self._post(j, r, w, b, ints, &self.requests[first + nr])
                    if err:
                        break
                    ints += 4 * r.n
                    nr += 1
                    if not r.flags & WITH_NEXT:
                        break
                    j += 1
                if not err and r.flags & IN_FLIGHT:
                    self.in_flight = nr
                else:
                    for j in range(first, first + nr if not err else first):
                        err = _mpi_wait(&self.requests[j], self.status)
                        if err:
                            break
                i = i + nr - 1
            if err:
                break
            i += 1
        at[0] = i
        return err

    cdef int _post(self, Py_ssize_t step, Row* r, int64_t* w, Buffers* b, int* v, uint64_t* request) noexcept nogil:
        """``MPI_Ialltoallv`` of one exchange (counts below a C int: off the large-count path)."""
        cdef Py_ssize_t n = r.n
        cdef int shift = self._counts(step, r, w, v)
        return _ialltoallv(b.data[r.src] + shift, v, v + n, b.data[r.dst], v + 2 * n, v + 3 * n, self.byte,
                           self._peers(r.comm).comm, request)

    cdef int _counts(self, Py_ssize_t step, Row* r, int64_t* w, int* v) noexcept nogil:
        """An exchange's four vectors as MPI reads them (C int; noted when tracing); returns the
        bytes the send buffer's start moves up (``apart``)."""
        cdef Py_ssize_t k, n = r.n
        cdef int shift = 0
        for k in range(n):
            v[k], v[n + k], v[2 * n + k], v[3 * n + k] = <int>w[r.v0 + k], <int>w[r.v1 + k], <int>w[r.v2 + k], \
                <int>w[r.v3 + k]
        if r.src == r.dst:
            shift = _apart(v, v + n, n)
        if self._log != NULL:
            for k in range(n):
                self._note(step, k, v[k], v[2 * n + k])
        return shift

    cdef int _blocking(self, Py_ssize_t step, Row* r, int64_t* w, Buffers* b) noexcept nogil:
        """One blocking ``MPI_Alltoallv``, or ``MPI_Alltoall`` of uniform blocks back to back."""
        cdef Py_ssize_t n = r.n
        cdef int* v = self.ints
        cdef uint64_t comm = self._peers(r.comm).comm
        cdef int shift = self._counts(step, r, w, v)
        if r.flags & UNIFORM:
            return _alltoall(b.data[r.src] + (w[r.v1] if n else 0), <int>(w[r.v0] if n else 0),
                             b.data[r.dst] + (w[r.v3] if n else 0), <int>(w[r.v2] if n else 0), self.byte, comm)
        return _alltoallv(b.data[r.src] + shift, v, v + n, b.data[r.dst], v + 2 * n, v + 3 * n, self.byte, comm)

    cdef int _pairwise(self, Py_ssize_t step, const Peers* peers, const int64_t* sc, const int64_t* sd,
                       const int64_t* rc, const int64_t* rd, const unsigned char* send,
                       unsigned char* recv) noexcept nogil:
        """``bruck.Pairwise``: the block to itself, then size - 1 rounds of a receive from rank - k
        and a send to rank + k, waited for (empty blocks are neither sent nor received)."""
        cdef Py_ssize_t k, n = peers.size, q = peers.rank, dst, src, nr, j
        cdef int err
        if sc[q] > 0:
            memcpy(recv + rd[q], send + sd[q], <size_t>sc[q])
            self._note(step, q, sc[q], sc[q])
        for k in range(1, n):
            dst, src, nr = (q + k) % n, (q - k + n) % n, 0
            if rc[src]:
                err = _irecv(recv + rd[src], <int>rc[src], self.byte, <int>src, self.tag, peers.comm,
                             &self.requests[nr])
                if err:
                    return err
                self._note(step, src, 0, rc[src])
                nr += 1
            if sc[dst]:
                err = _isend(send + sd[dst], <int>sc[dst], self.byte, <int>dst, self.tag, peers.comm,
                             &self.requests[nr])
                if err:
                    return err
                self._note(step, dst, sc[dst], 0)
                nr += 1
            for j in range(nr):
                err = _mpi_wait(&self.requests[j], self.status)
                if err:
                    return err
        return 0
