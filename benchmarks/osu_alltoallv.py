"""OSU-style all-to-all latency: bare MPI (one-shot and persistent), flat/hier/auto HierComm, persistent
plans, a naive mpi4py user.

    mpirun -np 4 python benchmarks/osu_alltoallv.py -m 8:1048576 --ranks-per-node 2 --json out.json

Sizes are bytes per block (per destination rank), as in osu_alltoallv. Latency is the mean time
per call in microseconds over ``-i`` iterations after ``-x`` warm-up calls, averaged over ranks
(``-f`` adds min and max over ranks). Columns: "bare" is ``comm.Alltoallv`` on prebuilt specs (C int
counts, MPI.BYTE), the floor for any one-shot wrapper; "bare-plan" is MPI's persistent collective on the
same specs (``comm.Alltoallv_init`` once, then Start/Wait: MPI-4), the floor for any plan; "flat", "hier", "auto" are ``HierComm.Alltoallv`` calls
(validated unless ``--no-validate``) with the same specs every call, so from the third call on they
run their cached persistent plan; so are "bruck" (flat radix-k Bruck), "hier_pairwise" and
"hier_bruck" (hier with pairwise or Bruck lanes; radix ``--radix``); "A-new" (A one of flat, hier,
bruck, hier_pairwise, hier_bruck) are the same calls with a new count pattern every call (the
receive displacements shift through 1024 patterns, none repeated within a size, so every call
agrees, plans and binds anew); "A-plan" are persistent requests (``HierComm.Alltoallv_init`` once,
then Start/Wait); "naive" is what a user without hxmpi writes:
per-destination numpy arrays, ``np.concatenate``, ``comm.Alltoallv``, ``np.split``.
The table shows the one-shot columns beside "bare", the plans beside "bare-plan"; ratios (printed for
the first and last size, every one in the JSON's ``ratios``) set one-shot columns over "bare" and
plans over the faster of "bare" and "bare-plan" (``hxmpi.baselines``).
``-c`` checks one extra, untimed call of every column per size against ``MPI_Alltoallv``, with the
receive buffer poisoned first; the verdict is agreed by all ranks.
``--uneven`` draws skewed counts (Zipf-like, as MoE routing produces) with the same mean.
``--rounds R`` times every column R times per size, one round after another, and keeps its best
round (the lowest mean over ranks): on a noisy host, each column's best of several runs.
``--chunks K`` gives the HierComm's hier columns a pipelined node phase of K chunks.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
from mpi4py import MPI

import hxmpi  # before mpi4py: it keeps Open MPI's UCX one-sided component out (docs/staging.md)
from hxmpi.baselines import BARE_PLAN, baseline, is_plan
from hxmpi.cli import command_line
from hxmpi.provenance import provenance

ALGORITHMS = ("flat", "hier", "bruck", "hier_pairwise", "hier_bruck")
#: One-shot calls after MPI's one-shot call, plans after MPI's persistent one (the order printed).
COLUMNS = ("bare", *ALGORITHMS, "auto", *(f"{a}-new" for a in ALGORITHMS), "naive",
           BARE_PLAN, *(f"{a}-plan" for a in ALGORITHMS))
#: The ratios printed (every column's is in the JSON), and two of hxmpi's paths against each other.
SHOWN_RATIOS = ("flat", "flat-new", "hier", "auto", BARE_PLAN, "flat-plan", "hier-plan")
PAIRS = (("hier", "flat"), ("hier-plan", "flat-plan"))
#: How the ratios name the baseline of a plan.
PLAN_BASE = "min(bare, bare-plan)"
POISON = 0xA5
# Receive-displacement shifts of the "-new" columns: none comes back within a run, so the plan cache
# (which keeps every 8th pattern of a long run of misses) never serves one.
PATTERNS = 1024


def parse_range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(":")
    return int(lo or 1), int(hi or lo)


def block_counts(size: int, nbytes: int, uneven: bool, rng: np.random.Generator) -> np.ndarray:
    """Bytes this rank sends to each rank; skewed counts keep the same total."""
    if not uneven:
        return np.full(size, nbytes, dtype=np.int64)
    weights = 1.0 / (1 + rng.permutation(size)) ** 1.2
    counts = np.floor(weights / weights.sum() * nbytes * size).astype(np.int64)
    counts[0] += nbytes * size - counts.sum()
    return counts


def run_size(hc: hxmpi.HierComm, nbytes: int, args, rng) -> dict:
    comm = hc.comm
    size = comm.size
    sc = block_counts(size, nbytes, args.uneven, rng)
    rc = np.empty(size, np.int64)
    comm.Alltoall(sc, rc)
    sbuf = rng.integers(0, 256, int(sc.sum()), dtype=np.uint8)
    rbuf = np.empty(int(rc.sum()), np.uint8)
    ref = np.empty_like(rbuf)
    shifted_buf = np.empty(int(rc.sum()) + PATTERNS, np.uint8)
    rd = np.concatenate([[0], np.cumsum(rc)[:-1]]).astype(np.int64)
    shifts = [rd + k for k in range(PATTERNS)]
    tick = [0]
    comm.Alltoallv([sbuf, sc, MPI.BYTE], [ref, rc, MPI.BYTE])
    pieces = np.split(sbuf, np.cumsum(sc)[:-1])  # the naive user's per-destination arrays
    iters = args.iterations if nbytes <= args.large_threshold else args.iterations_large
    result = {"size": nbytes, "check": {}}
    bare_specs = ([sbuf, (sc.astype(np.intc), np.concatenate([[0], np.cumsum(sc)[:-1]]).astype(np.intc)),
                   MPI.BYTE],
                  [rbuf, (rc.astype(np.intc), np.concatenate([[0], np.cumsum(rc)[:-1]]).astype(np.intc)),
                   MPI.BYTE])
    plans = {col: hc.Alltoallv_init([sbuf, sc, MPI.BYTE], [rbuf, rc, MPI.BYTE], algorithm=col[:-5])
             for col in COLUMNS if is_plan(col)}
    plans[BARE_PLAN] = comm.Alltoallv_init(*bare_specs)  # MPI's own plan: its schedule built here, once
    for col in COLUMNS:
        def once():
            if col == "naive":
                out = np.empty(int(rc.sum()), np.uint8)
                comm.Alltoallv([np.concatenate(pieces), sc, MPI.BYTE], [out, rc, MPI.BYTE])
                np.split(out, np.cumsum(rc)[:-1])
                return out
            if col == "bare":
                comm.Alltoallv(*bare_specs)
            elif col in plans:
                plans[col].Start()
                plans[col].Wait()
            elif col.endswith("-new"):
                k = tick[0] = (tick[0] + 1) % PATTERNS
                hc.Alltoallv([sbuf, sc, MPI.BYTE], [shifted_buf, (rc, shifts[k]), MPI.BYTE],
                             algorithm=col[:-4], validate=args.validate_input)
                return shifted_buf[k:k + rbuf.shape[0]]
            else:
                hc.Alltoallv([sbuf, sc, MPI.BYTE], [rbuf, rc, MPI.BYTE], algorithm=col,
                             validate=args.validate_input)
            return rbuf
        for _ in range(args.warmup if nbytes <= args.large_threshold else args.warmup_large):
            once()
        best = None
        for _ in range(args.rounds):  # a noisy host: the column's best round is kept
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                once()
            local = (time.perf_counter() - t0) / iters * 1e6
            times = comm.allgather(local)
            if best is None or np.mean(times) < np.mean(best):
                best = times
        times = best
        if args.check:  # one more call into a poisoned buffer: an exchange that moves nothing fails
            rbuf.fill(POISON)
            shifted_buf.fill(POISON)
            result["check"][col] = bool(np.array_equal(once(), ref))
        result[col] = {"avg_us": float(np.mean(times)), "min_us": float(np.min(times)),
                       "max_us": float(np.max(times))}
        if col == "auto":
            result["auto_choice"] = hc.last_stats["algorithm"]
        if col in ALGORITHMS or col.endswith("-new"):
            result[f"{col}_stats"] = hc.last_stats
    for plan in plans.values():
        plan.Free()
    if args.check:  # every rank learns every rank's verdict, so all stop together on a mismatch
        verdicts = comm.allgather(result["check"])
        bad = [(r, col) for r, v in enumerate(verdicts) for col, ok in v.items() if not ok]
        if bad:
            raise SystemExit(f"check failed at {nbytes} B: " + ", ".join(f"{c} on rank {r}" for r, c in bad[:8]))
    return result


def size_ratios(r: dict) -> dict:
    """One size's ratios: every column but "bare" over its baseline (one-shot calls and "bare-plan"
    over "bare", plans over the faster of "bare" and "bare-plan"; ``hxmpi.baselines``), then ``PAIRS``."""
    times = {c: r[c]["avg_us"] for c in COLUMNS}
    out = {f"{c}/{PLAN_BASE if is_plan(c) else 'bare'}": times[c] / baseline(c, times) for c in COLUMNS if c != "bare"}
    return out | {f"{a}/{b}": times[a] / times[b] for a, b in PAIRS}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--message-size", default="8:1048576", help="MIN:MAX bytes per block (powers of 2)")
    p.add_argument("-i", "--iterations", type=int, default=200, help="timed iterations per size")
    p.add_argument("--iterations-large", type=int, default=30, help="timed iterations above --large-threshold")
    p.add_argument("--large-threshold", type=int, default=65536, help="bytes per block counted as large")
    p.add_argument("-x", "--warmup", type=int, default=200,
                   help="warm-up iterations per size up to --large-threshold (OSU's small-message skip)")
    p.add_argument("--warmup-large", type=int, default=10, help="warm-up iterations above --large-threshold")
    p.add_argument("-c", "--check", action="store_true", help="validate every result against MPI_Alltoallv")
    p.add_argument("-f", "--full", action="store_true", help="also print min and max over ranks")
    p.add_argument("--uneven", action="store_true", help="skewed counts, like MoE token routing")
    p.add_argument("--ranks-per-node", type=int, default=None, help="virtual nodes (default: real nodes)")
    p.add_argument("--node-phase", choices=("auto", "shm", "mpi"), default=None,
                   help="hier node phase (default: env HXMPI_NODE_PHASE, else auto)")
    p.add_argument("--radix", type=int, default=2, help="Bruck radix of the bruck and hier_bruck columns (default 2)")
    p.add_argument("--chunks", type=int, default=1,
                   help="chunks of the hier columns' pipelined node phase, 1 to 8 (default 1: none)")
    p.add_argument("--rounds", type=int, default=1,
                   help="timed rounds per column and size; the round with the lowest mean over ranks is kept (default 1)")
    p.add_argument("--no-validate", dest="validate_input", action="store_false",
                   help="call HierComm with validate=False (skip input checks)")
    p.add_argument("--json", default=None, help="write results here (rank 0)")
    args = p.parse_args(argv)
    lo, hi = parse_range(args.message_size)
    comm = MPI.COMM_WORLD
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    hc = hxmpi.HierComm(comm, ranks_per_node=args.ranks_per_node, node_phase=args.node_phase, radix=args.radix,
                        chunks=args.chunks)
    topo = hc.topology
    rng = np.random.default_rng(comm.rank)
    sizes = [s for s in (2 ** k for k in range(0, 31)) if lo <= s <= hi]
    rows = [run_size(hc, s, args, rng) for s in sizes]
    if comm.rank == 0:
        print(f"# hxmpi OSU-style Alltoallv latency; {comm.size} ranks, nodes {list(topo.node_sizes)}, "
              f"node phase {hc.node_phase}{', uneven counts' if args.uneven else ''}")
        width = {c: max(15, len(c) + 7) for c in COLUMNS}
        head = f"{'# Size [B]':<10}" + "".join(f"{c + ' [us]':>{width[c]}}" for c in COLUMNS) + f"{'auto picks':>12}"
        if args.full:
            head += "".join(f"{c + ' min/max':>22}" for c in ("flat", "hier"))
        print(head)
        print("# one-shot columns to bare's right, plans to bare-plan's (MPI_Alltoallv_init once, then Start/Wait)")
        for r in rows:
            line = f"{r['size']:<10d}" + "".join(f"{r[c]['avg_us']:{width[c]}.2f}" for c in COLUMNS)
            line += f"{r['auto_choice']:>12}"
            if args.full:
                line += "".join(f"{r[c]['min_us']:11.2f}{r[c]['max_us']:11.2f}" for c in ("flat", "hier"))
            print(line, flush=True)
        if args.check:
            print(f"# check passed: {len(COLUMNS)} columns x {len(rows)} sizes equal MPI_Alltoallv on every rank")
        ratios = {f"{k} @ {r['size']} B": v for r in rows for k, v in size_ratios(r).items()}
        for r in ({rows[0]['size']: rows[0], rows[-1]['size']: rows[-1]}.values()):
            shown = {k: v for k, v in size_ratios(r).items() if k.split("/")[0] in SHOWN_RATIOS or
                     tuple(k.split("/")) in PAIRS}
            print(f"# ratios @ {r['size']} B: " + ", ".join(f"{k} {v:.2f}x" for k, v in shown.items()))
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"benchmark": "osu_alltoallv", "provenance": provenance(command_line("benchmarks/osu_alltoallv.py", comm.size)),
                           "world_size": comm.size,
                           "node_sizes": list(topo.node_sizes), "uneven": args.uneven,
                           "node_phase": hc.node_phase, "validate": args.validate_input, "radix": hc.radix,
                           "chunks": hc.chunks, "rounds": args.rounds,
                           "ratios": ratios,
                           "mpi": MPI.Get_library_version().splitlines()[0].strip(),
                           "results": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    from hxmpi.cli import run_main  # an uncaught error on one rank ends the job
    run_main(main, 'osu_alltoallv.py')
