"""One call as a step program: what every runner executes and the simulator replays.

A call's **step program** (``StepProgram``, written by a planner in compiled code; its layout is
``csrc/_steps.pxi``) lists, for one rank and one count pattern, every step in order:

- copies: a list of blocks (source offset, destination offset, length; bytes) from one buffer
  to another, the buffers named: ``send`` and ``recv`` (the caller's), ``scratch`` (private) and
  ``stage`` (what lanes receive into: the node's shared window, or private);
- exchanges: an all-to-all on one communicator (the world, the node, or a lane), with every
  peer's send and receive counts and displacements, posted as one MPI all-to-all (``linear``),
  as pairwise rounds or as radix-k Bruck rounds; consecutive exchanges marked ``with_next`` are
  posted together;
- barriers: the node window's barrier.

The program is made once per call by the planner, from the agreed counts. Everything downstream
only reads it: the compiled runner (``hxmpi.comm._call.Runner``: one C loop over the steps,
without the GIL and with no Python between them), ``hxmpi.comm.runs.Run`` (a program bound to
buffers and communicators, persistent or one-shot, with a Python walk for MPIs whose handles
cannot be passed), and the simulator (``hxmpi.sim.schedule.rank_schedule`` turns the same
program's steps into copies and messages between world ranks). So the simulator replays what
runs, and a step order is written in one place: the planner's.

An ``Algorithm`` says which planner makes its program and how its exchanges go: ``flat_program``
(one exchange on the world), ``HierPlanner`` (pack, the lanes, the node phase; below) or
``LeaderPlanner`` (multi-leader: k ranks of each node carry its inter-node traffic).

**Adding an algorithm** is writing its planner: a compiled pass that fills a program's vectors and
emits its steps (``_copy_step``, ``_exchange_step``, ``_emit`` of a barrier, ``_finish``, in
``csrc/_plan.pyx``), then an ``Algorithm`` naming it here. The runners and the simulator need
nothing new unless a step of a new kind appears. ``LeaderPlanner`` was added so: every rank
copies its blocks for other nodes into the node window (a copy ``send`` -> ``stage``), grouped
by leader and destination node; a barrier; leader j of each node exchanges its group's segments
with leader j of every other node on lane j's communicator, from the window into the window (an
exchange ``stage`` -> ``stage``; ranks that lead nothing have no exchange step); a barrier; every
rank copies its blocks out of the window (a copy ``stage`` -> ``recv``), and a last barrier frees
the window. Its planner needs both sides of the node's counts (``node_counts``), and k travels in
the program's radix slot.

The hierarchical layout rules (see ``docs/method.md``): node ids are renumbered by lowest rank;
local rank l of node m is the native member of lane l; on a node with fewer than l+1 ranks lane l
is served by local rank ``l % G_m``, so a rank serves the lanes {l, l+G_m, l+2 G_m, ...} below the
largest node size. Source s (node m, local rank l_s) sends its blocks for node n, in one segment,
on lane l_s; on node n the segment is received by local rank ``l_s % G_n``, its "server".

Bruck rounds come from ``bruck_rounds``, from the rank count alone, so the simulator
(``hxmpi.sim.schedule.bruck_messages``) replays the very rounds ``hxmpi.comm.bruck.Bruck`` sends.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Optional, Sequence, Union

import numpy as np

from ._plan import (
    HEADER_SIZE,
    MODE_MPI,
    MODE_SHM,
    ROW_SIZE,
    Buffer,
    Comm,
    HeaderWord,
    MAX_CHUNKS,
    HierPlanner,
    LeaderPlanner,
    Rounds,
    RowWord,
    StepFlag,
    StepKind,
    StepProgram,
    flat_program,
)

__all__ = ["exclusive_cumsum", "dense_node_ids", "Layout", "Algorithm", "ALGORITHMS", "ALGORITHM", "NODE_PHASES",
           "algorithm_of", "has_hierarchy", "runs_as", "program", "StepProgram", "CopyStep", "ExchangeStep",
           "BarrierStep", "WaitStep", "program_steps", "check_radix", "check_leaders", "check_chunks", "chunks_run",
           "bruck_rounds", "MAX_CHUNKS"]

#: The node phase's implementations: shared memory ("shm") or message passing ("mpi").
NODE_PHASES = {"shm": MODE_SHM, "mpi": MODE_MPI}
#: The world's communicator in a program (the node's is ``Comm.COMM_NODE``; lanes are numbered).
COMM_WORLD = int(Comm.COMM_WORLD)


def exclusive_cumsum(x: np.ndarray) -> np.ndarray:
    """Displacements of consecutive blocks of sizes ``x``: 0, x[0], x[0]+x[1], ... (int64)."""
    out = np.zeros(x.shape[0], dtype=np.int64)
    np.cumsum(x[:-1], out=out[1:])
    return out


def dense_node_ids(ids) -> np.ndarray:
    """Node ids renumbered 0..N-1 in order of each node's lowest rank (int64 array, one per rank)."""
    _, first, inverse = np.unique(np.asarray(ids), return_index=True, return_inverse=True)
    order = np.argsort(first)
    remap = np.empty_like(order)
    remap[order] = np.arange(order.size)
    return remap[inverse.reshape(-1)].astype(np.int64)


class Layout:
    """Static node layout of a world of ranks (no MPI): node map, members, lanes and their servers."""

    def __init__(self, node_of: Sequence[int]):
        self.node_of = dense_node_ids(node_of)
        self.size = int(self.node_of.shape[0])
        self.num_nodes = int(self.node_of.max()) + 1 if self.size else 0
        self.members = [np.flatnonzero(self.node_of == n).astype(np.int64) for n in range(self.num_nodes)]
        self.node_sizes = tuple(int(m.size) for m in self.members)
        self.max_node_size = max(self.node_sizes)
        self.local_of = np.empty(self.size, dtype=np.int64)
        for m in self.members:
            self.local_of[m] = np.arange(m.size)
        self.dest_order = np.concatenate(self.members)
        self.node_start = np.concatenate([[0], np.cumsum(self.node_sizes)]).astype(np.int64)
        self.planner = lru_cache(maxsize=None)(self._planner)
        self._leader_planners = lru_cache(maxsize=None)(self._leader_planner)

    @property
    def hier_possible(self) -> bool:
        """Whether the two phases differ from flat: more than one node and a node of two ranks or more."""
        return has_hierarchy(self.num_nodes, self.max_node_size)

    @property
    def is_regular(self) -> bool:
        """Whether every node has the same number of ranks (``Topology.is_regular``'s rule)."""
        return len(set(self.node_sizes)) == 1

    def runs(self, algorithm: Union[str, "Algorithm"]) -> "Algorithm":
        """The algorithm a call of ``algorithm`` runs on this layout (``runs_as``)."""
        return runs_as(algorithm, self.hier_possible)

    def served_lanes(self, rank: int) -> list[int]:
        """Lanes ``rank`` serves, ascending: its own (its local rank) and stand-ins on small nodes."""
        g = self.node_sizes[self.node_of[rank]]
        return list(range(int(self.local_of[rank]), self.max_node_size, g))

    def lane_server(self, lane: int, node: int) -> int:
        """World rank of ``node`` that is the member of ``lane``."""
        return int(self.members[node][lane % self.node_sizes[node]])

    def comm_members(self, rank: int, comm: Union[str, int]) -> np.ndarray:
        """World ranks of a program's communicator (``ExchangeStep.comm``: "world", "node" or a lane
        number) as ``rank`` sees it, in the communicator's rank order (int64)."""
        if comm == "world":
            return np.arange(self.size, dtype=np.int64)
        if comm == "node":
            return self.members[int(self.node_of[rank])]
        return np.array([self.lane_server(comm, m) for m in range(self.num_nodes)], dtype=np.int64)

    def _planner(self, rank: int) -> HierPlanner:
        node, local = int(self.node_of[rank]), int(self.local_of[rank])
        g, gmax, sizes = self.node_sizes[node], self.max_node_size, self.node_sizes
        srv, ptr = [], [0]
        for j in range(g):  # sources whose segment local rank j receives, in (lane, node) order
            for lane in range(j, gmax, g):
                srv.extend(int(m[lane]) for m in self.members if m.size > lane)
            ptr.append(len(srv))
        lane_src = [[int(self.members[m][lane]) if sizes[m] > lane and m != node else -1
                     for m in range(self.num_nodes)] for lane in self.served_lanes(rank)]
        return HierPlanner(rank, node, local, self.members[node], self.dest_order, self.node_start,
                           np.asarray(srv, dtype=np.int64), np.asarray(ptr, dtype=np.int64),
                           np.asarray(lane_src, dtype=np.int64).reshape(len(lane_src), self.num_nodes),
                           self.served_lanes(rank), self.local_of)

    @property
    def max_leaders(self) -> int:
        """The most leaders per node a multi-leader call may have: the smallest node's size."""
        return min(self.node_sizes)

    def _leader_planner(self, rank: int, leaders: int) -> LeaderPlanner:
        node = int(self.node_of[rank])
        return LeaderPlanner(rank, node, int(self.local_of[rank]), self.members[node], self.dest_order,
                             self.node_start, leaders)

    def planner_for(self, rank: int, algorithm: Union[str, "Algorithm"], radix: Optional[int] = None):
        """The planner of ``rank``'s programs of hierarchical ``algorithm``: ``HierPlanner`` for the
        lanes, ``LeaderPlanner`` at ``radix`` leaders (``check_leaders``) for multi-leader. Cached."""
        if algorithm_of(algorithm).planner == "leaders":
            return self._leader_planners(rank, check_leaders(algorithm_of(algorithm).setting(radix), self.max_leaders))
        return self.planner(rank)

    def rank_program(self, rank: int, algorithm: Union[str, "Algorithm"], counts: np.ndarray, node_phase: str = "shm",
                     radix: Optional[int] = None, uniform: bool = False) -> StepProgram:
        """The step program of ``rank`` in a call of ``algorithm`` (as it runs on this layout,
        ``runs``) on the whole pattern ``counts`` (``counts[src, dst]``, int64 bytes): the one way
        the cost model and the simulator make the programs they price and replay. ``node_phase``:
        "shm" or "mpi"; ``radix``: the algorithm's setting (``Algorithm.setting``: the Bruck radix,
        multi-leader's leaders per node, the pipelined node phase's chunks); ``uniform``:
        an Alltoall's equal blocks. A hierarchical program is its planner's own (``detach`` one
        that must last past the rank's next plan)."""
        algo = self.runs(algorithm)
        sc, rc = counts[rank].copy(), np.ascontiguousarray(counts[:, rank])
        sides = (sc, exclusive_cumsum(sc), rc, exclusive_cumsum(rc))
        if algo.hierarchical:
            return program(algo, sides, self.planner_for(rank, algo, radix), NODE_PHASES[node_phase],
                           self.node_counts(algo, counts, rank), radix)
        return program(algo, sides, radix=radix, uniform=uniform)

    def node_counts(self, algorithm: Union[str, "Algorithm"], counts: np.ndarray, rank: int) -> np.ndarray:
        """What ``algorithm``'s planner takes as ``node_counts`` for ``rank``, from a whole
        pattern (``counts[src, dst]``, bytes): the receive counts of its node's ranks (node size x
        world size), and for multi-leader their send counts before them (node size x 2 world size)."""
        members = self.members[int(self.node_of[rank])]
        rc_node = counts[:, members].T
        if algorithm_of(algorithm).planner == "leaders":
            return np.ascontiguousarray(np.hstack([counts[members, :], rc_node]), dtype=np.int64)
        return np.ascontiguousarray(rc_node, dtype=np.int64)


@dataclass(frozen=True)
class Algorithm:
    """One of hxmpi's algorithms: which planner makes its program, and how its exchanges go.

    ``name``: as calls name it and ``last_stats`` reports it; ``planner``: "flat" (one exchange on
    the world, ``flat_program``), "lanes" (pack, the lanes, the node phase: ``HierPlanner``) or
    "leaders" (multi-leader through the node window: ``LeaderPlanner``);
    ``rounds``: how its world or lane exchanges run (``ROUNDS_LINEAR``: one MPI all-to-all,
    ``ROUNDS_PAIRWISE``, ``ROUNDS_BRUCK``: radix-k Bruck).
    """
    name: str
    planner: str
    rounds: int

    @property
    def hierarchical(self) -> bool:
        """Whether it runs over nodes (lanes, the node's counts): flat where the layout has none."""
        return self.planner != "flat"

    @property
    def radixed(self) -> bool:
        """Whether a radix is one of its settings (Bruck rounds)."""
        return self.rounds == Rounds.ROUNDS_BRUCK

    @property
    def chunked(self) -> bool:
        """Whether its setting is the chunks of a pipelined node phase (linear lanes; carried where
        a radix is; the shared-memory node phase pipelines, the message-passing one does not)."""
        return self.planner == "lanes" and self.rounds == Rounds.ROUNDS_LINEAR

    def setting(self, value: Optional[int] = None) -> int:
        """The setting its planner takes in the radix slot: ``value``, or where None its default
        (a Bruck radix of 2, 2 leaders per node, one chunk); 0 for an algorithm that takes none."""
        if not (self.radixed or self.led or self.chunked):
            return 0
        if value is None:
            return 1 if self.chunked else 2
        return int(value)

    @property
    def setting_name(self) -> Optional[str]:
        """What its setting is called (``last_stats`` reports it so): "radix", "leaders",
        "chunks", or None."""
        return "leaders" if self.led else "radix" if self.radixed else "chunks" if self.chunked else None

    @property
    def led(self) -> bool:
        """Whether its setting is the leaders per node (multi-leader; carried where a radix is)."""
        return self.planner == "leaders"

    @property
    def cpu_key(self) -> str:
        """Its name in a CPU-per-path table: multi-leader runs the hierarchical paths' code and is
        charged hier's CPU."""
        return "hier" if self.led else self.name

    @property
    def code(self) -> int:
        """What the agreement carries for it: its index in ``ALGORITHM_CHOICES``."""
        return ALGORITHM_CHOICES.index(self.name)

    def __str__(self) -> str:
        return self.name


_ALL = (Algorithm("flat", "flat", Rounds.ROUNDS_LINEAR), Algorithm("bruck", "flat", Rounds.ROUNDS_BRUCK),
        Algorithm("hier", "lanes", Rounds.ROUNDS_LINEAR),
        Algorithm("hier_pairwise", "lanes", Rounds.ROUNDS_PAIRWISE),
        Algorithm("hier_bruck", "lanes", Rounds.ROUNDS_BRUCK),
        Algorithm("hier_leaders", "leaders", Rounds.ROUNDS_LINEAR))
#: hxmpi's algorithms by name: flat Alltoallv, flat radix-k Bruck, hier with linear
#: (Ialltoallv), pairwise or Bruck lanes, and multi-leader (k leaders per node).
ALGORITHM = {a.name: a for a in _ALL}
#: Their names.
ALGORITHMS = tuple(ALGORITHM)
#: What a call may ask for: an algorithm, or "auto" (the cost model picks). A name's index in this
#: tuple is the code the agreement carries.
ALGORITHM_CHOICES = (*ALGORITHMS, "auto")
#: Bytes of a Bruck header entry (one int64 length per slot, first run only).
HEADER_BYTES = 8


def has_hierarchy(num_nodes: int, max_node_size: int) -> bool:
    """Whether a layout of ``num_nodes`` nodes, the largest of ``max_node_size`` ranks, has a
    hierarchy: more than one node and a node of two ranks or more."""
    return num_nodes > 1 and max_node_size > 1


def runs_as(algorithm: Union[str, "Algorithm"], hier_possible: bool) -> "Algorithm":
    """What a call of ``algorithm`` runs: the hierarchical algorithms run flat on a layout without
    a hierarchy (``hier_possible`` False; one node, or nodes of one rank). The one place this rule
    is written: the communicator, the cost model and the simulator all ask it."""
    algo = algorithm_of(algorithm)
    return ALGORITHM["flat"] if algo.hierarchical and not hier_possible else algo


def algorithm_of(name: Union[str, Algorithm]) -> Algorithm:
    """The ``Algorithm`` of a name (or the algorithm itself); ValueError naming the choices."""
    if isinstance(name, Algorithm):
        return name
    found = ALGORITHM.get(name)
    if found is None:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {name!r}")
    return found


def program(algorithm: Algorithm, sides: tuple, planner: Optional[HierPlanner] = None, mode: int = MODE_SHM,
            node_counts: Optional[np.ndarray] = None, radix: Optional[int] = None, uniform: bool = False) -> StepProgram:
    """The step program of one call on one rank: ``sides`` (send counts, send displacements,
    receive counts, receive displacements; int64 bytes, one per rank). A hierarchical algorithm
    needs the rank's ``planner`` (``Layout.planner``), the node phase ``mode`` and
    ``node_counts`` (what every rank of the node receives from every rank, node size x world
    size; for multi-leader, ``Layout.node_counts``'s send and receive counts); its program is the
    planner's own (``StepProgram.detach`` for one that lasts), ``planner`` the algorithm's
    (``Layout.planner_for``). ``radix``: the algorithm's setting (``Algorithm.setting``: the Bruck
    radix, multi-leader's leaders per node, the pipelined node phase's chunks; None: its default).
    ``uniform``: an Alltoall's equal blocks (flat: MPI_Alltoall)."""
    radix = algorithm.setting(radix)
    if algorithm.hierarchical:
        return planner.plan(mode, *sides, node_counts, algorithm.rounds, radix)
    return flat_program(algorithm.rounds, radix, uniform, *sides)


@dataclass(frozen=True)
class CopyStep:
    """Copy blocks (bytes) from buffer ``src`` to buffer ``dst`` ("send", "recv", "scratch",
    "stage"); ``what``: "pack", "self", "own", "out", "repack" or "unpack"."""
    what: str
    src: str
    dst: str
    src_off: np.ndarray
    dst_off: np.ndarray
    length: np.ndarray

    @property
    def nbytes(self) -> int:
        """Bytes it moves."""
        return int(self.length.sum())


@dataclass(frozen=True)
class ExchangeStep:
    """An all-to-all on ``comm`` ("world", "node", or a lane number) from buffer ``src`` to
    ``dst``, each peer's bytes (in the communicator's rank order). ``rounds``: "linear" (one MPI
    all-to-all), "pairwise" or "bruck" (at ``radix``); ``with_next``: posted with the next
    exchange; ``blocking``: one blocking call where the runner runs it whole (else nonblocking,
    then waited for); ``uniform``: MPI_Alltoall; ``in_flight`` (on a group's last exchange): left
    in flight while the steps after it run, up to the next ``WaitStep``."""
    comm: Union[str, int]
    rounds: str
    radix: int
    src: str
    dst: str
    send_counts: np.ndarray
    send_displs: np.ndarray
    recv_counts: np.ndarray
    recv_displs: np.ndarray
    with_next: bool
    blocking: bool
    uniform: bool
    in_flight: bool = False


@dataclass(frozen=True)
class BarrierStep:
    """The node window's barrier: every rank of the node, with memory fences."""


@dataclass(frozen=True)
class WaitStep:
    """Wait for the exchanges left in flight (``ExchangeStep.in_flight``)."""


Step = Union[CopyStep, ExchangeStep, BarrierStep, WaitStep]
_BUFFERS = {Buffer.BUF_SEND: "send", Buffer.BUF_RECV: "recv", Buffer.BUF_SCRATCH: "scratch",
            Buffer.BUF_STAGE: "stage"}
_COPIED = ("pack", "self", "own", "out", "repack", "unpack")  # ``Copied``'s order
_ROUNDS = {Rounds.ROUNDS_LINEAR: "linear", Rounds.ROUNDS_PAIRWISE: "pairwise", Rounds.ROUNDS_BRUCK: "bruck"}
_COMMS = {Comm.COMM_WORLD: "world", Comm.COMM_NODE: "node"}


def program_steps(prog: StepProgram) -> tuple:
    """The program's steps as typed records, in order; their arrays are views of its words
    (read-only)."""
    w = prog.words.view()
    w.flags.writeable = False
    rows = int(w[HeaderWord.ROWS])
    out = []
    for i in range(rows):
        row = w[HEADER_SIZE + i * ROW_SIZE:HEADER_SIZE + (i + 1) * ROW_SIZE]
        kind, n = int(row[RowWord.KIND]), int(row[RowWord.N])
        vec = [w[int(row[v]):int(row[v]) + n] for v in (RowWord.V0, RowWord.V1, RowWord.V2, RowWord.V3)]
        src, dst = _BUFFERS.get(int(row[RowWord.SRC])), _BUFFERS.get(int(row[RowWord.DST]))
        if kind == StepKind.STEP_COPY:
            out.append(CopyStep(_COPIED[int(row[RowWord.WHAT])], src, dst, *vec[:3]))
        elif kind == StepKind.STEP_EXCHANGE:
            comm, flags = int(row[RowWord.COMM]), int(row[RowWord.FLAGS])
            out.append(ExchangeStep(_COMMS.get(comm, comm), _ROUNDS[int(row[RowWord.ROUNDS])],
                                    int(row[RowWord.RADIX]), src, dst, *vec, bool(flags & StepFlag.WITH_NEXT),
                                    bool(flags & StepFlag.BLOCKING), bool(flags & StepFlag.UNIFORM),
                                    bool(flags & StepFlag.IN_FLIGHT)))
        elif kind == StepKind.STEP_WAIT:
            out.append(WaitStep())
        else:
            out.append(BarrierStep())
    return tuple(out)


def check_leaders(leaders, most: int) -> int:
    """The leaders per node to use where nodes have at least ``most`` ranks (values above act as
    ``most``); ValueError if not an integer >= 1."""
    if isinstance(leaders, bool) or not isinstance(leaders, (int, np.integer)) or leaders < 1:
        raise ValueError(f"leaders must be an integer >= 1, got {leaders!r}")
    return int(min(leaders, max(most, 1)))


def check_chunks(chunks) -> int:
    """The chunks of a pipelined node phase (0: the cost model's pick); ValueError unless an
    integer from 0 to ``MAX_CHUNKS``."""
    if isinstance(chunks, bool) or not isinstance(chunks, (int, np.integer)) or not 0 <= chunks <= MAX_CHUNKS:
        raise ValueError(f"chunks must be an integer from 0 (the cost model picks) to {MAX_CHUNKS}, got {chunks!r}")
    return int(chunks)


def chunks_run(chunks: int, node_sizes) -> int:
    """The chunks a pipelined node phase runs when ``chunks`` are asked on nodes of ``node_sizes``
    ranks: at most the largest node's ranks, as a chunk is a group of a node's ranks and more
    would be empty on every lane, each still costing a wait and a node barrier
    (``HierPlanner.plan`` runs no more)."""
    return min(int(chunks), max(node_sizes))


def check_radix(radix, size: int) -> int:
    """The radix to use on ``size`` ranks (values above ``size`` act as ``size``); ValueError if < 2."""
    if isinstance(radix, bool) or not isinstance(radix, (int, np.integer)) or radix < 2:
        raise ValueError(f"radix must be an integer >= 2, got {radix!r}")
    return int(min(radix, max(size, 2)))


def bruck_rounds(size: int, radix: int) -> tuple[tuple[tuple[int, np.ndarray], ...], ...]:
    """Per round, the (distance, slot indices) of each non-empty digit value on ``size`` ranks.

    Slot i (the block for rank +i) moves in round x, by z * radix**x, when its base-radix digit x is z.
    Computed once per (size, radix): every ``Bruck`` of a one-shot miss builds from it. The slot
    arrays are read-only, as they are shared.
    """
    return _bruck_rounds(size, check_radix(radix, size))


@lru_cache(maxsize=64)
def _bruck_rounds(size: int, radix: int) -> tuple:
    idx = np.arange(size, dtype=np.int64)
    rounds, dist = [], 1
    while dist < size:
        digit = (idx // dist) % radix
        group = []
        for z in range(1, radix):
            if z * dist < size:
                slots = np.flatnonzero(digit == z).astype(np.int64)
                slots.flags.writeable = False
                group.append((z * dist, slots))
        rounds.append(tuple(group))
        dist *= radix
    return tuple(rounds)
