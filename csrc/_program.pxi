# The request state machine: ``Program``, a run as compiled steps over fixed buffers (block
# copies, and Start + Wait of mpi4py's persistent requests), run blocking (``_run_steps``), split
# into Start and Wait, or stepped as a nonblocking request's state machine (``_advance``).
# Included by ``_call.pyx`` after ``_mpi.pxi`` (its MPI pointers) and ``_copy.pxi``.
from libc.stdint cimport int64_t, uintptr_t
from libc.stdlib cimport free, malloc

cimport numpy as cnp


cdef enum BoundKind:
    COPY = 0       # a copy list of ``n`` blocks
    REQUESTS = 1   # Start, then Wait, ``n`` persistent requests (``handles``)
    BARRIER = 2    # the same for a barrier request, between full memory fences
    SUB = 3        # another program's ``n`` steps (``sub``)
    GATE = 4       # the verdict of the agreement sums at ``src`` over ``n`` ranks: go on only on a
                   # clean hit (a nonblocking request's compiled hit: ``Program.diverted`` otherwise)
    STARTS = 5     # Start ``n`` persistent requests and go on: they stay in flight (the wire beside
                   # the copies after it)
    WAITS = 6      # Wait for ``n`` requests an earlier ``STARTS`` started

#: What ``_run_steps`` returns where a gate stopped the run (MPI error codes are positive).
cdef enum:
    DIVERTED = -1

#: A clean hit's verdict: no rank's problem, no setting or pair mismatch, nobody over budget, and
#: every rank on the same cached slot with its run bound to the call's buffers.
cdef int _NOT_CLEAN = PROBLEM | SETTINGS | PAIRS | ANY_OVER_BUDGET
cdef int _CLEAN = HIT | ALL_SAME_BUFFERS


cdef inline bint _clean_hit(const unsigned char* sums, Py_ssize_t size) noexcept nogil:
    cdef int flags = _verdict(<const Record*>sums, <uint64_t>size)
    return not (flags & _NOT_CLEAN) and flags & _CLEAN == _CLEAN


cdef struct Step:
    BoundKind kind
    const unsigned char* src
    unsigned char* dst
    const int64_t* src_off
    const int64_t* dst_off
    const int64_t* length
    Py_ssize_t n
    void** handles
    Step* sub


cdef int _start_all(void** handles, Py_ssize_t n) noexcept nogil:
    """Start every request; the first MPI error code, or 0."""
    cdef Py_ssize_t i
    cdef int err
    for i in range(n):
        err = _mpi_start(handles[i])
        if err:
            return err
    return 0


cdef int _wait_all(void** handles, Py_ssize_t n, char* status) noexcept nogil:
    """Wait for every request; the first MPI error code, or 0."""
    cdef Py_ssize_t i
    cdef int err
    for i in range(n):
        err = _mpi_wait(handles[i], status)
        if err:
            return err
    return 0


cdef int _start_wait(void** handles, Py_ssize_t n, char* status) noexcept nogil:
    """Start every request, then wait for every one; the first MPI error code, or 0."""
    cdef Py_ssize_t i
    cdef int err
    for i in range(n):
        err = _mpi_start(handles[i])
        if err:
            return err
    for i in range(n):
        err = _mpi_wait(handles[i], status)
        if err:
            return err
    return 0


cdef int _run_steps(Step* steps, Py_ssize_t n, char* status) noexcept nogil:
    """Run ``n`` steps; the first MPI error code, ``DIVERTED`` where a gate stopped them, or 0."""
    cdef Py_ssize_t i
    cdef int err = 0
    cdef Step* st
    for i in range(n):
        st = &steps[i]
        if st.kind == COPY:
            _copy_list(st.dst, st.src, st.src_off, st.dst_off, st.length, st.n)
        elif st.kind == SUB:
            err = _run_steps(st.sub, st.n, status)
        elif st.kind == GATE:
            err = 0 if _clean_hit(st.src, st.n) else DIVERTED
        elif st.kind == STARTS:
            err = _start_all(st.handles, st.n)
        elif st.kind == WAITS:
            err = _wait_all(st.handles, st.n, status)
        elif st.kind == BARRIER:
            # The node window's barrier: MPI_Win_sync on a shared-memory window is a full memory
            # fence in both families; the fences order this rank's window writes before the
            # barrier and the others' reads after it.
            hx_fence()
            err = _start_wait(st.handles, st.n, status)
            hx_fence()
        else:
            err = _start_wait(st.handles, st.n, status)
        if err:
            return err
    return 0


cdef Py_ssize_t _flat_count(const Step* steps, Py_ssize_t n) noexcept nogil:
    """Steps of ``steps`` with every ``SUB`` step replaced by its own steps (recursively)."""
    cdef Py_ssize_t i, total = 0
    for i in range(n):
        total += _flat_count(steps[i].sub, steps[i].n) if steps[i].kind == SUB else 1
    return total


cdef Py_ssize_t _flatten(const Step* steps, Py_ssize_t n, Step* out) noexcept nogil:
    """Copy ``steps`` into ``out`` with sub-programs inlined (their buffers and handles stay
    theirs: the program keeps them alive); the steps written."""
    cdef Py_ssize_t i, k = 0
    for i in range(n):
        if steps[i].kind == SUB:
            k += _flatten(steps[i].sub, steps[i].n, out + k)
        else:
            out[k] = steps[i]
            k += 1
    return k


cdef class Program:
    """A run as compiled steps over fixed buffers, executed without the GIL and without Python
    between them: block copies, and Start + Wait of MPI persistent requests (built by mpi4py).

    ``steps``: a list of ``("copy", src, src_off, dst, dst_off, length)`` (contiguous 1-D uint8
    buffers, ``dst`` writable; int64 byte lists of one length, checked against the buffers here,
    once); ``("mpi", requests)`` (mpi4py persistent requests: every one started, then every one
    waited); ``("start", requests)`` and ``("wait", requests)`` (the same requests started, left in
    flight while the steps between run, then waited for); ``("barrier", request)`` (a persistent
    barrier between memory fences: a node window's barrier); ``("program", program)`` (another
    program's steps); ``("gate", sums, size)`` (go on
    only where the summed agreement record ``sums``, uint64, of ``size`` ranks is a clean hit:
    every rank on the same cached slot, bound to its buffers, nothing wrong; else the run stops
    there and ``diverted`` says so: a nonblocking request's compiled hit, whose agreement came out
    otherwise, goes on in Python). The program keeps what it points into alive; the requests stay
    their owner's.

    ``run()`` runs it blocking; ``start()`` and ``wait()`` split it, for a persistent request's
    Start and Wait, after the Start of the first top-level ``"mpi"`` step (without one, ``start``
    runs it whole). ``begin()``, ``test()`` and ``finish()`` run it as a state machine instead
    (a nonblocking request's): each call goes as far as it can without waiting, copies as soon
    as the requests before them complete (``MPI_Test``), next requests started at once.
    """
    cdef Step* _steps
    cdef Py_ssize_t _n
    cdef Step* _flat         # the steps with sub-programs inlined (``begin``'s, made at the first)
    cdef Py_ssize_t _nflat
    cdef Py_ssize_t _pos     # the state machine's next step
    cdef bint _posted        # its requests are started
    cdef bint _begun         # a ``begin`` not yet completed
    cdef void** _handles
    cdef list _keep
    cdef list _requests
    cdef char _status[STATUS_BYTES]
    cdef Py_ssize_t _split   # the first top-level REQUESTS step (``start`` ends with its Start), or -1
    cdef bint _started
    #: whether the last run stopped at a gate (the agreement was not a clean hit)
    cdef readonly bint diverted

    def __cinit__(self, list steps):
        cdef Py_ssize_t i, j = 0, nh = 0, bad
        cdef int64_t total
        cdef cnp.ndarray src, dst, so, do, ln
        cdef Step* st
        self._keep, self._requests = [], []
        for step in steps:
            if step[0] in ("mpi", "start", "wait"):
                nh += len(step[1])
            elif step[0] == "barrier":
                nh += 1
        self._steps = <Step*>malloc(max(len(steps), 1) * sizeof(Step))
        self._handles = <void**>malloc(max(nh, 1) * sizeof(void*))
        if self._steps == NULL or self._handles == NULL:
            raise MemoryError()
        self._n = 0
        for i, step in enumerate(steps):
            st = &self._steps[i]
            st.sub, st.handles = NULL, NULL
            if step[0] in ("mpi", "barrier", "start", "wait"):
                requests = [step[1]] if step[0] == "barrier" else step[1]
                st.kind = {"mpi": REQUESTS, "barrier": BARRIER, "start": STARTS, "wait": WAITS}[step[0]]
                st.handles, st.n = &self._handles[j], len(requests)
                for req in requests:
                    self._handles[j] = <void*><uintptr_t>MPI._addressof(req)
                    self._requests.append(req)
                    j += 1
            elif step[0] == "program":
                sub = <Program?>step[1]
                if sub._requests is None:
                    raise ValueError("Program: a freed program cannot be a step")
                st.kind, st.sub, st.n = SUB, sub._steps, sub._n
                self._keep.append(sub)
            elif step[0] == "gate":
                _, sums, size = step
                if sums.dtype != np.uint64 or not cnp.PyArray_IS_C_CONTIGUOUS(sums) \
                        or sums.nbytes != sizeof(Record):
                    raise ValueError("Program: a gate reads one contiguous agreement record of uint64")
                st.kind, st.src, st.n = GATE, <const unsigned char*>cnp.PyArray_DATA(sums), size
                self._keep.append(sums)
            elif step[0] == "copy":
                _, src, so, dst, do, ln = step
                for buf, writable in ((src, False), (dst, True)):
                    if buf.dtype != np.uint8 or buf.ndim != 1 or not cnp.PyArray_IS_C_CONTIGUOUS(buf) \
                            or (writable and not cnp.PyArray_ISWRITEABLE(buf)):
                        raise ValueError("Program: copy buffers must be contiguous 1-D uint8 (the target writable)")
                for lst in (so, do, ln):
                    if lst.dtype != np.int64 or lst.ndim != 1 or not cnp.PyArray_IS_C_CONTIGUOUS(lst) \
                            or lst.shape[0] != ln.shape[0]:
                        raise ValueError("Program: copy lists must be contiguous 1-D int64 of one length")
                st.src, st.dst = <const unsigned char*>cnp.PyArray_DATA(src), <unsigned char*>cnp.PyArray_DATA(dst)
                st.src_off, st.dst_off = <const int64_t*>cnp.PyArray_DATA(so), <const int64_t*>cnp.PyArray_DATA(do)
                st.kind, st.length, st.n = COPY, <const int64_t*>cnp.PyArray_DATA(ln), ln.shape[0]
                bad = _first_outside(st.src_off, st.dst_off, st.length, st.n, src.shape[0], dst.shape[0], &total)
                if bad >= 0:
                    raise ValueError(f"Program: step {i}, block {bad} ({st.length[bad]} B from {st.src_off[bad]} "
                                     f"to {st.dst_off[bad]}) lies outside its buffers ({src.shape[0]} B, "
                                     f"{dst.shape[0]} B)")
                self._keep.append(step)
            else:
                raise ValueError(f"Program: unknown step {step[0]!r}")
            self._n = i + 1
        self._split, self._started, self.diverted = -1, False, False
        self._flat, self._nflat, self._pos, self._posted, self._begun = NULL, 0, 0, False, False
        for i in range(self._n):
            if self._steps[i].kind == REQUESTS:
                self._split = i
                break
            if self._steps[i].kind != COPY:
                break

    def __dealloc__(self):
        free(self._steps)
        free(self._handles)
        free(self._flat)

    cdef int execute(self) except -1:
        cdef int err
        if self._requests is None:
            raise RuntimeError("this compiled run was freed")
        with nogil:
            err = _run_steps(self._steps, self._n, self._status)
        self.diverted = err == DIVERTED
        if err and not self.diverted:
            raise MPI.Exception(err)
        return 0

    def run(self):
        """Run every step once (blocking)."""
        self.execute()

    def start(self):
        """Run the steps before the first ``"mpi"`` step and Start its requests (then ``wait``)."""
        self._start()

    def wait(self):
        """Wait for the requests ``start`` started, then run the remaining steps."""
        self._wait()

    cdef int _start(self) except -1:
        cdef int err = 0
        cdef Py_ssize_t i
        cdef Step* st
        if self._requests is None:
            raise RuntimeError("this compiled run was freed")
        if self._started:
            raise RuntimeError("Program.start called twice without wait")
        if self._split < 0:
            self.execute()
            self._started = True
            return 0
        with nogil:
            err = _run_steps(self._steps, self._split, self._status)
            if not err:
                st = &self._steps[self._split]
                for i in range(st.n):
                    err = _mpi_start(st.handles[i])
                    if err:
                        break
        if err:
            raise MPI.Exception(err)
        self._started = True
        return 0

    cdef int _wait(self) except -1:
        cdef int err = 0
        cdef Py_ssize_t i
        cdef Step* st
        if not self._started:
            raise RuntimeError("Program.wait without start")
        self._started = False
        if self._split < 0:
            return 0
        with nogil:
            st = &self._steps[self._split]
            for i in range(st.n):
                err = _mpi_wait(st.handles[i], self._status)
                if err:
                    break
            if not err:
                err = _run_steps(&self._steps[self._split + 1], self._n - self._split - 1, self._status)
        if err:
            raise MPI.Exception(err)
        return 0

    cdef int _advance(self, bint block, bint* done, bint post=False) noexcept nogil:
        """Run steps from ``_pos`` on; stop at requests not complete yet unless ``block``, and
        right after starting requests where ``post`` (``begin``: as MPI's own nonblocking calls,
        it starts the exchange and returns without a progress round). Sets ``done`` when every
        step ran; the first MPI error code, or 0."""
        cdef Step* st
        cdef Py_ssize_t i
        cdef int err, flag
        done[0] = False
        while self._pos < self._nflat:
            st = &self._flat[self._pos]
            if st.kind == COPY:
                _copy_list(st.dst, st.src, st.src_off, st.dst_off, st.length, st.n)
                self._pos += 1
                continue
            if st.kind == GATE:
                if not _clean_hit(st.src, st.n):
                    self.diverted = True
                    self._pos = self._nflat
                    break
                self._pos += 1
                continue
            if st.kind == STARTS:
                err = _start_all(st.handles, st.n)
                if err:
                    return err
                self._pos += 1
                continue
            if not self._posted and st.kind != WAITS:  # a wait's requests were started before
                if st.kind == BARRIER:
                    hx_fence()  # as ``_run_steps``: window writes before the barrier
                for i in range(st.n):
                    err = _mpi_start(st.handles[i])
                    if err:
                        return err
                self._posted = True
                if post:
                    return 0
            for i in range(st.n):  # a completed persistent request is inactive: it tests true again
                if block:
                    err = _mpi_wait(st.handles[i], self._status)
                else:
                    flag = 0
                    err = _mpi_test(st.handles[i], &flag, self._status)
                    if not err and not flag:
                        return 0
                if err:
                    return err
            if st.kind == BARRIER:
                hx_fence()
            self._posted = False
            self._pos += 1
        done[0] = True
        return 0

    cdef int _step(self, bint block, bint post=False) except -1:
        """One ``_advance`` from Python: 1 when the program completed (it is then idle), else 0."""
        cdef int err
        cdef bint done = False
        if not self._begun:
            return 1
        with nogil:
            err = self._advance(block, &done, post)
        if err:
            self._begun = False
            raise MPI.Exception(err)
        if done:
            self._begun = False
        return 1 if done else 0

    def begin(self):
        """Start a run as a state machine: copies up to the first requests, which it starts (and
        does not test yet); returns whether the run already completed (then ``test``/``finish``
        return at once)."""
        if self._requests is None:
            raise RuntimeError("this compiled run was freed")
        if self._started or self._begun:
            raise RuntimeError("Program.begin while a run of it is in progress")
        if self._flat == NULL:
            self._nflat = _flat_count(self._steps, self._n)
            self._flat = <Step*>malloc(max(self._nflat, 1) * sizeof(Step))
            if self._flat == NULL:
                raise MemoryError()
            _flatten(self._steps, self._n, self._flat)
        self._pos, self._posted, self._begun, self.diverted = 0, False, True, False
        return self._step(False, True) == 1

    def test(self):
        """Go on as far as possible without waiting; whether the run completed."""
        return self._step(False) == 1

    def finish(self):
        """Complete the run, waiting for each request in turn."""
        self._step(True)

    def free(self):
        """Stop the program: it cannot run again. Its requests stay their owner's to free; what it
        points into stays alive until it is collected (a program that holds it as a step may
        still point there)."""
        self._requests, self._n, self._nflat, self._begun = None, 0, 0, False
