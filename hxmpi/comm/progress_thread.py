"""Thread mode of the nonblocking all-to-alls (``HierComm(progress="thread")``): a progress
thread of the HierComm's own runs each call as the blocking call, and its request is completed
when the thread has run it. Request mode, the default, and the requests' common face
(``HierRequest``) are in ``nonblocking.py``.
"""
from __future__ import annotations

import queue
import threading
from _thread import allocate_lock
from typing import Callable, Optional

from mpi4py import MPI

from ..errors import HxmpiError, agreed_error, one_rank_error
from .nonblocking import _THREADS, ENGINE, HierRequest

__all__ = ["ThreadRequest", "Progress"]


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
            # The level is the job's: every rank raises alike.
            raise agreed_error(HxmpiError(
                "progress='thread' needs MPI_THREAD_MULTIPLE (mpi4py's default: mpi4py.rc.thread_level = "
                f"'multiple'); this MPI runs at level {MPI.Query_thread()}: use progress='request'"))
        self.hc = make()
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = threading.Thread(target=self._serve, name="hxmpi-progress",
                                                                    daemon=True)
        self._thread.start()
        with ENGINE.lock:
            _THREADS.append(self)

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
            except Exception as exc:  # noqa: BLE001 - agreed ones go to the caller, others end the job
                if not getattr(exc, "agreed", False):
                    one_rank_error(exc, f"the progress thread's {method}", self.hc.comm)
                error = exc  # handed to the caller's Wait/Test, on every rank alike
            request._finish(error)

    def close(self, timeout: Optional[float] = None) -> bool:
        """Finish the queued calls, stop the thread and free its HierComm (collective); False where
        the thread did not stop within ``timeout`` seconds (None: no limit; it is then left behind,
        its HierComm not freed)."""
        if self._thread is None:
            return True
        self._jobs.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            return False
        self._thread = None
        self.hc.free()
        with ENGINE.lock:
            if self in _THREADS:
                _THREADS.remove(self)
        return True
