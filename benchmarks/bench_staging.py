"""Staging from a bandwidth-limited HTTP store: memory mode vs distributed mode.

    mpirun -np 2 python benchmarks/bench_staging.py --store /tmp/hxmpi-bench-store --bandwidth 40 \\
        --json staging.json

Rank 0 writes a synthetic store (once; reused if ``--store`` holds one) and serves it from a separate
process on 127.0.0.1 whose total send rate is capped at ``--bandwidth`` MB/s (a token bucket over
all connections: the store's link, shared by every node). Then the same training runs twice, each
with an empty cache: ``--staging memory`` (download everything, then train) and ``--staging
distributed`` (shards staged ahead of training within ``--cache-limit``). Reported per mode: time
to first batch (from start-up, staging included), training time, time spent waiting for data and
its fraction of training time, test accuracy, bytes downloaded. The consumption rate (train MB/s of
memory mode, data in memory) tells whether the store's bandwidth exceeds what training consumes.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from hxmpi.cli import command_line

from hxmpi.provenance import provenance

MB = 1e6


def serve(directory: str, rate: float) -> None:
    """Serve ``directory`` on a free 127.0.0.1 port, at most ``rate`` bytes/s in total; prints the port."""
    lock, state = threading.Lock(), {"t": time.monotonic(), "tokens": 0.0}
    chunk = 64 * 1024

    def take(n: int) -> None:  # token bucket with a 1-chunk burst
        while True:
            with lock:
                now = time.monotonic()
                state["tokens"] = min(chunk, state["tokens"] + (now - state["t"]) * rate)
                state["t"] = now
                if state["tokens"] >= n:
                    state["tokens"] -= n
                    return
                short = (n - state["tokens"]) / rate
            time.sleep(short)

    class Handler(SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=directory, **kw)

        def log_message(self, *args):
            pass

        def copyfile(self, source, outputfile):
            for block in iter(lambda: source.read(chunk), b""):
                take(len(block))
                outputfile.write(block)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(httpd.server_address[1], flush=True)
    httpd.serve_forever()


def make_store(args) -> None:
    from hxmpi.data.store import INDEX, make_synthetic, split_train_test, write_store
    if (Path(args.store) / INDEX).exists():
        return
    X, y = make_synthetic(args.samples, args.features, args.classes, args.seed, separation=args.separation)
    write_store(args.store, split_train_test(X, y, args.test_fraction, args.seed), args.classes, args.shard_mb)


def run_mode(args, comm, url: str, mode: str) -> dict:
    from mpi4py import MPI

    from hxmpi.train.command import Trainer, parse_config
    cache = comm.bcast(tempfile.mkdtemp(prefix="hxmpi-bench-cache-") if comm.rank == 0 else None)
    flags = ["--quiet", "--dataset", url, "--staging", mode, "--cache-dir", cache, "--epochs", str(args.epochs),
             "--hidden", args.hidden, "--batch-size", str(args.batch_size), "--update", "sync",
             "--prefetch-shards", str(args.prefetch), "--fetch-workers", str(args.fetch_workers),
             "--seed", str(args.seed)]
    if mode == "distributed" and args.cache_limit:
        flags += ["--cache-limit", args.cache_limit]
    if args.ranks_per_node:
        flags += ["--ranks-per-node", str(args.ranks_per_node)]
    comm.Barrier()
    t0 = time.perf_counter()
    trainer = Trainer(parse_config(flags), comm)
    summary = trainer.run()
    wall = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    staging = [e for e in trainer.events if e["event"] == "staging"][0]
    last = [e for e in trainer.events if e["event"] == "epoch"][-1]
    streamed = last.get("staging", {})
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(cache, ignore_errors=True)
    return {"mode": mode, "time_to_first_batch_s": summary["time_to_first_batch_s"], "staging_s": staging["staging_s"],
            "train_time_s": summary["train_time_s"], "data_wait_s": summary["data_wait_s"],
            "data_wait_fraction": summary["data_wait_fraction"], "wall_s": wall,
            "test_accuracy": summary["test_accuracy"], "samples_per_s": summary["samples_per_s"],
            "bytes_downloaded": staging["bytes_downloaded"] + streamed.get("bytes_staged", 0),
            "train_bytes": staging["capacity_bytes"], "max_cache_bytes": streamed.get("max_used_bytes"),
            "evictions": streamed.get("evictions"), "cache_hits": streamed.get("cache_hits")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", default=os.path.join(tempfile.gettempdir(), "hxmpi-bench-store"),
                   help="store directory (written if it holds no index.json)")
    p.add_argument("--samples", type=int, default=200_000, help="samples in the generated store")
    p.add_argument("--features", type=int, default=256, help="features per sample (float32)")
    p.add_argument("--classes", type=int, default=10, help="classes")
    p.add_argument("--separation", type=float, default=0.25, help="class-centre separation (lower is harder)")
    p.add_argument("--test-fraction", type=float, default=0.05, help="test split fraction")
    p.add_argument("--shard-mb", type=float, default=8.0, help="shard size in MiB")
    p.add_argument("--seed", type=int, default=0, help="seed of the data and the training")
    p.add_argument("--bandwidth", type=float, default=40.0, help="store bandwidth cap in MB/s (1 MB = 1e6 B)")
    p.add_argument("--epochs", type=int, default=2, help="training epochs per mode")
    p.add_argument("--hidden", default="256", help="MLP hidden sizes, comma-separated")
    p.add_argument("--batch-size", type=int, default=256, help="global batch size")
    p.add_argument("--cache-limit", default="64M", help="distributed mode: --cache-limit per node")
    p.add_argument("--prefetch", type=int, default=2, help="distributed mode: --prefetch-shards")
    p.add_argument("--fetch-workers", type=int, default=4, help="--fetch-workers")
    p.add_argument("--ranks-per-node", type=int, default=None, help="virtual nodes of this many ranks")
    p.add_argument("--modes", default="memory,distributed", help="modes to run, comma-separated")
    p.add_argument("--json", default=None, help="write results here (rank 0)")
    p.add_argument("--serve", nargs=2, metavar=("DIR", "BYTES_PER_S"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        serve(args.serve[0], float(args.serve[1]))
        return 0

    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    server, url = None, None
    if comm.rank == 0:
        make_store(args)
        server = subprocess.Popen([sys.executable, __file__, "--serve", args.store, str(args.bandwidth * MB)],
                                  stdout=subprocess.PIPE, text=True)
        url = f"http://127.0.0.1:{server.stdout.readline().strip()}"
    url = comm.bcast(url, root=0)
    try:
        results = [run_mode(args, comm, url, mode) for mode in args.modes.split(",")]
    finally:
        if server:
            server.terminate()
            server.wait()
    if comm.rank == 0:
        train_mb = results[0]["train_bytes"] / MB
        print(f"# store {train_mb:.1f} MB train split at {args.bandwidth:g} MB/s; {comm.size} ranks, "
              f"{args.epochs} epochs, MLP {args.features}-{args.hidden}-{args.classes}, cache limit "
              f"{args.cache_limit}, prefetch {args.prefetch} shards of {args.shard_mb:g} MiB")
        for r in results:
            r["consumption_mb_per_s"] = r["samples_per_s"] * r["train_bytes"] / max(1, args.samples * (
                1 - args.test_fraction)) / MB
        print(f"{'# mode':<13}{'first batch s':>14}{'train s':>9}{'wait s':>8}{'wait %':>8}{'wall s':>8}"
              f"{'test acc':>9}{'MB fetched':>11}{'consume MB/s':>13}")
        for r in results:
            print(f"{r['mode']:<13}{r['time_to_first_batch_s']:14.2f}{r['train_time_s']:9.2f}{r['data_wait_s']:8.2f}"
                  f"{100 * r['data_wait_fraction']:8.1f}{r['wall_s']:8.2f}{r['test_accuracy']:9.4f}"
                  f"{r['bytes_downloaded'] / MB:11.1f}{r['consumption_mb_per_s']:13.1f}")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"benchmark": "staging", "provenance": provenance(command_line("benchmarks/bench_staging.py", comm.size)),
                           "world_size": comm.size, "args": vars(args),
                           "results": results}, fh, indent=1)
    return 0


if __name__ == "__main__":
    from hxmpi.cli import run_main  # an uncaught error on one rank ends the job
    run_main(main, 'bench_staging.py')
