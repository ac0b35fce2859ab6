"""Where a small all-to-all's time goes: bare MPI, the agreement, hxmpi's one-shot calls, plans.

    mpirun -np 4 python benchmarks/bench_overhead.py --ranks-per-node 2 --json overhead.json

Columns (us per call, mean over ranks, median of the rounds):
  bare           ``comm.Alltoallv`` on prebuilt specs
  bare-plan      a raw MPI persistent ``Alltoallv_init`` request, Start + Wait
  allreduce      the agreement alone: one ``Allreduce`` of 16 uint64
  flat-new       one-shot ``HierComm.Alltoallv`` (flat, validated), a new count pattern every call
                 (receive displacements shift through 32 patterns, more than the plan cache holds)
  flat-repeat    the same, one pattern and the same buffers every call (the plan cache hits)
  hier-new, hier-repeat   the same for the hierarchical path
  flat-plan, hier-plan    persistent ``HierComm.Alltoallv_init`` requests, Start + Wait
``--json`` also writes ``cpu_s_per_call``: hxmpi's own per-call work for each path, the path's time
minus the MPI-only columns it contains (flat: flat-new - allreduce - bare; flat_hit: flat-repeat -
allreduce - bare-plan; hier: hier-new - allreduce - hier-plan; hier_hit: hier-repeat - allreduce -
hier-plan; flat_plan: flat-plan - bare-plan; hier_plan: 0, its messages are all in hier-plan), clamped
at 0 (seconds). ``hxmpi.simulate`` charges these instead of fitted constants.
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import hxmpi  # before mpi4py: it keeps Open MPI's UCX one-sided component out (README)
from mpi4py import MPI

COLUMNS = ("bare", "bare-plan", "allreduce", "flat-new", "flat-repeat", "flat-plan",
           "hier-new", "hier-repeat", "hier-plan")
PATTERNS = 32


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--block", type=int, default=8, help="bytes per destination (default 8)")
    p.add_argument("-i", "--iterations", type=int, default=2000, help="timed calls per column and round (default 2000)")
    p.add_argument("-x", "--warmup", type=int, default=200, help="untimed calls first (default 200)")
    p.add_argument("--repeats", type=int, default=3, help="rounds over all columns; the median is kept (default 3)")
    p.add_argument("--ranks-per-node", type=int, default=None, help="virtual nodes of this many ranks (default: real nodes)")
    p.add_argument("--json", default=None, help="write results here (rank 0)")
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    size, block = comm.size, args.block
    hc = hxmpi.HierComm(comm, ranks_per_node=args.ranks_per_node)
    sbuf = np.ones(size * block, np.uint8)
    rbuf = np.zeros(size * block + PATTERNS, np.uint8)  # room for the shifted patterns
    counts = np.full(size, block, np.int64)
    displs = np.arange(size, dtype=np.int64) * block
    shifted = [displs + k for k in range(PATTERNS)]
    cint, dint = counts.astype(np.intc), displs.astype(np.intc)
    specs = ([sbuf, (cint, dint), MPI.BYTE], [rbuf, (cint, dint), MPI.BYTE])
    raw = comm.Alltoallv_init(*specs)
    record, sums = np.zeros(16, np.uint64), np.zeros(16, np.uint64)
    send_spec = [sbuf, (counts, displs), MPI.BYTE]
    plans = {a: hc.Alltoallv_init(send_spec, [rbuf, (counts, displs), MPI.BYTE], algorithm=a)
             for a in ("flat", "hier")}
    tick = [0]

    def call(col):
        if col == "bare":
            comm.Alltoallv(*specs)
        elif col == "bare-plan":
            raw.Start()
            raw.Wait()
        elif col == "allreduce":
            comm.Allreduce(record, sums, op=MPI.SUM)
        elif col.endswith("-plan"):
            plans[col[:-5]].Start()
            plans[col[:-5]].Wait()
        elif col.endswith("-new"):
            tick[0] += 1
            hc.Alltoallv(send_spec, [rbuf, (counts, shifted[tick[0] % PATTERNS]), MPI.BYTE],
                         algorithm=col[:-4])
        else:
            hc.Alltoallv(send_spec, [rbuf, (counts, displs), MPI.BYTE], algorithm=col[:-7])

    rounds, states = [], {}
    for _ in range(args.repeats):
        result = {}
        for col in COLUMNS:
            for _ in range(args.warmup):
                call(col)
            comm.Barrier()
            t0 = MPI.Wtime()
            for _ in range(args.iterations):
                call(col)
            result[col] = comm.allreduce((MPI.Wtime() - t0) / args.iterations * 1e6) / size
            if col.startswith(("flat-", "hier-")) and not col.endswith("-plan"):
                states[col] = (hc.last_stats["algorithm"], hc.last_stats["plan_cache"])
        rounds.append(result)
    for plan in plans.values():
        plan.Free()
    raw.Free()
    median = {c: float(np.median([r[c] for r in rounds])) for c in COLUMNS}
    m = median
    cpu_us = {"flat": m["flat-new"] - m["allreduce"] - m["bare"],
              "flat_hit": m["flat-repeat"] - m["allreduce"] - m["bare-plan"],
              "hier": m["hier-new"] - m["allreduce"] - m["hier-plan"],
              "hier_hit": m["hier-repeat"] - m["allreduce"] - m["hier-plan"],
              "flat_plan": m["flat-plan"] - m["bare-plan"], "hier_plan": 0.0}
    cpu_s = {k: max(v, 0.0) * 1e-6 for k, v in cpu_us.items()}
    if comm.rank == 0:
        print(f"# hxmpi per-call overhead; {size} ranks, nodes {list(hc.topology.node_sizes)}, "
              f"{block} B blocks, node phase {hc.node_phase}; median of {args.repeats} rounds")
        print(f"{'# column':<14}{'us/call':>10}{'x bare':>10}  path, plan cache")
        for c in COLUMNS:
            path = " ".join(states.get(c, ()))
            print(f"{c:<14}{m[c]:10.2f}{m[c] / m['bare']:10.2f}  {path}")
        print("# hxmpi's own work per call (us): " + ", ".join(f"{k} {v:.2f}" for k, v in cpu_us.items()))
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"benchmark": "overhead", "world_size": size, "block": block,
                           "node_sizes": list(hc.topology.node_sizes), "node_phase": hc.node_phase,
                           "median_us": median, "rounds_us": rounds, "paths": states,
                           "cpu_s_per_call": cpu_s}, fh, indent=1)
    hc.free()
    return 0


if __name__ == "__main__":
    from hxmpi.cli import run_main  # an uncaught error on one rank ends the job
    run_main(main, "bench_overhead.py")
