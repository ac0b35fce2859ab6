"""Where a small all-to-all's time goes: bare MPI, the agreement, hxmpi's one-shot calls, plans.

    mpirun -np 4 python benchmarks/bench_overhead.py --ranks-per-node 2 --json overhead.json

Columns (us per call, mean over ranks, median of the rounds; printed with each one's ratio to its
baseline: the plans ``A-plan`` over the faster of bare and bare-plan, every other column over bare):
  bare           ``comm.Alltoallv`` on prebuilt specs
  bare-plan      a raw MPI persistent ``Alltoallv_init`` request, Start + Wait
  allreduce      the agreement alone: one ``Allreduce`` of 16 uint64
  node-allgather what a hier plan-cache miss adds to the agreement: the node's ``Allgather`` of
                 one int64 per world rank (on the node communicator)
  bruck-p2p      the messages of a Bruck plan alone: raw persistent ``Send_init``/``Recv_init``
                 requests of each round's bytes (radix ``--radix``), each round Startall + Waitall
  floor          what a repeated one-shot call cannot go below: a persistent ``Allreduce_init`` of
                 16 uint64 and the raw persistent ``Alltoallv_init``, each Start + Wait
  A-new          one-shot ``HierComm.Alltoallv(algorithm=A)`` (validated), a new count pattern every
                 call (receive displacements shift through 1024 patterns: none comes back before
                 the plan cache, which keeps every 8th pattern of a run of misses, has evicted it;
                 the JSON's ``paths`` gives the hits counted in the timed calls), for A in flat, hier, bruck, hier_pairwise, hier_bruck (radix ``--radix``)
  A-repeat       the same, one pattern and the same buffers every call (the plan cache hits)
  A-rebound      the same pattern every call, into one of two receive buffers in turn: a hit on
                 buffers other than the ones its cache entry last ran on (a training loop's fresh
                 arrays), which runs the entry's plan without binding a persistent run
  A-plan         a persistent ``HierComm.Alltoallv_init(algorithm=A)`` request, Start + Wait
  flat-new-lists flat-new with counts and displacements as Python lists of integers (read as
                 such by the compiled miss path)
  flat-new-python flat-new with counts and displacements as uint64 arrays, a form only the general
                 reader takes: the Python miss path

``--json`` also writes ``cpu_s_per_call``: hxmpi's own per-call work for each path, the path's time
minus the MPI-only columns it contains (``cpu_formula`` in the JSON spells each one), clamped at 0
(seconds); ``hxmpi.sim.simulate`` charges these instead of fitted constants. Keys, for the one-shot
miss (a new pattern: what the simulator charges a one-shot call), the one-shot hit (``_hit``) and
the plan (``_plan``):
  flat         flat-new - allreduce - bare;    flat_hit  flat-repeat - allreduce - bare-plan;
               flat_plan    flat-plan - bare-plan
  bruck        bruck-new - allreduce - bruck-p2p;    bruck_hit  bruck-repeat - allreduce - bruck-p2p;
               bruck_plan   bruck-plan - bruck-p2p  (the Python of the rounds: packing, posting, waiting)
  hier, hier_pairwise, hier_bruck (H)   H = H-new - allreduce - node-allgather - hier-plan;
               H_hit  H-repeat - allreduce - hier-plan;  H_plan  H-plan - hier-plan (so hier_plan is
               0: hier-plan's lanes are one MPI persistent request, counted as MPI; the pairwise and
               Bruck lane phases add their rounds' Python on top of the same lane messages, which
               are the same on 2 nodes: one message per lane)
A one-shot Bruck miss sends its first run's length headers through ``Mprobe``; bruck-p2p has
neither (8 B per slot and one probe per message more), so a little MPI time stays in ``bruck``.
Degenerate layouts (one node, or one rank per node) run the hier paths flat: their hier keys are
flat's. JSON: ``provenance`` (this run's command line, commit, date, version, MPI, cores), ``radix``, ``cpu_formula``, ``python_miss_s``
(flat-new-python - allreduce - bare: the Python miss path's CPU, seconds).

``--combine-flat A.json ... --combine-hier B.json ... --json OUT`` runs nothing: it writes the CPU file
the simulator and ``HierComm``'s "auto" use from earlier ``--json`` runs. The packaged default is
``hxmpi/comm/overhead.json`` (package data: write it there, with ``--json hxmpi/comm/overhead.json``,
to change what a fresh install ships); any other file is used by ``python -m hxmpi.sim --overhead
FILE``, ``HierComm(overhead=FILE)`` or env ``HXMPI_OVERHEAD=FILE``. A file must hold every key above.
The flat and Bruck keys are the median over the ``--combine-flat`` runs (one rank per core: 2 ranks
on 2 cores, ``--ranks-per-node 1``); the hier keys need 2 nodes of 2 ranks, on this machine 4 ranks
on 2 cores, where a microsecond of Python between two collectives also costs the core-mate's
polling. So each hier key is the median over the ``--combine-hier`` runs, times the ratio of a
flat path's CPU between the two medians (miss: ``python_miss_s``, the Python miss path, since a
flat miss of array specs is compiled and costs next to nothing; hit and plan: ``flat_hit``, or
``python_miss_s`` as well where the 2x2 median of ``flat_hit`` is 0): the
same code in both runs, it measures how much the oversubscribed run inflates hxmpi's CPU. The
output names its inputs, each key's ``source`` and the ratios (``deflation``).

``--alltoallw`` runs, instead of the columns above, Alltoallw columns at each of ``--blocks`` (bytes per
peer; default 8 B to 64 KiB), one spec repeated every call (us per call, mean over ranks, median of
the rounds; ``--iterations`` calls up to 2 KiB per peer, proportionally fewer above, at least 50):
  w-basic-comm   ``comm.Alltoallw`` of float32 items, ``MPI.FLOAT`` for every peer
  w-basic        ``HierComm.Alltoallw`` of the same spec
  v-basic        ``HierComm.Alltoallv`` of the same bytes (``[buf, (counts, displs), MPI.FLOAT]``)
  w-pencil-comm  ``comm.Alltoallw`` of an FFT pencil transpose: a float32 array (n0, size * n1, nz)
                 sent along axis 1 (one subarray datatype per peer, n0 runs each) and received
                 along axis 0 (a subarray per peer, contiguous), n0 * n1 * nz * 4 B per peer
  w-pencil       ``HierComm.Alltoallw`` of the same specs
The HierComm columns run ``--algorithm`` (default ``auto``; ``paths`` names what ran, the plan cache's
state and its hits). JSON (benchmark ``overhead-alltoallw``): ``provenance``, per block ``median_us``,
``rounds_us``, ``paths``, and the ratios ``w-basic / v-basic`` and ``w-pencil / w-pencil-comm``.

``--breakdown`` also times, on each rank alone (no communication, so no waiting inside), the local
stages of one call (us, mean over ranks): parsing two new specs; recognising unchanged specs; the
plan-cache lookup of a pattern; filling the agreement record with its fingerprint; planning the
hierarchical exchange (its step program, the node counts given); binding a flat and a hier run
and freeing it.
"""
from __future__ import annotations

import argparse
import json

import numpy as np
from mpi4py import MPI

import hxmpi  # before mpi4py: it keeps Open MPI's UCX one-sided component out (docs/staging.md)
from hxmpi.baselines import ratio
from hxmpi.cli import command_line
from hxmpi.provenance import provenance
from hxmpi.comm.plan import bruck_rounds

ALGORITHMS = ("flat", "hier", "bruck", "hier_pairwise", "hier_bruck")
HIER = ("hier", "hier_pairwise", "hier_bruck")
COLUMNS = ("bare", "bare-plan", "allreduce", "node-allgather", "bruck-p2p", "floor") + tuple(
    f"{a}-{kind}" for a in ALGORITHMS for kind in ("new", "repeat", "rebound", "plan")) + ("flat-new-lists", "flat-new-python")
PATTERNS = 1024
#: cpu_s_per_call[key] = column - sum(subtracted columns): each path minus the MPI-only columns it contains.
CPU_FORMULA = {
    "flat": ("flat-new", ("allreduce", "bare")), "flat_hit": ("flat-repeat", ("allreduce", "bare-plan")),
    "flat_plan": ("flat-plan", ("bare-plan",)),
    "bruck": ("bruck-new", ("allreduce", "bruck-p2p")), "bruck_hit": ("bruck-repeat", ("allreduce", "bruck-p2p")),
    "bruck_plan": ("bruck-plan", ("bruck-p2p",))}
for _h in HIER:
    CPU_FORMULA.update({_h: (f"{_h}-new", ("allreduce", "node-allgather", "hier-plan")),
                        f"{_h}_hit": (f"{_h}-repeat", ("allreduce", "hier-plan")),
                        f"{_h}_plan": (f"{_h}-plan", ("hier-plan",))})
#: The Python miss path's CPU, the same code at every layout: what ``combine`` deflates the 2x2
#: miss keys by (not a key of the CPU file).
YARDSTICK = ("flat-new-python", ("allreduce", "bare"))


def bruck_p2p(comm, block: int, radix: int, sbuf: np.ndarray, rbuf: np.ndarray) -> list:
    """Per Bruck round, raw persistent send and receive requests of that round's bytes (the plan's messages)."""
    p, q = comm.size, comm.rank
    rounds = []
    for group in bruck_rounds(p, radix):
        reqs = []
        for d, slots in group:
            n = int(slots.shape[0]) * block
            reqs += [comm.Send_init([sbuf[:n], MPI.BYTE], (q + d) % p, 7),
                     comm.Recv_init([rbuf[:n], MPI.BYTE], (q - d) % p, 7)]
        rounds.append(reqs)
    return rounds


def cpu_per_call(median: dict) -> tuple[dict, dict]:
    """(cpu_s_per_call, cpu_formula) from the median columns (us): see the module docstring."""
    cpu, text = {}, {}
    for key, (col, minus) in CPU_FORMULA.items():
        cpu[key] = _difference(median, col, minus)
        text[key] = " - ".join((col,) + minus)
    return cpu, text


def _difference(median: dict, col: str, minus: tuple) -> float:
    """A column minus the MPI-only columns it contains, clamped at 0 (seconds)."""
    return max(median[col] - sum(median[c] for c in minus), 0.0) * 1e-6


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--block", type=int, default=8, help="bytes per destination (default 8)")
    p.add_argument("-i", "--iterations", type=int, default=2000, help="timed calls per column and round (default 2000)")
    p.add_argument("-x", "--warmup", type=int, default=200, help="untimed calls first (default 200)")
    p.add_argument("--repeats", type=int, default=3, help="rounds over all columns; the median is kept (default 3)")
    p.add_argument("--ranks-per-node", type=int, default=None, help="virtual nodes of this many ranks (default: real nodes)")
    p.add_argument("--radix", type=int, default=2, help="Bruck radix of the bruck and hier_bruck columns (default 2)")
    p.add_argument("--breakdown", action="store_true", help="also time each local stage of a call (see above)")
    p.add_argument("--combine-flat", nargs="+", metavar="JSON", help="combine mode (see above): runs with one "
                   "rank per core, source of the flat and Bruck keys")
    p.add_argument("--combine-hier", nargs="+", metavar="JSON", help="combine mode: runs on 2 nodes of 2 ranks, "
                   "source of the hier keys (deflated by their flat keys)")
    p.add_argument("--alltoallw", action="store_true", help="run the Alltoallw columns instead (see above)")
    p.add_argument("--blocks", type=int, nargs="+", default=list(W_BLOCKS), metavar="BYTES",
                   help="with --alltoallw: bytes per peer, each a key of the pencil shapes (default: all of them)")
    p.add_argument("--algorithm", default="auto", choices=("flat", "hier", "auto", "bruck", "hier_pairwise", "hier_bruck"),
                   help="with --alltoallw: the HierComm columns' algorithm (default auto)")
    p.add_argument("--json", default=None, help="write results here (rank 0); the CPU file packaged with hxmpi "
                   "is hxmpi/comm/overhead.json (see above)")
    args = p.parse_args(argv)
    if args.combine_flat or args.combine_hier:
        if not (args.combine_flat and args.combine_hier and args.json):
            p.error("--combine-flat and --combine-hier go together, with --json")
        if MPI.COMM_WORLD.rank == 0:
            combine(args.combine_flat, args.combine_hier, args.json, command_line("benchmarks/bench_overhead.py"))
        return 0
    comm = MPI.COMM_WORLD
    size, block = comm.size, args.block
    hc = hxmpi.HierComm(comm, ranks_per_node=args.ranks_per_node, radix=args.radix)
    if args.alltoallw:
        bad = [b for b in args.blocks if b not in W_BLOCKS]
        if bad:
            p.error(f"--blocks: {bad} not among {list(W_BLOCKS)}")
        alltoallw_columns(comm, hc, args)
        hc.free()
        return 0
    sbuf = np.ones(size * block, np.uint8)
    rbuf = np.zeros(size * block + PATTERNS, np.uint8)  # room for the shifted patterns
    other = np.zeros_like(rbuf)  # the rebound columns' second receive buffer
    counts = np.full(size, block, np.int64)
    displs = np.arange(size, dtype=np.int64) * block
    shifted = [displs + k for k in range(PATTERNS)]
    listed = [d.tolist() for d in shifted]  # flat-new-lists' specs
    # flat-new-python's: uint64, which only the general reader takes (and any --block fits)
    unsigned_counts, unsigned = counts.astype(np.uint64), [d.astype(np.uint64) for d in shifted]
    cint, dint = counts.astype(np.intc), displs.astype(np.intc)
    specs = ([sbuf, (cint, dint), MPI.BYTE], [rbuf, (cint, dint), MPI.BYTE])
    raw = comm.Alltoallv_init(*specs)
    record, sums = np.zeros(16, np.uint64), np.zeros(16, np.uint64)
    agree_req = comm.Allreduce_init(record, sums, op=MPI.SUM)
    intra = hc.topology.intra
    node_counts = np.empty((intra.size, size), np.int64)
    p2p_send, p2p_recv = np.ones(size * block, np.uint8), np.zeros(size * block, np.uint8)
    p2p = bruck_p2p(comm, block, hc.radix, p2p_send, p2p_recv)
    send_spec = [sbuf, (counts, displs), MPI.BYTE]
    plans = {a: hc.Alltoallv_init(send_spec, [rbuf, (counts, displs), MPI.BYTE], algorithm=a) for a in ALGORITHMS}
    tick = [0]

    def call(col):
        algo, _, kind = col.rpartition("-")
        if col == "bare":
            comm.Alltoallv(*specs)
        elif col == "bare-plan":
            raw.Start()
            raw.Wait()
        elif col == "allreduce":
            comm.Allreduce(record, sums, op=MPI.SUM)
        elif col == "node-allgather":
            intra.Allgather(counts, node_counts)
        elif col == "bruck-p2p":
            for reqs in p2p:
                MPI.Prequest.Startall(reqs)
                MPI.Request.Waitall(reqs)
        elif col == "floor":
            agree_req.Start()
            agree_req.Wait()
            raw.Start()
            raw.Wait()
        elif kind == "plan":
            plans[algo].Start()
            plans[algo].Wait()
        elif col == "flat-new-lists":
            tick[0] += 1
            hc.Alltoallv([sbuf, (counts.tolist(), listed[0]), MPI.BYTE],
                         [rbuf, (counts.tolist(), listed[tick[0] % PATTERNS]), MPI.BYTE], algorithm="flat")
        elif col == "flat-new-python":
            tick[0] += 1
            hc.Alltoallv([sbuf, (unsigned_counts, unsigned[0]), MPI.BYTE],
                         [rbuf, (unsigned_counts, unsigned[tick[0] % PATTERNS]), MPI.BYTE], algorithm="flat")
        elif kind == "rebound":
            tick[0] += 1
            hc.Alltoallv(send_spec, [other if tick[0] % 2 else rbuf, (counts, displs), MPI.BYTE], algorithm=algo)
        elif kind == "new":
            tick[0] += 1
            hc.Alltoallv(send_spec, [rbuf, (counts, shifted[tick[0] % PATTERNS]), MPI.BYTE], algorithm=algo)
        else:
            hc.Alltoallv(send_spec, [rbuf, (counts, displs), MPI.BYTE], algorithm=algo)

    breakdown = stage_times(hc, send_spec, [rbuf, (counts, displs), MPI.BYTE], args.iterations) \
        if args.breakdown else {}
    rounds, states = [], {}
    for _ in range(args.repeats):
        result = {}
        for col in COLUMNS:
            for _ in range(args.warmup):
                call(col)
            hits = hc.plan_cache.hits
            comm.Barrier()
            t0 = MPI.Wtime()
            for _ in range(args.iterations):
                call(col)
            result[col] = comm.allreduce((MPI.Wtime() - t0) / args.iterations * 1e6) / size
            if col.endswith(("-new", "-repeat", "-rebound", "-lists", "-python")):
                states[col] = (hc.last_stats["algorithm"], f"hits {hc.plan_cache.hits - hits}/{args.iterations}")
        rounds.append(result)
    for plan in plans.values():
        plan.Free()
    for req in (raw, agree_req, *(r for reqs in p2p for r in reqs)):
        req.Free()
    m = {c: float(np.median([r[c] for r in rounds])) for c in COLUMNS}
    cpu_s, formula = cpu_per_call(m)
    if comm.rank == 0:
        print(f"# hxmpi per-call overhead; {size} ranks, nodes {list(hc.topology.node_sizes)}, "
              f"{block} B blocks, node phase {hc.node_phase}, radix {hc.radix}; median of {args.repeats} rounds")
        # One-shot columns over bare, plans over the faster of bare and bare-plan (hxmpi.baselines).
        print(f"{'# column':<20}{'us/call':>10}{'x base':>10}  path, plan cache (x base: plans over "
              "min(bare, bare-plan), the rest over bare)")
        for c in COLUMNS:
            path = " ".join(states.get(c, ()))
            print(f"{c:<20}{m[c]:10.2f}{ratio(c, m):10.2f}  {path}")
        print("# hxmpi's own work per call (us): " + ", ".join(f"{k} {v * 1e6:.2f}" for k, v in cpu_s.items()))
        if breakdown:
            print(f"{'# local stage':<28}{'us/call':>10}")
            for k, v in breakdown.items():
                print(f"{k:<28}{v:10.2f}")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"benchmark": "overhead", "provenance": provenance(command_line("benchmarks/bench_overhead.py", size)),
                           "world_size": size, "block": block, "radix": hc.radix,
                           "node_sizes": list(hc.topology.node_sizes), "node_phase": hc.node_phase,
                           "median_us": m, "rounds_us": rounds, "paths": states,
                           "cpu_s_per_call": cpu_s, "cpu_formula": formula,
                           "python_miss_s": _difference(m, *YARDSTICK), "stages_us": breakdown}, fh, indent=1)
    hc.free()
    return 0


def combine(flat_files: list, hier_files: list, out: str, command: str) -> dict:
    """The default CPU file from one-rank-per-core runs (flat, Bruck keys) and 2x2 runs (hier keys,
    deflated by the flat keys' ratio); see the module docstring. Returns what it writes."""
    def load(files):
        reports = []
        for f in files:
            with open(f) as fh:
                reports.append(json.load(fh))
        med = {k: float(np.median([r["cpu_s_per_call"][k] for r in reports])) for k in CPU_FORMULA}
        return reports, med
    flat_runs, flat = load(flat_files)
    hier_runs, hier = load(hier_files)
    yard = [float(np.median([r["python_miss_s"] for r in runs])) for runs in (flat_runs, hier_runs)]
    if yard[1] <= 0:
        raise ValueError(f"the --combine-hier runs' median python_miss_s is {yard[1]}: no Python miss to "
                         "deflate their miss keys by")
    # A compiled hit can cost nothing measurable on 2x2 (flat_hit's median clamped to 0); its
    # ratio then says nothing, and the Python miss path's, the same code in both runs, stands in.
    hit_by_miss = hier["flat_hit"] <= 0
    deflation = {"miss": yard[0] / yard[1], "hit": yard[0] / yard[1] if hit_by_miss else flat["flat_hit"] / hier["flat_hit"]}
    cpu, source = {}, {}
    for key in CPU_FORMULA:
        if key.startswith("hier"):
            kind = "miss" if key in HIER else "hit"
            cpu[key] = hier[key] * deflation[kind]
            yardstick = "python_miss_s, the Python miss path," if kind == "miss" or hit_by_miss else "flat_hit"
            source[key] = (f"median over {len(hier_files)} runs on {hier_runs[0]['node_sizes']} of "
                           f"({CPU_FORMULA[key][0]} - {' - '.join(CPU_FORMULA[key][1])}), times {deflation[kind]:.3f} "
                           f"({yardstick} one rank per core / same on {hier_runs[0]['node_sizes']})")
        else:
            cpu[key] = flat[key]
            source[key] = (f"median over {len(flat_files)} runs on {flat_runs[0]['node_sizes']} of "
                           f"({CPU_FORMULA[key][0]} - {' - '.join(CPU_FORMULA[key][1])})")
    report = {"benchmark": "overhead-combined", "provenance": provenance(command), "block": flat_runs[0]["block"],
              "radix": flat_runs[0].get("radix"), "cpu_s_per_call": cpu, "source": source, "deflation": deflation,
              "inputs": [{"file": f, "provenance": r.get("provenance"), "node_sizes": r["node_sizes"],
                          "median_us": r["median_us"], "paths": r.get("paths"), "stages_us": r.get("stages_us"),
                          "cpu_s_per_call": r["cpu_s_per_call"]} for f, r in
                         zip(flat_files + hier_files, flat_runs + hier_runs)]}
    with open(out, "w") as fh:
        json.dump(report, fh, indent=1)
    print("# combined CPU per call (us): " + ", ".join(f"{k} {v * 1e6:.2f}" for k, v in cpu.items()))
    print(f"# deflation of the 2x2 keys: miss {deflation['miss']:.3f}, hit/plan {deflation['hit']:.3f}")
    return report


#: Bytes per peer -> the pencil's (n0, n1, nz): float32 items, n0 runs of n1 * nz items per peer.
W_BLOCKS = {8: (2, 1, 1), 64: (4, 4, 1), 512: (8, 8, 2), 2048: (8, 8, 8), 32768: (16, 16, 32), 65536: (16, 16, 64)}
W_COLUMNS = ("w-basic-comm", "w-basic", "v-basic", "w-pencil-comm", "w-pencil")


def _pencil_specs(size: int, n0: int, n1: int, nz: int) -> tuple[list, list, list]:
    """(send spec, receive spec, datatypes to free) of a pencil transpose: a (n0, size * n1, nz)
    float32 array sent along axis 1, an (size * n0, n1, nz) one received along axis 0."""
    a = np.ones((n0, size * n1, nz), np.float32)
    b = np.zeros((size * n0, n1, nz), np.float32)
    send_t = [MPI.FLOAT.Create_subarray(a.shape, (n0, n1, nz), (0, j * n1, 0)).Commit() for j in range(size)]
    recv_t = [MPI.FLOAT.Create_subarray(b.shape, (n0, n1, nz), (i * n0, 0, 0)).Commit() for i in range(size)]
    ones, zeros = [1] * size, [0] * size
    return [a, ones, zeros, send_t], [b, ones, zeros, recv_t], send_t + recv_t


def alltoallw_columns(comm, hc, args) -> None:
    """The ``--alltoallw`` columns (see the module docstring); rank 0 prints them and writes ``--json``."""
    size = comm.size
    blocks = {}
    for block in args.blocks:
        n = block // 4
        sbuf, rbuf = np.ones(size * n, np.float32), np.zeros(size * n, np.float32)
        counts, displs = np.full(size, n, np.int64), np.arange(size, dtype=np.int64) * n
        basic = ([sbuf, counts, displs * 4, [MPI.FLOAT] * size], [rbuf, counts, displs * 4, [MPI.FLOAT] * size])
        vector = ([sbuf, (counts, displs), MPI.FLOAT], [rbuf, (counts, displs), MPI.FLOAT])
        psend, precv, made = _pencil_specs(size, *W_BLOCKS[block])
        algo = args.algorithm
        calls = {"w-basic-comm": lambda: comm.Alltoallw(*basic), "w-basic": lambda: hc.Alltoallw(*basic, algo),
                 "v-basic": lambda: hc.Alltoallv(*vector, algo), "w-pencil-comm": lambda: comm.Alltoallw(psend, precv),
                 "w-pencil": lambda: hc.Alltoallw(psend, precv, algo)}
        iterations = max(50, int(args.iterations * min(1.0, 2048 / block)))
        rounds, paths = [], {}
        for _ in range(args.repeats):
            result = {}
            for col in W_COLUMNS:
                for _ in range(args.warmup):
                    calls[col]()
                hits = hc.plan_cache.hits
                comm.Barrier()
                t0 = MPI.Wtime()
                for _ in range(iterations):
                    calls[col]()
                result[col] = comm.allreduce((MPI.Wtime() - t0) / iterations * 1e6) / size
                if not col.endswith("-comm"):
                    paths[col] = (hc.last_stats["algorithm"], hc.last_stats["plan_cache"],
                                  f"hits {hc.plan_cache.hits - hits}/{iterations}")
            rounds.append(result)
        for t in made:
            t.Free()
        m = {c: float(np.median([r[c] for r in rounds])) for c in W_COLUMNS}
        ratios = {"w-basic / v-basic": m["w-basic"] / m["v-basic"],
                  "w-pencil / w-pencil-comm": m["w-pencil"] / m["w-pencil-comm"]}
        blocks[block] = {"iterations": iterations, "pencil": W_BLOCKS[block], "median_us": m, "rounds_us": rounds,
                         "paths": paths, "ratios": ratios}
    if comm.rank == 0:
        print(f"# Alltoallw, {size} ranks, nodes {list(hc.topology.node_sizes)}, node phase {hc.node_phase}; "
              f"us per call, median of {args.repeats} rounds")
        print(f"{'# B/peer':<10}" + "".join(f"{c:>15}" for c in W_COLUMNS) + f"{'w/v':>8}{'w/comm':>8}  paths")
        for block, d in blocks.items():
            r = d["ratios"]
            print(f"{block:<10}" + "".join(f"{d['median_us'][c]:15.2f}" for c in W_COLUMNS)
                  + f"{r['w-basic / v-basic']:8.2f}{r['w-pencil / w-pencil-comm']:8.2f}  "
                  + "; ".join(f"{k} {' '.join(v)}" for k, v in d["paths"].items()))
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"benchmark": "overhead-alltoallw",
                           "provenance": provenance(command_line("benchmarks/bench_overhead.py", size)),
                           "world_size": size, "node_sizes": list(hc.topology.node_sizes),
                           "node_phase": hc.node_phase, "algorithm": args.algorithm, "repeats": args.repeats,
                           "blocks": {str(b): d for b, d in blocks.items()}}, fh, indent=1)


def stage_times(hc, send_spec, recv_spec, iterations: int) -> dict:
    """Local stages of one call, each timed alone on this rank (us, mean over ranks; see --breakdown)."""
    from hxmpi.comm._agree import fill_record
    from hxmpi.comm._call import spec_unchanged
    from hxmpi.comm.engine import _spec_memo
    from hxmpi.comm.msgspec import parse_alltoallv
    from hxmpi.comm.plan import ALGORITHM, program
    from hxmpi.comm.plancache import CacheEntry
    from hxmpi.comm.runs import Scratch
    comm, size = hc.comm, hc.comm.size
    s, r, _ = parse_alltoallv(send_spec, recv_spec, size)
    memo = _spec_memo(send_spec, recv_spec)
    parts = (s.counts, s.displs, r.counts, r.displs)
    rec = np.zeros(16, np.uint64)
    rc_node = np.empty((len(hc.layout.members[hc.topology.node]), size), np.int64)
    hc.topology.intra.Allgather(r.counts, rc_node)
    stages = {"parse two new specs": lambda: parse_alltoallv(send_spec, recv_spec, size),
              "recognise unchanged specs": lambda: spec_unchanged((send_spec, recv_spec), memo),
              "plan-cache lookup": lambda: hc.plan_cache.lookup(parts, (0, True, 0, False)),
              "agreement record": lambda: fill_record(rec, False, False, 0, True, 0, 1, True, False, 1 << 20,
                                                      s.counts, r.counts, True, comm.rank, 1, 2),
              }
    scratch = Scratch()
    flat = CacheEntry(0, None, (0, True, 0, False), ALGORITHM["flat"], False)
    stages["bind + free flat run"] = lambda: hc._engine.bind(flat, s, r, False, scratch).free()
    if hc.layout.hier_possible:
        planner = hc.layout.planner(comm.rank)
        plan = program(ALGORITHM["hier"], parts, planner, hc._engine.mode, rc_node).detach()
        hier = CacheEntry(0, None, (2, True, 0, False), ALGORITHM["hier"], False, plan=plan)
        stages["plan hier (its program)"] = lambda: program(ALGORITHM["hier"], parts, planner, hc._engine.mode, rc_node)
        stages["bind + free hier run"] = lambda: hc._engine.bind(hier, s, r, False, scratch).free()
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
