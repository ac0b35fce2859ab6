"""Error types and the collective error agreement every hxmpi collective uses.

An error found on one rank must surface on every rank: a rank that raised alone would leave the
others waiting in the next collective forever.
"""
from __future__ import annotations

from typing import Optional

from mpi4py import MPI


class HxmpiError(Exception):
    """Base class of every error hxmpi raises on purpose."""


class TopologyError(HxmpiError, ValueError):
    """Bad node layout (node_of, ranks_per_node): raised on every rank."""


class ExchangeError(HxmpiError, ValueError):
    """Bad all-to-all input (counts, displacements, buffers): raised on every rank, before data moves."""


class SettingError(HxmpiError, ValueError):
    """A run setting with a bad value (or a bad combination), raised on every rank.

    ``setting`` names the setting (a ``config.TrainConfig`` field), never a command-line flag: the
    CLI maps it to its flag when it prints the error.
    """

    def __init__(self, setting: str, detail: str):
        super().__init__(f"{setting} {detail}")
        self.setting, self.detail = setting, detail


def agree(comm: MPI.Comm, problem: Optional[str], error: type = HxmpiError) -> None:
    """Raise ``error`` on every rank of ``comm`` if any rank passes a non-empty ``problem``.

    Costs one int Allreduce when all is well; the messages are gathered only on failure, so the
    raised text names every failing rank and its reason.
    """
    flag = comm.allreduce(1 if problem else 0, op=MPI.MAX)
    if flag:
        raise_gathered(comm, problem, error)


def raise_gathered(comm: MPI.Comm, problem: Optional[str], error: type = HxmpiError) -> None:
    """Gather every rank's ``problem`` and raise ``error`` naming them (collective; call on all ranks)."""
    problems = comm.allgather(problem)
    lines = [f"rank {r}: {p}" for r, p in enumerate(problems) if p]
    shown = lines[:8] + ([f"... and {len(lines) - 8} more ranks"] if len(lines) > 8 else [])
    raise error("; ".join(shown))
