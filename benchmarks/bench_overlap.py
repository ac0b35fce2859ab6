"""Overlap of a nonblocking all-to-all with the caller's work: ``HierComm.Ialltoallv`` in flight
while the caller computes (or waits idle, as for an accelerator), against the two in turn.

    mpirun -np 4 python benchmarks/bench_overlap.py --block 65536 --json overlap_np4.json

Every rank sends ``--block`` bytes to every rank. Two kinds of work, each calibrated first to last
as long as the exchange alone (the same on every rank):

  compute   a loop of ``--matrix``-square float64 matrix products (BLAS held to one thread; each
            product releases the GIL): work that needs the caller's core
  idle      ``time.sleep``: a caller whose core is free meanwhile (one waiting for a GPU kernel)

Modes, interleaved in each of ``--rounds`` rounds; a mode runs ``--iterations`` iterations back to
back after a barrier, as a pipelined code calls them:

  exchange          ``hc.Ialltoallv(...).Wait()``: the exchange alone, on the progress thread
  blocking          ``hc.Alltoallv(...)``: the same exchange on the caller's thread
  compute, idle     the work alone
  in_turn           compute, then ``hc.Alltoallv(...)``
  overlap           ``req = hc.Ialltoallv(...)``, compute, ``req.Wait()``
  overlap_idle      ``req = hc.Ialltoallv(...)``, idle, ``req.Wait()``
  mpi_exchange      ``comm.Ialltoallv(...).Wait()``: MPI's own nonblocking collective
  mpi_overlap       ``req = comm.Ialltoallv(...)``, compute, ``req.Wait()`` (MPI progresses it only
                    when the caller enters MPI)
  mpi_overlap_idle  ``req = comm.Ialltoallv(...)``, idle, ``req.Wait()``

A mode's time per iteration in a round is the slowest rank's loop time over the iterations; the
tables show median (min-max) over rounds. An overlap ratio is the overlapped time over the longer
of its two parts alone (1.0: the shorter is hidden entirely; 2.0 for equal parts: no overlap).
CPU seconds per iteration (the process's, and the progress thread's) are recorded per mode, and
the cores' utilisation (ranks x CPU / (cores x wall)): work and exchange that each keep a core
busy cannot overlap on a host whose cores the ranks already fill.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import threading
import time

import numpy as np
from mpi4py import MPI
from threadpoolctl import threadpool_limits

import hxmpi  # before mpi4py's first call: it keeps Open MPI's UCX one-sided component out (docs/staging.md)
from hxmpi.cli import command_line
from hxmpi.provenance import provenance

MODES = ("exchange", "blocking", "compute", "idle", "in_turn", "overlap", "overlap_idle", "mpi_exchange",
         "mpi_overlap", "mpi_overlap_idle")
PR_SET_TIMERSLACK = 29  # prctl option (linux/prctl.h)
#: ratio name -> (overlapped mode, the two modes it overlaps)
RATIOS = {"overlap": ("overlap", "exchange", "compute"), "overlap_idle": ("overlap_idle", "exchange", "idle"),
          "in_turn": ("in_turn", "blocking", "compute"), "mpi_overlap": ("mpi_overlap", "mpi_exchange", "compute"),
          "mpi_overlap_idle": ("mpi_overlap_idle", "mpi_exchange", "idle")}


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


class Idle:
    """A sleep of ``request`` seconds (the work's length less the overshoot measured at calibration)."""

    def __init__(self):
        self.request = 0.0
        # Linux wakes a sleeper up to its timer slack (50 us by default) late, as long as a
        # 64 KiB exchange: 1 ns lets the sleep last what it is asked to (this thread only).
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)

    def __call__(self) -> None:
        time.sleep(self.request)


def loop_s(comm, fn, iterations: int) -> float:
    """Seconds per call of ``fn`` in a loop of ``iterations`` after a barrier: the slowest rank's."""
    comm.Barrier()
    t = time.perf_counter()
    for _ in range(iterations):
        fn()
    return comm.allreduce(time.perf_counter() - t, op=MPI.MAX) / iterations


def calibrate(comm, compute: Compute, idle: Idle, exchange, iterations: int) -> dict:
    """Size the work to the exchange alone (medians of 3 loops; agreed: rank 0's): the products
    per compute, and the sleep request whose measured sleep lasts as long. Returns the seconds
    measured (exchange, one product, the sleep's overshoot)."""
    def median_s(fn):
        return float(np.median([loop_s(comm, fn, iterations) for _ in range(3)]))
    compute.chunks = 1
    measured = {"exchange": median_s(exchange), "one_product": median_s(compute)}
    compute.chunks = comm.bcast(max(1, round(measured["exchange"] / measured["one_product"])))
    idle.request = measured["exchange"]
    measured["sleep_overshoot"] = median_s(idle) - idle.request
    idle.request = comm.bcast(max(0.0, measured["exchange"] - measured["sleep_overshoot"]))
    return measured


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--block", type=int, default=65536, help="bytes each rank sends to each rank (default 65536)")
    p.add_argument("--iterations", type=int, default=100, help="timed iterations per mode and round (default 100)")
    p.add_argument("--rounds", type=int, default=5, help="rounds, the modes interleaved in each (default 5)")
    p.add_argument("--warmup", type=int, default=50, help="untimed iterations of each mode first (default 50)")
    p.add_argument("--matrix", type=int, default=64, help="side of the compute's square matrices (default 64)")
    p.add_argument("--algorithm", default=None, help="HierComm algorithm (default: HierComm's default)")
    p.add_argument("--ranks-per-node", type=int, default=None, help="virtual nodes (default: real nodes)")
    p.add_argument("--json", default=None, help="write the results here (rank 0)")
    args = p.parse_args(argv)
    if min(args.block, args.iterations, args.rounds, args.matrix) < 1 or args.warmup < 0:
        p.error("--block, --iterations, --rounds and --matrix must be >= 1, --warmup >= 0")
    threadpool_limits(1)  # one BLAS thread: the compute is one core's, as the caller's thread is one
    comm = MPI.COMM_WORLD
    size = comm.size
    hc = hxmpi.HierComm(comm, ranks_per_node=args.ranks_per_node)
    counts = np.full(size, args.block, dtype=np.int64)
    displs = np.arange(size, dtype=np.int64) * args.block
    sbuf = np.random.default_rng(comm.rank).integers(0, 256, size * args.block, dtype=np.uint8)
    rbuf, mbuf, ref = (np.empty_like(sbuf) for _ in range(3))
    send, recv = [sbuf, (counts, displs), MPI.BYTE], [rbuf, (counts, displs), MPI.BYTE]
    mpi_specs = ([sbuf, (counts.astype(np.intc), displs.astype(np.intc)), MPI.BYTE],
                 [mbuf, (counts.astype(np.intc), displs.astype(np.intc)), MPI.BYTE])
    compute = Compute(args.matrix, np.random.default_rng(1000 + comm.rank))

    idle = Idle()
    hx = lambda: hc.Ialltoallv(send, recv, algorithm=args.algorithm)  # noqa: E731
    blocking = lambda: hc.Alltoallv(send, recv, algorithm=args.algorithm)  # noqa: E731
    mpi = lambda: comm.Ialltoallv(*mpi_specs)  # noqa: E731

    def overlapped(start, work):
        def run():
            req = start()
            work()
            req.Wait()
        return run
    modes = {"exchange": lambda: hx().Wait(), "blocking": blocking, "compute": compute, "idle": idle,
             "in_turn": lambda: (compute(), blocking()), "overlap": overlapped(hx, compute),
             "overlap_idle": overlapped(hx, idle), "mpi_exchange": lambda: mpi().Wait(),
             "mpi_overlap": overlapped(mpi, compute), "mpi_overlap_idle": overlapped(mpi, idle)}
    assert tuple(modes) == MODES

    comm.Alltoallv([sbuf, (counts, displs), MPI.BYTE], [ref, (counts, displs), MPI.BYTE])
    for run in modes.values():  # warm up: the plan cached, the progress thread started
        for _ in range(max(1, args.warmup)):
            run()
    progress = progress_clock()
    calibration = calibrate(comm, compute, idle, modes["exchange"], args.iterations)
    per_round = {m: [] for m in MODES}
    cpu = {m: 0.0 for m in MODES}
    progress_cpu = {m: 0.0 for m in MODES}
    for _ in range(args.rounds):
        for mode, run in modes.items():
            c0, p0 = time.process_time(), time.clock_gettime(progress)
            per_round[mode].append(loop_s(comm, run, args.iterations))
            cpu[mode] += time.process_time() - c0
            progress_cpu[mode] += time.clock_gettime(progress) - p0
    checks = [np.array_equal(rbuf, ref), np.array_equal(mbuf, ref)]
    if not all(comm.allgather(all(checks))):
        raise SystemExit("bench_overlap.py: a received buffer differs from comm.Alltoallv's")
    calls = args.rounds * args.iterations
    # CPU per iteration, mean over ranks (one barrier and one allreduce per loop included)
    cpu_us = {m: comm.allreduce(cpu[m] / calls, op=MPI.SUM) / size * 1e6 for m in MODES}
    progress_us = {m: comm.allreduce(progress_cpu[m] / calls, op=MPI.SUM) / size * 1e6 for m in MODES}
    hc_stats = hc.last_stats
    hc.free()
    if comm.rank == 0:
        stats = {m: {"median": float(np.median(v)), "min": min(v), "max": max(v)} for m, v in per_round.items()}
        med = {m: s["median"] for m, s in stats.items()}
        ratios = {name: med[o] / max(med[x], med[w]) for name, (o, x, w) in RATIOS.items()}
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
                           "calibration_s": calibration, "sleep_request_s": idle.request,
                           "seconds": stats, "cpu_us_per_iteration": cpu_us,
                           "progress_thread_cpu_us_per_iteration": progress_us, "cores_busy": busy,
                           "ratios": ratios}, f, indent=1)
    return 0


if __name__ == "__main__":
    from hxmpi.cli import run_main  # an uncaught error on one rank ends the job
    run_main(main, "bench_overlap.py")
