"""Where a small all-to-all's time goes: bare MPI, the agreement collective, hxmpi's Python, plans.

    mpirun -np 4 python benchmarks/bench_overhead.py --ranks-per-node 2 --json overhead.json

Columns (us per call, mean over ranks): "bare" ``comm.Alltoallv`` on prebuilt specs; "bare+agree"
the same plus the one ``Allgather`` of an agreement row (2P+7 int64) that a validated hxmpi call
makes first; "flat" and "hier" one-shot ``HierComm.Alltoallv`` (validated); "flat-plan" and
"hier-plan" persistent requests. flat - bare+agree is what hxmpi's Python costs per one-shot call.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import hxmpi  # before mpi4py: it keeps Open MPI's UCX one-sided component out (README)
from mpi4py import MPI

COLUMNS = ("bare", "bare+agree", "flat", "flat-plan", "hier", "hier-plan")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--block", type=int, default=8, help="bytes per destination (default 8)")
    p.add_argument("-i", "--iterations", type=int, default=2000, help="timed calls per column and repeat")
    p.add_argument("-x", "--warmup", type=int, default=200, help="untimed calls first")
    p.add_argument("--repeats", type=int, default=3, help="rounds over all columns (the median is kept)")
    p.add_argument("--ranks-per-node", type=int, default=None, help="virtual nodes (default: real nodes)")
    p.add_argument("--json", default=None, help="write results here (rank 0)")
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    size = comm.size
    hc = hxmpi.HierComm(comm, ranks_per_node=args.ranks_per_node)
    sbuf = np.ones(size * args.block, np.uint8)
    rbuf = np.zeros_like(sbuf)
    counts = np.full(size, args.block, np.int64)
    cint = counts.astype(np.intc)
    dint = (np.arange(size) * args.block).astype(np.intc)
    row = np.zeros(7 + 2 * size, np.int64)
    table = np.zeros((size, row.size), np.int64)
    specs = ([sbuf, (cint, dint), MPI.BYTE], [rbuf, (cint, dint), MPI.BYTE])
    plans = {a: hc.Alltoallv_init([sbuf, counts, MPI.BYTE], [rbuf, counts, MPI.BYTE], algorithm=a)
             for a in ("flat", "hier")}

    def call(col):
        if col.startswith("bare"):
            if col == "bare+agree":
                comm.Allgather(row, table)
            comm.Alltoallv(*specs)
        elif col.endswith("-plan"):
            plans[col[:-5]].Start()
            plans[col[:-5]].Wait()
        else:
            hc.Alltoallv([sbuf, counts, MPI.BYTE], [rbuf, counts, MPI.BYTE], algorithm=col)

    rounds = []
    for _ in range(args.repeats):
        result = {}
        for col in COLUMNS:
            for _ in range(args.warmup):
                call(col)
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(args.iterations):
                call(col)
            result[col] = comm.allreduce((time.perf_counter() - t0) / args.iterations * 1e6) / size
        rounds.append(result)
    for plan in plans.values():
        plan.Free()
    median = {c: float(np.median([r[c] for r in rounds])) for c in COLUMNS}
    if comm.rank == 0:
        print(f"# hxmpi per-call overhead; {size} ranks, nodes {list(hc.topology.node_sizes)}, "
              f"{args.block} B blocks, node phase {hc.node_phase}; median of {args.repeats} rounds")
        print(f"{'# column':<12}{'us/call':>10}{'x bare':>10}")
        for c in COLUMNS:
            print(f"{c:<12}{median[c]:10.2f}{median[c] / median['bare']:10.2f}")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"benchmark": "overhead", "world_size": size, "block": args.block,
                           "node_sizes": list(hc.topology.node_sizes), "node_phase": hc.node_phase,
                           "median_us": median, "rounds_us": rounds}, fh, indent=1)
    hc.free()
    return 0


if __name__ == "__main__":
    from hxmpi.cli import run_main  # an uncaught error on one rank ends the job
    run_main(main, "bench_overhead.py")
