"""HierComm: Alltoall/Alltoallv, flat or hierarchical (lanes, then nodes), byte-exact with MPI_Alltoallv.

The hierarchical algorithm (source A):
  pack     gather this rank's blocks by destination node                 (Cython copy_blocks)
  phase 1  Alltoallv on every lane this rank serves: one segment per node (inter-node)
  repack   regroup the received segments by destination local rank      (Cython copy_blocks)
  phase 2  Alltoallv on the node communicator                            (intra-node)
  unpack   scatter the blocks to the caller's receive displacements      (Cython copy_blocks)
Phase 2 needs to know what every rank of the node receives from every source; one Allgather of the
receive counts on the node communicator provides it, before any data moves.

All counts and displacements are handled as int64 bytes. MPI calls whose counts or displacements
exceed a C int use Alltoallw with one struct datatype per peer (64-bit displacements), because
Open MPI 5 has no MPI-4 large-count routines.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
from mpi4py import MPI

from . import transfer
from ._packing import copy_blocks
from .costmodel import CostModel
from .errors import ExchangeError, raise_gathered
from .msgspec import Side, exclusive_cumsum, int_vector, parse_uniform, parse_vector
from .topology import Topology
from .transfer import Transfer

ALGORITHMS = ("flat", "hier", "auto")

# Up to this many ranks, validation is one Allgather of all counts (2 * size int64 per rank)
# instead of an Alltoall plus an Allreduce: one collective less, and it feeds the hier path.
FUSED_AGREEMENT_MAX_RANKS = 256


class HierComm:
    """All-to-all over a Topology: flat (one MPI_Alltoallv) or hierarchical (lanes, then nodes).

    ``algorithm`` is "flat", "hier" or "auto" (per call overridable); "auto" asks the cost model,
    read from ``tuning`` (a calibration file) or env HXMPI_TUNING, else built-in defaults. Results
    equal ``comm.Alltoallv`` byte for byte. Bad input raises ``ExchangeError`` on every rank.
    Collective.
    """

    def __init__(self, comm: MPI.Intracomm = MPI.COMM_WORLD, ranks_per_node: Optional[int] = None,
                 node_of=None, algorithm: str = "auto", topology: Optional[Topology] = None,
                 tuning: Optional[str] = None):
        self.algorithm = self._check_algorithm(algorithm)
        self.topology = topology if topology is not None else Topology(comm, ranks_per_node, node_of)
        self.comm = self.topology.comm
        #: the cost model behind "auto" (same file on every rank, or the same defaults).
        self.cost_model = CostModel.from_env_or_default(tuning)
        self._choices: dict[int, str] = {}
        self._stats = None  # what last_stats is computed from, kept cheap on the hot path
        self._buffers: dict[str, np.ndarray] = {}
        self._plan()

    # ------------------------------------------------------------------ static plan
    def _plan(self) -> None:
        t = self.topology
        self._hier_possible = t.num_nodes > 1 and t.max_node_size > 1
        sizes = np.asarray(t.node_sizes, dtype=np.int64)
        members = [np.asarray(m, dtype=np.int64) for m in t.node_members]
        self._node_of = np.asarray(t.node_of, dtype=np.int64)
        self._node_members = members[t.node]
        self._dest_order = np.concatenate(members)
        self._node_start = exclusive_cumsum(sizes)
        # Sources carried by lane l: the native member (n, l) of every node with more than l ranks.
        lane_sources = [np.asarray([m[lane] for m in members if m.size > lane], dtype=np.int64)
                        for lane in range(t.max_node_size)]
        self._lane_src_nodes = [np.asarray([n for n, m in enumerate(members) if m.size > lane],
                                           dtype=np.int64) for lane in range(t.max_node_size)]
        self._lanes = [lane for lane, _ in t.served_lanes]
        self._lane_comms = [c for _, c in t.served_lanes]
        self._my_sources = np.concatenate([lane_sources[lane] for lane in self._lanes])
        g = t.node_sizes[t.node]
        # Phase 2 receives from local rank j the sources of every lane l with l % g == j.
        per_local = [np.concatenate([lane_sources[lane] for lane in range(j, t.max_node_size, g)])
                     for j in range(g)]
        self._recv_order = np.concatenate(per_local)
        self._recv_split = np.asarray([p.size for p in per_local], dtype=np.int64)
        # Where this rank itself appears: among the sources it serves (its native lane always),
        # among the phase-2 senders (its own slice of recv_order), and among the destinations.
        self._me_src = int(np.flatnonzero(self._my_sources == t.rank)[0])
        self._remote_src = np.ones(self._my_sources.size, dtype=bool)
        self._remote_src[self._me_src] = False
        starts = np.concatenate([[0], np.cumsum(self._recv_split)])
        self._recv_from_me = np.arange(starts[t.local_rank], starts[t.local_rank + 1])
        self._own_node_slots = np.arange(self._node_start[t.node], self._node_start[t.node] + g)

    # ------------------------------------------------------------------ public API
    def Alltoallv(self, sendbuf, recvbuf, algorithm: Optional[str] = None, validate: bool = True) -> None:
        """All to All Scatter/Gather Vector, with mpi4py buffer specs (counts and displs in elements)."""
        size = self.comm.size
        s, ps = parse_vector(sendbuf, size, False, "send")
        r, pr = parse_vector(recvbuf, size, True, "recv")
        self._exchange(s, r, algorithm, validate, ps or pr)

    def Alltoall(self, sendbuf, recvbuf, algorithm: Optional[str] = None, validate: bool = True) -> None:
        """All to All Scatter/Gather: equal blocks of ``len(buf) / size`` elements (or a given count)."""
        size = self.comm.size
        s, ps = parse_uniform(sendbuf, size, False, "send")
        r, pr = parse_uniform(recvbuf, size, True, "recv")
        self._exchange(s, r, algorithm, validate, ps or pr)

    def alltoallv(self, array, counts, algorithm: Optional[str] = None,
                  validate: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Send ``counts[d]`` consecutive rows of ``array`` (axis 0) to rank d; return (rows, recv counts).

        Rows arrive ordered by source rank. Counts are exchanged for you (one Alltoall of int64).
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
        header = np.full((size, 2), -1, dtype=np.int64)
        if problem is None:
            header[:, 0], header[:, 1] = c, row_bytes
        got = np.empty_like(header)
        self.comm.Alltoall(header, got)
        if problem is None:
            bad = np.flatnonzero((got[:, 0] > 0) & (got[:, 1] != row_bytes))
            if bad.size:
                p = int(bad[0])
                problem = (f"rank {p} sends rows of {got[p, 1]} B but this rank's rows are {row_bytes} B "
                           f"(dtype and row shape must match on every rank)")
        if self.comm.allreduce(1 if problem else 0, op=MPI.MAX):
            raise_gathered(self.comm, problem, ExchangeError)
        rcounts = got[:, 0].copy()
        out = np.empty((int(rcounts.sum()),) + row_shape, dtype=array.dtype)
        s = Side(np.frombuffer(array, np.uint8) if array.nbytes else np.empty(0, np.uint8),
                  c * row_bytes, exclusive_cumsum(c) * row_bytes)
        r = Side(out.reshape(-1).view(np.uint8) if out.nbytes else np.empty(0, np.uint8),
                  rcounts * row_bytes, exclusive_cumsum(rcounts) * row_bytes)
        # The header exchange already proved that both sides agree on every count.
        self._exchange(s, r, algorithm, validate=False, problem=None)
        return out, rcounts

    # ------------------------------------------------------------------ core
    @staticmethod
    def _check_algorithm(algorithm: str) -> str:
        if algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
        return algorithm

    def _buffer(self, name: str, nbytes: int) -> np.ndarray:
        """A cached scratch buffer of at least ``nbytes``; grown only when a call needs more."""
        buf = self._buffers.get(name)
        if buf is None or buf.shape[0] < nbytes:
            self._buffers.pop(name, None)  # drop the old one before allocating the new one
            buf = np.empty(max(nbytes, 1), dtype=np.uint8)
            self._buffers[name] = buf
        return buf

    def _exchange(self, s: Side, r: Side, algorithm, validate: bool, problem: Optional[str]) -> None:
        algo = self._check_algorithm(algorithm if algorithm is not None else self.algorithm)
        comm = self.comm
        extent = 0 if problem else max(s.view.shape[0], r.view.shape[0])
        rc_table = None
        if validate and comm.size <= FUSED_AGREEMENT_MAX_RANKS:
            max_total, max_extent, rc_table = self._agree_fused(s, r, problem, extent)
        else:
            if validate:
                problem = self._check_pairs(s, r, problem)
            # One small Allreduce settles, identically on every rank: whether any rank failed,
            # the algorithm for "auto", and whether any count or displacement of any phase can
            # pass a C int (every internal one is bounded by the sum of all send bytes).
            agreed = np.array([1 if problem else 0, 0 if problem else s.total, extent], dtype=np.int64)
            comm.Allreduce(MPI.IN_PLACE, agreed, op=MPI.MAX)
            if agreed[0]:
                raise_gathered(comm, problem, ExchangeError)
            max_total, max_extent = int(agreed[1]), int(agreed[2])
        big = transfer.needs_big(max_extent, max_total, comm.size)
        if algo == "auto":  # from agreed numbers only, so every rank decides alike
            algo = self._choose(max_total // comm.size)
        if algo == "hier" and self._hier_possible:
            self._hier(s, r, big, rc_table)
        else:
            self._flat(s, r, big)

    def _choose(self, mean_block: int) -> str:
        """The cost model's pick for this layout and block size, memoised (it is on the hot path)."""
        algo = self._choices.get(mean_block)
        if algo is None:
            if len(self._choices) > 4096:
                self._choices.clear()
            t = self.topology
            algo = self._choices[mean_block] = self.cost_model.choose(t.num_nodes, t.max_node_size, mean_block)
        return algo

    def _agree_fused(self, s: Side, r: Side, problem: Optional[str], extent: int):
        """Validation and agreement in one Allgather of every rank's counts (small worlds).

        Every rank sees the whole count matrix, so every rank reaches the same verdict on every
        pair without a second collective, and the hierarchical path gets its node's receive
        counts for free. Returns (max send bytes, max buffer extent, receive-count table).
        """
        size = self.comm.size
        row = np.full(3 + 2 * size, -1, dtype=np.int64)
        row[0], row[1], row[2] = (1 if problem else 0), (0 if problem else s.total), extent
        if not problem:
            row[3:3 + size], row[3 + size:] = s.counts, r.counts
        table = np.empty((size, row.size), dtype=np.int64)
        self.comm.Allgather(row, table)
        if table[:, 0].any():
            raise_gathered(self.comm, problem, ExchangeError)
        sent, expected = table[:, 3:3 + size], table[:, 3 + size:]
        if sent.tobytes() != expected.T.tobytes():
            src, dst = np.nonzero(sent != expected.T)
            parts = [f"rank {int(a)} sends {int(sent[a, b])} B to rank {int(b)}, which expects "
                     f"{int(expected[b, a])} B" for a, b in zip(src[:3], dst[:3])]
            more = f" (+{src.size - 3} more pairs)" if src.size > 3 else ""
            raise ExchangeError("; ".join(parts) + more)  # same text on every rank, no collective
        return int(table[:, 1].max()), int(table[:, 2].max()), expected

    def _check_pairs(self, s: Side, r: Side, problem: Optional[str]) -> Optional[str]:
        """Collective: every receiver compares the bytes each sender announces with what it expects."""
        size, me = self.comm.size, self.comm.rank
        announced = np.full(size, -1, dtype=np.int64) if problem else s.counts
        got = np.empty(size, dtype=np.int64)
        self.comm.Alltoall(announced, got)
        if problem or got.tobytes() == r.counts.tobytes():
            return problem
        bad = np.flatnonzero((got >= 0) & (got != r.counts))
        parts = [f"rank {int(p)} sends {int(got[p])} B to rank {me}, which expects {int(r.counts[p])} B"
                 for p in bad[:3]]
        return "; ".join(parts) + (f" (+{bad.size - 3} more pairs)" if bad.size > 3 else "")

    def _flat(self, s: Side, r: Side, big: bool) -> None:
        Transfer(self.comm, s.view, s.counts, s.displs, r.view, r.counts, r.displs, big).run()
        self._stats = ("flat", s.counts)

    def _hier(self, s: Side, r: Side, big: bool, rc_table: Optional[np.ndarray]) -> None:
        t = self.topology
        intra, node = t.intra, t.node
        g = t.node_sizes[node]
        # What every rank of this node receives from every source (bytes), for phase 2's layout.
        if rc_table is not None:
            rc_node = rc_table[self._node_members]
        else:
            rc_node = np.empty((g, self.comm.size), dtype=np.int64)
            intra.Allgather(r.counts, rc_node)

        # My own blocks for my own node never travel: phase 1 carries other nodes' blocks, and
        # every block bound for this rank goes straight to the caller's buffer after phase 1.
        me_src, local, members = self._me_src, t.local_rank, self._node_members

        # -- pack: my blocks in (destination node, local rank) order
        oc, od = s.counts[self._dest_order], s.displs[self._dest_order]
        oc_remote = oc.copy()
        oc_remote[self._own_node_slots] = 0
        pos = exclusive_cumsum(oc)
        node_bytes = np.add.reduceat(oc_remote, self._node_start) if oc.size else oc
        nz = np.flatnonzero(oc_remote)
        base = int(od[nz[0]] - pos[nz[0]]) if nz.size else 0
        copied = 0
        if base >= 0 and np.array_equal(od[nz], pos[nz] + base):
            p1_send, p1_base = s.view, base  # already grouped by node: send in place
        else:
            p1_send = self._buffer("a", s.total)
            copied += copy_blocks(s.view, od, p1_send, pos, oc_remote)
            p1_base = 0
        p1_sdispls = pos[self._node_start] + p1_base

        # -- phase 1: one Alltoallv per served lane; segment per source, sub-blocks by local rank
        src_matrix = rc_node[:, self._my_sources]            # (g, sources) bytes
        seg = src_matrix.sum(axis=0)
        seg[me_src] = 0
        seg_off = exclusive_cumsum(seg)
        p1_recv_total = int(seg.sum())
        p2_recv_counts = np.add.reduceat(r.counts[self._recv_order], exclusive_cumsum(self._recv_split))
        p2_recv_counts[local] = 0
        p2_recv_total = int(p2_recv_counts.sum())
        recv_buf = self._buffer("b", max(p1_recv_total, p2_recv_total))
        zeros = np.zeros(t.num_nodes, dtype=np.int64)
        transfers, cursor = [], 0
        for lane, comm in zip(self._lanes, self._lane_comms):
            src_nodes = self._lane_src_nodes[lane]
            rcounts, rdispls = zeros.copy(), zeros.copy()
            rcounts[src_nodes] = seg[cursor:cursor + src_nodes.size]
            rdispls[src_nodes] = seg_off[cursor:cursor + src_nodes.size]
            cursor += src_nodes.size
            native = lane == local
            transfers.append(Transfer(comm, p1_send, node_bytes if native else zeros,
                                       p1_sdispls if native else zeros, recv_buf, rcounts, rdispls, big))
        # Always the nonblocking form: a rank serving two lanes must start both, and MPI never
        # matches a blocking collective with a nonblocking one on the same communicator.
        try:
            MPI.Request.Waitall([tr.start() for tr in transfers])
        finally:
            for tr in transfers:
                tr.free()

        # -- repack: block (k, i) = what source i sends to local rank k. Row-major order of the
        # rows k != me is phase 2's send layout; row "me" goes to the caller's buffer directly.
        src_off = seg_off[None, :] + np.cumsum(src_matrix, axis=0) - src_matrix
        src_off[:, me_src] = s.displs[members]               # my own blocks, from the send buffer
        to_peers = src_matrix.copy()
        to_peers[local] = 0
        dst_off = exclusive_cumsum(to_peers.ravel()).reshape(to_peers.shape)
        p2_send = self._buffer("a", int(to_peers.sum()))
        remote = self._remote_src
        copied += copy_blocks(recv_buf, src_off[:, remote].ravel(), p2_send, dst_off[:, remote].ravel(),
                              to_peers[:, remote].ravel())
        col = np.ascontiguousarray
        copied += copy_blocks(s.view, col(src_off[:, me_src]), p2_send, col(dst_off[:, me_src]),
                              col(to_peers[:, me_src]))
        mine = self._my_sources
        copied += copy_blocks(recv_buf, src_off[local, remote], r.view, r.displs[mine[remote]],
                              src_matrix[local, remote])
        copied += copy_blocks(s.view, src_off[local, me_src:me_src + 1], r.view,
                              r.displs[mine[me_src:me_src + 1]], col(src_matrix[local, me_src:me_src + 1]))
        p2_send_counts = to_peers.sum(axis=1)

        # -- phase 2 on the node, then unpack what the other local ranks forwarded
        Transfer(intra, p2_send, p2_send_counts, exclusive_cumsum(p2_send_counts),
                  recv_buf, p2_recv_counts, exclusive_cumsum(p2_recv_counts), big).run()
        ordered = r.counts[self._recv_order]
        ordered[self._recv_from_me] = 0
        copied += copy_blocks(recv_buf, exclusive_cumsum(ordered), r.view,
                              r.displs[self._recv_order], ordered)

        self._stats = ("hier", node_bytes, p2_send_counts, copied)

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
        p2_out = p2_counts.copy()
        p2_out[t.local_rank] = 0
        inter = {"messages": int(np.count_nonzero(own)), "bytes": int(own.sum())}
        return {"algorithm": "hier", "inter": inter,
                "intra": {"messages": int(np.count_nonzero(p2_out)), "bytes": int(p2_out.sum())},
                "inter_node": dict(inter), "copy_bytes": int(copied)}
