"""Nonblocking all-to-alls in each progress mode: ``HierComm.Ialltoallv`` waited for at once,
and in flight while the caller computes, against the blocking call, compute and exchange in turn,
and MPI's own ``Ialltoallv``.

    mpirun -np 4 python benchmarks/bench_overlap.py --block 65536 --ranks-per-node 2 --json overlap_np4.json

Every rank sends ``--block`` bytes to every rank. The compute is a loop of ``--matrix``-square
float64 matrix products (BLAS held to one thread; each product releases the GIL), calibrated first
to last as long as the blocking exchange alone (the same on every rank). Two HierComms over the
same layout, one per progress mode (``request``: the request's Test/Wait move the exchange;
``thread``: a progress thread does), and MPI's own (``mpi``). Modes, interleaved in each of
``--rounds`` rounds; a mode runs ``--iterations`` iterations back to back after a barrier:

  blocking          ``hc.Alltoallv(...)``
  compute           the compute alone
  in_turn           compute, then ``hc.Alltoallv(...)``
  mpi_in_turn       compute, then ``comm.Alltoallv(...)``
  P_immediate       ``Ialltoallv(...).Wait()`` at once (P = request, thread, mpi)
  P_overlap         ``req = Ialltoallv(...)``, compute, ``req.Wait()``
  P_chunked         ``req = Ialltoallv(...)``, then each product of the compute followed by
                    ``req.Test()`` (a pipelined code's pattern), then ``req.Wait()``

A mode's time per iteration in a round is the slowest rank's loop time over the iterations; the
tables show median (min-max) over rounds. Ratios: ``immediate_P`` is P_immediate over the blocking
call (the nonblocking call's toll); ``overlap_P`` and ``chunked_P`` are the overlapped time over
compute and exchange run in turn (below 1.0: the overlap gains; the ``mpi`` ones over
``mpi_in_turn``). CPU seconds per iteration (the process's, and the progress thread's) are
recorded per mode, and the cores' utilisation (ranks x CPU / (cores x wall)): work and exchange
that each keep a core busy cannot overlap on a host whose cores the ranks already fill.
"""
from __future__ import annotations

import argparse
import json
import os
import threading
import time

import numpy as np
from mpi4py import MPI
from threadpoolctl import threadpool_limits

import hxmpi  # before mpi4py's first call: it keeps Open MPI's UCX one-sided component out (docs/staging.md)
from hxmpi.cli import command_line
from hxmpi.comm.nonblocking import PROGRESS_MODES
from hxmpi.provenance import provenance

#: the ways a nonblocking exchange progresses here: hxmpi's modes, and MPI's own Ialltoallv
WAYS = (*PROGRESS_MODES, "mpi")
MODES = ("blocking", "compute", "in_turn", "mpi_in_turn",
         *(f"{w}_{pattern}" for w in WAYS for pattern in ("immediate", "overlap", "chunked")))
#: ratio name -> (mode, the mode it is divided by)
RATIOS = {**{f"immediate_{w}": (f"{w}_immediate", "blocking") for w in PROGRESS_MODES},
          "immediate_mpi": ("mpi_immediate", "blocking"),
          **{f"{pattern}_{w}": (f"{w}_{pattern}", "mpi_in_turn" if w == "mpi" else "in_turn")
             for w in WAYS for pattern in ("overlap", "chunked")}}


def progress_clock() -> int:
    """The CPU-time clock of hxmpi's progress thread (made by the first nonblocking call)."""
    ids = [t.ident for t in threading.enumerate() if t.name == "hxmpi-progress"]
    if len(ids) != 1:
        raise SystemExit(f"bench_overlap.py: expected one hxmpi progress thread, found {len(ids)}")
    return time.pthread_getcpuclockid(ids[0])


class Compute:
    """``chunks`` products of two ``n``-square float64 matrices (GIL released in each)."""

    def __init__(self, n: int, rng: np.random.Generator):
        self.a, self.b = rng.random((n, n)), rng.random((n, n))
        self.out = np.empty((n, n))
        self.chunks = 1

    def __call__(self) -> None:
        for _ in range(self.chunks):
            np.matmul(self.a, self.b, out=self.out)


def loop_s(comm, fn, iterations: int) -> float:
    """Seconds per call of ``fn`` in a loop of ``iterations`` after a barrier: the slowest rank's."""
    comm.Barrier()
    t = time.perf_counter()
    for _ in range(iterations):
        fn()
    return comm.allreduce(time.perf_counter() - t, op=MPI.MAX) / iterations


def calibrate(comm, compute: Compute, exchange, iterations: int) -> dict:
    """Size the compute to the exchange alone (medians of 3 loops; agreed: rank 0's): the products
    per compute. Returns the seconds measured (exchange, one product)."""
    def median_s(fn):
        return float(np.median([loop_s(comm, fn, iterations) for _ in range(3)]))
    compute.chunks = 1
    measured = {"exchange": median_s(exchange), "one_product": median_s(compute)}
    compute.chunks = comm.bcast(max(1, round(measured["exchange"] / measured["one_product"])))
    return measured


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--block", type=int, default=65536, help="bytes each rank sends to each rank (default 65536)")
    p.add_argument("--iterations", type=int, default=100, help="timed iterations per mode and round (default 100)")
    p.add_argument("--rounds", type=int, default=5, help="rounds, the modes interleaved in each (default 5)")
    p.add_argument("--warmup", type=int, default=50, help="untimed iterations of each mode first (default 50)")
    p.add_argument("--matrix", type=int, default=48,
                   help="side of the compute's square matrices, one chunk of the chunked modes (default 48)")
    p.add_argument("--algorithm", default=None, help="HierComm algorithm (default: HierComm's default)")
    p.add_argument("--ranks-per-node", type=int, default=None, help="virtual nodes (default: real nodes)")
    p.add_argument("--json", default=None, help="write the results here (rank 0)")
    args = p.parse_args(argv)
    if min(args.block, args.iterations, args.rounds, args.matrix) < 1 or args.warmup < 0:
        p.error("--block, --iterations, --rounds and --matrix must be >= 1, --warmup >= 0")
    threadpool_limits(1)  # one BLAS thread: the compute is one core's, as the caller's thread is one
    comm = MPI.COMM_WORLD
    size = comm.size
    hcs = {mode: hxmpi.HierComm(comm, ranks_per_node=args.ranks_per_node, progress=mode) for mode in PROGRESS_MODES}
    hc = hcs["request"]
    counts = np.full(size, args.block, dtype=np.int64)
    displs = np.arange(size, dtype=np.int64) * args.block
    sbuf = np.random.default_rng(comm.rank).integers(0, 256, size * args.block, dtype=np.uint8)
    bufs = {w: np.empty_like(sbuf) for w in ("blocking", *WAYS)}
    ref = np.empty_like(sbuf)
    specs = {w: ([sbuf, (counts, displs), MPI.BYTE], [bufs[w], (counts, displs), MPI.BYTE])
             for w in ("blocking", *PROGRESS_MODES)}
    mpi_specs = ([sbuf, (counts.astype(np.intc), displs.astype(np.intc)), MPI.BYTE],
                 [bufs["mpi"], (counts.astype(np.intc), displs.astype(np.intc)), MPI.BYTE])
    compute = Compute(args.matrix, np.random.default_rng(1000 + comm.rank))

    starts = {w: (lambda w=w: hcs[w].Ialltoallv(*specs[w], algorithm=args.algorithm)) for w in PROGRESS_MODES}
    starts["mpi"] = lambda: comm.Ialltoallv(*mpi_specs)
    blocking = lambda: hc.Alltoallv(*specs["blocking"], algorithm=args.algorithm)  # noqa: E731

    def overlapped(start):
        def run():
            req = start()
            compute()
            req.Wait()
        return run

    def chunked(start):
        def run():
            req = start()
            for _ in range(compute.chunks):
                np.matmul(compute.a, compute.b, out=compute.out)
                req.Test()
            req.Wait()
        return run
    modes = {"blocking": blocking, "compute": compute, "in_turn": lambda: (compute(), blocking()),
             "mpi_in_turn": lambda: (compute(), comm.Alltoallv(*mpi_specs))}
    for w in WAYS:
        modes.update({f"{w}_immediate": (lambda w=w: starts[w]().Wait()), f"{w}_overlap": overlapped(starts[w]),
                      f"{w}_chunked": chunked(starts[w])})
    assert tuple(modes) == MODES

    comm.Alltoallv([sbuf, (counts, displs), MPI.BYTE], [ref, (counts, displs), MPI.BYTE])
    for run in modes.values():  # warm up: the plan cached, the progress thread started
        for _ in range(max(1, args.warmup)):
            run()
    progress = progress_clock()
    calibration = calibrate(comm, compute, blocking, args.iterations)
    per_round = {m: [] for m in MODES}
    cpu = {m: 0.0 for m in MODES}
    progress_cpu = {m: 0.0 for m in MODES}
    for _ in range(args.rounds):
        for mode, run in modes.items():
            c0, p0 = time.process_time(), time.clock_gettime(progress)
            per_round[mode].append(loop_s(comm, run, args.iterations))
            cpu[mode] += time.process_time() - c0
            progress_cpu[mode] += time.clock_gettime(progress) - p0
    if not all(comm.allgather(all(np.array_equal(b, ref) for b in bufs.values()))):
        raise SystemExit("bench_overlap.py: a received buffer differs from comm.Alltoallv's")
    calls = args.rounds * args.iterations
    # CPU per iteration, mean over ranks (one barrier and one allreduce per loop included)
    cpu_us = {m: comm.allreduce(cpu[m] / calls, op=MPI.SUM) / size * 1e6 for m in MODES}
    progress_us = {m: comm.allreduce(progress_cpu[m] / calls, op=MPI.SUM) / size * 1e6 for m in MODES}
    hc_stats = hc.last_stats
    for h in hcs.values():
        h.free()
    if comm.rank == 0:
        stats = {m: {"median": float(np.median(v)), "min": min(v), "max": max(v)} for m, v in per_round.items()}
        med = {m: s["median"] for m, s in stats.items()}
        ratios = {name: med[m] / med[base] for name, (m, base) in RATIOS.items()}
        cores = os.cpu_count()
        busy = {m: size * cpu_us[m] / (cores * med[m] * 1e6) for m in MODES}
        library = MPI.Get_library_version().splitlines()[0].strip()
        print(f"# {library}; {size} ranks on {cores} cores, {args.block} B blocks, algorithm "
              f"{hc_stats.get('algorithm')}, {compute.chunks} x {args.matrix}^2 matmul per compute; us per "
              f"iteration, median (min-max) of {args.rounds} rounds; CPU us per iteration and rank (process, "
              f"progress thread); cores busy")
        for m in MODES:
            s = stats[m]
            print(f"{m:17s} {s['median'] * 1e6:10.1f} ({s['min'] * 1e6:.1f}-{s['max'] * 1e6:.1f})"
                  f"  cpu {cpu_us[m]:9.1f}  progress {progress_us[m]:9.1f}  busy {busy[m]:5.0%}")
        print("# ratios: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"benchmark": "overlap",
                           "provenance": provenance(command_line("benchmarks/bench_overlap.py", size)),
                           "library": library, "world_size": size, "cores": cores,
                           "load_average": os.getloadavg(), "args": vars(args),
                           "algorithm": hc_stats.get("algorithm"), "compute_chunks": compute.chunks,
                           "calibration_s": calibration,
                           "seconds": stats, "cpu_us_per_iteration": cpu_us,
                           "progress_thread_cpu_us_per_iteration": progress_us, "cores_busy": busy,
                           "ratios": ratios}, f, indent=1)
    return 0


if __name__ == "__main__":
    from hxmpi.cli import run_main  # an uncaught error on one rank ends the job
    run_main(main, "bench_overlap.py")
