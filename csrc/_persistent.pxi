# The Start and Wait of a persistent request (``persistent.ExchangeRequest``), compiled: its state
# checks, an in-place send copy and its compiled program's start and wait, with no Python frame
# between the caller's Start and MPI_Start, nor between its Wait and MPI_Wait.

from hxmpi.errors import PlanStateError

_FREED = "this persistent exchange was freed; create a new one with Alltoallv_init"


cdef class Persisted:
    """The hot path of one persistent request.

    ``run``: its bound run (``runs.Run``); ``calls``: the owning HierComm's ``CallTable``, whose
    ``stats``/``state`` (its ``last_stats``) a completed ``wait`` sets; ``in_place``: (receive
    view, send copy), uint8, for ``MPI.IN_PLACE`` (the copy refreshed at each ``start``), or None;
    ``fail(error, where)``: what becomes of an error this rank alone met (``errors.route_error``).
    ``start``/``wait`` run the run's compiled program (``Run.program``) where it has one, else the
    run's own ``start``/``wait`` (a Bruck exchange before its first run learns its lengths).
    ``active``: started and not waited for; ``freed``: ``free`` was called.
    """
    cdef object run, fail
    cdef CallTable calls
    cdef Program _compiled      # the run's program, once it has one (built once, kept by the run)
    cdef Program _program       # the program the active exchange runs on, or None (the run's own path)
    cdef cnp.ndarray _recv, _send
    cdef readonly bint active, freed

    def __init__(self, run, CallTable calls, in_place, fail):
        self.run, self.calls, self.fail = run, calls, fail
        self._recv = self._send = None
        if in_place is not None:
            self._recv, self._send = in_place
            if not (self._recv.flags.c_contiguous and self._send.flags.c_contiguous
                    and self._recv.nbytes >= self._send.nbytes):
                raise ValueError("in-place views must be contiguous, the receive one at least as long")
        self.active = self.freed = False

    def start(self):
        """Start one exchange (``ExchangeRequest.Start``)."""
        cdef object program
        if self.freed:
            raise PlanStateError(_FREED)
        if self.active:
            raise PlanStateError("Start() called twice without Wait(); call Wait() first")
        try:
            if self._send is not None:
                memcpy(cnp.PyArray_DATA(self._send), cnp.PyArray_DATA(self._recv), <size_t>self._send.nbytes)
            if self._compiled is None:
                program = self.run.program()
                if program is not None:
                    self._compiled = <Program>program
            self._program = self._compiled
            if self._program is None:
                self.run.start()
            else:
                self._program._start()
        except BaseException as exc:
            self.fail(exc, "ExchangeRequest.Start")
        self.active = True

    def wait(self):
        """Complete the started exchange (``ExchangeRequest.Wait``)."""
        if self.freed:
            raise PlanStateError(_FREED)
        if not self.active:
            raise PlanStateError("Wait() without Start(); call Start() first")
        self.active = False
        try:
            if self._program is None:
                self.run.wait()
            else:
                self._program._wait()
        except BaseException as exc:
            self.fail(exc, "ExchangeRequest.Wait")
        self.calls.stats, self.calls.state = self.run.stats, "request"

    def free(self):
        """Forget the run (its owner frees it); later use raises ``PlanStateError``."""
        self.freed, self.run, self._program, self._compiled = True, None, None, None
