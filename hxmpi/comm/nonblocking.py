"""Nonblocking all-to-alls (``HierComm.Ialltoallv``, ``Ialltoall``, ``Ialltoallw``) and their requests.

Two ways to move a request, chosen by ``HierComm(progress=...)``:

  request  (default) the call is local: it parses the spec and queues a request, and returns
           without waiting for any other rank. The request is a state machine whose steps are
           MPI's own nonblocking operations, moved by any ``Test``/``Wait`` of the process (one
           progress engine, ``ProgressEngine``); no thread, any MPI thread level.
  thread   a progress thread of the HierComm's own runs each call as the blocking call; it needs
           ``MPI_THREAD_MULTIPLE`` and pays two thread hand-offs per request, and moves the data
           while the caller stays out of MPI only where the thread has a core of its own.

A request in request mode goes through the stages of a one-shot call (``engine.py``), each on
communicators of the HierComm's request engine, which nothing else uses::

  agree     this rank's plan-cache lookup and agreement record, then the agreement's Allreduce,
            started nonblocking (a persistent ``MPI_Allreduce_init`` where the library has one)
  diagnose  after a failed verdict: every rank's row gathered (``MPI_Iallgather``), the error
            composed from them, the same on every rank, raised by the request's ``Wait``/``Test``
  plan      a hierarchical miss: the node's counts gathered (``MPI_Iallgather``), then planned
  move      the run bound to the buffers, moved as a state machine over its step program: each
            message phase MPI's own nonblocking call (persistent ``MPI_Alltoallv_init``,
            ``Send_init``/``Recv_init`` rounds), each copy as soon as the phase before it completed

The requests of one HierComm pass each stage one at a time, in call order: the agreement of one
starts once the one before it concluded (so every rank's plan cache changes in the same order),
its run once the one before it completed. So every rank starts every MPI collective of a
communicator in the same order, whichever request it waits for, and requests of different
HierComms (different communicators) may be started and completed in any order, as MPI allows.

The progress engine moves every in-flight request of the process at every ``Test``/``Wait`` of
any of them: a rank waiting for one request moves what the others need of it. ``Test`` never
blocks; ``Wait`` polls. At ``MPI_THREAD_MULTIPLE`` several threads may test and wait on different
requests: a lock (not the GIL) lets one thread move the engine at a time, and a ``Test`` that finds
it moved by another thread returns at once. Two threads on one request is erroneous in MPI: the
second gets ``PlanStateError``.

A run handed to a request belongs to it until the request completes (``Run.hold``): a later call
that rebinds or evicts its cache entry only marks it to be freed then.

Errors: a bad spec raises the same ``ExchangeError`` on every rank, at that request's
``Wait``/``Test`` (the call itself never raises for bad input). An error one rank alone meets while
the data moves (an MPI error, an exception in a copy) cannot reach the others, which would wait
forever: it ends the job (``errors.abort_job``), unless the communicator's error handler is
``MPI.ERRORS_RETURN`` set by the user. Requests still in flight when the interpreter exits are
completed, in call order, and reported on stderr, before ``MPI_Finalize``; progress threads are
stopped then too, each given a bounded time.

The buffers, and the counts, displacements and datatypes of the specs, must stay untouched until the
request completes, as MPI requires.
"""
from __future__ import annotations

import atexit
import sys
import threading
from abc import ABCMeta
from _thread import allocate_lock
from collections import deque
from typing import Callable, Optional

import numpy as np
from mpi4py import MPI

from ..errors import HxmpiError, PlanStateError
from ._call import HitLane, HitRequest, Program, find_typed
from .agreement import Diagnosis
from .alltoallw import TypedSides
from .engine import Call
from .msgspec import Side, parse_alltoall, parse_alltoallv

__all__ = ["HierRequest", "StepRequest", "Requests", "ProgressEngine", "waitall",
           "PROGRESS_MODES", "ENGINE"]

#: ``HierComm(progress=...)``'s choices: a state machine driven by the request, or a thread
PROGRESS_MODES = ("request", "thread")
#: seconds a progress thread may take to finish its queue at exit before it is left behind
EXIT_JOIN_S = 60.0


class HierRequest(metaclass=ABCMeta):
    """The request of a nonblocking hxmpi all-to-all, with mpi4py's ``Request`` methods.

    What ``HierComm.Ialltoallv``, ``Ialltoall`` and ``Ialltoallw`` return. ``Test()`` moves every
    in-flight request of the process as far as it can without waiting and returns whether this one
    completed; ``Wait()`` completes it (both raise the call's error, on every rank alike); a
    completed request is inactive, so ``Wait()`` and ``Test()`` return True at once (as for MPI's
    null request). ``Free()`` completes the exchange first (MPI forbids freeing an active
    collective); ``Cancel()`` raises (collectives cannot be cancelled). ``HierRequest.Waitall`` and
    ``hxmpi.waitall`` wait for a list of them, mpi4py requests mixed in; mpi4py's own
    ``MPI.Request.Waitall`` takes mpi4py requests only (it raises ``TypeError``).

    Raises
    ------
    PlanStateError
        A freed request used again; two threads in one request's ``Test``/``Wait``/``Free`` at once
        (MPI forbids it: the second is refused); ``Cancel()``.

    Notes
    -----
    In request mode every ``Test``/``Wait`` of any hxmpi request moves every in-flight request of the
    process, on every HierComm: a rank waiting for one request moves what the other ranks need of it.
    At ``MPI_THREAD_MULTIPLE`` several threads may test and wait on different requests at once.

    Examples
    --------
    >>> req = hc.Ialltoallv([sbuf, scounts, MPI.DOUBLE], [rbuf, rcounts, MPI.DOUBLE])
    >>> isinstance(req, hxmpi.HierRequest)
    True
    >>> req.Wait(), req.Wait()  # completed: inactive, True at once
    (True, True)
    """

    def __init__(self):
        self._error: Optional[BaseException] = None
        self._inside = allocate_lock()  # held by the thread in this request's Test/Wait/Free
        self._freed = False

    # What a way of progress provides: whether the exchange ended (moving it on where it can
    # without waiting), and a wait for its end.
    def _done(self) -> bool:
        raise NotImplementedError

    def _sleep_until_done(self) -> None:
        raise NotImplementedError

    def _enter(self) -> None:
        if self._freed:
            raise PlanStateError("this request was freed; a freed request cannot be tested, waited for or freed "
                                 "again")
        if not self._inside.acquire(blocking=False):
            raise PlanStateError("another thread is in Test/Wait/Free of this request (MPI forbids two threads "
                                 "completing one request); wait for it in one thread")

    def _raise(self) -> None:
        error, self._error = self._error, None  # raised once: the request is inactive after that
        if error is not None:
            raise error

    def Test(self, status: Optional[MPI.Status] = None) -> bool:
        """Whether the exchange completed; never waits.

        In request mode it first moves every in-flight request of the process as far as it goes
        without waiting (a thread moving them already: it returns at once); with
        ``progress="thread"`` the thread moves them. A completed request returns True at once. The call's error, if it failed, is raised here (once),
        on every rank alike.

        Parameters
        ----------
        status : MPI.Status, optional
            Accepted for mpi4py's signature; not filled in.

        Returns
        -------
        bool
            True once the exchange completed.

        Raises
        ------
        hxmpi.ExchangeError
            The call's bad input or mismatch between ranks (or a subclass), on every rank, when the
            request completes.
        PlanStateError
            The request was freed, or another thread is in this request's ``Test``/``Wait``/``Free``.

        Examples
        --------
        >>> req = hc.Ialltoallv([sbuf, scounts, MPI.DOUBLE], [rbuf, rcounts, MPI.DOUBLE])
        >>> polls = 1
        >>> while not req.Test():  # work between the tests
        ...     polls += 1
        >>> req.Test(), np.array_equal(rbuf, expected)
        (True, True)
        """
        self._enter()
        try:
            if not self._done():
                return False
            self._raise()
            return True
        finally:
            self._inside.release()

    def Wait(self, status: Optional[MPI.Status] = None) -> bool:
        """Wait for the exchange to complete.

        In request mode it moves every in-flight request of the process meanwhile; with
        ``progress="thread"`` it sleeps until the thread completed it. A completed request returns
        True at once. The call's error, if it failed, is raised here (once),
        on every rank alike.

        Parameters
        ----------
        status : MPI.Status, optional
            Accepted for mpi4py's signature; not filled in.

        Returns
        -------
        bool
            True.

        Raises
        ------
        hxmpi.ExchangeError
            The call's bad input or mismatch between ranks (or a subclass), on every rank.
        PlanStateError
            The request was freed, or another thread is in this request's ``Test``/``Wait``/``Free``.

        Examples
        --------
        >>> req = hc.Ialltoallv([sbuf, scounts, MPI.DOUBLE], [rbuf, rcounts, MPI.DOUBLE])
        >>> req.Wait()
        True
        """
        self._enter()
        try:
            self._sleep_until_done()
            self._raise()
            return True
        finally:
            self._inside.release()

    def Free(self) -> None:
        """Release the request; an active exchange is completed first (its error is dropped).

        A freed request cannot be used again: any later ``Test``, ``Wait`` or ``Free`` raises
        ``PlanStateError``.

        Raises
        ------
        PlanStateError
            The request was freed already, or another thread is in this request's
            ``Test``/``Wait``/``Free``.

        Examples
        --------
        >>> req = hc.Ialltoallv([sbuf, scounts, MPI.DOUBLE], [rbuf, rcounts, MPI.DOUBLE])
        >>> req.Free()  # completes the exchange first
        >>> try:
        ...     req.Wait()
        ... except PlanStateError:
        ...     print("freed")
        freed
        """
        self._enter()
        try:
            self._sleep_until_done()
            self._error = None
            self._freed = True
        finally:
            self._inside.release()

    def Cancel(self) -> None:
        """Refused: MPI does not cancel collective operations; ``Wait()`` for the request instead.

        Raises
        ------
        PlanStateError
            Always.

        Examples
        --------
        >>> req = hc.Ialltoallv([sbuf, scounts, MPI.DOUBLE], [rbuf, rcounts, MPI.DOUBLE])
        >>> try:
        ...     req.Cancel()
        ... except PlanStateError:
        ...     print("cannot cancel")
        cannot cancel
        >>> req.Wait()
        True
        """
        raise PlanStateError("a nonblocking all-to-all cannot be cancelled (MPI cancels no collective); "
                             "Wait() for it")

    @classmethod
    def Waitall(cls, requests, statuses=None) -> bool:
        """Wait for every request, hxmpi's and mpi4py's mixed (``hxmpi.waitall``).

        Parameters
        ----------
        requests : sequence
            ``HierRequest`` objects (or any with a ``Wait()``) and ``MPI.Request`` objects.
        statuses : list, optional
            Accepted for mpi4py's signature; not filled in.

        Returns
        -------
        bool
            True.

        Raises
        ------
        hxmpi.ExchangeError
            The first error among the requests, raised after every request has completed.

        Examples
        --------
        >>> a = np.full(size, rank, dtype="i")
        >>> b = np.empty_like(a)
        >>> reqs = [hc.Ialltoall(a, b), MPI.COMM_WORLD.Ibarrier()]
        >>> hxmpi.HierRequest.Waitall(reqs)
        True
        """
        return waitall(requests)

    @classmethod
    def Testall(cls, requests, statuses=None) -> bool:
        """Whether every request completed, each moved on first; then they are all completed, else none is.

        Parameters
        ----------
        requests : sequence
            ``HierRequest`` objects and ``MPI.Request`` objects.
        statuses : list, optional
            Accepted for mpi4py's signature; not filled in.

        Returns
        -------
        bool
            True when every request completed (errors raised then), False when some has not (none is
            completed).

        Raises
        ------
        hxmpi.ExchangeError
            The first error among the requests, once every one has completed.

        Examples
        --------
        >>> a = np.full(size, rank, dtype="i")
        >>> b = np.empty_like(a)
        >>> reqs = [hc.Ialltoall(a, b)]
        >>> while not hxmpi.HierRequest.Testall(reqs):
        ...     pass
        >>> b.tolist() == list(range(size))
        True
        """
        ours = [r for r in requests if isinstance(r, HierRequest)]
        if not all([r._done() for r in ours]):  # a list: every request is moved on, not the first few
            return False
        theirs = [r for r in requests if not isinstance(r, HierRequest)]
        if theirs and not MPI.Request.Testall(theirs):
            return False
        return waitall(ours)


def waitall(requests) -> bool:
    """Wait for every request of ``requests``: hxmpi's and mpi4py's, mixed.

    hxmpi's requests (``HierRequest``, or any with a ``Wait()``) are waited for first, each
    ``Wait`` moving every in-flight request of the process; mpi4py's are then completed in one
    ``MPI_Waitall``. Every request is completed before the first error among them is raised.

    Parameters
    ----------
    requests : sequence
        ``HierRequest`` objects (or any with a ``Wait()``) and ``MPI.Request`` objects.

    Returns
    -------
    bool
        True.

    Raises
    ------
    hxmpi.ExchangeError
        The first error among hxmpi's requests (or a subclass; whatever their ``Wait`` raised),
        raised after every request has completed.

    Examples
    --------
    >>> a = np.full(size, rank, dtype="i")
    >>> b = np.empty_like(a)
    >>> reqs = [hc.Ialltoallv([sbuf, scounts, MPI.DOUBLE], [rbuf, rcounts, MPI.DOUBLE]),
    ...         hc.Ialltoall(a, b), MPI.COMM_WORLD.Ibarrier()]
    >>> hxmpi.waitall(reqs)
    True
    >>> np.array_equal(rbuf, expected), b.tolist() == list(range(size))
    (True, True)
    """
    theirs = [r for r in requests if isinstance(r, MPI.Request)]
    first: Optional[BaseException] = None
    # hxmpi's first: every Wait moves every in-flight request of the process, and the requests of a
    # thread sleep meanwhile.
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


HierRequest.register(HitRequest)


# --------------------------------------------------------------------------- request mode
class ProgressEngine:
    """The process's one progress engine of request mode: every HierComm's ``Requests``, in the
    order they were made (the same on every rank: construction is collective), moved together by
    any request's ``Test``/``Wait``. ``lock`` lets one thread move them at a time."""

    def __init__(self):
        self.lock = threading.Lock()
        self.queues: list["Requests"] = []

    def poll(self) -> None:
        """Move every request as far as it goes without waiting (hold ``lock``)."""
        for requests in self.queues:
            requests.advance()

    def test(self, request: "StepRequest") -> bool:
        """Move everything once, unless another thread is moving it; whether ``request`` ended."""
        if not request.ended and self.lock.acquire(blocking=False):
            try:
                self.poll()
            finally:
                self.lock.release()
        return request.ended

    def wait(self, request: "StepRequest") -> None:
        """Move everything until ``request`` ended."""
        while not self.test(request):
            pass

    def in_flight(self) -> int:
        """Requests of the process not completed (hold ``lock``)."""
        return sum(q.in_flight for q in self.queues)

    def settle(self) -> int:
        """Complete every request in flight (at exit; collective, as each is); how many there were."""
        with self.lock:
            pending = self.in_flight()
            while self.in_flight():
                self.poll()
        return pending


#: the progress engine of this process
ENGINE = ProgressEngine()


class StepRequest(HierRequest):
    """A request of request mode: one call moving through the stages of its ``Requests`` (see the
    module docstring). ``ended``: it completed (its error, if any, is raised by Test/Wait)."""

    def __init__(self, requests: "Requests", call, s, r, problem, specs, typed=None, slot=None):
        super().__init__()
        self._requests, self.call, self.s, self.r, self.problem = requests, call, s, r, problem
        self.specs, self.typed = specs, typed
        #: the call table's slot that recognised the specs (``CallTable.request_slot``): a
        #: candidate for the compiled hit, or None
        self.slot = slot
        self.stage = "queued"
        self.ended = False
        self.run = None
        self._pending = None  # the MPI request of a stage in flight (a diagnosis's, a node gather's)
        self._found = None  # what the agreement stage looked up: (entry, key, settings)
        self._fresh = None  # a miss's new cache entry, planned once the node's counts came
        self._work = None  # what the stage in flight keeps (a diagnosis, the node's counts)
        self.run_program = None  # the compiled hit's program under way (``Requests._begin_compiled``)

    def _done(self) -> bool:
        return ENGINE.test(self)

    def _sleep_until_done(self) -> None:
        ENGINE.wait(self)


def _span(view: Optional[np.ndarray]) -> tuple:
    """[first, last) address of a buffer's bytes ((0, 0) for an empty one)."""
    if view is None or view.nbytes == 0:
        return (0, 0)
    lo = view.__array_interface__["data"][0]
    return (lo, lo + view.nbytes)


class Requests:
    """The requests of one HierComm in request mode, in call order, and their stages.

    ``engine``: the HierComm's request engine (``engine.Engine``, deferred: communicators of its
    own, runs handed over); ``fail``: what to do with an error this rank alone meets (end the job,
    or raise where the communicator returns errors). ``agreeing``: requests whose agreement has
    not concluded, the head's in flight; ``moving``: concluded ones whose runs move, the head's in
    flight.
    """

    def __init__(self, engine, fail: Callable[[BaseException, str], None]):
        self.engine, self.fail = engine, fail
        self.agreeing: deque = deque()
        self.moving: deque = deque()
        #: requests that ran whole as one compiled hit (``_begin_compiled``, or the hit lane's)
        self.compiled = 0
        #: the hit lane's request in flight (``_call.HitRequest``), ahead of every queued one
        self.hit: Optional[HitRequest] = None
        #: where a repeated call on bound, compiled buffers begins at once, compiled (``_call.HitLane``)
        self.lane = HitLane(engine.calls, self, ENGINE, engine.plan_cache)
        self.types: Optional[TypedSides] = None  # Ialltoallw's layouts and kept calls, made on first use
        with ENGINE.lock:
            ENGINE.queues.append(self)

    @property
    def in_flight(self) -> int:
        """Requests not completed."""
        return len(self.agreeing) + len(self.moving) + (self.hit is not None)

    def call(self, method: str, sendbuf, recvbuf, algorithm, validate) -> StepRequest:
        """The request of a nonblocking ``method`` ("Alltoallv", "Alltoall", "Alltoallw"), its
        spec parsed and queued; a bad spec is this request's error, raised by its Wait/Test."""
        call = Call(algorithm, validate, uniform=method == "Alltoall", defer=True)
        if method != "Alltoallw":  # a repeated call on the same buffers may run as one compiled hit
            slot = self.engine.calls.request_slot(sendbuf, recvbuf, algorithm, validate, call.uniform)
            if slot is not None:
                return self.submit(StepRequest(self, call, slot.s, slot.r, None, (sendbuf, recvbuf), slot=slot))
        typed = None
        if method == "Alltoallw":
            if self.types is None:
                self.types = TypedSides(self.engine.comm.size)
            typed = find_typed(self.types.calls, sendbuf, recvbuf, algorithm, validate)
            if typed is None:
                typed, problem = self.types.prepare(sendbuf, recvbuf, algorithm, validate)
                if problem:
                    nothing = Side(None, None, None)
                    return self.submit(StepRequest(self, call, nothing, nothing, problem, None))
            sendbuf, recvbuf = typed.send_spec, typed.recv_spec
        s, r, problem = (parse_alltoall if call.uniform else parse_alltoallv)(sendbuf, recvbuf,
                                                                              self.engine.comm.size)
        specs = (sendbuf, recvbuf) if sendbuf is not MPI.IN_PLACE else None
        return self.submit(StepRequest(self, call, s, r, problem, specs, typed))

    def submit(self, request: StepRequest) -> StepRequest:
        """Queue a parsed call (local: nothing waits for another rank) and start what it can."""
        with ENGINE.lock:
            self.agreeing.append(request)
            self.advance()
        return request

    def advance(self) -> None:
        """Move this HierComm's requests as far as they go without waiting (the engine's lock is
        held). An error of this rank alone here ends the job (``fail``)."""
        try:
            if self.hit is not None and not self.hit.progress():  # ahead of the queue: its agreement is in use
                return
            while self.agreeing:
                request = self.agreeing[0]
                if not self._agree(request):
                    break
                self.agreeing.popleft()
                if request._error is None and request.stage != "moved":
                    self.moving.append(request)
                else:  # failed, or moved whole as a compiled hit
                    self._end(request)
            while self.moving:
                request = self.moving[0]
                if not self._move(request):
                    break
                self.moving.popleft()
                self._end(request)
        except BaseException as exc:  # noqa: BLE001 - this rank's alone: the others cannot learn of it
            self.fail(exc, "a nonblocking all-to-all's Test/Wait")

    # ------------------------------------------------------------------ the agreement stage
    def _agree(self, request: StepRequest) -> bool:
        """Move ``request``'s agreement stage on; whether it concluded (its run bound, or its error set)."""
        engine, call = self.engine, request.call
        if request.stage == "queued" and request.slot is not None:
            self._begin_compiled(request)
        if request.stage == "compiled":
            if not request.run_program.test():
                return False
            if self._compiled_ended(request):
                return True
            self._verdict(request)  # diverted: the agreement came out otherwise; Python goes on
        if request.stage == "queued":
            problem = request.problem
            if problem is None:
                problem = self._busy(request)
            request.problem = problem
            request._found = engine.lookup(call, request.s, request.r, problem, request.specs is not None)
            engine.fill(call, request.s, request.r, problem, request._found)
            engine.agreement.start()
            request.stage = "agreeing"
        if request.stage == "agreeing":
            if not engine.agreement.test():
                return False
            self._verdict(request)
        if request.stage in ("diagnosing", "gathering"):
            if not request._pending.Test():
                return False
            if request.stage == "diagnosing":
                request._error = request._work.error()
                return True
            fresh, s, r = request._fresh, request.s, request.r
            fresh.plan = engine.plan_with(s, r, fresh.algorithm, fresh.radix, request._work)
            engine.run_miss(call, fresh, s, r)
            request.stage = "bound"
        request._pending = request._work = request._fresh = request._found = None
        request.run = call.run
        return True

    def _begin_compiled(self, request: StepRequest) -> None:
        """Begin a recognised hit as one compiled program (stage "compiled"), where nothing of this
        HierComm is in flight ahead of it (its agreement and its data are both next): the slot's
        agreement record copied in, the agreement's persistent Allreduce, a gate that goes on only
        on a clean hit, then the slot's bound run. Where it cannot, the request stays "queued" and
        goes the staged way."""
        engine, slot = self.engine, request.slot
        agreement = engine.agreement
        if self.moving or agreement.handle == 0 or engine.plan_cache.over_budget or slot.run.held:
            return
        program = slot.request
        if program is None:
            entry = slot.entry
            engine.fill(request.call, slot.s, slot.r, None, (entry, entry.key, entry.settings))
            record = agreement.record.copy()
            one = np.zeros(1, dtype=np.int64)
            program = slot.request = Program([
                ("copy", record.view(np.uint8), one, agreement.record.view(np.uint8), one.copy(),
                 np.full(1, record.nbytes, dtype=np.int64)),
                ("mpi", [agreement.request]), ("gate", agreement.sums, engine.comm.size),
                ("program", slot.program)])
        request.run = slot.run
        request.run_program = program
        request.run.hold()
        request.stage = "compiled"
        program.begin()

    def _compiled_ended(self, request: StepRequest) -> bool:
        """The compiled hit's program ended: True where it ran the data (the request is done, its
        hit counted as the compiled blocking path counts one); False where the gate diverted it
        (its run given back, its agreement's verdict for ``_verdict``)."""
        engine, slot = self.engine, request.slot
        if request.run_program.diverted:
            request.run.release()
            request.run = request.run_program = None
            entry = slot.entry
            request._found = (entry, entry.key, entry.settings)
            request.stage = "agreeing"
            return False
        calls = engine.calls
        calls.tick += 1
        calls.misses = 0
        calls.touch(slot.entry)
        calls.stats, calls.state = slot.stats, "hit"
        request.run_program = None
        request.stage = "moved"
        self.compiled += 1
        return True

    def divert(self, sendbuf, recvbuf, algorithm, validate, uniform: bool, slot) -> StepRequest:
        """The staged request a hit lane's request goes on as where its gate diverted it (the
        agreement, which its program ran, was not a clean hit): its verdict read now, the request
        put at the head of the queue (the engine's lock held)."""
        call = Call(algorithm, validate, uniform=uniform, defer=True)
        request = StepRequest(self, call, slot.s, slot.r, None, (sendbuf, recvbuf), slot=slot)
        entry = slot.entry
        request._found = (entry, entry.key, entry.settings)
        request.stage = "agreeing"
        self._verdict(request)
        self.agreeing.appendleft(request)
        return request

    def _verdict(self, request: StepRequest) -> None:
        """The agreement came: a diagnosis to gather, a miss to plan, or the run bound."""
        engine, call, s, r = self.engine, request.call, request.s, request.r
        flags = engine.agreement.verdict()
        if engine.agreement.failed(flags):
            request._work = Diagnosis(engine.agreement.comm, flags, engine.agreement.sums, request.problem,
                                      2 * engine.code(call.algorithm) + call.uniform, bool(call.validate),
                                      call.kind_text, None if request.problem else s.counts,
                                      None if request.problem else r.counts)
            request._pending = request._work.start()
            request.stage = "diagnosing"
            return
        entry, key, settings = request._found
        try:
            fresh = engine.settle(call, engine.agreement.agreed(flags, entry.slot if entry is not None else 0),
                                  s, r, entry, key, settings, request.specs is not None, request.specs)
        except HxmpiError as exc:
            if not getattr(exc, "agreed", False):
                raise
            request._error = exc  # decided from agreed numbers: every rank raises it at its Wait
            request.stage = "failed"
            return
        if fresh is not None and fresh.algorithm.hierarchical:
            mine, request._work = engine.node_counts(s, r, fresh.algorithm)
            request._pending = engine.gather_comm.Iallgather([mine, MPI.INT64_T], [request._work, MPI.INT64_T])
            request._fresh = fresh
            request.stage = "gathering"
            return
        if fresh is not None:
            engine.run_miss(call, fresh, s, r)
        request.stage = "bound"

    def _busy(self, request: StepRequest) -> Optional[str]:
        """Why ``request`` may not receive where it does: a request before it, not completed, still
        receives there (the same check on every rank: an agreed problem)."""
        lo, hi = _span(request.r.view)
        ahead = [q for q in (*([self.hit] if self.hit is not None else []), *self.moving, *self.agreeing)
                 if q is not request]
        for k, other in enumerate(ahead):
            start, end = _span(other.r.view if other.r is not None else None)
            if lo < end and start < hi:
                return (f"the receive buffer overlaps that of a nonblocking all-to-all still in flight "
                        f"({k + 1} of {len(ahead)} in call order); Wait() for it first")
        return None

    # ------------------------------------------------------------------ the moving stage
    def _move(self, request: StepRequest) -> bool:
        """Move ``request``'s run on; whether it completed."""
        run = request.run
        if request.stage == "bound":
            if request.typed is not None and request.typed.pack is not None:
                request.typed.pack.run()
            request.stage = "moving"
            return run.begin()
        return run.test()

    def _end(self, request: StepRequest) -> None:
        """The request completed: its run given back, the received bytes scattered (Alltoallw)."""
        run, request.run = request.run, None
        if run is not None:
            run.release()
            if request.typed is not None and request.typed.unpack is not None:
                request.typed.unpack.run()
        request.ended, request.stage = True, "ended"
        request.s = request.r = request.specs = request.typed = request.call = None

    def close(self) -> int:
        """Complete every request still in flight (collective, as each is), leave the engine and
        free the kept Ialltoallw layouts; how many requests there were."""
        with ENGINE.lock:
            pending = self.in_flight
            while self.in_flight:
                self.advance()
            ENGINE.queues.remove(self)
        if self.types is not None:
            self.types.clear()
        return pending


#: every live progress thread (``progress_thread.Progress``), in the order they were made:
#: stopped at exit, before MPI_Finalize
_THREADS: list = []


@atexit.register
def _close_at_exit() -> None:
    """Complete what is still in flight and stop the threads before mpi4py finalizes MPI (atexit
    runs this first: it was registered after mpi4py's import), saying so on stderr."""
    if not MPI.Is_initialized() or MPI.Is_finalized():
        return
    pending = ENGINE.settle()
    for progress in list(_THREADS):
        if not progress.close(EXIT_JOIN_S):
            print(f"hxmpi: rank {MPI.COMM_WORLD.rank}: a progress thread did not finish its queue within "
                  f"{EXIT_JOIN_S:.0f} s at exit; left behind", file=sys.stderr, flush=True)
    if pending:
        print(f"hxmpi: rank {MPI.COMM_WORLD.rank}: {pending} nonblocking all-to-all(s) were still in flight at "
              f"exit; completed them before MPI_Finalize (Wait() for every request)", file=sys.stderr, flush=True)
