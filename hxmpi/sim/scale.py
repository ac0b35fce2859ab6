"""``python -m hxmpi.sim.scale``: hxmpi against each library run with its own CPU, at scale.

One row per layout and block size (even counts), in seconds per call:

- hxmpi: ``auto``'s one-shot call (the agreement included) and its plan (a persistent request),
  charged hxmpi's measured CPU per path (``sweep.simulate_point``);
- Open MPI tuned: ``MPI_Alltoall`` as Open MPI's tuned component decides it
  (``reference.tuned_alltoall``: its modified Bruck, linear or pairwise), with the CPU per block
  the preset's fit found in Open MPI's Bruck (``RefCpu.ddt_block``);
- HAN: coll/han's ``alltoall_using_smsc`` with its fitted CPU per block (``RefCpu.han_block``);
- lower bound: the fastest of bare ``MPI_Alltoallv`` (Open MPI's rule, as ``python -m hxmpi.sim``
  replays it), MPI's persistent ``MPI_Alltoallv_init`` (Open MPI's libnbc: every message posted at
  once) and ``MPI_Alltoall`` as Open MPI's tuned decision runs it, all replayed with no
  library CPU at all (only the platform's per-message cost): no MPI library runs that fast, so a
  ratio to it is an upper bound of hxmpi's cost.

Worlds above ``--max-replay-ranks`` are given by the models (hxmpi's ``costmodel``, the
references' ``reference_features``); every record carries the model's numbers beside the replay's,
so the model's error at the replayed points is stated with the table. ``--coarse`` replays linear
world phases coarsely (``actions.coarse_actions``: one message per node pair and local rank), the
shortcut that brings a 1024-rank point to minutes.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from typing import Optional, Sequence

from ..comm.costmodel.cpu import CpuTimes
from ..comm.costmodel.model import CostModel
from ..comm.plan import Layout
from ..provenance import provenance
from .actions import Coarse, Nic, even_hierarchy
from .args import add_replay_flags, block_sizes, command_line, cpu_of, layouts_of
from .calls import node_of_sizes
from .errors import ReplayTimeout, SimulateError
from .output import us
from .platform import Network
from .presets import PRESET_NICS, calibrated_preset
from .reference import RefCpu, predict_reference, reference_trace, tuned_alltoall
from .replay import replay_traces, simgrid
from .simgrid import SimGrid
from .sweep import DEFAULT_MAX_REPLAY_RANKS, simulate_point

__all__ = ["BASELINES", "HXMPI_FIELDS", "ALLTOALLV_FIELDS", "COLUMNS", "scale_point", "model_errors", "build_parser", "main"]

#: Open MPI's schedules replayed: (record key, reference schedule, with the library's CPU).
BASELINES = (("ompi_tuned", "ompi_tuned", True), ("han", "han_alltoall", True),
             ("ompi_tuned_free", "ompi_tuned", False))
#: simulate_point's fields the table needs (the rest of its record is not replayed).
HXMPI_FIELDS = ("bare_alltoallv", "bare_alltoallv_plan", "auto", "auto_plan", "agreement")
#: The fields of bare MPI_Alltoallv, one-shot and persistent: the same messages (``--no-alltoallv``
#: skips both).
ALLTOALLV_FIELDS = ("bare_alltoallv", "bare_alltoallv_plan")
#: The table's columns: (record key, heading).
COLUMNS = (("auto", "hxmpi one-shot"), ("auto_plan", "hxmpi plan"), ("ompi_tuned", "Open MPI tuned + CPU"),
           ("han", "HAN + CPU"), ("lower_bound", "lower bound (CPU-free bare)"))


def scale_point(sizes: Sequence[int], block: int, model: CostModel, ref: RefCpu, nic: Optional[Nic],
                cpu: Optional[CpuTimes] = None, network: Network = Network(), timeout: Optional[float] = None,
                coarse: bool = False, max_replay_ranks: int = DEFAULT_MAX_REPLAY_RANKS,
                sg: Optional[SimGrid] = None, alltoallv: bool = True) -> dict:
    """One record of the table: ``simulate_point``'s (``HXMPI_FIELDS`` replayed), plus each
    baseline of ``BASELINES`` replayed (``<key>_sim_s``, wall seconds in ``replay_s``) and
    modelled (``model_<key>_s``), and ``lower_bound_sim_s`` / ``model_lower_bound_s``; ``<column>_s``
    is the replay's value, or the model's where the world is not replayed. ``alltoallv=False``: bare
    MPI_Alltoallv, one-shot and persistent, is not replayed (the lower bound is then Open MPI's
    tuned MPI_Alltoall alone; ``lower_bound_of`` says which)."""
    only = HXMPI_FIELDS if alltoallv else tuple(f for f in HXMPI_FIELDS if f not in ALLTOALLV_FIELDS)
    rec = simulate_point(sizes, block, model, network, timeout=timeout, cpu=cpu, max_replay_ranks=max_replay_ranks,
                         only=only, sg=sg, nic=nic, coarse=coarse)
    layout = Layout(node_of_sizes(sizes))
    n, g, p = layout.num_nodes, layout.max_node_size, layout.size
    rec["ompi_tuned_schedule"] = tuned_alltoall(p, block)
    rec["reference_cpu"] = dict(ref.__dict__)
    how = Coarse.of(model, nic) if coarse else None
    for key, name, with_cpu in BASELINES:
        ok = name != "han_alltoall" or even_hierarchy(layout)
        lib = ref if with_cpu else RefCpu()
        rec[f"model_{key}_s"] = predict_reference(name, n, g, block, model, lib) if ok else None
        rec[f"{key}_sim_s"] = None
        if rec["by_model"] or not ok:
            continue
        traces = (reference_trace(name, layout, block, r, model, lib, how) for r in range(p))
        t0 = time.perf_counter()
        try:
            with tempfile.TemporaryDirectory(prefix="hxmpi-scale-") as tmp:
                rec[f"{key}_sim_s"] = replay_traces(layout, traces, model, network, tmp, timeout, sg, name, nic)
        except ReplayTimeout:
            rec["timed_out"].append(key)
        rec["replay_s"][key] = round(time.perf_counter() - t0, 3)
    bare = ALLTOALLV_FIELDS if alltoallv else ()
    rec["model_lower_bound_s"] = min([rec["model_ompi_tuned_free_s"]] + [rec[f"model_{k}_s"] for k in bare])
    free = [rec["ompi_tuned_free_sim_s"]] + [rec[f"{k}_sim_s"] for k in bare]
    rec["lower_bound_sim_s"] = None if None in free else min(free)
    rec["lower_bound_of"] = "MPI_Alltoallv, MPI_Alltoallv_init and MPI_Alltoall" if alltoallv else "MPI_Alltoall"
    for key, _ in COLUMNS:
        shown = rec[f"model_{key}_s"] if rec["by_model"] else rec[f"{key}_sim_s"]
        rec[f"{key}_s"] = shown
    for key in ("auto", "auto_plan"):
        for base in ("ompi_tuned", "han", "lower_bound"):
            other = rec[f"{base}_s"]
            rec[f"{key}_vs_{base}"] = rec[f"{key}_s"] / other if rec[f"{key}_s"] and other else None
    return rec


def model_errors(records: list[dict]) -> dict:
    """The model's relative error per column over the replayed records,
    ``abs(model - replay) / replay``: mean, max and points."""
    out = {}
    for key, _ in COLUMNS:
        errs = [abs(r[f"model_{key}_s"] - r[f"{key}_sim_s"]) / r[f"{key}_sim_s"] for r in records
                if not r["by_model"] and r.get(f"{key}_sim_s") and r.get(f"model_{key}_s") is not None]
        out[key] = {"mean_rel_error": sum(errs) / len(errs) if errs else None,
                    "max_rel_error": max(errs) if errs else None, "points": len(errs)}
    return out


def build_parser() -> argparse.ArgumentParser:
    """The flags of ``python -m hxmpi.sim.scale`` (docs/tools.md, Simulator, lists them)."""
    p = argparse.ArgumentParser(prog="python -m hxmpi.sim.scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", action="append", help="one layout of N nodes of G ranks, as NxG, e.g. 32x32 "
                   "(repeatable)")
    p.add_argument("-m", "--message-size", default="8:4096", help="MIN:MAX block bytes (default 8:4096)")
    p.add_argument("--factor", type=int, default=8, help="step between block sizes (default 8)")
    p.add_argument("--no-nic", action="store_true", help="replay without the preset's NIC (message rate and "
                   "injection bandwidth per node)")
    p.add_argument("--coarse", action="store_true", help="replay linear world phases coarsely (one message per "
                   "node pair and local rank; their CPU and NIC costs kept)")
    p.add_argument("--no-alltoallv", action="store_true", help="do not replay bare MPI_Alltoallv nor MPI's "
                   "persistent MPI_Alltoallv_init (their linear phase is the slowest replay at 1024 ranks on SimGrid "
                   "3.32); the lower bound is then Open MPI's tuned MPI_Alltoall without CPU")
    add_replay_flags(p)
    p.add_argument("--json", help="write the records here")
    return p


def main(argv=None) -> int:
    """``python -m hxmpi.sim.scale``: the table on the ``slingshot`` preset; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        if not args.shape:
            raise SimulateError("give at least one --shape NxG")
        args.nodes, args.layout = None, None
        layouts = layouts_of(args)
        sizes = block_sizes(args.message_size, args.factor)
        model, data = calibrated_preset()
        ref = RefCpu(**data["reference_cpu"])
        nic = None if args.no_nic else PRESET_NICS["slingshot"]
        cpu = cpu_of(args)
        sg = simgrid(args.smpirun)
    except SimulateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    prov = provenance(command_line(argv, "hxmpi.sim.scale"), sg.label)  # the tree the replays ran from
    print(f"# hxmpi.sim.scale: {sg.label}, preset slingshot, NIC {'off' if nic is None else 'on'}, "
          f"{'coarse' if args.coarse else 'full'} replays of linear world phases; us per call")
    print(f"{'# layout':<10}{'block':>7}" + "".join(f"{h[:13]:>14}" for _, h in COLUMNS) + f"{'tuned runs':>15}  from")
    records = []

    def write(done: bool) -> None:
        # After every row: a sweep stopped midway keeps what it replayed ("complete" says which).
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"benchmark": "simulate-scale", "provenance": prov, "simgrid": sg.version,
                           "source": "preset slingshot", "model": model.__dict__, "reference_cpu": ref.__dict__,
                           "nic": None if nic is None else nic.__dict__, "coarse": args.coarse,
                           "overhead": cpu.source, "complete": done, "model_errors": model_errors(records),
                           "records": records}, fh, indent=1)
    for lay in layouts:
        for b in sizes:
            try:
                r = scale_point(lay, b, model, ref, nic, cpu, timeout=args.timeout, coarse=args.coarse,
                                max_replay_ranks=args.max_replay_ranks, sg=sg, alltoallv=not args.no_alltoallv)
            except SimulateError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
            records.append(r)
            print(f"{r['nodes']}x{r['ranks_per_node']:<7}{b:>7}" + "".join(us(r[f'{k}_s'], 14) for k, _ in COLUMNS)
                  + f"{r['ompi_tuned_schedule']:>15}  {'model' if r['by_model'] else 'replay'}", flush=True)
            write(False)
    errors = model_errors(records)
    for key, e in errors.items():
        if e["points"]:
            print(f"# model vs replay, {key}: mean {e['mean_rel_error']:.1%}, max {e['max_rel_error']:.1%} "
                  f"over {e['points']} points")
    write(True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
