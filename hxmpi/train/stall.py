"""Stall watch: every blocking collective of a training run, on every rank (``--stall-timeout``).

Every collective of a run goes through one ``WatchedComm`` (the trainer's communicator, and its
HierComm's exchanges), which runs it inside ``watch.waiting(label, step)``: coverage holds by
construction. The trainer sets ``watch.step`` as training moves on. Each rank counts the waits it has entered (every rank
enters the same ones, in the same order); a heartbeat thread sends that count and the step to
every other rank over a communicator of its own, promptly when a wait begins and every
``interval`` seconds otherwise. An async round's wait for the average happens only on ranks that
ran ahead, so it is not counted (``counted=False``); there ranks are compared by step.

A rank that has been inside one wait for more than ``timeout`` seconds names the missing ranks:
those behind it (count below its own, or for an uncounted wait, step below its own: they have
not reached this collective, as a straggler or a stopped rank) and those not heard from for
``max(timeout, 1 s)`` (stopped, crashed without the job noticing, or cut off by the network). Rank 0 logs a ``"stall"`` record; with
``abort`` every rank that sees the stall prints it and aborts the job (``MPI_Abort``, and
``os._exit`` 5 s later should the abort itself hang, as it can while the network is
partitioned). So a stall ends the job about ``timeout`` (+ the heartbeat period) after it began.

Costs (only when ``timeout`` > 0): one 8-byte message to every other rank per wait and per
interval, i.e. O(ranks^2) small messages, and MPI_THREAD_MULTIPLE.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, Optional

import numpy as np
from mpi4py import MPI

from ..cli import FLUSH_BEFORE_ABORT_S
from ..errors import SettingError

__all__ = ["wait_politely", "NoWatch", "StallWatch", "WatchedComm", "WatchedRequest"]

HEARTBEAT_TAG = 7072
ABORT_CODE = 3
ABORT_GRACE_S = 5.0  # after MPI_Abort, exit anyway (an abort can hang while a host is cut off)


SPIN_S = 200e-6   # a wait polls MPI this long before it starts sleeping between polls
NAP_S = 50e-6     # sleep between polls after that


def wait_politely(request) -> None:
    """Wait for ``request`` without keeping a core busy for long.

    Open MPI's own waits poll in a loop. Where ranks share cores (more ranks than cores, other
    jobs, or two virtual CPUs on one physical core) a polling rank takes cycles from the ranks
    still computing: on the 2-vCPU development VM a matmul ran 1.7x slower while the other
    rank polled than while it slept. So poll for ``SPIN_S`` (short waits stay fast), then sleep
    ``NAP_S`` between polls.
    """
    t0 = time.perf_counter()
    while not request.Test():
        if time.perf_counter() - t0 > SPIN_S:
            time.sleep(NAP_S)


class NoWatch:
    """The watch when stall detection is off: waits cost nothing."""

    timeout = 0.0
    step = 0

    @contextmanager
    def waiting(self, label: str, step: int, counted: bool = True):
        """No-op."""
        yield

    def iterate(self, items: Iterable, label: str, step: Callable[[], int]) -> Iterator:
        """``items`` unchanged."""
        return iter(items)

    def close(self) -> None:
        """No-op."""


class StallWatch(NoWatch):
    """Watches the waits of one run on this rank (create and close it on every rank: collective).

    ``emit(record)`` logs a stall (rank 0 only); ``prog`` prefixes the abort message.
    """

    def __init__(self, comm: MPI.Intracomm, timeout: float, abort: bool, emit: Callable[[dict], None],
                 prog: str = "hxmpi.train"):
        if timeout <= 0:
            raise SettingError("stall_timeout", f"must be > 0 seconds for a watch, got {timeout}")
        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            raise SettingError("stall_timeout", "needs MPI initialised with MPI_THREAD_MULTIPLE "
                                                "(mpi4py's default)")
        self.comm = comm.Dup()  # heartbeats never mix with the run's messages
        self.rank, self.size = self.comm.rank, self.comm.size
        self.timeout, self.abort, self.emit, self.prog = float(timeout), abort, emit, prog
        self.interval = min(0.5, self.timeout / 4)
        self.stale_s = max(self.timeout, 1.0)
        self.seq = 0  # counted waits entered on this rank
        self.step = 0  # training step this rank is at (set by the trainer)
        self._where: Optional[tuple] = None  # (label, step, since, seq, counted) while inside a wait
        self._waits = 0  # waits entered, counted or not (identifies the one being reported)
        self._reported = 0  # the last wait a stall was reported for
        now = time.monotonic()
        self.heard = [(0, 0, now)] * self.size  # per rank: (its count, its step, when heard), local clock
        self._wake, self._stop = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, name="hxmpi-stall-watch", daemon=True)
        self._thread.start()

    @classmethod
    def for_run(cls, comm: MPI.Intracomm, timeout: float, abort: bool, emit: Callable[[dict], None]) -> NoWatch:
        """A watch if ``timeout`` > 0, else the free no-op (collective)."""
        return cls(comm, timeout, abort, emit) if timeout > 0 else NoWatch()

    @contextmanager
    def waiting(self, label: str, step: int, counted: bool = True):
        """Mark a blocking collective named ``label`` at training step ``step``; ``counted=False``
        for a wait that only some ranks make."""
        if self._where is not None:  # inside a wait already (a collective made while producing an
            yield                    # item of ``iterate``): every rank nests alike, the outer one counts
            return
        self.seq += counted
        self._waits += 1
        self._where = (label, step, time.monotonic(), self.seq if counted else step, counted, self._waits)
        self._wake.set()  # tell the others at once that this rank has arrived
        try:
            yield
        finally:
            self._where = None

    def iterate(self, items: Iterable, label: str, step: Callable[[], int]) -> Iterator:
        """``items``, each ``next()`` inside a wait (for generators that communicate to produce)."""
        it = iter(items)
        while True:
            with self.waiting(label, step()):
                try:
                    item = next(it)
                except StopIteration:
                    return
            yield item

    def close(self) -> None:
        """Stop the heartbeat thread (messages still in flight are left to MPI_Finalize)."""
        self._stop.set()
        self._wake.set()
        self._thread.join()

    # ------------------------------------------------------------------ the heartbeat thread
    def _run(self) -> None:
        pending = []
        inbox = np.empty(2, np.int64)
        status = MPI.Status()
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if len(pending) < 64 * self.size:  # a stopped peer must not make this list grow forever
                out = np.array([self.seq, self.step], np.int64)
                pending += [(self.comm.Isend(out, dest=r, tag=HEARTBEAT_TAG), out)
                            for r in range(self.size) if r != self.rank]
            pending = [(req, buf) for req, buf in pending if not req.Test()]
            while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=HEARTBEAT_TAG, status=status):
                src = status.Get_source()
                self.comm.Recv(inbox, source=src, tag=HEARTBEAT_TAG)
                self.heard[src] = (int(inbox[0]), int(inbox[1]), time.monotonic())
            self._check()

    def missing(self, mark: int, counted: bool, now: float) -> list[int]:
        """Ranks behind ``mark`` (a count of waits, or a step if not ``counted``) or not heard from lately."""
        return [r for r, (count, step, when) in enumerate(self.heard)
                if r != self.rank and ((count if counted else step) < mark or now - when > self.stale_s)]

    def _check(self) -> None:
        where = self._where
        if where is None:
            return
        label, step, since, mark, counted, wait_id = where
        now = time.monotonic()
        waited = now - since
        if waited <= self.timeout or self._reported == wait_id:
            return
        missing = self.missing(mark, counted, now)
        if not missing:  # everyone is in this collective: slow, not stalled
            return
        self._reported = wait_id
        if self.rank == 0:
            self.emit({"event": "stall", "round": step, "where": label, "missing_ranks": missing,
                       "waited_s": round(waited, 3)})
        if self.abort:
            sys.stderr.write(f"{self.prog}: stall: ranks {missing} missing at step {step} ({label}) after "
                             f"{waited:.1f} s, seen by rank {self.rank}; aborting (stall_abort is set)\n")
            sys.stderr.flush()
            timer = threading.Timer(ABORT_GRACE_S, os._exit, (ABORT_CODE,))
            timer.daemon = True
            timer.start()
            time.sleep(FLUSH_BEFORE_ABORT_S)  # let the launcher forward the message before the kill
            MPI.COMM_WORLD.Abort(ABORT_CODE)


# The collectives of an MPI communicator and of a HierComm that a training run makes (blocking,
# then nonblocking and persistent: they return requests whose Wait is watched).
BLOCKING = frozenset({"allreduce", "Allreduce", "allgather", "Allgather", "Allgatherv", "bcast", "Bcast",
                      "Barrier", "barrier", "gather", "Gather", "scatter", "Scatter", "reduce", "Reduce",
                      "alltoall", "Alltoall", "alltoallv", "Alltoallv", "Reduce_scatter", "scan", "exscan"})
NONBLOCKING = frozenset({"Iallreduce", "Iallgather", "Ibcast", "Ibarrier", "Ialltoall", "Ialltoallv",
                         "Alltoallv_init"})


class WatchedComm:
    """``comm`` (an MPI intracommunicator or a ``HierComm``) with every collective inside the
    run's stall watch, so that coverage holds by construction, not by wrapping call sites.

    A blocking collective is one wait labelled with its name (``"allreduce"``); a nonblocking or
    persistent one returns a ``WatchedRequest`` whose ``Wait`` is one (polite, see
    ``wait_politely``). Every other attribute passes through, except a HierComm's ``comm``, which
    comes watched too. ``watch`` (a ``StallWatch`` or the free ``NoWatch``) may be replaced while
    the proxy is in use: the trainer sets it when a run starts. Never pass a proxy to MPI itself
    (``HierComm(...)``, windows): give those the communicator it wraps, ``raw``.
    """

    def __init__(self, comm, watch: Optional[NoWatch] = None, owner: Optional["WatchedComm"] = None):
        self.raw, self._owner = comm, owner
        self._watch = watch or NoWatch()

    @property
    def watch(self) -> NoWatch:
        """The stall watch in force (the owner's, for a HierComm's ``comm``)."""
        return self._owner.watch if self._owner is not None else self._watch

    @watch.setter
    def watch(self, watch: NoWatch) -> None:
        self._watch = watch

    def __getattr__(self, name: str):
        attr = getattr(self.raw, name)
        if name in BLOCKING:
            def blocking(*args, **kwargs):
                with self.watch.waiting(name.lower(), self.watch.step):
                    return attr(*args, **kwargs)
            return blocking
        if name in NONBLOCKING:
            def nonblocking(*args, **kwargs):
                return WatchedRequest(attr(*args, **kwargs), self, name.lower().lstrip("i").replace("_init", ""))
            return nonblocking
        if name == "comm" and not isinstance(self.raw, MPI.Comm):  # a HierComm's communicator
            return WatchedComm(attr, owner=self)
        return attr


class WatchedRequest:
    """A request of a ``WatchedComm``: ``Wait`` is a wait of the stall watch, ``Test`` and
    ``Start`` (persistent requests) pass through."""

    def __init__(self, request, comm: WatchedComm, label: str):
        self.request, self._comm, self.label = request, comm, label

    def Test(self) -> bool:
        """Whether the operation is complete (progresses it)."""
        return self.request.Test()

    def Start(self) -> None:
        """Start a persistent operation (inside the watch for a HierComm's, whose start may
        already exchange)."""
        if isinstance(self.request, MPI.Request):
            self.request.Start()
            return
        watch = self._comm.watch
        with watch.waiting(self.label, watch.step):
            self.request.Start()

    def Wait(self, counted: bool = True) -> None:
        """Wait politely inside the watch; ``counted=False`` for a wait that only some ranks make
        (an async round's, on the ranks that ran ahead)."""
        watch = self._comm.watch
        with watch.waiting(self.label, watch.step, counted=counted):
            if isinstance(self.request, MPI.Request):
                wait_politely(self.request)
            else:  # a HierComm ExchangeRequest: its Wait runs the remaining stages
                self.request.Wait()

    def Free(self) -> None:
        """Free a persistent request (collective for HierComm's)."""
        self.request.Free()
