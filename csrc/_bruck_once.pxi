# The first run of a radix-k Bruck exchange, compiled (``BruckOnce``): included by ``_call.pyx``
# after ``_mpi.pxi``, whose MPI wrappers it calls (``_isend``, ``_mprobe``, ``_get_count``,
# ``_imrecv``); ``_runner.pxi`` and ``_calltable.pxi`` run it.
from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

cimport numpy as cnp


cdef inline const int64_t* _i64(object arr, Py_ssize_t n, str name) except NULL:
    """The data of a contiguous int64 array of ``n`` items (ValueError naming ``name`` otherwise)."""
    if type(arr) is not np.ndarray or cnp.PyArray_TYPE(<cnp.ndarray>arr) != cnp.NPY_INT64 \
            or not cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>arr) or cnp.PyArray_SIZE(<cnp.ndarray>arr) != n:
        raise ValueError(f"{name} must be a contiguous int64 array of {n} items")
    return <const int64_t*>cnp.PyArray_DATA(<cnp.ndarray>arr)


cdef inline bint _off_buffer(int64_t off, int64_t n, int64_t size) noexcept nogil:
    return n < 0 or (n > 0 and (off < 0 or off > size - n))


cdef struct BruckRun:
    # One ``BruckOnce.exchange`` as its helpers read it (on the stack; the pointers are the
    # caller's buffers and the ``BruckOnce``'s arrays): the send buffer, where every slot lies now
    # (``where`` 0: the send buffer, 1: the arena; its offset there and its length), each
    # message's slots (message m's are ``slots[start[m]:start[m + 1]]``, sent to ``dest[m]`` and
    # received from ``src[m]``), and what the run learns (``learned``, ``base``, ``nbytes``).
    const unsigned char* s
    int64_t sn
    signed char* where
    int64_t* off
    int64_t* length
    const int64_t* slots
    const int64_t* start
    const int64_t* dest
    const int64_t* src
    int64_t* learned
    int64_t* base
    int64_t* nbytes


cdef inline int64_t _round_bytes(BruckRun* b, Py_ssize_t m, Py_ssize_t nm, int64_t an,
                                 Py_ssize_t* bad) noexcept nogil:
    """The bytes of messages m to m + nm - 1 (headers included), each slot checked in its buffer
    (the send buffer, or the arena of ``an`` bytes) before any message goes; ``bad``: the first
    slot outside its buffer (then the bytes up to it), else -1."""
    cdef Py_ssize_t k, j, i
    cdef int64_t total = 0
    bad[0] = -1
    for k in range(nm):
        for j in range(b.start[m + k], b.start[m + k + 1]):
            i = b.slots[j]
            if _off_buffer(b.off[i], b.length[i], b.sn if b.where[i] == 0 else an):
                bad[0] = i
                return total
            total += b.length[i]
        total += 8 * (b.start[m + k + 1] - b.start[m + k])
    return total


cdef inline Py_ssize_t _read_headers(BruckRun* b, Py_ssize_t m, Py_ssize_t nm, const unsigned char* arena,
                                     int64_t* got) noexcept nogil:
    """Read the headers of messages m to m + nm - 1, landed in the arena: where each slot now lies,
    and its length (``learned``). The first message whose header does not fit it (shorter than
    its header: ``nbytes`` < 0, or slot lengths adding up to ``got`` bytes, not its ``nbytes``),
    else -1; the messages before it are read."""
    cdef Py_ssize_t k, j, i
    cdef int64_t pos, v, total
    for k in range(nm):
        if b.nbytes[m + k] < 0:
            return k
        pos, total = b.base[m + k], 0
        for j in range(b.start[m + k], b.start[m + k + 1]):
            memcpy(&v, arena + pos, 8)
            pos += 8
            if v < 0 or total < 0:
                total = -1
            else:
                total += v
            b.learned[j] = v
        if total != b.nbytes[m + k]:
            got[0] = total
            return k
        for j in range(b.start[m + k], b.start[m + k + 1]):  # ``pos``: the data, after the header
            i = b.slots[j]
            b.where[i], b.off[i], b.length[i] = 1, pos, b.learned[j]
            pos += b.learned[j]
    return -1


cdef inline Py_ssize_t _deliver(BruckRun* b, Py_ssize_t p, Py_ssize_t q, const unsigned char* arena, int64_t an,
                                unsigned char* r, int64_t rn, const int64_t* rc, const int64_t* rd) noexcept nogil:
    """Copy every rank's block to its place in the receive buffer, every block checked before the
    first byte moves: the first rank whose block is not the length ``rc`` expects or lies outside
    its buffer (nothing copied), else -1."""
    cdef Py_ssize_t i, k
    for i in range(p):
        k = (q - i + p) % p
        if b.length[i] != rc[k] or _off_buffer(rd[k], rc[k], rn) \
                or _off_buffer(b.off[i], b.length[i], b.sn if b.where[i] == 0 else an):
            return k
    for i in range(p):
        if b.length[i] > 0:
            memcpy(r + rd[(q - i + p) % p], (b.s if b.where[i] == 0 else arena) + b.off[i], <size_t>b.length[i])
    return -1


cdef class BruckOnce:
    """The first run of a radix-k Bruck byte all-to-all (``hxmpi.comm.bruck``) on one
    communicator, compiled: per round, pack every message (a header of its slots' lengths, then
    their bytes), ``MPI_Isend`` it, ``MPI_Mprobe`` and ``MPI_Imrecv`` every incoming one into the
    arena, wait, and read the headers; then copy every slot to its place in the receive buffer.
    Without the GIL, except to grow the send buffer and the arena.

    ``comm``: the communicator; ``rounds``: ``hxmpi.comm.plan.bruck_rounds`` of its size; ``tag``:
    the messages' tag; ``byte``: ``MPI.BYTE``. What a run learns stays for the caller: per
    message (in round order) ``base`` and ``nbytes`` (where it landed in ``arena``, header first,
    and its bytes without the header), per slot of each message ``learned`` (its length; message m's
    slots are ``slots[slot_start[m]:slot_start[m + 1]]``), and per slot ``where``/``off``/
    ``length`` (0: the send buffer, 1: the arena).
    """
    cdef readonly Py_ssize_t size, rank
    cdef readonly cnp.ndarray slots, slot_start, dest, src, round_start, where, off, length, learned, base, nbytes
    cdef public cnp.ndarray sendbuf, arena
    cdef uint64_t comm, byte
    cdef int tag
    cdef Py_ssize_t most   # messages in the largest round
    cdef uint64_t* requests
    cdef uint64_t* messages
    cdef int* counts
    cdef char status[STATUS_BYTES]

    def __cinit__(self, comm, tuple rounds, int tag, byte):
        cdef Py_ssize_t p = comm.size, q = comm.rank
        if _handle_bytes == 0 or _mpi_isend == NULL or _mpi_mprobe == NULL or _mpi_imrecv == NULL \
                or _mpi_get_count == NULL:
            raise NotImplementedError("BruckOnce: this MPI's handles cannot be passed from compiled code")
        self.size, self.rank, self.tag = p, q, tag
        self.comm, self.byte = <uint64_t>comm.handle, <uint64_t>byte.handle
        groups = [[(d, np.ascontiguousarray(s, np.int64)) for d, s in group] for group in rounds]
        flat = [(d, s) for group in groups for d, s in group]
        self.most = max([len(group) for group in groups] + [1])
        self.round_start = np.cumsum([0] + [len(group) for group in groups]).astype(np.int64)
        self.dest = np.array([(q + d) % p for d, _ in flat], np.int64)
        self.src = np.array([(q - d) % p for d, _ in flat], np.int64)
        self.slot_start = np.cumsum([0] + [s.shape[0] for _, s in flat]).astype(np.int64)
        self.slots = np.concatenate([s for _, s in flat]) if flat else np.zeros(0, np.int64)
        self.learned = np.zeros(self.slots.shape[0], np.int64)
        self.base, self.nbytes = np.zeros(len(flat), np.int64), np.zeros(len(flat), np.int64)
        self.where, self.off, self.length = np.zeros(p, np.int8), np.zeros(p, np.int64), np.zeros(p, np.int64)
        self.sendbuf, self.arena = np.empty(0, np.uint8), np.empty(0, np.uint8)
        self.requests = <uint64_t*>malloc(2 * self.most * sizeof(uint64_t))
        self.messages = <uint64_t*>malloc(self.most * sizeof(uint64_t))
        self.counts = <int*>malloc(self.most * sizeof(int))
        if self.requests == NULL or self.messages == NULL or self.counts == NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self.requests)
        free(self.messages)
        free(self.counts)

    @property
    def scratch_bytes(self):
        """Scratch held: the send buffer and the arena (bytes)."""
        return cnp.PyArray_NBYTES(self.sendbuf) + cnp.PyArray_NBYTES(self.arena)

    def run(self, cnp.ndarray send not None, cnp.ndarray recv not None, cnp.ndarray sc not None,
            cnp.ndarray sd not None, cnp.ndarray rc not None, cnp.ndarray rd not None):
        """One run from ``send`` to ``recv`` (contiguous uint8; ``recv`` writable) with the sides'
        byte counts and displacements (contiguous int64, one per rank). ValueError where a block
        lies outside its buffer or a sender's length is not the one ``rc`` expects (no byte of
        the receive buffer has moved then)."""
        cdef Py_ssize_t p = self.size
        for arr, writable in ((send, False), (recv, True)):
            if cnp.PyArray_TYPE(arr) != cnp.NPY_UINT8 or not cnp.PyArray_IS_C_CONTIGUOUS(arr) \
                    or (writable and not cnp.PyArray_ISWRITEABLE(arr)):
                raise ValueError("BruckOnce.run: buffers must be contiguous uint8 (the receive buffer writable)")
        self.exchange(<const unsigned char*>cnp.PyArray_DATA(send), cnp.PyArray_NBYTES(send),
                      <unsigned char*>cnp.PyArray_DATA(recv), cnp.PyArray_NBYTES(recv),
                      _i64(sc, p, "send counts"), _i64(sd, p, "send displs"), _i64(rc, p, "receive counts"),
                      _i64(rd, p, "receive displs"))

    cdef int exchange(self, const unsigned char* s, int64_t sn, unsigned char* r, int64_t rn, const int64_t* sc,
                      const int64_t* sd, const int64_t* rc, const int64_t* rd) except -1:
        """``run`` on raw buffers and sides (bytes)."""
        cdef Py_ssize_t p = self.size, q = self.rank, i, m, k, nm, nrounds = self.round_start.shape[0] - 1, x
        cdef Py_ssize_t bad = -1
        cdef const int64_t* rstart = <const int64_t*>cnp.PyArray_DATA(self.round_start)
        cdef int64_t fill = 0, total, need, an, got = 0
        cdef unsigned char* out
        cdef unsigned char* arena
        cdef int err = 0
        cdef BruckRun b
        b.s, b.sn = s, sn
        b.where = <signed char*>cnp.PyArray_DATA(self.where)
        b.off = <int64_t*>cnp.PyArray_DATA(self.off)
        b.length = <int64_t*>cnp.PyArray_DATA(self.length)
        b.slots = <const int64_t*>cnp.PyArray_DATA(self.slots)
        b.start = <const int64_t*>cnp.PyArray_DATA(self.slot_start)
        b.dest = <const int64_t*>cnp.PyArray_DATA(self.dest)
        b.src = <const int64_t*>cnp.PyArray_DATA(self.src)
        b.learned = <int64_t*>cnp.PyArray_DATA(self.learned)
        b.base = <int64_t*>cnp.PyArray_DATA(self.base)
        b.nbytes = <int64_t*>cnp.PyArray_DATA(self.nbytes)
        with nogil:
            for i in range(p):
                k = (q + i) % p
                b.where[i], b.off[i], b.length[i] = 0, sd[k], sc[k]
        for x in range(nrounds):
            m, nm = rstart[x], rstart[x + 1] - rstart[x]
            an = cnp.PyArray_NBYTES(self.arena)
            total = _round_bytes(&b, m, nm, an, &bad)  # every slot of the round checked before any message goes
            if bad >= 0:
                raise ValueError(f"bruck pack: slot {bad} (offset {b.off[bad]}, {b.length[bad]} B) is outside its "
                                 "buffer")
            if cnp.PyArray_NBYTES(self.sendbuf) < total:
                self.sendbuf = np.empty(max(total, 2 * cnp.PyArray_NBYTES(self.sendbuf)), np.uint8)
            out, arena = <unsigned char*>cnp.PyArray_DATA(self.sendbuf), <unsigned char*>cnp.PyArray_DATA(self.arena)
            with nogil:
                err = self._send_round(&b, m, nm, out, arena)
            if err:
                raise MPI.Exception(err)
            need = fill
            for k in range(nm):
                need += self.counts[k]
            if an < need:
                grown = np.empty(max(need, 2 * an), np.uint8)
                grown[:fill] = self.arena[:fill]
                self.arena = grown
            arena = <unsigned char*>cnp.PyArray_DATA(self.arena)
            with nogil:
                err = self._receive_round(&b, m, nm, arena, &fill)
            if err:
                raise MPI.Exception(err)
            k = _read_headers(&b, m, nm, arena, &got)  # where each slot now lies, and its length
            if k >= 0 and b.nbytes[m + k] < 0:
                raise ValueError(f"bruck take: a message of {self.counts[k]} B is shorter than its header")
            if k >= 0:
                raise ValueError(f"bruck take: slot lengths add up to {got} B, the message carries "
                                 f"{b.nbytes[m + k]} B")
        an = cnp.PyArray_NBYTES(self.arena)
        arena = <unsigned char*>cnp.PyArray_DATA(self.arena)
        with nogil:  # every block checked before the first byte moves
            bad = _deliver(&b, p, q, arena, an, r, rn, rc, rd)
        if bad >= 0:
            got = b.length[(q - bad + p) % p]
            raise ValueError(f"bruck: rank {q} expects {rc[bad]} B from rank {bad}, which sent {got} B "
                             f"(or the block lies outside the receive buffer)")
        return 0

    cdef int _send_round(self, BruckRun* b, Py_ssize_t m, Py_ssize_t nm, unsigned char* out,
                         const unsigned char* arena) noexcept nogil:
        """Pack messages m to m + nm - 1 into ``out`` (each a header of its slots' lengths, then
        their bytes) and ``MPI_Isend`` each; then probe every incoming one, so that the arena grows
        once, before any receive lands in it (``counts``: their bytes). The first MPI error, or 0."""
        cdef Py_ssize_t k, j, i
        cdef int64_t pos = 0, need
        cdef int err = 0
        for k in range(nm):
            need = pos
            for j in range(b.start[m + k], b.start[m + k + 1]):
                memcpy(out + pos, &b.length[b.slots[j]], 8)
                pos += 8
            for j in range(b.start[m + k], b.start[m + k + 1]):
                i = b.slots[j]
                if b.length[i] > 0:
                    memcpy(out + pos, (b.s if b.where[i] == 0 else arena) + b.off[i], <size_t>b.length[i])
                    pos += b.length[i]
            err = _isend(out + need, <int>(pos - need), self.byte, <int>b.dest[m + k], self.tag, self.comm,
                         &self.requests[k])
            if err:
                break
        # Probe every peer first: the arena grows once, before any receive lands in it.
        for k in range(nm):
            if err:
                break
            err = _mprobe(<int>b.src[m + k], self.tag, self.comm, &self.messages[k], self.status)
            if not err:
                err = _get_count(self.status, self.byte, &self.counts[k])
        return err

    cdef int _receive_round(self, BruckRun* b, Py_ssize_t m, Py_ssize_t nm, unsigned char* arena,
                            int64_t* fill) noexcept nogil:
        """``MPI_Imrecv`` the probed messages into the arena from byte ``fill`` on (moved past them;
        ``base``, ``nbytes``: where each landed, and its bytes without the header), then wait for
        every send and receive of the round. The first MPI error, or 0."""
        cdef Py_ssize_t k
        cdef int err = 0
        for k in range(nm):
            b.base[m + k], b.nbytes[m + k] = fill[0], self.counts[k] - 8 * (b.start[m + k + 1] - b.start[m + k])
            err = _imrecv(arena + fill[0], self.counts[k], self.byte, &self.messages[k], &self.requests[nm + k])
            if err:
                break
            fill[0] += self.counts[k]
        for k in range(2 * nm):
            if err:
                break
            err = _mpi_wait(&self.requests[k], self.status)
        return err
