"""Nonblocking all-to-alls (``HierComm.Ialltoallv``, ``Ialltoall``, ``Ialltoallw``) and their requests.

A ``HierComm``'s nonblocking calls run on a progress thread of its own (``Progress``), one after
another in call order, each as the blocking call of a second ``HierComm``: the same node layout
and settings over a duplicate of the communicator, so they never mix with the caller's own
collectives, and every algorithm, the agreement and the plan cache apply unchanged. MPI calls and
hxmpi's copy kernels release the GIL, so the exchange moves while the caller computes (numpy
releases the GIL too); the caller's ``Wait`` sleeps on a lock the thread releases when the exchange
ends, instead of spinning in MPI. A request costs the two thread wake-ups on top of the exchange
(a bare lock, not a ``threading.Event``, whose condition variable doubles that cost).

Every rank must make its nonblocking calls on a ``HierComm`` in the same order (as MPI requires
of collectives); the first one sets the progress thread up, collectively. Needs
``MPI_THREAD_MULTIPLE`` (what mpi4py asks for by default); without it the call raises.

Errors: a bad spec is found by the progress thread, agreed as in the blocking call, and raised by
``Wait``/``Test`` on every rank (the call itself never raises for bad input). The buffers, and
the counts, displacements and datatypes of the specs, must stay untouched until the request
completes, as MPI requires.
"""
from __future__ import annotations

import queue
import threading
from _thread import allocate_lock
from typing import Callable, Optional

from mpi4py import MPI

from ..errors import HxmpiError, PlanStateError

__all__ = ["HierRequest", "Progress", "waitall"]


class HierRequest:
    """The request of a nonblocking hxmpi all-to-all, with mpi4py's ``Request`` methods.

    ``Test()`` returns whether it completed and ``Wait()`` waits for it (both raise the call's
    error, on every rank alike); a completed request is inactive, so waiting again returns at once
    (as MPI's null request). ``Free()`` waits for the exchange first (MPI forbids freeing an active
    collective); ``Cancel()`` raises (collectives cannot be cancelled). ``HierRequest.Waitall``
    and ``hxmpi.waitall`` wait for a list of them, mpi4py requests mixed in.
    """

    def __init__(self):
        self._active = allocate_lock()  # held while the exchange is in flight
        self._active.acquire()
        self._ended = False  # read by Test: the lock may be held a moment by a waiting thread
        self._error: Optional[BaseException] = None

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

    def _raise(self) -> None:
        error, self._error = self._error, None  # raised once: the request is inactive after that
        if error is not None:
            raise error

    def Test(self, status: Optional[MPI.Status] = None) -> bool:
        """Whether the exchange completed (raises its error if it failed)."""
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
        """Whether every request completed; then they are all completed (errors raised), else none is."""
        ours = [r for r in requests if isinstance(r, HierRequest)]
        if not all(r._done() for r in ours):
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
    # hxmpi's first: their progress does not depend on the caller, and waiting for them sleeps.
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


class Progress:
    """The progress thread of one ``HierComm``'s nonblocking calls.

    ``make()`` builds (collectively) the ``HierComm`` the thread calls; ``submit`` queues one call
    and returns its request. ``close`` lets the queued calls finish, stops the thread and frees its
    ``HierComm`` (collective).
    """

    def __init__(self, make: Callable):
        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            raise HxmpiError(
                "nonblocking hxmpi all-to-alls need MPI_THREAD_MULTIPLE (mpi4py's default: "
                f"mpi4py.rc.thread_level = 'multiple'); this MPI runs at level {MPI.Query_thread()}")
        self.hc = make()
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="hxmpi-progress", daemon=True)
        self._thread.start()

    def submit(self, method: str, sendbuf, recvbuf, algorithm, validate) -> HierRequest:
        """Queue ``method`` (the blocking method's name) of the thread's HierComm; its request."""
        request = HierRequest()
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
            except Exception as exc:  # handed to the caller's Wait/Test, on every rank for agreed errors
                error = exc
            request._finish(error)

    def close(self) -> None:
        """Finish the queued calls, stop the thread and free its HierComm (collective)."""
        self._jobs.put(None)
        self._thread.join()
        self.hc.free()
