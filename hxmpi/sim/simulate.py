"""``python -m hxmpi.sim``: replay hxmpi's exact message schedules in SimGrid (SMPI).

Evidence at a scale this machine cannot run. For every layout and block size, every rank's part
of one flat and one hier all-to-all is written as a time-independent trace and replayed with
``smpirun -replay`` (SimGrid's ``smpireplaymain``, Debian package ``libsimgrid-dev``) on a
simulated cluster. The traces come from ``hxmpi.comm.plan.rank_schedule``, the planner ``HierComm``
executes, so the simulated messages and copies are the ones hxmpi makes:

- messages: each all-to-all phase as Open MPI runs it. A blocking ``MPI_Alltoallv`` (flat, and
  hier's message-passing node phase) follows Open MPI's fixed rule (``costmodel.alltoallv_algorithm``):
  pairwise rounds (send to rank+k, receive from rank-k, wait) or linear (post every receive and
  send, then wait). Hier's lane phase is a nonblocking ``Ialltoallv``, which Open MPI runs linear.
- copies (pack, repack, copy out of the node window, unpack) and hxmpi's own CPU per call:
  ``sleep`` actions, at the model's copy bandwidth and the measured CPU per path (``--overhead``,
  default the file packaged with hxmpi: ``costmodel.CpuTimes``);
- node barriers of the shared-memory node phase: dissemination rounds of 1-byte messages.

The platform is a SimGrid cluster of N hosts of G cores: a private link per host (inter-node
latency and bandwidth, full duplex), a backbone (non-blocking unless ``--oversubscription``) or a
two-level fat tree, a loopback link per host for intra-node messages, and a per-message CPU
overhead at the sender and the receiver. The numbers come from a tuning file (``calibrate.py``'s)
or a preset (``PRESETS``), and the same numbers feed ``hxmpi.comm.costmodel``, so the report's model
columns and errors show what the model's structure misses, not a difference in parameters.

This module is the command: it reads the flags (``args``) and runs the sweep (``sweep``). Each
call's steps (``calls``) become every rank's trace (``trace``, written with ``actions`` and Open
MPI's ``reference`` schedules), replayed (``replay``) on a platform (``platform``, ``presets``);
the records are shown as a table and a plot (``output``).
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from ..comm.costmodel.model import CostModel
from ..comm.plan import MAX_CHUNKS
from ..provenance import provenance
from .args import add_replay_flags, block_sizes, command_line, cpu_of, layouts_of, model_of
from .errors import SimulateError
from .output import plot, print_layout, us
from .platform import NETWORKS, Network, oversubscribe, oversubscription
from .presets import PRESET_NICS, PRESETS
from .replay import simgrid
from .sweep import REPLAYED, compare_measured, simulate_point, summarize

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The flags of ``python -m hxmpi.sim`` (docs/tools.md, Simulator, lists them)."""
    p = argparse.ArgumentParser(prog="python -m hxmpi.sim", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Presets: " + "; ".join(
                                    f"{k}: inter {m.alpha_inter * 1e6:g} us / {1 / m.beta_inter / 1e9:g} GB/s, "
                                    f"intra {m.alpha_intra * 1e6:g} us / {1 / m.beta_intra / 1e9:g} GB/s, "
                                    f"{m.msg_overhead * 1e6:g} us per message" for k, m in PRESETS.items()))
    p.add_argument("--nodes", help="node counts, comma-separated (e.g. 8,64)")
    p.add_argument("--ranks-per-node", default="8", help="ranks per node, comma-separated (default 8); "
                   "every pair with --nodes is one layout")
    p.add_argument("--shape", action="append", help="one layout of N nodes of G ranks, as NxG, e.g. 128x8 "
                   "(repeatable; beside the pairs of --nodes and --ranks-per-node)")
    p.add_argument("--layout", action="append", help="an irregular layout as node sizes, e.g. 2+2+1 (repeatable)")
    p.add_argument("-m", "--message-size", default="8:1048576", help="MIN:MAX block bytes (default 8:1048576)")
    p.add_argument("--factor", type=int, default=2, help="step between block sizes (default 2: powers of two)")
    p.add_argument("--uneven", action="store_true", help="skewed Zipf-like counts per destination, same mean")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--tuning", help="platform and model from a calibration file (benchmarks/calibrate.py --out)")
    src.add_argument("--preset", default="hdr", help=f"named platform: {', '.join(PRESETS)} (default hdr)")
    p.add_argument("--node-phase", choices=("shm", "mpi"), default="shm",
                   help="hier's node phase: shared-memory window (default) or message passing")
    p.add_argument("--network", choices=NETWORKS, default="backbone", help="backbone (default) or fat-tree")
    p.add_argument("--oversubscription", type=float, default=None,
                   help="the backbone (or spine) carries 1/R of all node links' bandwidth (default: the "
                   "model's beta_backbone; 1 = non-blocking); the model gets the matching beta_backbone")
    add_replay_flags(p)
    p.add_argument("--numpy-call", action="store_true",
                   help="simulate the alltoallv(array, counts) form: its agreement also exchanges the counts")
    p.add_argument("--no-nic", action="store_true", help="replay without the preset's NIC (its message rate and "
                   "bandwidth per node; presets with one: " + ", ".join(k for k, v in PRESET_NICS.items() if v) + ")")
    p.add_argument("--coarse", action="store_true", help="replay linear world phases coarsely: one message per "
                   "node pair and local rank, their CPU and NIC costs kept (much faster at 1024 ranks)")
    p.add_argument("--chunks", type=int, choices=range(1, MAX_CHUNKS + 1), metavar=f"1..{MAX_CHUNKS}",
                   help="replay hier with this many chunks in its pipelined node phase (default: the model's "
                   "pick among 1, 2, 4 and 8, per point)")
    p.add_argument("--only", help="replay only these fields of each record, comma-separated, of: "
                   f"{', '.join(REPLAYED)} (default: all); the others are null and listed in not_run")
    p.add_argument("--compare", help="a calibrate.py --json report: simulate its layout and sizes with its "
                   "model and print simulated vs measured (the layout flags are then not needed); or an "
                   "osu_alltoallv.py --json report: every hxmpi column (one-shot hits, -new misses, -plan), bare "
                   "and bare-plan, on --tuning's platform with --overhead's CPU per path")
    p.add_argument("--json", help="write the records (and the summary) here")
    p.add_argument("--plot", help="write a PNG of auto / best bare MPI per layout here (needs matplotlib)")
    return p


def main(argv=None) -> int:
    """``python -m hxmpi.sim``: replay the sweep (or ``--compare`` a report); returns the exit code."""
    args = build_parser().parse_args(argv)
    if args.compare:
        return _main_compare(args, argv)
    try:
        layouts = layouts_of(args)
        sizes = block_sizes(args.message_size, args.factor)
        only = None
        if args.only is not None:
            only = [k.strip() for k in args.only.split(",") if k.strip()]
            bad = sorted(set(only) - set(REPLAYED))
            if bad or not only:
                raise SimulateError(f"--only: unknown field(s) {bad or args.only!r}; choose from {', '.join(REPLAYED)}")
        model, source = model_of(args)
        cpu = cpu_of(args)
        if args.oversubscription is not None:
            if args.oversubscription < 1:
                raise SimulateError(f"--oversubscription must be >= 1, got {args.oversubscription:g}")
            model = oversubscribe(model, args.oversubscription)
        network = Network(args.network)
        nic = None if args.tuning or args.no_nic else PRESET_NICS.get(args.preset)
        sg = simgrid(args.smpirun)
        if args.plot:
            try:
                import matplotlib  # noqa: F401  (checked before hours of replay, not after)
            except ImportError:
                raise SimulateError("--plot needs matplotlib: pip install -e '.[bench]'") from None
        records = []
        print(f"# hxmpi.sim: {sg.label} SMPI replay ({sg.smpirun}), {source}, {args.network} network, "
              f"node phase {args.node_phase}{', uneven counts' if args.uneven else ''}"
              f"{', NIC ' + format(nic.msg_rate / 1e6, '.4g') + ' M msg/s per node' if nic else ''}"
              f"{', coarse linear phases' if args.coarse else ''}", flush=True)
        for lay in layouts:
            rows = [simulate_point(lay, b, model, network, args.node_phase, args.uneven, timeout=args.timeout,
                                   cpu=cpu, numpy=args.numpy_call, max_replay_ranks=args.max_replay_ranks,
                                   only=only, sg=sg, nic=nic, coarse=args.coarse, chunks=args.chunks)
                    for b in sizes]
            print_layout(rows)
            sys.stdout.flush()
            records += rows
    except SimulateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    summary = summarize(records)
    for algo, s in summary.items():
        if isinstance(s, dict) and s["points"]:
            print(f"# model vs simulation, {algo}: mean error {s['mean_rel_error']:.1%}, "
                  f"max {s['max_rel_error']:.1%} over {s['points']} points")
    print(f"# model's pick within 5% of the fastest replayed algorithm at {summary['auto_right']}/"
          f"{summary['auto_points']} points")
    if summary["oneshot_minus_agreement_vs_best_bare_max"] is not None:
        plan = summary["plan_vs_plan_baseline_max"]
        print("# worst auto over the sweep: plan / best bare MPI call, persistent included "
              f"{'n/a' if plan is None else f'{plan:.2f}'}, (one-shot - agreement) / best bare one-shot "
              f"{summary['oneshot_minus_agreement_vs_best_bare_max']:.2f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"benchmark": "simulate", "provenance": provenance(command_line(argv), sg.label),
                       "simgrid": sg.version, "source": source, "network": args.network,
                       "oversubscription": oversubscription(model), "node_phase": args.node_phase,
                       "uneven": args.uneven, "model": model.__dict__, "summary": summary,
                       "nic": None if nic is None else nic.__dict__, "coarse": args.coarse,
                       "overhead": cpu.source, "cpu_s_per_call": dict(cpu.seconds),
                       "records": records}, fh, indent=1)
    if args.plot:
        plot(records, args.plot, f"SimGrid replay, {source}, node phase {args.node_phase}")
    return 0



def _main_compare(args, argv=None) -> int:
    try:
        with open(args.compare) as fh:
            report = json.load(fh)
        osu = report.get("benchmark") == "osu_alltoallv"
        if osu and not args.tuning:
            raise SimulateError("--compare of an osu_alltoallv.py report needs --tuning (the platform)")
        model = model_of(args)[0] if osu else CostModel(**report["model"])
        cpu = cpu_of(args) if osu else None
        network = Network(args.network)
        node_phase = report.get("node_phase", args.node_phase)
        sg = simgrid(args.smpirun)
        rows = compare_measured(report, model, network, node_phase, cpu, sg)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"error: --compare {args.compare}: {exc}", file=sys.stderr)
        return 2
    except SimulateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sizes = report["node_sizes"] if osu else report["layout"]["node_sizes"]
    print(f"# simulated vs measured: nodes {sizes}, model of {args.tuning if osu else args.compare}, "
          f"node phase {node_phase}" + (f", CPU per path from {cpu.source}" if osu else ""))
    print(f"{'# Block [B]':<12}{'algorithm':>20}{'measured':>12}{'simulated':>12}{'error':>8}  [us]")
    for r in rows:
        print(f"{r['block_bytes']:<12d}{r['algorithm']:>20}{us(r['measured_s'])}{us(r['sim_s'])}{r['rel_error']:8.1%}")
    summary = {a: float(np.mean([r["rel_error"] for r in rows if r["algorithm"] == a]))
               for a in dict.fromkeys(r["algorithm"] for r in rows)}
    print("# mean |simulated - measured| / measured: " + ", ".join(f"{a} {e:.1%}" for a, e in summary.items()))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"benchmark": "simulate-compare", "provenance": provenance(command_line(argv), sg.label),
                       "simgrid": sg.version, "source": args.compare, "node_phase": node_phase,
                       "layout": report.get("layout", {"node_sizes": sizes}), "tuning": args.tuning if osu else None,
                       "overhead": cpu.source if osu else None,
                       "cpu_s_per_call": dict(cpu.seconds) if osu else None,
                       "summary": summary, "rows": rows}, fh, indent=1)
    return 0
