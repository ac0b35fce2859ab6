# Writing a step program (``_steps.pxi``): the row and pool writers every planner calls
# (``_start``, ``_emit``, ``_copy_step``, ``_exchange_step``, ``_finish``), ``StepProgram`` (one
# program's words, as Python reads them) and ``flat_program``. Included by ``_plan.pyx`` before the
# planners.
from libc.stdint cimport int64_t
from libc.string cimport memcpy, memset

cimport numpy as cnp


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
