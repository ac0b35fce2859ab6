"""Time to target accuracy and throughput: hxmpi vs PyTorch DistributedDataParallel (CPU, gloo).

    python -m hxmpi.data make --out /tmp/lasting --samples 200000 --features 256 --shard-mb 16
    mpirun --allow-run-as-root -np 2 python benchmarks/bench_train.py --dataset /tmp/lasting --json train.json

The lasting workload: a generated store (200,000 samples x 256 features, 10 classes in 4 Gaussian
clusters each, 160,000 train / 40,000 test), an MLP 256-1024-1024-10 (ReLU), global batch 512,
momentum SGD 0.9 with weight decay 1e-4, one epoch of linear warm-up then cosine decay over
``--epochs``, float32. Both frameworks start from the same initial weights (hxmpi's Glorot draw,
copied into torch), see the same samples in the same global order (hxmpi's ``epoch_order``) and
split every batch over the ranks the same way, so they take the same steps up to floating-point
rounding and differ in speed only. A run stops after the first epoch whose test accuracy reaches
``--target`` (or after ``--epochs``). Runs alternate hxmpi, DDP, ``--repeats`` times.

Headline: time to target (training seconds, slowest rank, evaluation excluded) and samples/s
(training samples over training time) as the median of the runs with their spread (min-max).
hxmpi's per-step breakdown (mean over ranks and steps): compute (forward, backward and optimizer),
waiting for the gradient sums after the backward pass, the shuffle exchange, waiting for data.
Threads: hxmpi uses its default (the host's cores divided by its ranks; no thread variables are
needed), DDP gets the same via ``torch.set_num_threads``. torch is optional and needed only here:
``pip install torch==2.13.0`` (the CPU wheel).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time

import numpy as np
from mpi4py import MPI

import hxmpi  # noqa: F401 - before mpi4py: it keeps Open MPI's UCX one-sided component out (docs/staging.md)
from hxmpi.cli import command_line
from hxmpi.provenance import provenance
from hxmpi.data import DATASETS, load_dataset
from hxmpi.data.shuffle import epoch_order
from hxmpi.data.store import load_shard, parse_index
from hxmpi.models import MLP
from hxmpi.runlog import time_to_target
from hxmpi.train.command import Trainer, parse_config
from hxmpi.train.optim import learning_rate
from hxmpi.train.threads import default_threads
from hxmpi.train.trainer import BREAKDOWN


def hxmpi_flags(args) -> list[str]:
    """The hxmpi.train flags of the compared run (also its schedule: warm-up 1 epoch, cosine)."""
    return ["--quiet", "--model", "mlp", "--hidden", args.hidden, "--epochs", str(args.epochs),
            "--batch-size", str(args.batch_size), "--lr", str(args.lr), "--seed", str(args.seed),
            "--dtype", "float32", "--update", "sync", "--dataset", args.dataset,
            "--bucket-cap-mb", str(args.bucket_cap_mb)]


def run_hxmpi(args, comm) -> dict:
    """One hxmpi run until the target (or the last epoch)."""
    trainer = Trainer(parse_config(hxmpi_flags(args)), comm)
    summary = trainer.run(stop_at_accuracy=args.target)
    epochs = [e for e in trainer.events if e["event"] == "epoch"]
    return summarize(epochs, sum(e["samples"] for e in epochs), args.target, threads=trainer.threads,
                     step_breakdown_s=summary["step_breakdown_s"])


def summarize(epochs: list[dict], samples: int, target: float, **extra) -> dict:
    """One run's figures from its epoch records."""
    train_time = sum(e["train_time_s"] for e in epochs)
    ttt, at = time_to_target(epochs, target)
    return {"time_to_target_s": ttt, "epoch_at_target": at, "samples_per_s": samples / train_time,
            "train_time_s": train_time, "test_accuracy": epochs[-1]["test_accuracy"],
            "epochs": epochs, **extra}


def load_arrays(dataset: str, seed: int):
    """(X_train, y_train, X_test, y_test) of a bundled dataset or a local store, in the order
    hxmpi's memory-mode staging holds them (train shards in index order)."""
    if dataset in DATASETS:
        d = load_dataset(dataset, seed=seed)
        return d.X_train, d.y_train, d.X_test, d.y_test
    with open(os.path.join(dataset, "index.json")) as fh:
        index = parse_index(fh.read(), dataset)
    out = []
    for split in ("train", "test"):
        loaded = [load_shard(dataset, shard) for shard in index["splits"][split]["shards"]]
        out += [np.concatenate([x for x, _ in loaded]), np.concatenate([y for _, y in loaded])]
    return tuple(out)


class DDPRunner:
    """DDP in this job's processes: torch.distributed over gloo, rank and size from MPI."""

    def __init__(self, args, comm):
        import torch
        import torch.distributed as dist
        self.torch, self.dist, self.args, self.comm = torch, dist, args, comm
        self.threads = default_threads(comm)  # the same share of the cores as hxmpi's default
        torch.set_num_threads(self.threads)
        port = None
        if comm.rank == 0:  # a free loopback port for gloo's rendezvous
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(comm.bcast(port, root=0))
        dist.init_process_group("gloo", rank=comm.rank, world_size=comm.size)
        X, self.y, X_test, self.y_test = load_arrays(args.dataset, args.seed)
        self.X = torch.from_numpy(np.ascontiguousarray(X, dtype=np.float32))
        self.X_test = torch.from_numpy(np.ascontiguousarray(X_test, dtype=np.float32))
        self.y_t = torch.from_numpy(np.ascontiguousarray(self.y, dtype=np.int64))

    def model(self):
        """The MLP with hxmpi's initial weights (same seed, Glorot, zero biases)."""
        torch, a = self.torch, self.args
        hidden = [int(h) for h in a.hidden.split(",")]
        ref = MLP(self.X.shape[1], int(self.y.max()) + 1, hidden, a.seed, np.float32)
        layers = []
        for i in range(ref.layers):
            lin = torch.nn.Linear(*ref.flat.p[f"W{i}"].shape)
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(ref.flat.p[f"W{i}"].T.copy()))
                lin.bias.copy_(torch.from_numpy(ref.flat.p[f"b{i}"].copy()))
            layers += [lin, torch.nn.ReLU()]
        return torch.nn.Sequential(*layers[:-1])

    def run(self) -> dict:
        """One DDP run until the target (or the last epoch)."""
        from torch.nn.parallel import DistributedDataParallel as DDP
        torch, a, comm = self.torch, self.args, self.comm
        model = DDP(self.model(), bucket_cap_mb=a.bucket_cap_mb)
        opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9, weight_decay=1e-4)
        n, b, size = len(self.y), a.batch_size, comm.size
        steps = -(-n // b)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: learning_rate(s, 1.0, "cosine", steps * a.epochs, warmup_steps=steps))
        loss_fn = torch.nn.CrossEntropyLoss()
        epochs, samples = [], 0
        for epoch in range(a.epochs):
            order = torch.from_numpy(epoch_order(n, a.seed, epoch))
            comm.Barrier()
            t0 = time.perf_counter()
            loss_sum = torch.zeros(())
            for s in range(steps):
                batch = order[s * b:(s + 1) * b]
                m = len(batch)  # hxmpi's split: offset j of the batch goes to rank j * size // m
                mine = batch[-(-comm.rank * m // size):-(-(comm.rank + 1) * m // size)]
                opt.zero_grad()
                loss = loss_fn(model(self.X[mine]), self.y_t[mine])
                loss.backward()
                opt.step()
                sched.step()
                loss_sum += loss.detach() * len(mine)
            elapsed = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
            samples += n
            with torch.no_grad():  # every rank holds the same model: evaluate locally
                pred = model.module(self.X_test).argmax(1).numpy()
            epochs.append({"epoch": epoch + 1, "train_time_s": elapsed,
                           "train_loss": comm.allreduce(float(loss_sum), op=MPI.SUM) / n,
                           "test_accuracy": float((pred == self.y_test).mean())})
            if epochs[-1]["test_accuracy"] >= a.target:
                break
        return summarize(epochs, samples, a.target, threads=self.threads, torch=torch.__version__)

    def close(self) -> None:
        """End the gloo group."""
        self.dist.destroy_process_group()


def spread(values: list) -> dict:
    """Median, min and max of the values that exist (None: a run that missed the target)."""
    got = [v for v in values if v is not None]
    return {"median": statistics.median(got) if got else None, "min": min(got) if got else None,
            "max": max(got) if got else None, "missed": len(values) - len(got)}


def figure(s: dict, fmt: str) -> str:
    if s["median"] is None:
        return "never"
    text = f"{s['median']:{fmt}} ({s['min']:{fmt}}-{s['max']:{fmt}})"
    return text + (f" {s['missed']} missed" if s["missed"] else "")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="digits",
                   help="store directory made by python -m hxmpi.data make (the lasting workload, above), "
                        "or digits (a quick check only: runs of a fraction of a second)")
    p.add_argument("--epochs", type=int, default=6, help="epochs of the schedule (and at most per run)")
    p.add_argument("--batch-size", type=int, default=512, help="global batch size")
    p.add_argument("--hidden", default="1024,1024", help="hidden layer sizes, comma-separated")
    p.add_argument("--lr", type=float, default=0.1, help="base learning rate")
    p.add_argument("--seed", type=int, default=0, help="seed")
    p.add_argument("--target", type=float, default=0.92, help="test accuracy for 'time to target'")
    p.add_argument("--repeats", type=int, default=3, help="runs of each framework (medians shown)")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0,
                   help="gradient bucket cap of both frameworks, MiB (DDP's default)")
    p.add_argument("--no-ddp", action="store_true", help="hxmpi only")
    p.add_argument("--json", default=None, help="write results here (rank 0)")
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    ddp = None
    if not args.no_ddp:
        try:
            ddp = DDPRunner(args, comm)
        except ImportError as exc:
            if comm.rank == 0:
                print(f"# DDP skipped: {exc} (pip install torch==2.13.0)")
    runs = {"hxmpi": [], **({"ddp": []} if ddp else {})}
    for _ in range(args.repeats):  # alternating, so that a burst of load hits both
        runs["hxmpi"].append(run_hxmpi(args, comm))
        if ddp:
            runs["ddp"].append(ddp.run())
    if ddp:
        ddp.close()
    results = {name: {"time_to_target_s": spread([r["time_to_target_s"] for r in rs]),
                      "samples_per_s": spread([r["samples_per_s"] for r in rs]), "runs": rs}
               for name, rs in runs.items()}
    if comm.rank != 0:
        return 0
    print(f"# MLP {args.hidden} on {args.dataset}, {comm.size} ranks, global batch {args.batch_size}, "
          f"float32, schedule {args.epochs} epochs, target {args.target}, {args.repeats} runs: median (min-max)")
    print(f"{'# framework':<12}{'to target s':>26}{'epoch':>7}{'samples/s':>26}{'final acc':>10}{'threads':>8}")
    for name, r in results.items():
        at = sorted(x["epoch_at_target"] or 0 for x in r["runs"])[(len(r["runs"]) - 1) // 2]
        print(f"{name:<12}{figure(r['time_to_target_s'], '.2f'):>26}{at:>7}{figure(r['samples_per_s'], '.0f'):>26}"
              f"{statistics.median(x['test_accuracy'] for x in r['runs']):10.4f}{r['runs'][0]['threads']:8d}")
    step = {k: statistics.median(x["step_breakdown_s"][k] for x in runs["hxmpi"]) for k in BREAKDOWN}
    print("# hxmpi per step, ms (mean over ranks, median of runs): "
          + ", ".join(f"{k} {v * 1e3:.2f}" for k, v in step.items()))
    if ddp:
        h, d = results["hxmpi"], results["ddp"]
        speed = d["time_to_target_s"]["median"] / h["time_to_target_s"]["median"] \
            if h["time_to_target_s"]["median"] and d["time_to_target_s"]["median"] else None
        rate = h["samples_per_s"]["median"] / d["samples_per_s"]["median"]
        results["speedup"] = {"time_to_target": speed, "samples_per_s": rate}
        print(f"# speed-up over DDP (median): time to target {'n/a' if speed is None else f'{speed:.2f}x'}, "
              f"samples/s {rate:.2f}x")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"benchmark": "train", "provenance": provenance(command_line("benchmarks/bench_train.py", comm.size)),
                       "world_size": comm.size, "args": vars(args),
                       "step_breakdown_s": step, "results": results}, fh, indent=1)
    return 0


if __name__ == "__main__":
    from hxmpi.cli import run_main  # an uncaught error on one rank ends the job
    run_main(main, 'bench_train.py')
