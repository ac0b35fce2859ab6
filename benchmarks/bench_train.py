"""Training throughput and accuracy: hxmpi vs PyTorch DistributedDataParallel (CPU, gloo).

    mpirun -np 2 python benchmarks/bench_train.py --epochs 20 --json train.json --plot train.png

Both train the same MLP (64 -> hidden -> 10, ReLU) on the same digits split with the same global
batch, epochs, momentum SGD, weight decay and warm-up + cosine schedule. hxmpi runs first, then DDP
in the same processes (torch.distributed over gloo, rank and world size taken from MPI).
samples/s counts training samples (each once per epoch) over training time (evaluation excluded),
slowest rank. Both evaluate test accuracy after every epoch; time to target is the training time
until the first epoch at or above ``--target``. Threads: hxmpi uses its default (the host's cores
divided by its ranks; no thread variables are needed), DDP gets the same via
``torch.set_num_threads``. torch is optional and needed only here: ``pip install torch==2.13.0``.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

from mpi4py import MPI

from hxmpi.data import load_dataset
from hxmpi.optim import learning_rate
from hxmpi.runlog import time_to_target
from hxmpi.threads import default_threads
from hxmpi.train import Trainer, parse_config


def run_hxmpi(args, comm) -> dict:
    cfg = parse_config(["--quiet", "--model", "mlp", "--hidden", str(args.hidden), "--epochs", str(args.epochs),
                        "--batch-size", str(args.batch_size), "--lr", str(args.lr), "--seed", str(args.seed),
                        "--dtype", args.dtype])
    trainer = Trainer(cfg, comm)
    losses, epochs, train_time, samples = [], [], 0.0, 0
    for epoch in range(args.epochs):
        m = trainer.train_epoch(epoch)  # train_time_s: the slowest rank's
        train_time += m["train_time_s"]
        samples += m["samples"]
        losses.append(m["train_loss"])
        epochs.append({"epoch": epoch + 1, "train_time_s": m["train_time_s"], "test_accuracy": trainer.evaluate()[1]})
    ttt, at = time_to_target(epochs, args.target)
    return {"samples_per_s": samples / train_time, "test_accuracy": epochs[-1]["test_accuracy"], "train_loss": losses,
            "train_time_s": train_time, "time_to_target_s": ttt, "epoch_at_target": at,
            "threads": trainer.threads, "dtype": args.dtype}


def run_ddp(args, comm) -> dict:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    threads = default_threads(comm)  # the same share of the cores as hxmpi's default
    torch.set_num_threads(threads)
    port = None
    if comm.rank == 0:  # a free loopback port for gloo's rendezvous
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(comm.bcast(port, root=0))
    dist.init_process_group("gloo", rank=comm.rank, world_size=comm.size)
    data = load_dataset("digits", seed=args.seed)
    torch.manual_seed(args.seed)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, args.hidden), torch.nn.ReLU(),
                                    torch.nn.Linear(args.hidden, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    n = len(data.y_train)
    steps = -(-n // args.batch_size)
    total = steps * args.epochs
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: learning_rate(s, 1.0, "cosine", total, warmup_steps=steps))
    X = torch.tensor(data.X_train, dtype=torch.float32)
    y = torch.tensor(data.y_train)
    X_test = torch.tensor(data.X_test, dtype=torch.float32)
    loss_fn = torch.nn.CrossEntropyLoss()
    losses, epochs, train_time, samples = [], [], 0.0, 0
    for epoch in range(args.epochs):
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(args.seed * 1000 + epoch))
        comm.Barrier()
        t0 = time.perf_counter()
        loss_sum = torch.zeros(())
        for s in range(steps):
            batch = perm[s * args.batch_size:(s + 1) * args.batch_size]
            mine = batch[comm.rank::comm.size]  # DistributedSampler's strided split
            opt.zero_grad()
            loss = loss_fn(model(X[mine]), y[mine])
            loss.backward()
            opt.step()
            sched.step()
            loss_sum += loss.detach() * len(mine)
        elapsed = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
        train_time += elapsed
        samples += n
        losses.append(comm.allreduce(float(loss_sum), op=MPI.SUM) / n)
        with torch.no_grad():  # every rank holds the same model: evaluate locally
            pred = model.module(X_test).argmax(1).numpy()
        epochs.append({"epoch": epoch + 1, "train_time_s": elapsed,
                       "test_accuracy": float((pred == data.y_test).mean())})
    dist.destroy_process_group()
    ttt, at = time_to_target(epochs, args.target)
    return {"samples_per_s": samples / train_time, "test_accuracy": epochs[-1]["test_accuracy"],
            "train_loss": losses, "train_time_s": train_time, "time_to_target_s": ttt, "epoch_at_target": at,
            "threads": threads, "dtype": "float32", "torch": torch.__version__}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=20, help="epochs")
    p.add_argument("--batch-size", type=int, default=64, help="global batch size")
    p.add_argument("--hidden", type=int, default=64, help="hidden units")
    p.add_argument("--lr", type=float, default=0.1, help="base learning rate")
    p.add_argument("--seed", type=int, default=0, help="seed")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="hxmpi's dtype")
    p.add_argument("--target", type=float, default=0.95, help="test accuracy for 'time to target'")
    p.add_argument("--json", default=None, help="write results here (rank 0)")
    p.add_argument("--plot", default=None, help="PNG of the loss curves (rank 0; needs matplotlib)")
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    results = {"hxmpi": run_hxmpi(args, comm)}
    try:
        results["ddp"] = run_ddp(args, comm)
    except ImportError as exc:
        if comm.rank == 0:
            print(f"# DDP skipped: {exc} (pip install torch==2.13.0)")
    if comm.rank == 0:
        print(f"# MLP 64-{args.hidden}-10 on digits, {comm.size} ranks, global batch {args.batch_size}, "
              f"{args.epochs} epochs")
        print(f"{'# framework':<12}{'samples/s':>12}{'to target s':>13}{'epoch':>6}{'test acc':>10}"
              f"{'final loss':>12}{'threads':>8}")
        for name, r in results.items():
            ttt = f"{r['time_to_target_s']:.3f}" if r["time_to_target_s"] is not None else "never"
            print(f"{name:<12}{r['samples_per_s']:12.0f}{ttt:>13}{str(r['epoch_at_target']):>6}"
                  f"{r['test_accuracy']:10.4f}{r['train_loss'][-1]:12.4f}{r['threads']:8d}")
        if "ddp" in results:
            h, d = results["hxmpi"], results["ddp"]
            print(f"# hxmpi / DDP: samples/s {h['samples_per_s'] / d['samples_per_s']:.2f}x", end="")
            if h["time_to_target_s"] and d["time_to_target_s"]:
                print(f", time to target {h['time_to_target_s'] / d['time_to_target_s']:.2f}x", end="")
            print()
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"benchmark": "train", "world_size": comm.size, "args": vars(args),
                           "results": results}, fh, indent=1)
        if args.plot:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
            fig, ax = plt.subplots(figsize=(6, 4))
            for name, r in results.items():
                ax.plot(range(1, len(r["train_loss"]) + 1), r["train_loss"], marker="o", label=name)
            ax.set_xlabel("epoch")
            ax.set_ylabel("train loss")
            ax.set_yscale("log")
            ax.set_title(f"MLP on digits, {comm.size} ranks")
            ax.legend()
            fig.tight_layout()
            fig.savefig(args.plot, dpi=100)
    return 0


if __name__ == "__main__":
    sys.exit(main())
