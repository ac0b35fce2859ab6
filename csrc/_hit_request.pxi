# A nonblocking call's compiled hit (``nonblocking.Requests``' hit lane): a repeated Ialltoallv or
# Ialltoall on buffers whose run is bound and compiled, begun at its call as one program (the
# slot's agreement record copied in, the agreement's persistent Allreduce, the clean-hit gate, the
# bound run) and moved by its request's Test/Wait in compiled code, with no Python frame per poll.
# Anything else (a queue ahead of it, a gate that diverts, other requests in flight to move) goes
# through ``nonblocking.Requests`` in Python, as the staged requests do.

cdef class HitLane:
    """The compiled hit lane of one HierComm's nonblocking calls (request mode).

    ``calls``: the request engine's ``CallTable``; ``requests``: its ``nonblocking.Requests``, whose
    ``hit`` is this lane's request in flight (at most one: it is begun only where nothing of the
    HierComm is in flight, and later calls queue behind it); ``engine``: the process's
    ``nonblocking.ProgressEngine``; ``cache``: the request engine's ``PlanCache``. ``begun``
    counts the requests begun here.
    """
    cdef CallTable calls
    cdef object requests, engine, lock, queues, cache
    cdef readonly long long begun

    def __init__(self, CallTable calls, requests, engine, cache):
        self.calls, self.requests, self.engine, self.cache = calls, requests, engine, cache
        self.lock, self.queues = engine.lock, engine.queues
        self.begun = 0

    def call(self, sendbuf, recvbuf, algorithm, validate, bint uniform):
        """The request of a recognised hit, begun here; None where the call goes the staged way
        (nothing was communicated)."""
        cdef Slot slot
        cdef HitRequest request
        requests = self.requests
        if requests.hit is not None or requests.agreeing or requests.moving:
            return None
        slot = self.calls._find(sendbuf, recvbuf, algorithm, validate, uniform)
        # ``slot.request``: the slot's whole program, made by the staged path's first compiled hit
        if slot is None or slot.request is None or not self.calls._same_buffers(slot) \
                or self.cache.over_budget or slot.run.held:
            return None
        request = HitRequest.__new__(HitRequest)
        request.lane, request.slot, request.program = self, slot, <Program>slot.request
        request.sendbuf, request.recvbuf, request.algorithm = sendbuf, recvbuf, algorithm
        request.validate, request.uniform = validate, uniform
        self.lock.acquire()
        try:
            if requests.hit is not None or requests.agreeing or requests.moving:  # another thread's, meanwhile
                return None
            slot.run.hold()
            requests.hit = request
            self.begun += 1
            try:
                request.program.begin()
            except BaseException as exc:  # noqa - this rank's alone: the others cannot learn of it
                requests.fail(exc, "a nonblocking all-to-all's call")
        finally:
            self.lock.release()
        return request

    cdef bint _alone(self):
        """Whether this lane's request is the only request of the process in flight (so its own
        program is all a poll needs to move)."""
        for q in self.queues:
            if q.agreeing or q.moving or (q is not self.requests and q.hit is not None):
                return False
        return True


cdef class HitRequest:
    """A nonblocking request begun as a compiled hit (``HitLane.call``); a ``HierRequest``
    (registered as one), with its ``Test``, ``Wait``, ``Free`` and ``Cancel``.

    While its program runs it is its HierComm's ``Requests.hit``; once the program ends it is
    complete, or, where the gate diverted it (the agreement was not a clean hit), ``fallback``:
    the staged request that goes on from the agreement's verdict in Python, whose outcome this
    request reports.
    """
    cdef HitLane lane
    cdef Slot slot
    cdef Program program
    cdef object sendbuf, recvbuf, algorithm, validate
    cdef bint uniform
    #: the staged request (``nonblocking.StepRequest``) a diverted hit goes on as, or None
    cdef readonly object fallback
    #: the hit ran: the request completed
    cdef readonly bint ended
    cdef bint _freed, _inside

    @property
    def r(self):
        """The receive side of its slot (``msgspec.Side``): where it receives, for later calls' checks."""
        return self.slot.r

    def progress(self):
        """Move the program on without waiting (the engine's lock held); whether it left the lane
        (completed, or diverted to ``fallback``). An error is this rank's alone: the caller's
        ``Requests.advance`` hands it to ``fail``."""
        if self.program._step(False) == 0:
            return False
        self._conclude()
        return True

    cdef int _conclude(self) except -1:
        """The program ended: count the hit as the compiled blocking path counts one, or divert."""
        cdef CallTable calls = self.lane.calls
        cdef Slot slot = self.slot
        requests = self.lane.requests
        requests.hit = None
        slot.run.release()
        if self.program.diverted:
            self.fallback = requests.divert(self.sendbuf, self.recvbuf, self.algorithm, self.validate,
                                            self.uniform, slot)
            return 0
        calls.tick += 1
        calls.misses = 0
        calls.touch(slot.entry)
        calls.stats, calls.state = slot.stats, "hit"
        requests.compiled += 1
        self.ended = True
        return 0

    cdef int _poll(self) except -1:
        """One poll: its own program where it is the process's only request in flight, else the
        whole engine; nothing where another thread is moving the engine."""
        lane = self.lane
        if not lane.lock.acquire(False):
            return 0
        try:
            if lane.requests.hit is self:
                if lane._alone():
                    try:
                        self.progress()
                    except BaseException as exc:  # noqa - this rank's alone: the others cannot learn of it
                        lane.requests.fail(exc, "a nonblocking all-to-all's Test/Wait")
                else:
                    lane.engine.poll()
        finally:
            lane.lock.release()
        return 0

    cdef int _enter(self) except -1:
        if self._freed:
            raise PlanStateError("this request was freed; a freed request cannot be tested, waited for or freed "
                                 "again")
        if self._inside:
            raise PlanStateError("another thread is in Test/Wait/Free of this request (MPI forbids two threads "
                                 "completing one request); wait for it in one thread")
        self._inside = True
        return 0

    cdef int _complete(self) except -1:
        while not self.ended and self.fallback is None:
            self._poll()
        if self.fallback is not None:
            self.fallback._sleep_until_done()
        return 0

    def _done(self):
        """Whether it completed, moving it on first (``HierRequest.Testall``); raises nothing."""
        if not self.ended and self.fallback is None:
            self._poll()
        if self.fallback is not None:
            return self.fallback._done()
        return self.ended

    def Test(self, status=None):
        """Whether the exchange completed; never waits (``HierRequest.Test``)."""
        self._enter()
        try:
            if not self._done():
                return False
            if self.fallback is not None:
                self.fallback._raise()
            return True
        finally:
            self._inside = False

    def Wait(self, status=None):
        """Wait for the exchange to complete (``HierRequest.Wait``); True."""
        self._enter()
        try:
            self._complete()
            if self.fallback is not None:
                self.fallback._raise()
            return True
        finally:
            self._inside = False

    def Free(self):
        """Complete the exchange, drop its error and free the request (``HierRequest.Free``)."""
        self._enter()
        try:
            self._complete()
            if self.fallback is not None:
                self.fallback._error = None
            self._freed = True
        finally:
            self._inside = False

    def Cancel(self):
        """Refused, as ``HierRequest.Cancel``."""
        raise PlanStateError("a nonblocking all-to-all cannot be cancelled (MPI cancels no collective); "
                             "Wait() for it")
