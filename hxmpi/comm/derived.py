"""Communicators derived from a HierComm (``Dup``, ``Split``, ``Split_type``, ``Create_cart``,
``Sub``, ``Create_group``): the calls (``Deriving``, ``CartDeriving``), the checks of their
arguments and the node layout they inherit.

A derived communicator keeps its parent's nodes: each of its ranks is on the node its process had
in the parent (``derived_node_of``), so virtual nodes (``ranks_per_node``/``node_of``) carry over
and nothing is detected again. Each check returns this rank's problem (None when all is well) and
the arguments normalised to what every rank must pass alike; ``HierComm`` agrees both over the
parent before the MPI call, so a bad argument raises on every rank instead of leaving the others
inside the call.
"""
from __future__ import annotations

import operator
from typing import Optional, Sequence

from mpi4py import MPI

from ..errors import TopologyError, agree, guarded

__all__ = ["Deriving", "CartDeriving", "split_problem", "split_type_args", "dup_problem", "cart_args", "sub_args",
           "group_problem", "derived_node_of", "is_cartesian"]


class Deriving:
    """The calls of a HierComm that make communicators: each returns a HierComm over the new
    communicator, with this one's settings and each rank on the node its process has here.

    A class using it has ``comm`` (its communicator), ``topology`` (its nodes) and
    ``_derived(comm, node_of)`` (a HierComm like itself over a duplicate of ``comm``)."""

    @guarded(owner="HierComm")
    def Dup(self, info: Optional[MPI.Info] = None):
        """A HierComm over a duplicate of ``comm``, with this one's settings and nodes.

        Collective. Each rank stays on the node its process has here (virtual nodes kept); over a
        Cartesian communicator the result is a ``CartHierComm``.

        Parameters
        ----------
        info : MPI.Info, optional
            Hints for the new communicator.

        Returns
        -------
        HierComm
            The new HierComm; ``free()`` it when done.

        Raises
        ------
        hxmpi.TopologyError
            On every rank, before the MPI call: ``info`` is neither an ``MPI.Info`` nor None on some rank.

        Examples
        --------
        >>> twin = hc.Dup()
        >>> twin.topology.node_sizes == hc.topology.node_sizes
        True
        >>> twin.free()
        """
        return self._derive(dup_problem(info), lambda comm: comm.Dup(info))

    def Dup_with_info(self, info: MPI.Info):
        """``Dup`` with hints.

        Parameters
        ----------
        info : MPI.Info
            Hints for the new communicator.

        Returns
        -------
        HierComm
            As ``Dup``.

        Raises
        ------
        hxmpi.TopologyError
            As ``Dup``.

        Examples
        --------
        >>> info = MPI.Info.Create()
        >>> info.Set("mpi_assert_no_any_tag", "true")
        >>> hinted = hc.Dup_with_info(info)
        >>> info.Free()
        >>> hinted.free()
        """
        return self.Dup(info)

    def Clone(self):
        """``Dup``, under mpi4py's other name for it.

        Returns
        -------
        HierComm
            As ``Dup``.

        Raises
        ------
        hxmpi.TopologyError
            As ``Dup``.

        Examples
        --------
        >>> copy = hc.Clone()
        >>> type(copy).__name__
        'HierComm'
        >>> copy.free()
        """
        return self.Dup()

    @guarded(owner="HierComm")
    def Split(self, color: int = 0, key: int = 0):
        """A HierComm over the ranks that pass this ``color``, ordered by ``key`` then by rank.

        As ``MPI_Comm_split``; settings and nodes inherited (each rank on the node its process has
        here). Collective.

        Parameters
        ----------
        color : int, default 0
            The new communicator's colour (>= 0), or ``MPI.UNDEFINED`` for none.
        key : int, default 0
            Orders the ranks of a colour (ties: by rank here).

        Returns
        -------
        HierComm or MPI.Comm
            The new HierComm; ``MPI.COMM_NULL`` on ranks passing ``MPI.UNDEFINED``.

        Raises
        ------
        hxmpi.TopologyError
            On every rank, before the MPI call: a ``color`` that is not an integer >= 0 or
            ``MPI.UNDEFINED``, or a ``key`` that is not an integer, on any rank.

        Examples
        --------
        >>> half = hc.Split(color=rank % 2, key=rank)
        >>> half.Get_size() == len(range(rank % 2, size, 2))
        True
        >>> half.free()
        >>> first = hc.Split(0 if rank == 0 else MPI.UNDEFINED)
        >>> (first == MPI.COMM_NULL) == (rank != 0)
        True
        >>> if rank == 0:
        ...     first.free()
        """
        return self._derive(split_problem(color, key), lambda comm: comm.Split(color, key))

    @guarded(owner="HierComm")
    def Split_type(self, split_type: int, key: int = 0, info: MPI.Info = MPI.INFO_NULL):
        """A HierComm over the ranks that ``split_type`` groups with this rank, ordered by ``key``.

        As ``MPI_Comm_split_type``. Its nodes are still this one's, virtual ones included. Collective.

        Parameters
        ----------
        split_type : int
            ``MPI.COMM_TYPE_SHARED`` or another ``MPI.COMM_TYPE_*`` constant, or ``MPI.UNDEFINED`` for
            none; every rank passing one passes the same.
        key : int, default 0
            Orders the ranks of a group (ties: by rank here).
        info : MPI.Info, default MPI.INFO_NULL
            Hints for the new communicator.

        Returns
        -------
        HierComm or MPI.Comm
            The new HierComm; ``MPI.COMM_NULL`` on ranks passing ``MPI.UNDEFINED``.

        Raises
        ------
        hxmpi.TopologyError
            On every rank, before the MPI call: a bad ``split_type``, ``key`` or ``info`` on any rank,
            or split types that differ between ranks.

        Examples
        --------
        >>> shared = hc.Split_type(MPI.COMM_TYPE_SHARED)  # one host here: every rank
        >>> shared.topology.node_sizes == hc.topology.node_sizes  # the virtual nodes stay
        True
        >>> shared.free()
        """
        shared, problem = split_type_args(split_type, key, info)
        return self._derive(problem, lambda comm: comm.Split_type(split_type, key, info), "split_type", shared)

    @guarded(owner="HierComm")
    def Create_cart(self, dims, periods=None, reorder: bool = False):
        """A ``CartHierComm`` over a grid of ``dims`` ranks per dimension, as ``MPI_Cart_create``.

        Settings and nodes inherited (each rank on the node its process has here). Collective.

        Parameters
        ----------
        dims : sequence of int
            Ranks per dimension, each >= 1 (``MPI.Compute_dims`` fills in zeros); their product at most
            the communicator's size.
        periods : sequence of bool, optional
            Which dimensions wrap around, one per dimension; default: none.
        reorder : bool, default False
            Whether MPI may renumber the ranks.

        Returns
        -------
        CartHierComm or MPI.Comm
            The grid; ``MPI.COMM_NULL`` on ranks outside it.

        Raises
        ------
        hxmpi.TopologyError
            On every rank, before the MPI call: bad ``dims`` or ``periods`` on any rank, a grid larger
            than the communicator, or ``dims``, ``periods`` and ``reorder`` that differ between ranks.

        Examples
        --------
        >>> grid = hc.Create_cart([1, size], periods=[False, True])
        >>> type(grid).__name__, grid.Get_coords(grid.Get_rank())[1] == grid.Get_rank()
        ('CartHierComm', True)
        >>> grid.free()
        """
        args, problem = cart_args(dims, periods, reorder, self.comm.size)
        return self._derive(problem, lambda comm: comm.Create_cart(*args), "dims, periods and reorder", args)

    @guarded(owner="HierComm")
    def Create_group(self, group: MPI.Group, tag: int = 0):
        """A HierComm over ``group``'s processes, as ``MPI_Comm_create_group``: collective over the group alone.

        The group's ranks call it; settings and nodes inherited (each rank on the node its process
        has here).

        Parameters
        ----------
        group : MPI.Group
            A subgroup of ``comm``'s group.
        tag : int, default 0
            Tells concurrent calls apart (0 to ``MPI.TAG_UB``).

        Returns
        -------
        HierComm or MPI.Comm
            The new HierComm; ``MPI.COMM_NULL`` on a rank outside the group.

        Raises
        ------
        hxmpi.TopologyError
            A bad argument (``group`` not an ``MPI.Group``, ``tag`` out of range, group ranks that are
            not processes of this communicator) is found on the rank that passes it, with no
            communication: the other ranks cannot learn of it, so it ends the job (``MPI_Abort``),
            naming the rank and the cause, unless the user chose ``MPI.ERRORS_RETURN`` for the
            communicator: then it is raised on that rank.

        Examples
        --------
        >>> pair = hc.Get_group().Incl([0, 1])  # ranks 0 and 1
        >>> if rank < 2:
        ...     duo = hc.Create_group(pair)
        ...     print(duo.Get_size())
        ...     duo.free()
        ... else:
        ...     print(2)
        2
        >>> pair.Free()
        """
        problem = group_problem(group, tag, self.comm)
        if problem:
            raise TopologyError(problem)
        return self._derive(None, lambda comm: comm.Create_group(group, tag), collective=False)

    @guarded(owner="HierComm")
    def Create(self, group: MPI.Group):
        """A HierComm over ``group``'s processes, as ``MPI_Comm_create``: collective over ``comm``.

        Ranks may pass disjoint groups; settings and nodes inherited (each rank on the node its process
        has here).

        Parameters
        ----------
        group : MPI.Group
            A subgroup of ``comm``'s group.

        Returns
        -------
        HierComm or MPI.Comm
            The new HierComm; ``MPI.COMM_NULL`` on a rank outside its group.

        Raises
        ------
        hxmpi.TopologyError
            On every rank, before the MPI call: a bad ``group`` on any rank (not an ``MPI.Group``, or
            ranks that are not processes of this communicator).

        Examples
        --------
        >>> evens = hc.Get_group().Incl(list(range(0, size, 2)))
        >>> sub = hc.Create(evens)  # every rank calls
        >>> (sub == MPI.COMM_NULL) == (rank % 2 == 1)
        True
        >>> if rank % 2 == 0:
        ...     sub.free()
        >>> evens.Free()
        """
        return self._derive(group_problem(group, 0, self.comm), lambda comm: comm.Create(group))

    def _derive(self, problem: Optional[str], make, what: Optional[str] = None, shared=None,
                collective: bool = True):
        """A HierComm over ``make(comm)`` (the new communicator it duplicates is freed here), with
        this one's settings and each rank on the node its process has here; what ``make`` gives
        where it makes none (``MPI.COMM_NULL``).

        ``collective``: first agree over ``comm`` on ``problem`` (this rank's bad argument) and,
        where ``what`` names them, on ``shared``, the arguments every rank passing one (not None)
        must pass alike: a ``TopologyError`` on every rank, before the MPI call."""
        if collective:
            if what is not None:
                views = self.comm.allgather(shared)
                first = next((r for r, v in enumerate(views) if v is not None), None)
                if problem is None and shared is not None and shared != views[first]:
                    problem = f"{what} {shared!r} differ from rank {first}'s {views[first]!r}"
            agree(self.comm, problem, TopologyError)
        new = make(self.comm)
        if new == MPI.COMM_NULL:
            return new
        try:
            return self._derived(new, derived_node_of(self.topology.node_of, self.comm, new))
        finally:
            new.Free()


class CartDeriving(Deriving):
    """``Deriving`` over a Cartesian communicator: also ``Sub``."""

    @guarded(owner="HierComm")
    def Sub(self, remain_dims):
        """The sub-grid of the ranks that differ from this one only along the dimensions ``remain_dims`` keeps.

        As ``MPI_Cart_sub``, a ``CartHierComm`` with this one's settings and nodes. Collective.

        Parameters
        ----------
        remain_dims : sequence of bool
            One per dimension of the grid: True keeps it.

        Returns
        -------
        CartHierComm
            The sub-grid this rank is in.

        Raises
        ------
        hxmpi.TopologyError
            On every rank, before the MPI call: ``remain_dims`` not a sequence of booleans, of the wrong
            length, or differing between ranks.

        Examples
        --------
        >>> grid = hc.Create_cart([1, size])
        >>> row = grid.Sub([False, True])
        >>> type(row).__name__, row.Get_size() == size
        ('CartHierComm', True)
        >>> row.free()
        >>> grid.free()
        """
        kept, problem = sub_args(remain_dims, self.comm.Get_dim())
        return self._derive(problem, lambda comm: comm.Sub(kept), "remain_dims", kept)


def _integer(value) -> Optional[int]:
    """``value`` as an int where it is one (numpy integers included), else None."""
    try:
        return operator.index(value)
    except TypeError:
        return None


def _key_problem(key) -> Optional[str]:
    return None if _integer(key) is not None else f"key must be an integer, got {key!r}"


def split_problem(color, key) -> Optional[str]:
    """What is wrong with ``Split(color, key)``'s arguments on this rank, if anything."""
    c = _integer(color)
    if c is None or (c < 0 and c != MPI.UNDEFINED):
        return f"color must be an integer >= 0 or MPI.UNDEFINED, got {color!r}"
    return _key_problem(key)


def split_type_args(split_type, key, info) -> tuple[Optional[int], Optional[str]]:
    """(``split_type`` as an int, None for ``MPI.UNDEFINED``: what every other rank must pass
    alike; this rank's problem or None) for ``Split_type(split_type, key, info)``."""
    t = _integer(split_type)
    if t is None or (t < 0 and t != MPI.UNDEFINED):
        return None, f"split_type must be an MPI.COMM_TYPE_* constant or MPI.UNDEFINED, got {split_type!r}"
    return (None if t == MPI.UNDEFINED else t), _key_problem(key) or _info_problem(info, allow_none=False)


def _info_problem(info, allow_none: bool) -> Optional[str]:
    if isinstance(info, MPI.Info) or (allow_none and info is None):
        return None
    return f"info must be an MPI.Info{' or None' if allow_none else ''}, got {info!r}"


def dup_problem(info) -> Optional[str]:
    """What is wrong with ``Dup(info)``'s argument, if anything."""
    return _info_problem(info, allow_none=True)


def cart_args(dims, periods, reorder, size: int) -> tuple[Optional[tuple], Optional[str]]:
    """(``(dims, periods, reorder)`` normalised to a list of ints, a list of bools and a bool, or
    None; this rank's problem or None) for ``Create_cart`` on a communicator of ``size`` ranks."""
    try:
        d = [operator.index(x) for x in dims]
    except TypeError:
        return None, f"dims must be a sequence of integers, got {dims!r}"
    if any(x < 1 for x in d):
        return None, f"dims must be positive (MPI.Compute_dims fills in zeros), got {d}"
    grid = 1
    for x in d:
        grid *= x
    if grid > size:
        return None, f"the grid {d} has {grid} ranks, more than the communicator's {size}"
    if periods is None:
        p = [False] * len(d)
    else:
        try:
            p = [bool(x) for x in periods]
        except TypeError:
            return None, f"periods must be a sequence of booleans, got {periods!r}"
        if len(p) != len(d):
            return None, f"periods has {len(p)} entries but dims has {len(d)}"
    return (d, p, bool(reorder)), None


def sub_args(remain_dims, ndim: int) -> tuple[Optional[list], Optional[str]]:
    """(``remain_dims`` as a list of bools or None, this rank's problem or None) for ``Sub`` on a
    grid of ``ndim`` dimensions."""
    try:
        kept = [bool(x) for x in remain_dims]
    except TypeError:
        return None, f"remain_dims must be a sequence of booleans, got {remain_dims!r}"
    if len(kept) != ndim:
        return None, f"remain_dims has {len(kept)} entries but the grid has {ndim} dimensions"
    return kept, None


def group_problem(group, tag, parent: MPI.Intracomm) -> Optional[str]:
    """What is wrong with ``Create_group(group, tag)`` on ``parent``, if anything: the same on every
    rank that passes the same arguments (the call is collective over the group alone)."""
    if not isinstance(group, MPI.Group) or group == MPI.GROUP_NULL:
        return f"group must be an MPI.Group, got {group!r}"
    t = _integer(tag)
    upper = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)  # set on the world alone; it holds for every communicator
    if t is None or t < 0 or (upper is not None and t > upper):
        return f"tag must be an integer from 0 to MPI.TAG_UB ({upper}), got {tag!r}"
    outside = [r for r, p in enumerate(_translate(group, parent)) if p == MPI.UNDEFINED]
    if outside:
        return f"group ranks {outside} are not processes of this communicator"
    return None


def _translate(group: MPI.Group, comm: MPI.Intracomm) -> list:
    """Each rank of ``group``'s rank in ``comm`` (MPI.UNDEFINED where it has none)."""
    whole = comm.Get_group()
    try:
        return MPI.Group.Translate_ranks(group, list(range(group.Get_size())), whole)
    finally:
        whole.Free()


def derived_node_of(node_of: Sequence[int], parent: MPI.Intracomm, child: MPI.Intracomm) -> list:
    """The node of each rank of ``child``: that of its process in ``parent``, whose ranks are on
    the nodes ``node_of`` gives (collective over ``child``). Each rank says its parent rank (one
    allgather): MPICH gives the group of a Cartesian communicator smaller than its parent's the
    parent's size, so the group's ranks cannot be read off it."""
    return [node_of[p] for p in child.allgather(parent.Get_rank())]


def is_cartesian(comm) -> bool:
    """Whether ``comm`` is an intracommunicator with a Cartesian topology (``MPI.Cartcomm``'s calls)."""
    return isinstance(comm, MPI.Intracomm) and bool(comm) and comm.Get_topology() == MPI.CART
