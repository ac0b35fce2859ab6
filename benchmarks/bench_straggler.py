r"""The update policy's report card: every update mode under every straggler condition, by time to
target and final accuracy (docs/method.md: *The report card*).

    python -m hxmpi.data make --out /tmp/store --samples 120000 --features 128 --clusters-per-class 6 \
        --separation 2.5
    mpirun --allow-run-as-root -np 2 python benchmarks/bench_straggler.py --dataset /tmp/store

Judge it at one rank per core (np 2 on a 2-core host, ``--ranks-per-node 1`` so the two ranks
talk as two nodes): ``--straggle`` makes a rank sleep, and a sleeping rank on a host with fewer
cores than ranks frees a core for the others, which flatters plain sync.

Conditions (``--conditions``):
  none   no straggler;
  x3     the last rank computes ``--factor`` times as long for the whole run (``--straggle LAST:xF``);
  x3half ... for the first half of the schedule's steps only (``--straggle LAST:xF:0.5``);
  hog    an outside CPU hog: rank 0 starts a busy process ``--hog-after`` seconds into the run and
         stops it ``--hog-for`` seconds later (it competes with the ranks for the cores).
Modes (``--modes``): sync, async (forced; post-local SGD after --local-steps-until), balanced
(sync with ``--balance on``), auto (the policy controller, default flags).

Every run trains the whole schedule (no early stop) from the same seed; its time to target is
read between evaluations (``hxmpi.runlog.time_to_target_interpolated``: training time,
evaluation excluded, linear between the last evaluation below the target and the first at it;
``--eval-every`` steps within an epoch as well as after it, default 25: an epoch of the 120k
store is 375 steps, and an accuracy curve that flattens near the target makes a line drawn
across a whole epoch charge a run most of that epoch for a few thousandths of accuracy). Each
cell shows the median (min-max) over ``--runs`` runs, interleaved so that a burst of load hits
every mode alike. Per condition the card marks the best forced mode (the shortest median time
to target; a mode that never reaches it is not a candidate), auto's time ratio to it (of the
medians, and the median of the per-run ratios: run i of auto against run i of that mode, a few
seconds apart, which a host whose load drifts over minutes disturbs less) and its accuracy
difference. ``--recard FILE`` prints the card of a JSON written before, without running.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time

import numpy as np
from mpi4py import MPI

import hxmpi  # noqa: F401 - before mpi4py: it keeps Open MPI's UCX one-sided component out (docs/staging.md)
from hxmpi.cli import command_line
from hxmpi.provenance import provenance
from hxmpi.runlog import accuracy_points, time_to_target_interpolated
from hxmpi.train.command import Trainer, parse_config

MODES = {"sync": ["--update", "sync"], "async": ["--update", "async"],
         "balanced": ["--update", "sync", "--balance", "on"], "auto": ["--update", "auto"]}
CONDITIONS = ("none", "x3", "x3half", "hog")
FORCED = ("sync", "async", "balanced")
HOG = "while True: pass"


class Hog:
    """A busy process outside the job, from ``after`` seconds for ``length`` seconds (rank 0)."""

    def __init__(self, after: float, length: float):
        self.proc, self.after, self.length = None, after, length
        self.timers = [threading.Timer(after, self._start), threading.Timer(after + length, self.stop)]

    def _start(self):
        self.proc = subprocess.Popen([sys.executable, "-c", HOG], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)

    def __enter__(self):
        for t in self.timers:
            t.start()
        return self

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __exit__(self, *exc):
        for t in self.timers:
            t.cancel()
        self.stop()


def straggle_flags(condition: str, comm, factor: float) -> list[str]:
    last = comm.size - 1
    return {"none": [], "hog": [], "x3": ["--straggle", f"{last}:x{factor:g}"],
            "x3half": ["--straggle", f"{last}:x{factor:g}:0.5"]}[condition]


def run_one(args, comm, mode: str, condition: str) -> dict:
    cfg = parse_config(["--quiet", "--model", "mlp", "--hidden", args.hidden, "--batch-size", str(args.batch_size),
                        "--epochs", str(args.epochs), "--seed", str(args.seed), "--dataset", args.dataset,
                        "--ranks-per-node", str(args.ranks_per_node), "--eval-every", str(args.eval_every),
                        *MODES[mode],
                        *straggle_flags(condition, comm, args.factor), *args.extra])
    trainer = Trainer(cfg, comm)
    hog = Hog(args.hog_after, args.hog_for) if condition == "hog" and comm.rank == 0 else None
    comm.Barrier()
    if hog:
        with hog:
            summary = trainer.run()
    else:
        summary = trainer.run()
    epochs = [e for e in trainer.events if e["event"] == "epoch"]
    evaluations = [e for e in trainer.events if e["event"] in ("epoch", "evaluation")]
    policy = [e for e in trainer.events if e["event"] == "policy"]
    return {"time_to_target_s": time_to_target_interpolated(evaluations, args.target),
            "final_accuracy": summary["test_accuracy"], "epoch_time_s": summary["train_time_s"] / len(epochs),
            "train_time_s": summary["train_time_s"], "modes_used": summary["modes_used"],
            "actions": [p.get("action") for p in policy if p.get("action") not in (None, "stay")],
            "rebalances": summary["rebalances"],
            "test_accuracy_per_epoch": [e["test_accuracy"] for e in epochs],
            "accuracy_points": [[round(t, 4), a] for t, a, _ in accuracy_points(evaluations)]}


def spread(values: list) -> dict:
    """median, min, max of the values that are not None; ``missed``: how many are None."""
    got = [v for v in values if v is not None]
    if not got:
        return {"median": None, "min": None, "max": None, "missed": len(values)}
    return {"median": float(np.median(got)), "min": min(got), "max": max(got), "missed": len(values) - len(got)}


def cell_text(s: dict, digits: int) -> str:
    if s["median"] is None:
        return "never"
    text = f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"
    return text + (f" {s['missed']} never" if s["missed"] else "")


def card(runs: dict, conditions, modes) -> dict:
    """Per condition and mode: spreads of time to target, final accuracy and epoch time; the
    best forced mode and auto's figures against it; async and balanced against sync."""
    out = {}
    for c in conditions:
        cells = {m: {k: spread([r[k] for r in runs[(c, m)]])
                     for k in ("time_to_target_s", "final_accuracy", "epoch_time_s")} for m in modes}
        forced = [m for m in FORCED if m in modes and cells[m]["time_to_target_s"]["median"] is not None]
        best = min(forced, key=lambda m: cells[m]["time_to_target_s"]["median"]) if forced else None
        row = {"cells": cells, "best_forced": best}
        if best and "auto" in modes:
            a, b = cells["auto"], cells[best]
            row["auto_time_ratio"] = (a["time_to_target_s"]["median"] / b["time_to_target_s"]["median"]
                                      if a["time_to_target_s"]["median"] is not None else None)
            row["auto_accuracy_diff"] = a["final_accuracy"]["median"] - b["final_accuracy"]["median"]
            # Run i of auto against run i of the best forced mode: the two ran a few seconds apart,
            # so a host whose load drifts over minutes weighs on both alike.
            pairs = [x["time_to_target_s"] / y["time_to_target_s"] for x, y in zip(runs[(c, "auto")], runs[(c, best)])
                     if x["time_to_target_s"] is not None and y["time_to_target_s"]]
            row["auto_time_ratio_paired"] = float(np.median(pairs)) if pairs else None
        if "sync" in modes:
            s = cells["sync"]
            if "async" in modes:
                row["async_minus_sync_accuracy"] = cells["async"]["final_accuracy"]["median"] - s["final_accuracy"]["median"]
            if "balanced" in modes:
                row["balanced_over_sync_epoch"] = cells["balanced"]["epoch_time_s"]["median"] / s["epoch_time_s"]["median"]
        out[c] = row
    return out


def print_card(result: dict, modes, args, comm) -> None:
    print(f"# MLP {args.hidden} on {args.dataset}, np {comm.size} (--ranks-per-node {args.ranks_per_node}), "
          f"batch {args.batch_size}, {args.epochs} epochs, seed {args.seed}, target {args.target}, "
          f"{args.runs} runs: median (min-max)")
    print("| condition | mode | time to target s | final accuracy | epoch s |")
    print("| --- | --- | ---: | ---: | ---: |")
    for c, row in result.items():
        for m in modes:
            cell = row["cells"][m]
            mark = " (best forced)" if m == row["best_forced"] else ""
            print(f"| {c} | {m}{mark} | {cell_text(cell['time_to_target_s'], 2)} | "
                  f"{cell_text(cell['final_accuracy'], 4)} | {cell_text(cell['epoch_time_s'], 2)} |")
    print("\n| condition | auto time / best forced | ... paired by run | auto accuracy - best forced | "
          "async - sync accuracy | balanced / sync epoch |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    fmt = (lambda v, d: "n/a" if v is None else f"{v:+.{d}f}" if d == 4 else f"{v:.{d}f}")
    for c, row in result.items():
        print(f"| {c} | {fmt(row.get('auto_time_ratio'), 2)} | {fmt(row.get('auto_time_ratio_paired'), 2)} | "
              f"{fmt(row.get('auto_accuracy_diff'), 4)} | "
              f"{fmt(row.get('async_minus_sync_accuracy'), 4)} | {fmt(row.get('balanced_over_sync_epoch'), 2)} |")


def recard(path: str, comm) -> int:
    """Print (rank 0) the card of a JSON this benchmark wrote, recomputed from its runs."""
    if comm.rank != 0:
        return 0
    saved = json.load(open(path))
    runs = {tuple(k.split("/")): rs for k, rs in saved["runs"].items()}
    conditions = list(dict.fromkeys(c for c, _ in runs))
    modes = list(dict.fromkeys(m for _, m in runs))
    args = argparse.Namespace(**saved["args"])

    class Size:  # the world the runs had, for the heading
        size = saved["world_size"]
    print_card(card(runs, conditions, modes), modes, args, Size)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", help="store directory made by python -m hxmpi.data make (above)")
    p.add_argument("--hidden", default="256,256", help="MLP hidden layer sizes, comma-separated")
    p.add_argument("--batch-size", type=int, default=256, help="global batch (samples)")
    p.add_argument("--epochs", type=int, default=6, help="epochs of every run")
    p.add_argument("--seed", type=int, default=3, help="seed of the split, the model and the shuffles")
    p.add_argument("--target", type=float, default=0.69, help="test accuracy of 'time to target'")
    p.add_argument("--eval-every", type=int, default=25,
                   help="evaluate every this many steps as well as after each epoch (0: only after each epoch); "
                        "time to target is read between evaluations")
    p.add_argument("--factor", type=float, default=3.0, help="the slow rank's compute-time factor")
    p.add_argument("--runs", type=int, default=3, help="runs of every cell (median and range shown)")
    p.add_argument("--conditions", default=",".join(CONDITIONS), help="comma-separated, of " + ", ".join(CONDITIONS))
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated, of " + ", ".join(MODES))
    p.add_argument("--hog-after", type=float, default=1.0, help="hog condition: seconds into a run it starts")
    p.add_argument("--hog-for", type=float, default=5.0, help="hog condition: seconds it runs")
    p.add_argument("--ranks-per-node", type=int, default=1, help="virtual node size (1: every rank a node)")
    p.add_argument("--json", default="benchmarks/results/straggler_card_np2.json", help="write the card here (rank 0)")
    p.add_argument("--recard", default=None, help="print the card of this JSON (written before) and exit")
    p.add_argument("extra", nargs="*", help="more python -m hxmpi.train flags for every run (after --)")
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    if args.recard:
        return recard(args.recard, comm)
    if not args.dataset:
        p.error("--dataset is required (or --recard)")
    conditions, modes = args.conditions.split(","), args.modes.split(",")
    bad = [c for c in conditions if c not in CONDITIONS] + [m for m in modes if m not in MODES]
    if bad or comm.size < 2:
        if comm.rank == 0:
            print(f"bench_straggler.py: needs at least 2 ranks and known conditions/modes; unknown: {bad}",
                  file=sys.stderr)
        return 2
    runs = {(c, m): [] for c in conditions for m in modes}
    for i in range(args.runs):
        for c in conditions:
            for m in modes:
                t0 = time.perf_counter()
                r = run_one(args, comm, m, c)
                runs[(c, m)].append(r)
                if comm.rank == 0:  # progress, so that a long benchmark shows where it is
                    ttt = r["time_to_target_s"]
                    print(f"# run {i + 1} {c}/{m}: to target {'never' if ttt is None else f'{ttt:.2f}'} s, "
                          f"accuracy {r['final_accuracy']:.4f}, epoch {r['epoch_time_s']:.2f} s, modes "
                          f"{','.join(r['modes_used'])} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    if comm.rank != 0:
        return 0
    result = card(runs, conditions, modes)
    print_card(result, modes, args, comm)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"benchmark": "straggler_card", "provenance": provenance(command_line("benchmarks/bench_straggler.py", comm.size)),
                       "world_size": comm.size, "args": vars(args),
                       "card": result, "runs": {f"{c}/{m}": rs for (c, m), rs in runs.items()}}, fh, indent=1)
    return 0


if __name__ == "__main__":
    from hxmpi.cli import run_main  # an uncaught error on one rank ends the job
    run_main(main, 'bench_straggler.py')
