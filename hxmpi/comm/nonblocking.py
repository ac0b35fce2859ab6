"""Nonblocking all-to-alls (``HierComm.Ialltoallv``, ``Ialltoall``, ``Ialltoallw``) and their requests.

Two ways to move a request, chosen by ``HierComm(progress=...)``:

  request  (default) the request is a state machine over the call's step program: each message
           phase is MPI's own nonblocking call (a persistent ``MPI_Alltoallv_init`` on the lane or
           node communicator, or the Bruck and pairwise rounds' ``Send_init``/``Recv_init``), and
           the copies between phases run inside ``Test``/``Wait`` as soon as the phase before them
           completed. No thread, any MPI thread level; whatever progress the MPI library (or a
           NIC that offloads it) makes moves the exchange between the caller's ``Test`` calls.
  thread   a progress thread of the HierComm's own runs each call as the blocking call; it needs
           ``MPI_THREAD_MULTIPLE`` and pays two thread hand-offs per request, and moves the data
           while the caller stays out of MPI only where the thread has a core of its own.

Request mode (``Requests``): the call itself agrees the spec with every rank (one small
``Allreduce``, as a blocking call does; a repeated pattern then runs its cached, bound program),
so it returns once every rank has made it. Its data moves afterwards, on communicators of its own
(duplicates kept for this: the agreement's collectives and the data's never interleave). Requests
of one HierComm run one after another in call order; ``Test``/``Wait`` of any of them moves the
earliest ones first, so every rank starts every MPI collective in the same order whatever order it
waits in. The node phase goes by message passing (an ``MPI_Alltoallv`` on the node), not the shared
window: a window's barriers would need every rank of the node inside the library at once.
Between phases an exchange needs its rank's next ``Test``/``Wait`` (or ``waitall``; a ``Wait``
polls every HierComm's requests meanwhile): MPI moves the phase in flight on its own, but a rank
blocked in another collective does not start the next phase. So every rank completes its requests
before a blocking collective that another rank may enter only after its own ``Wait``, as codes
do when all ranks wait in the same order; where that cannot hold, use ``progress="thread"``.

Errors: a bad spec is agreed at the call and raised by ``Wait``/``Test`` on every rank alike (the
call itself never raises for bad input; a receive buffer still in use by an earlier request of the
same HierComm is such a bad spec). An error that one rank alone meets while the data moves (an MPI
error, an exception in a copy) cannot reach the others, which would wait forever: it ends the job
with a message naming the rank and the cause (``errors.abort_job``), as ``MPI_ERRORS_ARE_FATAL``
does. Requests still in flight when the interpreter exits are completed, and reported on stderr,
before ``MPI_Finalize``; progress threads are stopped then too.

The buffers, and the counts, displacements and datatypes of the specs, must stay untouched until the
request completes, as MPI requires.
"""
from __future__ import annotations

import atexit
import queue
import sys
import threading
import weakref
from _thread import allocate_lock
from collections import deque
from typing import Callable, Optional

import numpy as np
from mpi4py import MPI

from ..errors import HxmpiError, PlanStateError, abort_job

__all__ = ["HierRequest", "StepRequest", "ThreadRequest", "Progress", "Requests", "waitall", "PROGRESS_MODES"]

#: ``HierComm(progress=...)``'s choices: a state machine driven by the request, or a thread
PROGRESS_MODES = ("request", "thread")


class HierRequest:
    """The request of a nonblocking hxmpi all-to-all, with mpi4py's ``Request`` methods.

    ``Test()`` moves the exchange on as far as it can without waiting and returns whether it
    completed; ``Wait()`` completes it (both raise the call's error, on every rank alike); a
    completed request is inactive, so waiting again returns at once (as MPI's null request).
    ``Free()`` completes the exchange first (MPI forbids freeing an active collective);
    ``Cancel()`` raises (collectives cannot be cancelled). ``HierRequest.Waitall`` and
    ``hxmpi.waitall`` wait for a list of them, mpi4py requests mixed in; mpi4py's own
    ``MPI.Request.Waitall`` takes mpi4py requests only (it raises ``TypeError``).
    """

    def __init__(self):
        self._error: Optional[BaseException] = None

    # What a way of progress provides: whether the exchange ended (moving it on where it can
    # without waiting), and a wait for its end.
    def _done(self) -> bool:
        raise NotImplementedError

    def _sleep_until_done(self) -> None:
        raise NotImplementedError

    def _raise(self) -> None:
        error, self._error = self._error, None  # raised once: the request is inactive after that
        if error is not None:
            raise error

    def Test(self, status: Optional[MPI.Status] = None) -> bool:
        """Whether the exchange completed (moving it on first; raises its error if it failed)."""
        if not self._done():
            return False
        self._raise()
        return True

    def Wait(self, status: Optional[MPI.Status] = None) -> bool:
        """Wait for the exchange to complete (raises its error if it failed); returns True."""
        self._sleep_until_done()
        self._raise()
        return True

    def Free(self) -> None:
        """Release the request; an active exchange is completed first (its error is dropped)."""
        self._sleep_until_done()
        self._error = None

    def Cancel(self) -> None:
        """Refused: MPI does not cancel collective operations."""
        raise PlanStateError("a nonblocking all-to-all cannot be cancelled (MPI cancels no collective); "
                             "Wait() for it")

    @classmethod
    def Waitall(cls, requests, statuses=None) -> bool:
        """Wait for every request (``waitall``); returns True."""
        return waitall(requests)

    @classmethod
    def Testall(cls, requests, statuses=None) -> bool:
        """Whether every request completed (each moved on first); then they are all completed
        (errors raised), else none is."""
        ours = [r for r in requests if isinstance(r, HierRequest)]
        if not all([r._done() for r in ours]):  # a list: every request is moved on, not the first few
            return False
        theirs = [r for r in requests if not isinstance(r, HierRequest)]
        if theirs and not MPI.Request.Testall(theirs):
            return False
        return waitall(ours)


def waitall(requests) -> bool:
    """Wait for every request of ``requests``: hxmpi's (``HierRequest``, or any with a ``Wait()``)
    and mpi4py's, which MPI completes in one ``MPI_Waitall``. Every request is completed before the
    first error among them is raised. Returns True."""
    theirs = [r for r in requests if isinstance(r, MPI.Request)]
    first: Optional[BaseException] = None
    # hxmpi's first: each completes whatever of its HierComm's was called before it, and the
    # requests of a thread sleep meanwhile.
    for r in requests:
        if not isinstance(r, MPI.Request):
            try:
                r.Wait()
            except Exception as exc:  # every request completes before any error is raised
                first = first or exc
    if theirs:
        MPI.Request.Waitall(theirs)
    if first is not None:
        raise first
    return True


# --------------------------------------------------------------------------- request mode
class StepRequest(HierRequest):
    """A request of request mode: the call's bound run, moved on by ``Test``/``Wait`` through its
    HierComm's ``Requests`` (see the module docstring)."""

    def __init__(self, requests: "Requests", run, after: Optional[Callable], recv: Optional[np.ndarray]):
        super().__init__()
        self._requests, self.run, self.after, self.recv = requests, run, after, recv
        self.ended = run is None

    def _done(self) -> bool:
        if not self.ended:
            self._requests.progress(self, block=False)
        return self.ended

    def _sleep_until_done(self) -> None:
        if not self.ended:
            self._requests.progress(self, block=True)


def _span(view: np.ndarray) -> tuple:
    """[first, last) address of a buffer's bytes ((0, 0) for an empty one)."""
    if view is None or view.nbytes == 0:
        return (0, 0)
    lo = view.__array_interface__["data"][0]
    return (lo, lo + view.nbytes)


class Requests:
    """The requests of one HierComm in request mode, in call order.

    ``hc``: the HierComm the calls are agreed and planned on (``HierComm._deferred_of``: the same
    layout and settings over a duplicate communicator, its runs bound but not run); ``submit``
    agrees one call and returns its request; ``progress`` moves the queue on from its head.
    """

    def __init__(self, hc):
        self.hc = hc
        self.queue: deque = deque()  # requests not completed, in call order; the head is the one moving
        _LIVE.add(self)

    def busy_problem(self, recv: np.ndarray) -> Optional[str]:
        """Why a new call may not receive into ``recv`` (bytes): a request in flight still does."""
        lo, hi = _span(recv)
        for k, req in enumerate(self.queue):
            start, end = _span(req.recv)  # only here: a call with nothing in flight never asks
            if lo < end and start < hi:
                return (f"the receive buffer overlaps that of a nonblocking all-to-all still in flight "
                        f"({k + 1} of {len(self.queue)} in call order); Wait() for it first")
        return None

    def submit(self, method: str, sendbuf, recvbuf, algorithm, validate) -> StepRequest:
        """Agree and plan one call (collective), queue its run; its request. An agreed error is
        the request's, raised by its ``Wait``/``Test``."""
        try:
            run, after, recv = self.hc._defer(method, sendbuf, recvbuf, algorithm, validate,
                                              self.busy_problem if self.queue else None)
        except BaseException as exc:
            if not getattr(exc, "agreed", False):
                abort_job(exc, f"HierComm.I{method[0].lower()}{method[1:]}")
            request = StepRequest(self, None, None, None)
            request._error = exc
            return request
        request = StepRequest(self, run, after, recv)
        self.queue.append(request)
        if len(self.queue) == 1:
            try:
                self._begin_head()
            except BaseException as exc:
                abort_job(exc, "a nonblocking all-to-all's start")
        return request

    def progress(self, target: Optional[StepRequest], block: bool) -> None:
        """Move the queue on from its head: until ``target`` completed (``block``; None: every
        request), or as far as it goes without waiting. A wait while another HierComm's requests
        are in flight too polls theirs as well: a rank waiting here may be what the ranks waiting
        for those need. An error here is this rank's alone: it ends the job."""
        try:
            while self.queue and (target is None or not target.ended):
                if not block:
                    if not self.queue[0].run.test():
                        return
                    self._complete()
                    continue
                others = [q for q in _LIVE if q is not self and isinstance(q, Requests) and q.queue]
                if not others:  # nothing else to move meanwhile: MPI_Wait each step
                    self.queue[0].run.finish()
                    self._complete()
                    continue
                for q in (self, *others):
                    while q.queue and q.queue[0].run.test():
                        q._complete()
        except BaseException as exc:
            abort_job(exc, "a nonblocking all-to-all's Test/Wait")

    def _complete(self) -> None:
        """The head's run ended: unpack what it received, then start the next ones'."""
        self._end(self.queue.popleft())
        self._begin_head()

    def _begin_head(self) -> None:
        while self.queue and self.queue[0].run.begin():  # a run may end at its begin (all local)
            self._end(self.queue.popleft())

    @staticmethod
    def _end(request: StepRequest) -> None:
        request.ended, request.run, request.recv = True, None, None
        if request.after is not None:
            request.after()

    def close(self) -> int:
        """Complete every request still in flight (collective, as each is); how many there were."""
        pending = len(self.queue)
        self.progress(None, block=True)
        return pending


# --------------------------------------------------------------------------- thread mode
class ThreadRequest(HierRequest):
    """A request of thread mode: completed by the progress thread, which releases a bare lock
    (not a ``threading.Event``, whose condition variable doubles the wake-up cost)."""

    def __init__(self):
        super().__init__()
        self._active = allocate_lock()  # held while the exchange is in flight
        self._active.acquire()
        self._ended = False  # read by Test: the lock may be held a moment by a waiting thread

    def _finish(self, error: Optional[BaseException]) -> None:
        """Called by the progress thread when the exchange has ended."""
        self._error = error
        self._ended = True
        self._active.release()

    def _done(self) -> bool:
        return self._ended

    def _sleep_until_done(self) -> None:
        with self._active:  # acquired once the progress thread released it
            pass


class Progress:
    """The progress thread of one ``HierComm``'s nonblocking calls (thread mode).

    ``make()`` builds (collectively) the ``HierComm`` the thread calls; ``submit`` queues one call
    and returns its request. ``close`` lets the queued calls finish, stops the thread and frees its
    ``HierComm`` (collective). An error the thread meets that is not agreed (raised on every rank)
    ends the job (``errors.abort_job``): the other ranks' threads would wait for this one forever,
    and its next queued call would run out of step with theirs.
    """

    def __init__(self, make: Callable):
        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            error = HxmpiError(
                "progress='thread' needs MPI_THREAD_MULTIPLE (mpi4py's default: mpi4py.rc.thread_level = "
                f"'multiple'); this MPI runs at level {MPI.Query_thread()}: use progress='request'")
            error.agreed = True  # the level is the job's: every rank raises alike
            raise error
        self.hc = make()
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="hxmpi-progress", daemon=True)
        self._thread.start()
        _LIVE.add(self)

    def submit(self, method: str, sendbuf, recvbuf, algorithm, validate) -> ThreadRequest:
        """Queue ``method`` (the blocking method's name) of the thread's HierComm; its request."""
        request = ThreadRequest()
        self._jobs.put((method, sendbuf, recvbuf, algorithm, validate, request))
        return request

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            method, sendbuf, recvbuf, algorithm, validate, request = job
            error = None
            try:
                getattr(self.hc, method)(sendbuf, recvbuf, algorithm=algorithm, validate=validate)
            except BaseException as exc:
                if not getattr(exc, "agreed", False):
                    abort_job(exc, f"the progress thread's {method}")
                error = exc  # handed to the caller's Wait/Test, on every rank alike
            request._finish(error)

    def close(self) -> int:
        """Finish the queued calls, stop the thread and free its HierComm (collective); 0 (what is
        queued is not counted)."""
        if self._thread is None:
            return 0
        self._jobs.put(None)
        self._thread.join()
        self._thread = None
        self.hc.free()
        return 0


#: every live ``Requests`` and ``Progress``: completed and stopped at exit, before MPI_Finalize
_LIVE: "weakref.WeakSet" = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    """Complete what is still in flight and stop the threads before mpi4py finalizes MPI (atexit
    runs this first: it was registered after mpi4py's import), saying so on stderr."""
    if not MPI.Is_initialized() or MPI.Is_finalized():
        return
    pending = 0
    for live in list(_LIVE):
        pending += live.close()
    if pending:
        print(f"hxmpi: rank {MPI.COMM_WORLD.rank}: {pending} nonblocking all-to-all(s) were still in flight at "
              f"exit; completed them before MPI_Finalize (Wait() for every request)", file=sys.stderr, flush=True)
