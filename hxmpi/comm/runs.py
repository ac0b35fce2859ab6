"""Executing exchanges: a step program bound to buffers and communicators, run once or started again and again.

Typed stages (``hxmpi/comm/exchange.py`` drives them)::

  ``StepProgram``  one call's steps on one rank (``hxmpi/comm/plan.py``): what the planner made, the
                   same program every runner below executes and the simulator replays;
  ``Run``          a program bound to the caller's buffers, scratch and communicators only, with
                   ``start()`` (local copies, the first exchange started) and ``wait()`` (the rest);
  ``ExchangeStats``  what a run moved, read by ``HierComm.last_stats``.

A one-shot ``Run`` off the large-count path is run whole by the compiled runner (``_call.Runner``).
Otherwise its steps are bound once: a copy to the kernel's block lists (``copy_blocks``); an
exchange to a ``Transfer`` (linear), ``Pairwise`` or ``Bruck`` on its communicator, each an MPI
persistent request where the run is persistent and the library has them; the node barrier to the
window's. A persistent run compiles these into a ``_call.Program`` (persistent requests, learned
Bruck rounds, the barrier between memory fences), run without Python between its MPI calls; where
a part cannot be compiled the steps are walked in Python.

Node phases, as the planner writes them:

  shm  phase 1 receives into a node-shared window (``NodeWindow``); a node barrier; each rank copies
       its blocks straight from the window to its receive buffer; a second barrier frees the window
       for the next call (so one window serves every call, with no double buffering);
  mpi  phase 1 receives into a private buffer; repack by destination local rank; an Alltoallv on the
       node; unpack.

A run is bound to its buffers' addresses: ``Scratch`` and ``NodeWindow`` count their regrowths in
``generation`` so that a cached run can tell it must be bound again.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
from mpi4py import MPI

from ._call import Program
from ._packing import copy_blocks
from .bruck import Bruck, Pairwise
from .msgspec import Side
from .plan import Algorithm, BarrierStep, CopyStep, ExchangeStep, StepProgram, WaitStep, program_steps
from .transfer import Transfer

__all__ = ["NodeWindow", "Scratch", "ExchangeStats", "Run"]

class NodeWindow:
    """A byte buffer shared by the ranks of one node (``MPI_Win_allocate_shared``), grown on demand.

    ``ensure`` is collective on ``intra`` and must be called with the same size on every node rank
    (sizes come from the agreed node counts, so they are). ``generation`` counts regrowths.
    """

    def __init__(self, intra: MPI.Intracomm):
        self.intra = intra
        self.win: Optional[MPI.Win] = None
        self.view = np.empty(0, dtype=np.uint8)
        self.generation = 0
        #: a persistent node barrier (MPI-4 ``Barrier_init``; None where the library has none): a
        #: compiled run's window barrier, between memory fences (collective, as construction is)
        try:
            self.barrier_request: Optional[MPI.Prequest] = intra.Barrier_init()
        except (NotImplementedError, AttributeError):
            self.barrier_request = None

    def ensure(self, nbytes: int) -> np.ndarray:
        """The window as a uint8 array of at least ``nbytes`` (collective only when it grows)."""
        if self.win is None or self.view.shape[0] < nbytes:
            self._release()
            self.win = MPI.Win.Allocate_shared(max(nbytes, 1) if self.intra.rank == 0 else 0, 1,
                                               comm=self.intra)
            buf, _ = self.win.Shared_query(0)
            self.view = np.frombuffer(buf, dtype=np.uint8)
            self.generation += 1
            # Passive-target epoch for the window's lifetime: Sync() then orders memory between ranks.
            self.win.Lock_all(MPI.MODE_NOCHECK)
        return self.view

    def barrier(self) -> None:
        """Node barrier that also makes every rank's window writes visible to the others."""
        self.win.Sync()
        self.intra.Barrier()
        self.win.Sync()

    def free(self) -> None:
        """Release the window and the barrier (collective on the node)."""
        self._release()
        if self.barrier_request is not None:
            self.barrier_request.Free()
            self.barrier_request = None

    def _release(self) -> None:
        if self.win is not None:
            self.view = np.empty(0, dtype=np.uint8)
            self.win.Unlock_all()
            self.win.Free()
            self.win = None


class Scratch:
    """Named private byte buffers, grown only when a call needs more; ``generation`` counts regrowths."""

    def __init__(self):
        self.buffers: dict[str, np.ndarray] = {}
        self.generation = 0

    def get(self, name: str, nbytes: int) -> np.ndarray:
        """The buffer ``name`` with at least ``nbytes`` bytes."""
        buf = self.buffers.get(name)
        if buf is None or buf.shape[0] < nbytes:
            self.buffers.pop(name, None)  # drop the old one before allocating the new one
            buf = self.buffers[name] = np.empty(max(nbytes, 1), dtype=np.uint8)
            self.generation += 1
        return buf

    @property
    def nbytes(self) -> int:
        """Bytes held."""
        return sum(b.nbytes for b in self.buffers.values())


class ExchangeStats:
    """What one run moves on this rank (bytes): its algorithm's name, per-peer sends, copies.

    ``flat_counts``: bytes to each world rank (flat algorithms); ``program``: the step program of
    a hierarchical run, whose exchanges and copies ``node_bytes``, ``node_sends`` and ``copied``
    read; ``radix``: the Bruck radix of "bruck" and "hier_bruck" runs, the leaders per node of
    "hier_leaders" ones (0 for the others).
    """
    __slots__ = ("algorithm", "flat_counts", "program", "radix")

    def __init__(self, algorithm: str, flat_counts: Optional[np.ndarray] = None,
                 program: Optional[StepProgram] = None, radix: int = 0):
        self.algorithm, self.flat_counts, self.program, self.radix = algorithm, flat_counts, program, radix

    @classmethod
    def of(cls, algorithm: Algorithm, radix: int, program: Optional[StepProgram] = None,
           flat_counts: Optional[np.ndarray] = None) -> "ExchangeStats":
        """The stats of a run of ``algorithm`` at ``radix`` (kept only where it has one)."""
        return cls(algorithm.name, flat_counts, program, algorithm.setting(radix))

    def _sends(self, lanes: bool) -> Optional[np.ndarray]:
        """Bytes to each peer of the lane exchanges (summed: a rank sends on its own lane only)
        or of the node phase; None where there is none (a multi-leader rank that leads nothing)."""
        found = None
        for step in program_steps(self.program):
            if not isinstance(step, ExchangeStep) or isinstance(step.comm, int) != lanes \
                    or (not lanes and step.comm != "node"):
                continue
            found = step.send_counts.copy() if found is None else found + step.send_counts
        return found

    @property
    def node_bytes(self) -> np.ndarray:
        """Phase-1 bytes to each node (hierarchical)."""
        return self._sends(True)

    @property
    def node_sends(self) -> Optional[np.ndarray]:
        """Phase-2 bytes to each local rank, None without a message-passing node phase."""
        return self._sends(False)

    @property
    def copied(self) -> int:
        """Bytes the run's copies move."""
        return self.program.copied if self.program is not None else 0

    @property
    def delivered(self) -> int:
        """Bytes the run writes into the receive buffer (copied there, or received there by an
        exchange): what the call delivers to this rank, for ``copied`` per byte delivered."""
        total = 0
        for step in program_steps(self.program):
            if getattr(step, "dst", None) == "recv":  # barriers and waits have none
                total += step.nbytes if isinstance(step, CopyStep) else int(step.recv_counts.sum())
        return total


class _Phase:
    """One exchange, started nonblocking each time or bound once as an MPI persistent collective."""

    def __init__(self, transfer, persistent: bool):
        self.transfer = transfer
        self.request = transfer.init() if persistent else None  # None: no persistent collectives

    def start(self) -> MPI.Request:
        if self.request is None:
            return self.transfer.start()
        self.request.Start()
        return self.request

    def run(self) -> None:
        """The whole exchange, blocking."""
        if self.request is None:
            self.transfer.run()
        else:
            self.request.Start()
            self.request.Wait()

    def free(self) -> None:
        if self.request is not None and self.request != MPI.REQUEST_NULL:
            self.request.Free()
        self.request = None
        self.transfer.free()


class _Native:
    """An exchange that is one MPI persistent collective built elsewhere (an Alltoallw's
    ``Alltoallw_init`` on the caller's own specs): its phase starts and frees that request."""

    def __init__(self, request: MPI.Prequest):
        self.request = request

    def init(self) -> MPI.Prequest:
        return self.request

    def program(self) -> None:
        return None

    def free(self) -> None:
        pass  # the request is its phase's, freed there


def _exchange(step, comm, send: Side, recv: Side, big: bool):
    """What runs one exchange step: ``Transfer`` (linear), ``Pairwise`` or ``Bruck`` (with ``big``,
    each runs the large-count ``Transfer``)."""
    if step.rounds == "linear":
        return Transfer(comm, send, recv, big, step.uniform)
    return (Bruck if step.rounds == "bruck" else Pairwise)(comm, send, recv, big, radix=step.radix)


def _apart(buf: np.ndarray, counts: np.ndarray, displs: np.ndarray) -> Side:
    """The send side of an exchange within one buffer (multi-leader's, in the node window), from
    the first byte it sends on (at least 1: the planner leaves byte 0 unused): libnbc takes equal
    send and receive starts for ``MPI_IN_PLACE``, and MPICH refuses them as aliased. An unsent
    peer's displacement is 0 (as ``_call._apart``)."""
    sent = counts > 0
    shift = max(int(displs[sent].min()) if sent.any() else 1, 1)
    return Side(buf[shift:], counts, np.where(sent, displs - shift, 0).astype(np.int64))


def _nothing() -> None:
    """What ``wait`` calls after a start that finished the run."""


_EMPTY = np.empty(0, dtype=np.uint8)


class Run:
    """A step program (``hxmpi.comm.plan``) bound to the caller's buffers, scratch and communicators.

    ``algorithm`` and ``radix``: what it runs (for its stats); ``s``, ``r``: the caller's sides
    (bytes); ``big``: the large-count path (agreed); ``comms``: the communicator of each
    exchange's code (``plan.ExchangeStep.comm``: "world", "node", a lane number); ``scratch``:
    where the scratch and a private stage buffer come from, and ``window``: the node window, the
    stage where the program's is shared; ``persistent``: bind MPI persistent requests (started
    again and again); ``runner``: the compiled runner (``_call.Runner``), which runs a one-shot
    run off the large-count path whole.
    """

    def __init__(self, program: StepProgram, algorithm: Algorithm, radix: int, s: Side, r: Side, big: bool,
                 comms: dict, scratch, window: Optional[NodeWindow], persistent: bool, runner=None,
                 native: Optional[MPI.Prequest] = None):
        self.plan, self.s, self.r, self.window = program, s, r, window
        self._native = native  # MPI's own persistent collective that moves the whole call, or None
        if algorithm.hierarchical:
            self.stats = ExchangeStats.of(algorithm, radix, program=program)
        else:
            self.stats = ExchangeStats.of(algorithm, radix, flat_counts=s.counts)
        self.a = scratch.get("a", program.scratch_bytes) if program.scratch_bytes else _EMPTY
        if program.stage_shared:  # collective on the node: every rank's program names the same size
            self.buf = window.ensure(program.stage_bytes)
        else:
            self.buf = scratch.get("b", program.stage_bytes) if program.stage_bytes else _EMPTY
        self._once = runner if not persistent and not big else None
        self._persistent = persistent
        self._program: Optional[Program] = None
        self._owns_program = False  # False: ``_program`` is a phase's own (freed with it)
        self._phases: list = []
        self._steps: list = []
        self._finish: Optional[Callable] = None  # what ``wait`` calls: the started part's end
        #: a ``begin`` not completed yet (its buffers and requests are in use)
        self.busy = False
        self._holders = 0  # requests this run is handed to, not completed yet (``hold``)
        self._learning: Optional[Program] = None  # the Bruck headers a ``begin`` runs first
        self._in_flight: list = []  # the walk's requests left in flight up to its next "wait"
        self._free_when_done = False
        if self._once is not None:
            return
        self._steps = self._bind(comms, big, persistent)
        # ``start`` walks the steps before the first "mpi" step and starts that one's phases
        self._first = next((i for i, step in enumerate(self._steps) if step[0] == "mpi"), len(self._steps))
        self._requests: list = []

    def _bind(self, comms: dict, big: bool, persistent: bool) -> list:
        """The program's steps bound (built once): ``("copy", src, src_off, dst, dst_off, length)``;
        ``("mpi", phases, blocking)``: start every phase, then wait for all (``blocking``: one
        phase, run whole in one call where the run is run whole); ``("start", phases)`` and
        ``("wait",)``: start them, and wait for them after the steps between; ``("barrier",)``: the
        node window's barrier."""
        if self._native is not None:  # MPI's own request moves the whole call: no step of the program
            self._phases.append(_Phase(_Native(self._native), persistent))
            return [("mpi", list(self._phases), True)]
        bufs = {"send": self.s.view, "recv": self.r.view, "scratch": self.a, "stage": self.buf}
        steps, group = [], []
        for step in program_steps(self.plan):
            if isinstance(step, CopyStep):
                steps.append(("copy", bufs[step.src], step.src_off, bufs[step.dst], step.dst_off, step.length))
            elif isinstance(step, BarrierStep):
                steps.append(("barrier",))
            elif isinstance(step, WaitStep):
                steps.append(("wait",))
            else:
                send = Side(bufs[step.src], step.send_counts, step.send_displs) if step.src != step.dst \
                    else _apart(bufs[step.src], step.send_counts, step.send_displs)
                recv = Side(bufs[step.dst], step.recv_counts, step.recv_displs)
                group.append(_Phase(_exchange(step, comms[step.comm], send, recv, big), persistent))
                self._phases.append(group[-1])
                if not step.with_next:
                    blocking = step.blocking and len(group) == 1
                    steps.append(("start", group) if step.in_flight else ("mpi", group, blocking))
                    group = []
        return steps

    def _walk(self, steps: list, whole: bool = True) -> None:
        for step in steps:
            if step[0] == "copy":
                copy_blocks(step[1], step[2], step[3], step[4], step[5])
            elif step[0] == "mpi":
                if whole and step[2]:
                    step[1][0].run()
                else:
                    MPI.Request.Waitall([phase.start() for phase in step[1]])
            elif step[0] == "start":  # left in flight while the steps up to the next "wait" run
                self._in_flight = [phase.start() for phase in step[1]]
            elif step[0] == "wait":
                MPI.Request.Waitall(self._in_flight)
                self._in_flight = []
            else:
                self.window.barrier()

    def start(self) -> None:
        """Local copies that need no peer, then the first exchange (nonblocking); the compiled
        program's first part where the run has one (``program``); a compiled one-shot run runs
        whole here."""
        if self._once is not None:
            self.run()
            self._finish = _nothing
            return
        program = self.program()
        if program is not None:
            program.start()
            self._finish = program.wait
            return
        self._walk(self._steps[:self._first])
        self._requests = [phase.start() for phase in self._steps[self._first][1]] \
            if self._first < len(self._steps) else []
        self._finish = self._walk_rest

    def wait(self) -> None:
        """Complete what ``start`` started."""
        self._finish()

    def _walk_rest(self) -> None:
        MPI.Request.Waitall(self._requests)
        self._requests = []
        self._walk(self._steps[self._first + 1:], whole=False)

    def run(self) -> None:
        """Start and wait: one blocking call."""
        if self._once is not None:
            self._once.run(self.plan, self.s.view, self.r.view, self.a, self.buf)
            return
        program = self.program()
        if program is not None:
            program.run()
        else:
            self._walk(self._steps)

    def begin(self) -> bool:
        """Start the run as a state machine (a nonblocking request's): the compiled program's
        ``begin``; whether it already completed. A run whose Bruck exchanges have not learned
        their lengths yet first runs their headers (``Bruck.headers``), as a state machine too;
        one with no program at all (the large-count path's rounds) runs whole at its first
        ``test``/``finish``."""
        self.busy = True
        program = self.program()
        if program is None:
            self._learning = self._headers()
            if self._learning is None or not self._learning.begin():
                return False
            return self._learned()
        if program.begin():
            self._ended()
            return True
        return False

    def _headers(self) -> Optional[Program]:
        """The header rounds of every Bruck exchange of the run that has not learned its lengths,
        one after another, as one program; None where some exchange cannot learn them so."""
        subs = []
        for phase in self._phases:
            if phase.request is None and phase.transfer.program() is None:
                headers = getattr(phase.transfer, "headers", lambda: None)()
                if headers is None:
                    return None
                subs.append(("program", headers))
        return Program(subs) if subs else None

    def _learned(self) -> bool:
        """The headers ran: every Bruck exchange learns, then the run's own program begins;
        whether it already completed."""
        self._learning.free()
        self._learning = None
        for phase in self._phases:
            if hasattr(phase.transfer, "learn") and phase.transfer.program() is None:
                phase.transfer.learn()
        if self.program().begin():
            self._ended()
            return True
        return False

    def test(self) -> bool:
        """Go on without waiting (copies once the requests before them completed); whether done."""
        if not self.busy:
            return True
        if self._learning is not None:
            return self._learning.test() and self._learned()
        program = self.program()
        if program is None:
            self.run()
        elif not program.test():
            return False
        self._ended()
        return True

    def finish(self) -> None:
        """Complete a ``begin``: wait for each step in turn."""
        if not self.busy:
            return
        if self._learning is not None:
            self._learning.finish()
            if self._learned():
                return
        program = self.program()
        if program is None:
            self.run()
        else:
            program.finish()
        self._ended()

    def free_when_done(self) -> None:
        """Free the run once the request it is handed to released it (a run of a request's own)."""
        self._free_when_done = True

    def hold(self) -> None:
        """A request takes this run until it completes (``release``): a ``free`` meanwhile (its
        cache entry rebound or evicted) only marks it to be freed then."""
        self._holders += 1

    @property
    def native(self) -> bool:
        """Whether MPI's own persistent collective moves the whole call (an Alltoallw's flat run)."""
        return self._native is not None

    @property
    def held(self) -> bool:
        """Whether a request holds the run (``hold``) and has not completed."""
        return self._holders > 0

    def release(self) -> None:
        """The request that held the run completed; the run is freed now if that was asked."""
        self._holders -= 1
        if self._free_when_done and not self._holders and not self.busy:
            self.free()

    def _ended(self) -> None:
        self.busy = False
        if self._free_when_done and not self._holders:
            self.free()

    def program(self) -> Optional[Program]:
        """This run compiled (``_call.Program``, built once), persistent runs only: persistent
        requests, learned Bruck and pairwise exchanges as their own programs, and the window
        barrier (a persistent barrier between memory fences); None where a step has none of these
        (yet: a Bruck exchange before its first run, a round-based one on the large-count path)."""
        if self._program is None and self._persistent:
            steps, in_flight = [], []
            for step in self._steps:
                if step[0] == "start":  # linear phases: persistent requests where the library has them
                    if any(ph.request is None for ph in step[1]):
                        return None
                    in_flight = [ph.request for ph in step[1]]
                    steps.append(("start", in_flight))
                    continue
                if step[0] == "wait":
                    steps.append(("wait", in_flight))
                    continue
                if step[0] == "mpi":
                    phases = step[1]
                    if all(ph.request is not None for ph in phases):
                        steps.append(("mpi", [ph.request for ph in phases]))
                        continue
                    subs = [ph.transfer.program() for ph in phases]
                    if any(sub is None for sub in subs):
                        return None
                    steps += [("program", sub) for sub in subs]  # one after another, as ``start`` runs them
                elif step[0] == "barrier":
                    if self.window.barrier_request is None:
                        return None
                    steps.append(("barrier", self.window.barrier_request))
                else:
                    steps.append(step)
            # One round-based exchange alone is its own program (its start and wait split it).
            self._owns_program = not (len(steps) == 1 and steps[0][0] == "program")
            self._program = Program(steps) if self._owns_program else steps[0][1]
        return self._program

    def free(self) -> None:
        """Release the run's requests and programs; a run in progress (``begin``) or held by a
        request (``hold``) is released when it completes."""
        if self.busy or self._holders:
            self._free_when_done = True
            return
        if self._program is not None and self._owns_program:
            self._program.free()
        self._program = None
        for phase in self._phases:
            phase.free()
        self._phases, self._steps = [], []
