"""``MPI_Alltoall``'s price: the flat program's exchange as Open MPI's tuned decision runs it
(``collectives.alltoall_algorithm``), with the library's own copies and CPU per block."""
from __future__ import annotations

from dataclasses import replace

from .collectives import alltoall_algorithm, bruck_schedule
from .params import Parameters
from .walk import shape_price

__all__ = ["alltoall_price"]


def alltoall_price(m: Parameters, shape: tuple, block: float, library: bool = True) -> float:
    """Seconds of MPI_Alltoall of ``block``-byte blocks on nodes of ``shape``, run as
    ``alltoall_algorithm`` says: the flat program's exchange priced as radix-2 Bruck rounds (no
    headers), linear or pairwise, plus the library's copies (Bruck: the two rotations and each
    round's pack, unpack and copy back; the others: the own block) and, with ``library``, its CPU
    per block and Bruck round (``mpi_ddt_block``); without: the CPU-free lower bound."""
    p = sum(shape)
    how = alltoall_algorithm(p, block)
    free = replace(m, beta_copy=0.0)  # the exchange alone; the library's copies are added below
    if how != "bruck":
        return shape_price(shape, "flat", 2, "shm", True, how).price(free, block) + block * m.beta_copy
    k = sum(r.blocks for r in bruck_schedule(p))  # blocks sent over all rounds
    cpu = k * m.mpi_ddt_block if library else 0.0
    copies = (2 * p + 3 * k) * block * m.beta_copy
    return shape_price(shape, "bruck", 2, "shm", True, "").price(free, block) + cpu + copies

