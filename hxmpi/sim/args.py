"""The simulator commands' flags read: layouts, block sizes, the platform, the CPU file, and the
command line a result records (``python -m hxmpi.sim``, ``hxmpi.sim.scale``, ``hxmpi.sim.mleader``)."""
from __future__ import annotations

import argparse
import shlex
import sys

from ..comm.costmodel.cpu import CpuTimes
from ..comm.costmodel.model import CostModel
from ..errors import CpuFileError
from .errors import SimulateError
from .presets import PRESETS
from .sweep import DEFAULT_MAX_REPLAY_RANKS

__all__ = ["add_replay_flags", "int_list", "block_sizes", "layouts_of", "model_of", "cpu_of", "command_line"]


def add_replay_flags(p: argparse.ArgumentParser) -> None:
    """The flags every replaying command shares: ``--timeout`` (seconds per replay),
    ``--max-replay-ranks``, ``--overhead`` (hxmpi's CPU per path) and ``--smpirun``."""
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per replay (default 1800)")
    p.add_argument("--max-replay-ranks", type=int, default=DEFAULT_MAX_REPLAY_RANKS,
                   help=f"larger worlds are given by the model only, marked so (default {DEFAULT_MAX_REPLAY_RANKS})")
    p.add_argument("--overhead", metavar="FILE",
                   help="bench_overhead.py --json output: hxmpi's CPU seconds per call by path (key "
                   "cpu_s_per_call, every path; default: the file packaged with hxmpi, hxmpi/comm/overhead.json); "
                   "a missing or malformed file is an error")
    p.add_argument("--smpirun", help="the SimGrid smpirun to replay with (default: env HXMPI_SMPIRUN, else the "
                   "source build of python -m hxmpi.sim.simgrid build, else smpirun on PATH)")


def int_list(text: str, what: str) -> list[int]:
    """Positive integers from comma-separated ``text``; SimulateError naming the flag ``what``."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SimulateError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise SimulateError(f"{what} must be positive integers, got {text!r}")
    return values


def block_sizes(text: str, factor: int) -> list[int]:
    """Block sizes MIN, MIN*factor, ... <= MAX from "MIN:MAX" (bytes)."""
    lo, _, hi = text.partition(":")
    try:
        lo_i, hi_i = int(lo), int(hi or lo)
    except ValueError:
        raise SimulateError(f"-m must be MIN:MAX bytes, got {text!r}") from None
    if lo_i < 1 or hi_i < lo_i:
        raise SimulateError(f"-m {text}: the size range is empty (need 1 <= MIN <= MAX)")
    if factor < 2:
        raise SimulateError(f"--factor must be at least 2, got {factor}")
    sizes, b = [], lo_i
    while b <= hi_i:
        sizes.append(b)
        b *= factor
    return sizes


def layouts_of(args) -> list[list[int]]:
    """Node sizes of every layout the flags name: ``--nodes`` x ``--ranks-per-node``, ``--shape NxG``,
    ``--layout A+B+...``."""
    layouts = [[g] * n for n in int_list(args.nodes, "--nodes")
               for g in int_list(args.ranks_per_node, "--ranks-per-node")] if args.nodes else []
    for text in args.shape or []:
        n, x, g = text.lower().partition("x")
        if not x:
            raise SimulateError(f"--shape must be NODESxRANKS, e.g. 128x8, got {text!r}")
        n_i, g_i = int_list(n, "--shape")[0], int_list(g, "--shape")[0]
        layouts.append([g_i] * n_i)
    for text in args.layout or []:
        layouts.append(int_list(text.replace("+", ","), "--layout"))
    if not layouts:
        raise SimulateError("give --nodes and --ranks-per-node, --shape or --layout")
    return layouts


def model_of(args) -> tuple[CostModel, str]:
    """(the platform's CostModel, its source's name) from ``--tuning`` or ``--preset``."""
    if args.tuning:
        try:
            return CostModel.load(args.tuning), f"tuning {args.tuning}"
        except (OSError, ValueError) as exc:
            raise SimulateError(f"--tuning {args.tuning}: {exc}") from None
    if args.preset not in PRESETS:
        raise SimulateError(f"unknown preset {args.preset!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[args.preset], f"preset {args.preset}"


def command_line(argv, prog: str = "hxmpi.sim") -> str:
    """The command line a result records: ``python -m PROG`` and its arguments (``argv``, else the
    process's)."""
    return shlex.join(["python", "-m", prog, *(sys.argv[1:] if argv is None else argv)])


def cpu_of(args) -> CpuTimes:
    """--overhead's CPU per path, or the packaged file's; SimulateError naming a bad file."""
    try:
        return CpuTimes.load(args.overhead)
    except CpuFileError as exc:
        raise SimulateError(f"--overhead: {exc}") from None

