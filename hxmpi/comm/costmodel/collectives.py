"""MPI's collectives as the model prices them and the simulator replays them.

Facts about how the library runs the collectives an hxmpi call meets, each written once here:
Open MPI's fixed decisions (``alltoallv_algorithm`` for a blocking ``MPI_Alltoallv``,
``alltoall_algorithm`` for ``MPI_Alltoall``), the rounds of its modified Bruck
(``bruck_schedule``), and the rounds of a dissemination over a node (``dissemination_distances``:
the node barrier, the node's Allgather). The cost model prices them, ``hxmpi.sim`` writes them as
traces; neither counts rounds on its own.
"""
from __future__ import annotations

from typing import NamedTuple

from ..plan import bruck_rounds

__all__ = ["alltoallv_algorithm", "ALLTOALL_TUNED", "alltoall_algorithm", "BruckRound", "bruck_schedule",
           "dissemination_distances",
           "allgather_blocks"]


def alltoallv_algorithm(size: int) -> str:
    """Open MPI's (coll/tuned, fixed rules) choice for a blocking MPI_Alltoallv on ``size`` ranks."""
    if size < 4 or 64 <= size < 128 or 256 <= size < 1024:
        return "pairwise"
    return "linear"


#: Open MPI's tuned fixed decision for MPI_Alltoall above 2 ranks: (communicator size below
#: which the row holds, ((block bytes below which the algorithm holds, algorithm), ...)); the last
#: row and the last entry of a row hold beyond. "linear" stands for its linear and linear_sync.
ALLTOALL_TUNED = (
    (8, ((8192, "linear"), (16384, "linear"), (65536, "linear"), (524288, "linear"), (1048576, "pairwise"),
         (None, "linear"))),
    (16, ((None, "linear"),)),
    (32, ((4, "linear"), (512, "bruck"), (None, "linear"))),
    (64, ((512, "bruck"), (524288, "linear"), (None, "linear"))),
    (128, ((1024, "bruck"), (262144, "linear"), (None, "pairwise"))),
    (256, ((1024, "bruck"), (262144, "linear"), (None, "pairwise"))),
    (512, ((1024, "bruck"), (32768, "linear"), (None, "pairwise"))),
    (1024, ((512, "bruck"), (262144, "linear"), (None, "pairwise"))),
    (2048, ((512, "bruck"), (None, "linear"))),
    (4096, ((1024, "bruck"), (None, "linear"))),
    (None, ((2048, "bruck"), (None, "linear"))),
)


def alltoall_algorithm(size: int, block: float) -> str:
    """What Open MPI's tuned component (fixed rules) runs ``MPI_Alltoall`` of ``block``-byte blocks
    on ``size`` ranks as: "bruck" (its modified Bruck, radix 2), "linear" (every message posted at
    once) or "pairwise" (one peer per round)."""
    if size <= 2:
        return "pairwise"
    for below, rules in ALLTOALL_TUNED:
        if below is None or size < below:
            for limit, algo in rules:
                if limit is None or block < limit:
                    return algo
    raise AssertionError("unreachable: the table's last row holds beyond")


class BruckRound(NamedTuple):
    """One round of Open MPI's modified Bruck: to rank + ``distance`` (from rank - ``distance``),
    ``blocks`` blocks of the call, ``nbytes`` bytes, each way."""
    distance: int
    blocks: int
    nbytes: float


def bruck_schedule(size: int, block: float = 1) -> tuple[BruckRound, ...]:
    """The rounds of Open MPI's modified Bruck ``MPI_Alltoall`` on ``size`` ranks with ``block``-byte
    blocks: round d (d = 1, 2, 4, ... below ``size``) sends, as one message, the blocks whose index
    (1 .. size - 1) has bit d set. These are hxmpi's own radix-2 Bruck rounds (``plan.bruck_rounds``),
    so the flat Bruck program's walk prices the same messages."""
    return tuple(BruckRound(d, int(slots.size), slots.size * block) for (d, slots), in bruck_rounds(size, 2))


def dissemination_distances(size: int) -> tuple[int, ...]:
    """The rounds of a dissemination over ``size`` ranks (a node barrier, a node's Allgather), by
    distance: 1, 2, 4, ... below ``size``, ceil(log2 size) rounds (none on one rank). In round d a
    rank sends to the rank d ahead and receives from the rank d behind (or the mirror image)."""
    out, d = [], 1
    while d < size:
        out.append(d)
        d *= 2
    return tuple(out)


def allgather_blocks(distance: int, size: int) -> int:
    """Ranks' contributions that round ``distance`` of a Bruck (dissemination) Allgather over
    ``size`` ranks carries: min(d, size - d); over every round of ``dissemination_distances``,
    size - 1."""
    return min(distance, size - distance)
