"""Calibrate the flat-vs-hier cost model on this machine and layout; write a tuning file.

    mpirun -np 4 python benchmarks/calibrate.py --ranks-per-node 2 --out tuning.json
    HXMPI_TUNING=tuning.json mpirun ...        # "auto" then uses these parameters

1. Ping-pong between two ranks of one node and two ranks of different nodes gives the intra- and
   inter-node latency and seconds per byte (least squares over message sizes); timing a burst of
   small Isends gives the CPU cost per message, taken out of both latencies.
2. copy_blocks on a large contiguous buffer gives the local copy cost per byte.
3. Flat and hier all-to-all times over block sizes give the two fixed per-call costs (the only
   parameters fitted to the all-to-all itself).
The report shows the model against every measurement (the validation error), and its projection:
the crossover block size below which hier wins, for layouts up to 4096 nodes x 8 ranks.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
from hxmpi.comm._packing import copy_blocks
from mpi4py import MPI

import hxmpi  # before mpi4py: it keeps Open MPI's UCX one-sided component out (docs/staging.md)
from hxmpi.cli import command_line
from hxmpi.provenance import provenance
from hxmpi.comm.costmodel import fit

PROJECT_NODES = (2, 8, 64, 512, 4096)
PROJECT_PER_NODE = (2, 4, 8)


def pingpong(comm, a: int, b: int, nbytes: int, iters: int) -> float:
    """One-way seconds for ``nbytes`` between ranks a and b (others wait at the barrier)."""
    buf = np.zeros(max(nbytes, 1), np.uint8)
    comm.Barrier()
    t = 0.0
    if comm.rank in (a, b):
        peer = b if comm.rank == a else a
        for i in range(iters + 2):
            if i == 2:
                t0 = time.perf_counter()
            if comm.rank == a:
                comm.Send([buf, nbytes, MPI.BYTE], peer)
                comm.Recv([buf, nbytes, MPI.BYTE], peer)
            else:
                comm.Recv([buf, nbytes, MPI.BYTE], peer)
                comm.Send([buf, nbytes, MPI.BYTE], peer)
        t = (time.perf_counter() - t0) / iters / 2
    comm.Barrier()
    return comm.bcast(t, root=a)


def link(comm, a: int, b: int, iters: int) -> tuple[float, float]:
    """(latency s, seconds per byte) between a and b."""
    sizes = np.array([8, 1024, 65536, 1 << 20], dtype=float)
    times = np.array([pingpong(comm, a, b, int(s), iters if s < 65536 else max(5, iters // 10))
                      for s in sizes])
    beta, alpha = np.polyfit(sizes, times, 1)
    return max(alpha, 0.0), max(beta, 0.0)


def message_cost(comm, a: int, b: int, count: int = 256) -> float:
    """CPU seconds rank a spends posting one small nonblocking send (the model's per-message overhead)."""
    buf = np.zeros(8 * count, np.uint8)
    comm.Barrier()
    cost = 0.0
    if comm.rank == b:
        MPI.Request.Waitall([comm.Irecv([buf[8 * i:8 * i + 8], MPI.BYTE], a, tag=i) for i in range(count)])
    elif comm.rank == a:
        t0 = time.perf_counter()
        reqs = [comm.Isend([buf[8 * i:8 * i + 8], MPI.BYTE], b, tag=i) for i in range(count)]
        cost = (time.perf_counter() - t0) / count
        MPI.Request.Waitall(reqs)
    comm.Barrier()
    return comm.bcast(cost, root=a)


def copy_cost() -> float:
    n = 32 << 20
    src, dst = np.ones(n, np.uint8), np.empty(n, np.uint8)
    z, ln = np.zeros(1, np.int64), np.array([n], np.int64)
    best = min(_timed(lambda: copy_blocks(src, z, dst, z, ln)) for _ in range(5))
    return best / n


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def alltoall_time(hc, algorithm: str, block: int, iters: int) -> float:
    """Slowest rank's mean seconds per call."""
    size = hc.comm.size
    sbuf = np.ones(block * size, np.uint8)
    rbuf = np.empty_like(sbuf)
    for _ in range(3):
        hc.Alltoall(sbuf, rbuf, algorithm=algorithm)
    hc.comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        hc.Alltoall(sbuf, rbuf, algorithm=algorithm)
    return hc.comm.allreduce((time.perf_counter() - t0) / iters, op=MPI.MAX)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks-per-node", type=int, default=None, help="virtual nodes (default: real nodes)")
    p.add_argument("-m", "--message-size", default="8:262144", help="MIN:MAX block bytes for the all-to-all fit")
    p.add_argument("-i", "--iterations", type=int, default=100, help="iterations per measurement")
    p.add_argument("--out", default="tuning.json", help="calibration file to write (rank 0)")
    p.add_argument("--json", default=None, help="also write the full report here (rank 0)")
    p.add_argument("--node-phase", choices=("shm", "mpi"), default="shm",
                   help="the node phase HierComm's hier runs here (shared-memory window or message passing)")
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    hc = hxmpi.HierComm(comm, ranks_per_node=args.ranks_per_node)
    t = hc.topology
    if t.num_nodes < 2 or t.max_node_size < 2:
        if comm.rank == 0:
            print("calibrate.py: needs at least 2 nodes and a node with 2 ranks", file=sys.stderr)
        return 2
    big_node = max(range(t.num_nodes), key=lambda n: t.node_sizes[n])
    a = t.node_members[big_node][0]
    intra_peer = t.node_members[big_node][1]
    inter_peer = t.node_members[(big_node + 1) % t.num_nodes][0]
    # A ping-pong's one-way time holds the sender's and the receiver's per-message cost as well as
    # the wire's latency: the model counts them apart, so they are taken out of the latencies.
    msg_overhead = message_cost(comm, a, inter_peer)
    alpha_intra, beta_intra = link(comm, a, intra_peer, args.iterations)
    alpha_inter, beta_inter = link(comm, a, inter_peer, args.iterations)
    alpha_intra, alpha_inter = (max(0.0, x - 2 * msg_overhead) for x in (alpha_intra, alpha_inter))
    beta_copy = comm.allreduce(copy_cost(), op=MPI.MAX)
    lo, _, hi = args.message_size.partition(":")
    blocks = [b for b in (2 ** k for k in range(31)) if int(lo) <= b <= int(hi or lo)]
    n, g = t.num_nodes, t.max_node_size
    samples = []
    for algo in ("flat", "hier"):
        for b in blocks:
            iters = args.iterations if b <= 16384 else max(10, args.iterations // 10)
            samples.append((algo, n, g, b, alltoall_time(hc, algo, b, iters)))
    measured = {"alpha_intra": alpha_intra, "beta_intra": beta_intra, "alpha_inter": alpha_inter,
                "beta_inter": beta_inter, "beta_copy": beta_copy, "msg_overhead": msg_overhead,
                "beta_backbone": 0.0}  # two or three hosts on one switch: nothing oversubscribed
    model = fit(samples, fixed=measured, node_phase=args.node_phase)
    rows = [{"algorithm": al, "block": b, "measured_us": s * 1e6,
             "model_us": model.predict(al, nn, gg, b, args.node_phase) * 1e6} for al, nn, gg, b, s in samples]
    errors = [abs(r["model_us"] - r["measured_us"]) / r["measured_us"] for r in rows]
    seconds = {(al, b): sec for al, _, _, b, sec in samples}
    faster = {b: "hier" if seconds[("hier", b)] < seconds[("flat", b)] else "flat" for b in blocks}
    choice_right = sum(model.choose(n, g, b, args.node_phase) == faster[b] for b in blocks)
    projection = [{"nodes": nn, "per_node": gg, "crossover_bytes": model.crossover(nn, gg, args.node_phase)}
                  for nn in PROJECT_NODES for gg in PROJECT_PER_NODE]
    if comm.rank == 0:
        meta = {"layout": {"nodes": n, "per_node": g, "node_sizes": list(t.node_sizes)}, "node_phase": args.node_phase,
                "mean_abs_rel_error": float(np.mean(errors)), "auto_right": f"{choice_right}/{len(blocks)}"}
        model.save(args.out, **meta)
        print(f"# calibrated on {comm.size} ranks, nodes {list(t.node_sizes)}; wrote {args.out}")
        for k, v in model.__dict__.items():
            print(f"#   {k:<14} {v * 1e6:10.4f} us" if k.startswith(("alpha", "overhead", "msg"))
                  else f"#   {k:<14} {1 / v / 1e9 if v else float('inf'):10.2f} GB/s")
        print(f"{'# Block [B]':<12}{'flat meas':>12}{'flat model':>12}{'hier meas':>12}{'hier model':>12}  [us]")
        by = {(r["algorithm"], r["block"]): r for r in rows}
        for b in blocks:
            f, h = by[("flat", b)], by[("hier", b)]
            print(f"{b:<12d}{f['measured_us']:12.1f}{f['model_us']:12.1f}{h['measured_us']:12.1f}{h['model_us']:12.1f}")
        print(f"# validation: mean |model - measured| / measured = {np.mean(errors):.1%}; "
              f"auto picks the faster algorithm at {choice_right}/{len(blocks)} sizes")
        print("# projection: hier wins below this block size [B] ('always', or 0 = never)")
        print(f"{'# nodes':<10}" + "".join(f"{'G=' + str(gg):>12}" for gg in PROJECT_PER_NODE))
        for nn in PROJECT_NODES:
            cells = []
            for gg in PROJECT_PER_NODE:
                c = model.crossover(nn, gg, args.node_phase)
                cells.append(f"{'always' if c is None else int(c):>12}")
            print(f"{nn:<10d}" + "".join(cells))
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"benchmark": "calibrate", "provenance": provenance(command_line("benchmarks/calibrate.py", comm.size)),
                           **meta, "model": model.__dict__, "rows": rows, "projection": projection}, fh, indent=1)
    return 0


if __name__ == "__main__":
    from hxmpi.cli import run_main  # an uncaught error on one rank ends the job
    run_main(main, 'calibrate.py')
