"""HierComm: Alltoall/Alltoallv, flat or hierarchical (lanes, then nodes), byte-exact with MPI_Alltoallv.

The hierarchical algorithm (``docs/method.md``; planner in ``hxmpi/plan.py``, execution in
``hxmpi/execute.py``):
  pack     gather this rank's blocks for other nodes, by destination node        (Cython copy_blocks)
  phase 1  Alltoallv on every lane this rank serves: one segment per node (inter-node)
  node     shared memory: phase 1 lands in a node window; each rank copies its blocks out of it.
           message passing (fallback, env HXMPI_NODE_PHASE=mpi): repack, Alltoallv on the node, unpack.

Before any data moves, one collective agrees on everything every rank must share: whether any rank's
input is bad, the per-call settings (algorithm, validate), whether counts need the large-count path,
and, up to ``FUSED_AGREEMENT_MAX_RANKS`` ranks, the whole count matrix (which validates every pair and
gives the node phase its counts). A persistent request (``Alltoallv_init``) agrees and plans once;
each ``Start`` then only copies and communicates.

All counts and displacements are int64 bytes. Bad input raises ``ExchangeError`` on every rank.
"""
from __future__ import annotations

import os
import zlib
from typing import Optional

import numpy as np
from mpi4py import MPI

from . import transfer
from ._packing import check_table
from .costmodel import CostModel
from .errors import ExchangeError, HxmpiError, agree, raise_gathered
from .execute import FlatRun, HierRun, NodeWindow
from .msgspec import Side, exclusive_cumsum, int_vector, parse_alltoall, parse_alltoallv
from .plan import NODE_PHASES, Layout
from .topology import Topology

ALGORITHMS = ("flat", "hier", "auto")
ENV_NODE_PHASE = "HXMPI_NODE_PHASE"
# Up to this many ranks, the agreement is one Allgather of all counts (2 * size int64 per rank)
# instead of an Alltoall plus an Allreduce: one collective less, and it feeds the hier path.
FUSED_AGREEMENT_MAX_RANKS = 256
# Agreement row: problem flag, (unused), buffer extent, then the settings every rank must share:
# algorithm code, validate flag, row dtype code, bytes per count unit (row bytes for alltoallv, else
# 1); then the send counts and the receive counts.
_HEAD = 7
_ALGO_CODE = {name: i for i, name in enumerate(ALGORITHMS)}


class PlanStateError(HxmpiError, RuntimeError):
    """A persistent request used out of order: Start twice, Wait without Start, or after Free."""


class HierComm:
    """All-to-all over a Topology: flat (one MPI_Alltoallv) or hierarchical (lanes, then nodes).

    ``algorithm`` is "flat", "hier" or "auto" (per call overridable); "auto" asks the cost model,
    read from ``tuning`` (a calibration file) or env HXMPI_TUNING, else built-in defaults.
    ``node_phase`` is "auto" (shared memory where every node's ranks share memory), "shm" or "mpi";
    env HXMPI_NODE_PHASE sets it when not given. Results equal ``comm.Alltoallv`` byte for byte.
    Bad input raises ``ExchangeError`` on every rank. Collective.
    """

    def __init__(self, comm: MPI.Intracomm = MPI.COMM_WORLD, ranks_per_node: Optional[int] = None,
                 node_of=None, algorithm: str = "auto", topology: Optional[Topology] = None,
                 tuning: Optional[str] = None, node_phase: Optional[str] = None):
        # A bad name is agreed below, with the node phase: a rank raising here alone would leave
        # the others waiting in Topology's collectives.
        bad_algorithm = None if algorithm in ALGORITHMS else \
            f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}"
        self.algorithm = algorithm
        self.topology = topology if topology is not None else Topology(comm, ranks_per_node, node_of)
        self.comm = self.topology.comm
        t = self.topology
        #: the cost model behind "auto" (same file on every rank, or the same defaults).
        self.cost_model = CostModel.from_env_or_default(tuning)
        self.layout = Layout(t.node_of)
        self._hier_possible = self.layout.hier_possible
        self._planner = self.layout.planner(t.rank) if self._hier_possible else None
        #: "shm" or "mpi": how the hierarchical path's node phase moves data.
        self.node_phase = self._agree_settings(node_phase, bad_algorithm)
        self._mode = NODE_PHASES[self.node_phase]
        self._window = NodeWindow(t.intra) if self.node_phase == "shm" else None
        self._choices: dict[int, str] = {}
        self._stats = None  # what last_stats is computed from, kept cheap on the hot path
        self._buffers: dict[str, np.ndarray] = {}
        self._node_of = np.asarray(t.node_of, dtype=np.int64)
        self._members = self.layout.members[t.node]
        size = self.comm.size
        if size <= FUSED_AGREEMENT_MAX_RANKS:  # reused by every call: no allocation on the hot path
            self._row = np.zeros(_HEAD + 2 * size, dtype=np.int64)
            self._table = np.empty((size, self._row.size), dtype=np.int64)

    def _agree_settings(self, requested: Optional[str], problem: Optional[str]) -> str:
        """Agree on the constructor's settings; return the node phase every rank uses ("shm" only
        where every node's ranks share memory). ``problem``: this rank's bad algorithm, if any."""
        requested = requested if requested is not None else os.environ.get(ENV_NODE_PHASE, "auto")
        if problem is None and requested not in ("auto", *NODE_PHASES):
            problem = f"node_phase must be 'auto', 'shm' or 'mpi', got {requested!r}"
        shared = True
        if self._hier_possible:  # can the node's ranks map one window? (not if a node spans hosts)
            probe = self.topology.intra.Split_type(MPI.COMM_TYPE_SHARED)
            shared = probe.size == self.topology.intra.size
            probe.Free()
        views = self.comm.allgather((requested, shared, problem))
        if problem is None and len({r for r, _, _ in views}) > 1:
            problem = f"node_phase {requested!r} differs between ranks"
        agree(self.comm, problem, ExchangeError)
        everywhere = all(s for _, s, _ in views)
        if requested == "shm" and not everywhere:
            raise ExchangeError("node_phase='shm', but the ranks of a node do not all share memory")
        return "shm" if requested != "mpi" and everywhere else "mpi"

    # ------------------------------------------------------------------ public API
    def Alltoallv(self, sendbuf, recvbuf, algorithm: Optional[str] = None, validate: bool = True) -> None:
        """All to All Scatter/Gather Vector, with mpi4py buffer specs (counts and displs in elements)."""
        size = self.comm.size
        s, r, problem = parse_alltoallv(sendbuf, recvbuf, size)
        self._execute(self._bind(s, r, algorithm, validate, problem, persistent=False))

    def Alltoall(self, sendbuf, recvbuf, algorithm: Optional[str] = None, validate: bool = True) -> None:
        """All to All Scatter/Gather: equal blocks of ``len(buf) / size`` elements (or a given count)."""
        size = self.comm.size
        s, r, problem = parse_alltoall(sendbuf, recvbuf, size)
        self._execute(self._bind(s, r, algorithm, validate, problem, persistent=False))

    def Alltoallv_init(self, sendbuf, recvbuf, algorithm: Optional[str] = None) -> "ExchangeRequest":
        """Persistent All to All Scatter/Gather Vector (MPI-4 style): validate, agree and plan once.

        Each ``Start()``/``Wait()`` of the returned request moves what the same buffers hold then
        (with ``MPI.IN_PLACE``, what the receive buffer holds at ``Start``).
        """
        return self._init(parse_alltoallv, sendbuf, recvbuf, algorithm)

    def Alltoall_init(self, sendbuf, recvbuf, algorithm: Optional[str] = None) -> "ExchangeRequest":
        """Persistent All to All Scatter/Gather (equal blocks); see ``Alltoallv_init``."""
        return self._init(parse_alltoall, sendbuf, recvbuf, algorithm)

    def _init(self, parse, sendbuf, recvbuf, algorithm) -> "ExchangeRequest":
        s, r, problem = parse(sendbuf, recvbuf, self.comm.size)
        run = self._bind(s, r, algorithm, True, problem, persistent=True)
        # In place, the send side is a copy of the receive blocks: refreshed at every Start.
        return ExchangeRequest(self, run, (r.view, s.view) if sendbuf is MPI.IN_PLACE else None)

    def alltoallv(self, array, counts, algorithm: Optional[str] = None,
                  validate: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Send ``counts[d]`` consecutive rows of ``array`` (axis 0) to rank d; return (rows, recv counts).

        Rows arrive ordered by source rank. Counts, dtype and row shape are agreed for you (one
        collective); every rank must pass the same dtype and row shape.
        """
        size = self.comm.size
        array = np.ascontiguousarray(array)
        c, problem = int_vector(counts, size, "counts")
        row_shape = array.shape[1:] if array.ndim else ()
        row_bytes = int(array.itemsize * int(np.prod(row_shape, dtype=np.int64)))
        if problem is None and array.ndim == 0:
            problem = "array must have at least one dimension (rows along axis 0)"
        if problem is None and int(c.sum()) != array.shape[0]:
            problem = f"counts sum to {int(c.sum())} rows but the array has {array.shape[0]}"
        kind = f"{array.dtype.str if array.dtype.names is None else array.dtype.descr} rows of shape {row_shape}"
        s = Side(np.frombuffer(array, np.uint8) if array.nbytes else np.empty(0, np.uint8),
                 c * row_bytes if problem is None else None,
                 exclusive_cumsum(c) * row_bytes if problem is None else None)
        rows = (zlib.crc32(kind.encode()), row_bytes, kind, c)
        algo, big, rc_node, rcounts = self._agree(s, None, problem, algorithm, validate, rows=rows)
        out = np.empty((int(rcounts.sum()),) + row_shape, dtype=array.dtype)
        r = Side(out.reshape(-1).view(np.uint8) if out.nbytes else np.empty(0, np.uint8),
                 rcounts * row_bytes, exclusive_cumsum(rcounts) * row_bytes)
        self._execute(self._run_for(algo, s, r, big, rc_node, persistent=False))
        return out, rcounts

    @property
    def scratch_bytes(self) -> int:
        """Scratch memory of one-shot calls on this rank: private buffers plus its share of the window (bytes)."""
        window = self._window.view.shape[0] // self.topology.intra.size if self._window else 0
        return sum(b.nbytes for b in self._buffers.values()) + window

    # ------------------------------------------------------------------ core
    def _buffer(self, name: str, nbytes: int) -> np.ndarray:
        """A cached scratch buffer of at least ``nbytes``; grown only when a call needs more."""
        buf = self._buffers.get(name)
        if buf is None or buf.shape[0] < nbytes:
            self._buffers.pop(name, None)  # drop the old one before allocating the new one
            buf = np.empty(max(nbytes, 1), dtype=np.uint8)
            self._buffers[name] = buf
        return buf

    def _execute(self, run) -> None:
        run.run()
        self._stats = run.stats

    def _bind(self, s: Side, r: Side, algorithm, validate, problem: Optional[str], persistent: bool):
        """Agree on everything, then bind the chosen algorithm's run to the buffers."""
        algo, big, rc_node, _ = self._agree(s, r, problem, algorithm, validate)
        return self._run_for(algo, s, r, big, rc_node, persistent)

    def _run_for(self, algo: str, s: Side, r: Side, big: bool, rc_node, persistent: bool):
        if algo == "hier" and self._hier_possible:
            if rc_node is None:  # large worlds: the node's receive counts, from the node
                rc_node = np.empty((len(self._members), self.comm.size), dtype=np.int64)
                self.topology.intra.Allgather(r.counts, rc_node)
            if persistent:
                own: dict[str, np.ndarray] = {}
                scratch = lambda name, n: own.setdefault(name, np.empty(max(n, 1), np.uint8))  # noqa: E731
                window = NodeWindow(self.topology.intra) if self._window else None
                return HierRun(self, s, r, big, rc_node, True, scratch, window)
            return HierRun(self, s, r, big, rc_node, False, self._buffer, self._window)
        return FlatRun(self.comm, s, r, big, persistent)

    def _agree(self, s: Side, r: Optional[Side], problem: Optional[str], algorithm, validate, rows=None):
        """One agreement for the call; returns (algorithm, big, node receive counts or None, my receive counts).

        ``r`` is None for ``alltoallv`` (``rows`` = (dtype code, row bytes, description, row counts)):
        the receive counts (in rows) are learned here instead of checked.
        """
        comm, size = self.comm, self.comm.size
        code = _ALGO_CODE.get(algorithm if algorithm is not None else self.algorithm, -1)
        if problem is None and code < 0:
            problem = f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}"
        unit = rows[1] if rows is not None else 1
        if size <= FUSED_AGREEMENT_MAX_RANKS:
            table = self._allgather_counts(s, r, problem, code, validate, rows, unit)
            status, max_total, max_extent, a, b = check_table(table, _HEAD, 4, r is not None and validate, 6)
            sent = table[:, _HEAD:_HEAD + size]
            if status == 1:
                raise_gathered(comm, problem, ExchangeError)
            if status == 2:
                self._settings_differ(table[:, 3], table[:, 4], rows)
            if status == 3:
                raise ExchangeError(_pair_mismatch(sent, table[:, _HEAD + size:]))  # same text everywhere
            if r is None:
                mine = np.ascontiguousarray(sent[:, comm.rank])
                rc_node = np.ascontiguousarray(sent[:, self._members].T) * unit if code != 0 else None
            else:
                mine = None
                rc_node = np.ascontiguousarray(table[self._members, _HEAD + size:]) if code != 0 else None
        else:
            mine, problem = self._exchange_counts(s, r, problem, validate, rows)
            # One small Allreduce settles, identically on every rank: any failure, the settings
            # (max and negated min), and the sizes that decide the large-count path.
            extent = 0 if problem else max(s.view.shape[0], r.view.shape[0] if r is not None else 0)
            total = 0 if problem else int(s.counts.sum())
            v = 1 if validate else 0
            agreed = np.array([1 if problem else 0, total, extent, code, -code, v, -v], dtype=np.int64)
            comm.Allreduce(MPI.IN_PLACE, agreed, op=MPI.MAX)
            if agreed[0]:
                raise_gathered(comm, problem, ExchangeError)
            if agreed[3] != -agreed[4] or agreed[5] != -agreed[6]:
                self._settings_differ(agreed[3:5] * [1, -1], agreed[5:7] * [1, -1], None)
            max_total, max_extent = int(agreed[1]), int(agreed[2])
            rc_node = None
        algo = ALGORITHMS[code]
        big = transfer.needs_big(max_extent, max_total, size)
        if algo == "auto":  # from agreed numbers only, so every rank decides alike
            algo = self._choose(max_total // size)
        return algo, big, rc_node, mine

    def _allgather_counts(self, s: Side, r: Optional[Side], problem, code: int, validate, rows,
                          unit: int) -> np.ndarray:
        """Every rank's agreement row (head, send counts, receive counts), in reused buffers."""
        size = self.comm.size
        row, table = self._row, self._table
        if problem:
            row.fill(-1)
            row[0] = 1
        else:
            row[0] = 0
            row[2] = max(s.view.shape[0], r.view.shape[0] if r is not None else 0)
            row[_HEAD:_HEAD + size] = s.counts if r is not None else rows[3]
            row[_HEAD + size:] = r.counts if r is not None else -1
        row[3], row[4] = code, 1 if validate else 0
        row[5], row[6] = (rows[0], unit) if rows is not None else (0, unit)
        self.comm.Allgather(row, table)
        return table

    def _exchange_counts(self, s: Side, r: Optional[Side], problem, validate, rows):
        """Large worlds: every receiver learns what each sender announces (one Alltoall) and checks it."""
        size, me = self.comm.size, self.comm.rank
        width = 3 if rows else 1
        announced = np.full((size, width), -1, dtype=np.int64)
        if not problem:
            announced[:, 0] = s.counts if not rows else rows[3]
            if rows:
                announced[:, 1], announced[:, 2] = rows[0], rows[1]
        got = np.empty_like(announced)
        self.comm.Alltoall(announced, got)
        if problem:
            return None, problem
        if rows:
            bad = np.flatnonzero((got[:, 1] != rows[0]) | (got[:, 2] != rows[1]))
            if bad.size:
                return None, (f"rank {int(bad[0])} sends other rows than this rank's {rows[2]} "
                              f"(dtype and row shape must match on every rank)")
            return got[:, 0].copy(), None
        if validate and got[:, 0].tobytes() != r.counts.tobytes():
            bad = np.flatnonzero(got[:, 0] != r.counts)
            parts = [f"rank {int(p)} sends {int(got[p, 0])} B to rank {me}, which expects "
                     f"{int(r.counts[p])} B" for p in bad[:3]]
            return None, "; ".join(parts) + (f" (+{bad.size - 3} more pairs)" if bad.size > 3 else "")
        return r.counts, None

    def _settings_differ(self, algos: np.ndarray, validates: np.ndarray, rows) -> None:
        """Raise the same ExchangeError on every rank: ranks passed different per-call settings."""
        parts = []
        if (algos != algos[0]).any():
            parts.append("algorithm differs between ranks (" + ", ".join(
                sorted({repr(ALGORITHMS[int(a)]) for a in algos})) + ")")
        if (validates != validates[0]).any():
            parts.append("validate differs between ranks")
        if rows is not None and not parts:
            # Every rank saw the same table, so every rank takes this collective branch.
            kinds = self.comm.allgather(rows[2])
            odd = [r for r, k in enumerate(kinds) if k != kinds[0]]
            parts.append(f"rank {odd[0]} sends {kinds[odd[0]]} but rank 0 sends {kinds[0]} "
                         f"(dtype and row shape must match on every rank)")
        raise ExchangeError("; ".join(parts))

    def _choose(self, mean_block: int) -> str:
        """The cost model's pick for this layout and block size, memoised (it is on the hot path)."""
        algo = self._choices.get(mean_block)
        if algo is None:
            if len(self._choices) > 4096:
                self._choices.clear()
            t = self.topology
            algo = self._choices[mean_block] = self.cost_model.choose(t.num_nodes, t.max_node_size, mean_block,
                                                                      self.node_phase)
        return algo

    @property
    def last_stats(self) -> dict:
        """Messages and bytes of the last call: per phase, across node boundaries, and copied (bytes)."""
        if self._stats is None:
            return {}
        t, me = self.topology, self.comm.rank
        if self._stats[0] == "flat":
            counts = self._stats[1]
            live = counts > 0
            live[me] = False
            remote = live & (self._node_of != self._node_of[me])
            return {"algorithm": "flat",
                    "flat": {"messages": int(live.sum()), "bytes": int(counts[live].sum())},
                    "inter_node": {"messages": int(remote.sum()), "bytes": int(counts[remote].sum())},
                    "copy_bytes": 0}
        _, node_bytes, p2_counts, copied = self._stats
        own = node_bytes.copy()
        own[t.node] = 0
        inter = {"messages": int(np.count_nonzero(own)), "bytes": int(own.sum())}
        if p2_counts is None:
            intra = {"messages": 0, "bytes": 0}
        else:
            p2_out = p2_counts.copy()
            p2_out[t.local_rank] = 0
            intra = {"messages": int(np.count_nonzero(p2_out)), "bytes": int(p2_out.sum())}
        return {"algorithm": "hier", "node_phase": self.node_phase, "inter": inter, "intra": intra,
                "inter_node": dict(inter), "copy_bytes": int(copied)}

    def free(self) -> None:
        """Free the node window and the Topology's communicators (collective)."""
        if self._window is not None:
            self._window.free()
        self.topology.free()


def _pair_mismatch(sent: np.ndarray, expected: np.ndarray) -> str:
    src, dst = np.nonzero(sent != expected.T)
    parts = [f"rank {int(a)} sends {int(sent[a, b])} B to rank {int(b)}, which expects "
             f"{int(expected[b, a])} B" for a, b in zip(src[:3], dst[:3])]
    return "; ".join(parts) + (f" (+{src.size - 3} more pairs)" if src.size > 3 else "")


class ExchangeRequest:
    """A persistent all-to-all (as mpi4py's ``Prequest``): ``Start()``, ``Wait()``, ``Free()``.

    Agreed, validated and planned once by ``HierComm.Alltoallv_init``; each Start/Wait moves what
    the bound buffers hold at Start. Collective: every rank starts, waits and frees its requests in
    the same order. Usable as a context manager (frees on exit).
    """

    def __init__(self, hc: HierComm, run, in_place: Optional[tuple] = None):
        self._hc, self._run, self._active = hc, run, False
        self._in_place = in_place  # (receive view, send copy) for MPI.IN_PLACE

    @property
    def algorithm(self) -> str:
        """The algorithm this request runs: "flat" or "hier"."""
        return self._run.stats[0]

    def Start(self) -> None:
        """Start one exchange of the bound buffers' current contents."""
        if self._run is None:
            raise PlanStateError("this persistent exchange was freed; create a new one with Alltoallv_init")
        if self._active:
            raise PlanStateError("Start() called twice without Wait(); call Wait() first")
        if self._in_place is not None:
            recv, send = self._in_place
            send[:] = recv[:send.shape[0]]
        self._run.start()
        self._active = True

    def Wait(self) -> None:
        """Complete the exchange started by ``Start()``."""
        if self._run is None:
            raise PlanStateError("this persistent exchange was freed; create a new one with Alltoallv_init")
        if not self._active:
            raise PlanStateError("Wait() without Start(); call Start() first")
        self._active = False
        self._run.wait()
        self._hc._stats = self._run.stats

    def Free(self) -> None:
        """Release the request's MPI requests, datatypes and buffers (waits for an active exchange first)."""
        if self._run is None:
            return
        if self._active:
            self.Wait()
        self._run.free()
        window = getattr(self._run, "window", None)
        if window is not None and window is not self._hc._window:
            window.free()
        self._run = None

    def __enter__(self) -> "ExchangeRequest":
        return self

    def __exit__(self, *exc) -> None:
        self.Free()
