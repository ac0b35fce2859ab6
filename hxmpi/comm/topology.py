"""Node topology: the world, intra-node and inter-node ("lane") communicators, and the node map.

A rank is (node n, local rank l). ``intra`` holds the ranks of one node in world order. A lane is
the set of ranks that share a local rank, one per node; ``inter`` is this rank's own lane.

Irregular layouts: a node with fewer ranks than lane l has no native member of that lane. By the
modular rule of docs/method.md (section 1), lane l on such a node m is served by its local rank ``l % G_m``, so every lane
communicator has exactly one member per node, in node order (``inter.rank == node``). A rank may
therefore serve several lanes: ``served_lanes`` lists them with their communicators.
"""
from __future__ import annotations

import copy
import os
import socket
from typing import Optional, Sequence

import numpy as np
from mpi4py import MPI

from ..errors import TopologyError, agree
from .plan import dense_node_ids

__all__ = ["Topology"]

ENV_RANKS_PER_NODE = "HXMPI_RANKS_PER_NODE"


def _check_node_of(node_of, size: int) -> tuple[Optional[np.ndarray], Optional[str]]:
    """Return (node_of as int64 array, None) or (None, what is wrong)."""
    try:
        arr = np.asarray(node_of)
    except Exception as exc:  # any unconvertible object is a user error, reported as such
        return None, f"node_of is not a sequence of integers ({exc})"
    if arr.ndim != 1 or arr.shape[0] != size:
        return None, f"node_of has shape {arr.shape}, expected ({size},): one node id per rank"
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if not (np.issubdtype(arr.dtype, np.floating) and np.all(arr == np.floor(arr))):
            return None, f"node_of must hold integers, got dtype {arr.dtype}"
    arr = arr.astype(np.int64)
    if arr.size and arr.min() < 0:
        bad = int(np.argmin(arr))
        return None, f"node_of[{bad}] = {arr[bad]} is negative"
    return arr, None


class Topology:
    """Node map of ``comm`` and its intra-node and lane communicators.

    A rank is (node n, local rank l). ``intra`` holds the ranks of its node in ``comm`` order; a lane
    is the set of ranks that share a local rank, one per node, and ``inter`` is this rank's own lane.
    On an irregular layout a rank of a small node also serves the lanes its node lacks
    (``served_lanes``), so every lane communicator has one member per node, in node order. Node ids
    are renumbered 0..num_nodes-1 in order of each node's lowest rank. Collective over ``comm``.

    Parameters
    ----------
    comm : MPI.Intracomm or hxmpi.HierComm, default MPI.COMM_WORLD
        The ranks to map (a HierComm stands for its communicator); the Topology works on a
        duplicate.
    ranks_per_node : int, optional
        Virtual nodes of k consecutive ranks (the last may be smaller).
    node_of : sequence of int, optional
        Every rank's node id, explicitly (any layout). With neither, nodes are the shared-memory
        domains (``Split_type(COMM_TYPE_SHARED)``), unless env ``HXMPI_RANKS_PER_NODE`` is set.

    Raises
    ------
    hxmpi.TopologyError
        On every rank: both ``ranks_per_node`` and ``node_of`` given, a ``ranks_per_node`` that is
        not a positive integer, a ``node_of`` that is not one integer >= 0 per rank, a layout given
        on some ranks only, or one that differs from rank 0's.

    Attributes
    ----------
    comm : MPI.Intracomm
        The duplicate of the communicator given.
    intra : MPI.Intracomm
        This node's ranks, in ``comm`` order.
    inter : MPI.Intracomm
        This rank's own lane: one rank per node, in node order (``inter.rank == node``).
    node : int
        This rank's node.
    local_rank : int
        This rank's rank on its node.
    num_nodes : int
        Number of nodes.
    node_of : tuple of int
        Every rank's node.
    node_sizes : tuple of int
        Ranks per node.
    node_members : tuple of tuple of int
        Every node's ranks.
    local_rank_of : tuple of int
        Every rank's local rank.
    max_node_size : int
        Ranks of the largest node.
    is_regular : bool
        Whether every node has the same number of ranks.
    served_lanes : tuple of (int, MPI.Intracomm)
        The lanes this rank serves, with their communicators: its own and, on a small node, the
        lanes its node lacks.

    Examples
    --------
    >>> topo = hxmpi.Topology(MPI.COMM_WORLD, ranks_per_node=2)
    >>> topo.node == rank // 2, topo.local_rank == rank % 2
    (True, True)
    >>> topo.node_sizes == tuple([2] * (size // 2) + [1] * (size % 2))
    True
    >>> topo.inter.Get_rank() == topo.node
    True
    >>> topo.free()
    """

    def __init__(self, comm: MPI.Intracomm = MPI.COMM_WORLD, ranks_per_node: Optional[int] = None,
                 node_of: Optional[Sequence[int]] = None):
        # A HierComm given stands for its communicator (its own Dup makes a HierComm).
        self.comm = (comm if isinstance(comm, MPI.Comm) else getattr(comm, "comm", comm)).Dup()
        size, rank = self.comm.size, self.comm.rank
        if ranks_per_node is None and node_of is None and os.environ.get(ENV_RANKS_PER_NODE):
            ranks_per_node = os.environ[ENV_RANKS_PER_NODE]
        ids, problem = self._node_ids(ranks_per_node, node_of, size)
        # Agree on how the layout is given before the shared-memory split, which is collective.
        modes = self.comm.allgather(ids is None and problem is None)
        if all(modes):
            shm = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
            leader = shm.allreduce(rank, op=MPI.MIN)
            shm.Free()
            ids = np.asarray(self.comm.allgather(leader), dtype=np.int64)
        elif problem is None and modes[rank]:
            problem = "no ranks_per_node/node_of given here, but other ranks gave one"
        # Every rank must pass the same layout: compare against rank 0's.
        ref = self.comm.bcast(ids, root=0)
        if problem is None and (ref is None or not np.array_equal(ref, ids)):
            problem = "node layout differs from rank 0's (ranks_per_node/node_of must agree on all ranks)"
        agree(self.comm, problem, TopologyError)

        node_of_arr = dense_node_ids(ids)
        num_nodes = int(node_of_arr.max()) + 1 if node_of_arr.size else 0

        self.node_of: tuple[int, ...] = tuple(int(x) for x in node_of_arr)
        self.num_nodes: int = num_nodes
        self.node: int = self.node_of[rank]
        members = [np.flatnonzero(node_of_arr == n) for n in range(self.num_nodes)]
        self.node_members: tuple[tuple[int, ...], ...] = tuple(tuple(int(r) for r in m) for m in members)
        self.node_sizes: tuple[int, ...] = tuple(len(m) for m in members)
        local_of = np.empty(size, dtype=np.int64)
        for m in members:
            local_of[m] = np.arange(m.size)
        self.local_rank_of: tuple[int, ...] = tuple(int(x) for x in local_of)
        self.local_rank: int = self.local_rank_of[rank]
        self.is_regular: bool = len(set(self.node_sizes)) == 1
        self.max_node_size: int = max(self.node_sizes)

        self.intra = self.comm.Split(self.node, rank)
        self.served_lanes: tuple[tuple[int, MPI.Intracomm], ...] = self._make_lanes()
        self.inter = dict(self.served_lanes)[self.local_rank]

    @staticmethod
    def _node_ids(ranks_per_node, node_of, size) -> tuple[Optional[np.ndarray], Optional[str]]:
        if ranks_per_node is not None and node_of is not None:
            return None, "give ranks_per_node or node_of, not both"
        if node_of is not None:
            return _check_node_of(node_of, size)
        if ranks_per_node is not None:
            try:
                k = int(ranks_per_node)
                if isinstance(ranks_per_node, float) and k != ranks_per_node:
                    raise ValueError
            except (TypeError, ValueError):
                return None, f"ranks_per_node must be a positive integer, got {ranks_per_node!r}"
            if k < 1:
                return None, f"ranks_per_node must be a positive integer, got {k}"
            return np.arange(size, dtype=np.int64) // k, None
        return None, None  # the caller asks the shared-memory split

    def _make_lanes(self) -> tuple[tuple[int, MPI.Intracomm], ...]:
        """Create every lane communicator this rank serves (one member per node, in node order)."""
        sizes, node, local = self.node_sizes, self.node, self.local_rank
        gmin, gmax = min(sizes), self.max_node_size
        lanes = []
        # Lanes below the smallest node size have a native member on every node: one Split.
        native = self.comm.Split(local if local < gmin else MPI.UNDEFINED, node)
        if native != MPI.COMM_NULL:
            lanes.append((local, native))
        # Each remaining lane needs stand-ins on small nodes, so it gets a Split of its own.
        for lane in range(gmin, gmax):
            serves = lane % sizes[node] == local
            comm = self.comm.Split(0 if serves else MPI.UNDEFINED, node)
            if serves:
                lanes.append((lane, comm))
        return tuple(lanes)

    @property
    def lane(self) -> MPI.Intracomm:
        """This rank's own lane communicator (alias of ``inter``).

        Returns
        -------
        MPI.Intracomm
            One rank per node, in node order.

        Examples
        --------
        >>> hc.topology.lane.Get_size() == hc.topology.num_nodes
        True
        """
        return self.inter

    @property
    def size(self) -> int:
        """Number of ranks in ``comm``.

        Returns
        -------
        int
            ``comm``'s size.

        Raises
        ------
        MPI.Exception
            After ``free()``.

        Examples
        --------
        >>> hc.topology.size == size
        True
        """
        return self.comm.size

    @property
    def rank(self) -> int:
        """This rank in ``comm``.

        Returns
        -------
        int
            ``comm``'s rank.

        Raises
        ------
        MPI.Exception
            After ``free()``.

        Examples
        --------
        >>> hc.topology.rank == rank
        True
        """
        return self.comm.rank

    def describe(self) -> dict:
        """This rank's topology as a plain dict (for logs and ``python -m hxmpi``).

        Returns
        -------
        dict
            ``rank``, ``size``, ``host``, ``node``, ``local_rank``, ``lane`` (its own),
            ``served_lanes``, ``num_nodes``, ``node_sizes``, ``is_regular``.

        Raises
        ------
        MPI.Exception
            After ``free()``.

        Examples
        --------
        >>> info = hc.topology.describe()
        >>> info["node"] == rank // 2, info["num_nodes"] == (size + 1) // 2
        (True, True)
        """
        return {
            "rank": self.rank, "size": self.size, "host": socket.gethostname(),
            "node": self.node, "local_rank": self.local_rank, "lane": self.local_rank,
            "served_lanes": [lane for lane, _ in self.served_lanes],
            "num_nodes": self.num_nodes, "node_sizes": list(self.node_sizes),
            "is_regular": self.is_regular,
        }

    def duplicate(self) -> "Topology":
        """The same nodes over duplicates of this Topology's communicators (collective).

        What a HierComm's nonblocking calls move on, apart from its blocking ones.

        Returns
        -------
        Topology
            A Topology of its own communicators; ``free()`` it when done.

        Raises
        ------
        MPI.Exception
            After ``free()``.

        Examples
        --------
        >>> twin = hc.topology.duplicate()
        >>> twin.node_of == hc.topology.node_of, twin.comm != hc.topology.comm
        (True, True)
        >>> twin.free()
        """
        # Blocking duplicates: Open MPI's nonblocking MPI_Comm_idup can deadlock beside other
        # collectives on the same communicator (open-mpi/ompi issue 2025).
        twin = copy.copy(self)
        twin.comm, twin.intra = self.comm.Dup(), self.intra.Dup()
        twin.served_lanes = tuple((lane, comm.Dup()) for lane, comm in self.served_lanes)
        twin.inter = dict(twin.served_lanes)[self.local_rank]
        return twin

    def free(self) -> None:
        """Free the communicators this Topology created (collective).

        Raises
        ------
        MPI.Exception
            When called a second time.

        Examples
        --------
        >>> topo = hxmpi.Topology(MPI.COMM_WORLD, ranks_per_node=2)
        >>> topo.free()
        """
        for _, comm in self.served_lanes:
            comm.Free()
        self.served_lanes = ()
        self.intra.Free()
        self.comm.Free()
