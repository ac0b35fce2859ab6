"""One slow rank: plain sync against the update policy (auto) and load-balanced sync, by time to target.

    python -m hxmpi.data make --out /tmp/lasting --samples 200000 --features 256 --shard-mb 16
    mpirun --allow-run-as-root --oversubscribe -np 4 python benchmarks/bench_straggler.py --dataset /tmp/lasting \
        --json straggler.json

Every configuration trains the same model from the same seed in float64 (so that the balanced
run's loss can be compared with plain sync's to 1e-6), once with the last rank slowed by
``--straggle LAST:xF`` and once without. The runs happen one after another in the same processes;
with ``--repeats N`` the whole sequence runs N times and the table shows each figure's median
(the runs' trajectories do not depend on timing except auto's decisions, so only times vary).
The default workload is bench_train.py's lasting one (MLP 1024,1024, batch 512, target 0.92);
each run stops after the first epoch at the target.

Time to target is the training time (slowest rank, evaluation excluded) until the first epoch
whose test accuracy reaches ``--target``: the summary's ``time_to_target_s``, computed from the
epoch records. The runs do not pass ``--target-accuracy`` to the trainer, because that also turns
on the gradient coefficient, whose damping depends on measured step times and would make the
runs differ for reasons other than the update mode. The per-step breakdown (ms, mean over ranks)
says where the time went: compute, waiting for gradients (or an async round's average), exchange.
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np
from mpi4py import MPI

import hxmpi  # noqa: F401 - before mpi4py: it keeps Open MPI's UCX one-sided component out (docs/staging.md)
from hxmpi.runlog import time_to_target
from hxmpi.train.command import Trainer, parse_config

CONFIGS = (("sync", ["--update", "sync"]), ("auto", ["--update", "auto"]),
           ("balance", ["--update", "sync", "--balance", "on"]))


def run_one(args, comm, flags: list[str]) -> dict:
    cfg = parse_config(["--quiet", "--dtype", "float64", "--model", "mlp", "--hidden", args.hidden,
                        "--batch-size", str(args.batch_size), "--epochs", str(args.epochs),
                        "--seed", str(args.seed), "--policy-window", str(args.policy_window),
                        "--b1", str(args.b1), "--dataset", args.dataset, *flags])
    trainer = Trainer(cfg, comm)
    summary = trainer.run(stop_at_accuracy=args.target)
    events = trainer.events
    epochs = [e for e in events if e["event"] == "epoch"]
    ttt, at = time_to_target(epochs, args.target)
    policy = [e for e in events if e["event"] == "policy"]
    slowdown = [max(p["step_times_s"]) / float(np.median(p["step_times_s"])) for p in policy]
    return {"epoch_time_s": summary["train_time_s"] / len(epochs), "time_to_target_s": ttt,
            "epoch_at_target": at, "test_loss": summary["test_loss"], "test_accuracy": summary["test_accuracy"],
            "samples_per_s": summary["samples_per_s"], "processed_samples_per_s": summary["processed_samples_per_s"],
            "modes": sorted({p["mode"] for p in policy}), "rebalances": summary["rebalances"],
            "last_counts": next((e["counts"] for e in reversed(events) if e["event"] == "rebalance"), None),
            "measured_slowdown": float(np.median(slowdown)) if slowdown else None,
            "steps_per_async_round_per_rank": summary["steps_per_async_round_per_rank"],
            "step_breakdown_s": summary["step_breakdown_s"],
            "test_loss_per_epoch": [e["test_loss"] for e in epochs],
            "test_accuracy_per_epoch": [e["test_accuracy"] for e in epochs]}


def trajectory_difference(a: dict, b: dict) -> float:
    """The largest relative difference of two runs' test losses over their common epochs."""
    return max(abs(x / y - 1) for x, y in zip(a["test_loss_per_epoch"], b["test_loss_per_epoch"]))


def median_run(rs: list[dict]) -> dict:
    """The run with the median epoch time, its time to target replaced by the median over runs
    (None counts as slower than any time); every run is kept under ``"runs"``."""
    by_time = sorted(rs, key=lambda r: r["epoch_time_s"])
    ttt = sorted(rs, key=lambda r: (r["time_to_target_s"] is None, r["time_to_target_s"] or 0.0))
    mid = ttt[(len(rs) - 1) // 2]
    return {**by_time[(len(rs) - 1) // 2], "time_to_target_s": mid["time_to_target_s"],
            "epoch_at_target": mid["epoch_at_target"], "runs": rs}


def ratio(a, b):
    return a / b if a is not None and b else None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="digits",
                   help="store directory made by python -m hxmpi.data make (the lasting workload, above), "
                        "or digits (a quick check only)")
    p.add_argument("--hidden", default="1024,1024", help="MLP hidden layer sizes, comma-separated")
    p.add_argument("--batch-size", type=int, default=512, help="global batch (samples)")
    p.add_argument("--epochs", type=int, default=6, help="epochs of the schedule (and at most per run)")
    p.add_argument("--policy-window", type=int, default=20, help="steps between policy decisions")
    p.add_argument("--factor", type=float, default=3.0, help="the slow rank's compute-time factor")
    p.add_argument("--b1", type=float, default=0.3,
                   help="the rule's async threshold (one straggler of 2 ranks is B = 0.5: use 0.5)")
    p.add_argument("--target", type=float, default=0.92, help="test accuracy of 'time to target' (runs stop there)")
    p.add_argument("--seed", type=int, default=0, help="seed")
    p.add_argument("--repeats", type=int, default=3, help="runs of every configuration (medians shown)")
    p.add_argument("--json", default=None, help="write results here (rank 0)")
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    if comm.size < 2:
        if comm.rank == 0:
            print("bench_straggler.py: needs at least 2 ranks", file=sys.stderr)
        return 2
    runs = {}
    for _ in range(args.repeats):  # interleaved, so that a burst of load hits every configuration
        for straggler in ("none", f"x{args.factor:g}"):
            extra = [] if straggler == "none" else ["--straggle", f"{comm.size - 1}:x{args.factor:g}"]
            for name, flags in CONFIGS:
                r = run_one(args, comm, flags + extra)
                runs.setdefault(f"{name}/{straggler}", []).append(r)
                if comm.rank == 0:  # progress, so that a long benchmark shows where it is
                    print(f"# done {name}/{straggler}: epoch {r['epoch_time_s']:.2f} s, to target "
                          f"{r['time_to_target_s']}", file=sys.stderr, flush=True)
    results = {key: median_run(rs) for key, rs in runs.items()}
    if comm.rank != 0:
        return 0
    slow = f"x{args.factor:g}"
    print(f"# MLP {args.hidden} on {args.dataset}, {comm.size} ranks, batch {args.batch_size}, {args.epochs} epochs, "
          f"float64; straggler: rank {comm.size - 1} compute x{args.factor:g}; target {args.target}")
    print(f"{'# config':<16}{'epoch s':>9}{'to target s':>13}{'epoch':>6}{'test loss':>12}{'test acc':>9}"
          f"{'uniq/s':>9}{'proc/s':>9}{'rebal':>6}{'slowdown':>9}{'comp ms':>9}{'wait ms':>9}{'exch ms':>9}  modes")
    for key, r in results.items():
        ttt = f"{r['time_to_target_s']:.3f}" if r["time_to_target_s"] is not None else "never"
        sd = f"{r['measured_slowdown']:.1f}" if r["measured_slowdown"] else "-"
        print(f"{key:<16}{r['epoch_time_s']:9.4f}{ttt:>13}{str(r['epoch_at_target']):>6}{r['test_loss']:12.6g}"
              f"{r['test_accuracy']:9.4f}{r['samples_per_s']:9.0f}{r['processed_samples_per_s']:9.0f}"
              f"{r['rebalances']:6d}{sd:>9}{r['step_breakdown_s']['compute'] * 1e3:9.1f}"
              f"{r['step_breakdown_s']['gradient_wait'] * 1e3:9.1f}{r['step_breakdown_s']['exchange'] * 1e3:9.1f}"
              f"  {','.join(r['modes'])}")
    targets = {
        "auto_time_to_target_vs_sync (straggler; target <= 0.7)":
            ratio(results[f"auto/{slow}"]["time_to_target_s"], results[f"sync/{slow}"]["time_to_target_s"]),
        "balance_epoch_time_vs_sync (straggler; target <= 0.7)":
            ratio(results[f"balance/{slow}"]["epoch_time_s"], results[f"sync/{slow}"]["epoch_time_s"]),
        "balance_test_loss_relative_difference_per_epoch (straggler; target <= 1e-6)":
            trajectory_difference(results[f"balance/{slow}"], results[f"sync/{slow}"]),
        "auto_time_to_target_vs_sync (no straggler; target <= 1.05)":
            ratio(results["auto/none"]["time_to_target_s"], results["sync/none"]["time_to_target_s"]),
    }
    print("# ratios")
    for k, v in targets.items():
        print(f"#   {k}: {'n/a' if v is None else f'{v:.3g}'}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"benchmark": "straggler", "world_size": comm.size, "args": vars(args),
                       "results": results, "ratios": targets}, fh, indent=1)
    return 0


if __name__ == "__main__":
    from hxmpi.cli import run_main  # an uncaught error on one rank ends the job
    run_main(main, 'bench_straggler.py')
