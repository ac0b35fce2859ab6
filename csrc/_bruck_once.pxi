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
        cdef Py_ssize_t p = self.size, q = self.rank, i, m, j, k, nm, nrounds = self.round_start.shape[0] - 1, x
        cdef signed char* where = <signed char*>cnp.PyArray_DATA(self.where)
        cdef int64_t* off = <int64_t*>cnp.PyArray_DATA(self.off)
        cdef int64_t* length = <int64_t*>cnp.PyArray_DATA(self.length)
        cdef const int64_t* slots = <const int64_t*>cnp.PyArray_DATA(self.slots)
        cdef const int64_t* start = <const int64_t*>cnp.PyArray_DATA(self.slot_start)
        cdef const int64_t* rstart = <const int64_t*>cnp.PyArray_DATA(self.round_start)
        cdef const int64_t* dest = <const int64_t*>cnp.PyArray_DATA(self.dest)
        cdef const int64_t* src = <const int64_t*>cnp.PyArray_DATA(self.src)
        cdef int64_t* learned = <int64_t*>cnp.PyArray_DATA(self.learned)
        cdef int64_t* base = <int64_t*>cnp.PyArray_DATA(self.base)
        cdef int64_t* nbytes = <int64_t*>cnp.PyArray_DATA(self.nbytes)
        cdef int64_t fill = 0, total, pos, need, bad = -1, v, an, got
        cdef unsigned char* out
        cdef unsigned char* arena
        cdef int err = 0
        with nogil:
            for i in range(p):
                k = (q + i) % p
                where[i], off[i], length[i] = 0, sd[k], sc[k]
        for x in range(nrounds):
            m, nm = rstart[x], rstart[x + 1] - rstart[x]
            total = 0
            an = cnp.PyArray_NBYTES(self.arena)
            for k in range(nm):  # every slot of the round in its buffer before any message goes
                for j in range(start[m + k], start[m + k + 1]):
                    i = slots[j]
                    if _off_buffer(off[i], length[i], sn if where[i] == 0 else an):
                        raise ValueError(f"bruck pack: slot {i} (offset {off[i]}, {length[i]} B) is outside its buffer")
                    total += length[i]
                total += 8 * (start[m + k + 1] - start[m + k])
            if cnp.PyArray_NBYTES(self.sendbuf) < total:
                self.sendbuf = np.empty(max(total, 2 * cnp.PyArray_NBYTES(self.sendbuf)), np.uint8)
            out, arena = <unsigned char*>cnp.PyArray_DATA(self.sendbuf), <unsigned char*>cnp.PyArray_DATA(self.arena)
            with nogil:
                pos = 0
                for k in range(nm):
                    need = pos
                    for j in range(start[m + k], start[m + k + 1]):
                        memcpy(out + pos, &length[slots[j]], 8)
                        pos += 8
                    for j in range(start[m + k], start[m + k + 1]):
                        i = slots[j]
                        if length[i] > 0:
                            memcpy(out + pos, (s if where[i] == 0 else arena) + off[i], <size_t>length[i])
                            pos += length[i]
                    err = _isend(out + need, <int>(pos - need), self.byte, <int>dest[m + k], self.tag, self.comm,
                                 &self.requests[k])
                    if err:
                        break
                # Probe every peer first: the arena grows once, before any receive lands in it.
                for k in range(nm):
                    if err:
                        break
                    err = _mprobe(<int>src[m + k], self.tag, self.comm, &self.messages[k], self.status)
                    if not err:
                        err = _get_count(self.status, self.byte, &self.counts[k])
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
                for k in range(nm):
                    base[m + k], nbytes[m + k] = fill, self.counts[k] - 8 * (start[m + k + 1] - start[m + k])
                    err = _imrecv(arena + fill, self.counts[k], self.byte, &self.messages[k], &self.requests[nm + k])
                    if err:
                        break
                    fill += self.counts[k]
                for k in range(2 * nm):
                    if err:
                        break
                    err = _mpi_wait(&self.requests[k], self.status)
            if err:
                raise MPI.Exception(err)
            for k in range(nm):  # the headers: where each slot now lies, and its length
                if nbytes[m + k] < 0:
                    raise ValueError(f"bruck take: a message of {self.counts[k]} B is shorter than its header")
                pos, got = base[m + k], 0
                for j in range(start[m + k], start[m + k + 1]):
                    memcpy(&v, arena + pos, 8)
                    pos += 8
                    if v < 0 or got < 0:
                        got = -1
                    else:
                        got += v
                    learned[j] = v
                if got != nbytes[m + k]:
                    raise ValueError(f"bruck take: slot lengths add up to {got} B, the message carries "
                                     f"{nbytes[m + k]} B")
                for j in range(start[m + k], start[m + k + 1]):  # ``pos``: the data, after the header
                    i = slots[j]
                    where[i], off[i], length[i] = 1, pos, learned[j]
                    pos += learned[j]
        an = cnp.PyArray_NBYTES(self.arena)
        arena = <unsigned char*>cnp.PyArray_DATA(self.arena)
        with nogil:  # every block checked before the first byte moves
            for i in range(p):
                k = (q - i + p) % p
                if length[i] != rc[k] or _off_buffer(rd[k], rc[k], rn) \
                        or _off_buffer(off[i], length[i], sn if where[i] == 0 else an):
                    bad = k
                    break
            if bad < 0:
                for i in range(p):
                    if length[i] > 0:
                        memcpy(r + rd[(q - i + p) % p], (s if where[i] == 0 else arena) + off[i], <size_t>length[i])
        if bad >= 0:
            got = length[(q - bad + p) % p]
            raise ValueError(f"bruck: rank {q} expects {rc[bad]} B from rank {bad}, which sent {got} B "
                             f"(or the block lies outside the receive buffer)")
        return 0
