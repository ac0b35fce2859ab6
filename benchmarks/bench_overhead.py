"""Where a small all-to-all's time goes: bare MPI, the agreement, hxmpi's one-shot calls, plans.

    mpirun -np 4 python benchmarks/bench_overhead.py --ranks-per-node 2 --json overhead.json

Columns (us per call, mean over ranks, median of the rounds):
  bare           ``comm.Alltoallv`` on prebuilt specs
  bare-plan      a raw MPI persistent ``Alltoallv_init`` request, Start + Wait
  allreduce      the agreement alone: one ``Allreduce`` of 16 uint64
  floor          what a repeated one-shot call cannot go below: a persistent ``Allreduce_init`` of
                 16 uint64 and the raw persistent ``Alltoallv_init``, each Start + Wait
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

``--breakdown`` also times, on each rank alone (no communication, so no waiting inside), the local
stages of one call (us, mean over ranks): parsing two new specs; recognising unchanged specs; the
plan-cache lookup of a pattern; filling the agreement record with its fingerprint; planning the
hierarchical exchange (``HierPlan``, the node counts given); binding a flat and a hier run and
freeing it.
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import hxmpi  # before mpi4py: it keeps Open MPI's UCX one-sided component out (README)
from mpi4py import MPI

COLUMNS = ("bare", "bare-plan", "allreduce", "floor", "flat-new", "flat-repeat", "flat-plan",
           "hier-new", "hier-repeat", "hier-plan")
PATTERNS = 32


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--block", type=int, default=8, help="bytes per destination (default 8)")
    p.add_argument("-i", "--iterations", type=int, default=2000, help="timed calls per column and round (default 2000)")
    p.add_argument("-x", "--warmup", type=int, default=200, help="untimed calls first (default 200)")
    p.add_argument("--repeats", type=int, default=3, help="rounds over all columns; the median is kept (default 3)")
    p.add_argument("--ranks-per-node", type=int, default=None, help="virtual nodes of this many ranks (default: real nodes)")
    p.add_argument("--breakdown", action="store_true", help="also time each local stage of a call (see above)")
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
    agree_req = comm.Allreduce_init(record, sums, op=MPI.SUM)
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
        elif col == "floor":
            agree_req.Start()
            agree_req.Wait()
            raw.Start()
            raw.Wait()
        elif col.endswith("-plan"):
            plans[col[:-5]].Start()
            plans[col[:-5]].Wait()
        elif col.endswith("-new"):
            tick[0] += 1
            hc.Alltoallv(send_spec, [rbuf, (counts, shifted[tick[0] % PATTERNS]), MPI.BYTE],
                         algorithm=col[:-4])
        else:
            hc.Alltoallv(send_spec, [rbuf, (counts, displs), MPI.BYTE], algorithm=col[:-7])

    breakdown = stage_times(hc, send_spec, [rbuf, (counts, displs), MPI.BYTE], args.iterations) \
        if args.breakdown else {}
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
    agree_req.Free()
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
        if breakdown:
            print(f"{'# local stage':<28}{'us/call':>10}")
            for k, v in breakdown.items():
                print(f"{k:<28}{v:10.2f}")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"benchmark": "overhead", "world_size": size, "block": block,
                           "node_sizes": list(hc.topology.node_sizes), "node_phase": hc.node_phase,
                           "median_us": median, "rounds_us": rounds, "paths": states,
                           "cpu_s_per_call": cpu_s, "stages_us": breakdown}, fh, indent=1)
    hc.free()
    return 0


def stage_times(hc, send_spec, recv_spec, iterations: int) -> dict:
    """Local stages of one call, each timed alone on this rank (us, mean over ranks; see --breakdown)."""
    from hxmpi._agree import fill_record, spec_unchanged
    from hxmpi.exchange import _spec_memo
    from hxmpi.execute import FlatRun, HierPlan, HierRun, Scratch
    from hxmpi.msgspec import parse_alltoallv
    from hxmpi.plancache import CacheEntry
    comm, size = hc.comm, hc.comm.size
    s, r, _ = parse_alltoallv(send_spec, recv_spec, size)
    memo = _spec_memo(False, send_spec, recv_spec, s, r)
    parts = (s.counts, s.displs, r.counts, r.displs)
    rec = np.zeros(16, np.uint64)
    rc_node = np.empty((len(hc.layout.members[hc.topology.node]), size), np.int64)
    hc.topology.intra.Allgather(r.counts, rc_node)
    stages = {"parse two new specs": lambda: parse_alltoallv(send_spec, recv_spec, size),
              "recognise unchanged specs": lambda: spec_unchanged((send_spec, recv_spec), *memo[1:5]),
              "plan-cache lookup": lambda: hc.plan_cache.lookup(parts, (0, True, 0, False)),
              "agreement record": lambda: fill_record(rec, False, False, 0, True, 0, 1, True, False, 1 << 20,
                                                      s.counts, r.counts, True, comm.rank, 1, 2),
              "bind + free flat run": lambda: FlatRun(comm, s, r, False, False).free()}
    if hc.layout.hier_possible:
        plan = HierPlan(hc.layout.planner(comm.rank), hc._mode, s, r, rc_node, comm.rank)
        hier = CacheEntry(0, None, (1, True, 0, False), "hier", False, plan=plan)
        scratch = Scratch()
        stages["plan hier (HierPlan)"] = lambda: HierPlan(hc.layout.planner(comm.rank), hc._mode, s, r,
                                                          rc_node, comm.rank)
        stages["bind + free hier run"] = lambda: hc._bind(hier, s, r, False, scratch).free()
    out = {}
    for name, fn in stages.items():
        for _ in range(20):
            fn()
        t0 = MPI.Wtime()
        for _ in range(iterations):
            fn()
        out[name] = comm.allreduce((MPI.Wtime() - t0) / iterations * 1e6) / size
    return out


if __name__ == "__main__":
    from hxmpi.cli import run_main  # an uncaught error on one rank ends the job
    run_main(main, "bench_overhead.py")
