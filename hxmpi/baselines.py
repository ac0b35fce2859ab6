"""Which bare MPI call a result's column is set against: plans against MPI's plans too, one-shot
calls against MPI's one-shot calls.

An hxmpi persistent request (a column or field named ``*-plan`` or ``*_plan``: ``Alltoallv_init``
once, then Start + Wait) is set against the best bare MPI call, persistent included: the faster of
MPI's one-shot call (``ONESHOT``) and MPI's own persistent collective (``PERSISTENT``: MPI-4's
``MPI_Alltoallv_init``, built once and started every call). A one-shot hxmpi call is set against
the best bare one-shot call. A result without MPI's persistent call (made before it was measured)
gives a plan no baseline (None; the tables say n/a) until it is rerun.

The names are those of ``benchmarks/osu_alltoallv.py``'s and ``benchmarks/bench_overhead.py``'s
columns and of ``python -m hxmpi.sim``'s fields (``<field>_sim_s``, ``model_<field>_s``). Pure: no MPI.
"""
from __future__ import annotations

from typing import Mapping, Optional

__all__ = ["BARE_PLAN", "ONESHOT", "PERSISTENT", "BASELINES", "is_plan", "baseline", "ratio", "BASELINE_WORDS"]

#: MPI's one-shot calls: the benchmarks' ``bare`` (``comm.Alltoallv``), the simulator's
#: ``bare_alltoallv`` and ``bare_alltoall``.
ONESHOT = ("bare", "bare_alltoallv", "bare_alltoall")
#: The benchmarks' column of MPI's persistent collective (``comm.Alltoallv_init``, then Start + Wait).
BARE_PLAN = "bare-plan"
#: MPI's persistent collectives: the benchmarks' ``BARE_PLAN``, the simulator's ``bare_alltoallv_plan``.
PERSISTENT = (BARE_PLAN, "bare_alltoallv_plan")
BASELINES = ONESHOT + PERSISTENT
#: What each kind of column is set against, as the tables' notes say it.
BASELINE_WORDS = {"plan": "the best bare MPI call, persistent included (the faster of MPI's one-shot call and "
                          "MPI's persistent MPI_Alltoallv_init)",
                  "oneshot": "the best bare one-shot MPI call"}


def is_plan(name: str) -> bool:
    """Whether column ``name`` is one of hxmpi's persistent requests (MPI's own are baselines)."""
    return name not in BASELINES and name.endswith(("-plan", "_plan"))


def baseline(name: str, times: Mapping[str, Optional[float]]) -> Optional[float]:
    """The time column ``name`` is set against, in the unit of ``times`` (column -> time, None
    where not measured): the fastest of ``ONESHOT`` for a one-shot call or a baseline, and of
    ``ONESHOT`` and ``PERSISTENT`` for a plan; None where a plan has no ``PERSISTENT`` time or
    nothing is there."""
    oneshot = [times[k] for k in ONESHOT if times.get(k) is not None]
    if not is_plan(name):
        return min(oneshot, default=None)
    persistent = [times[k] for k in PERSISTENT if times.get(k) is not None]
    return min(oneshot + persistent) if persistent else None


def ratio(name: str, times: Mapping[str, Optional[float]]) -> Optional[float]:
    """``times[name]`` over its ``baseline``; None where either is missing."""
    base, value = baseline(name, times), times.get(name)
    return None if base is None or value is None or base <= 0 else value / base
