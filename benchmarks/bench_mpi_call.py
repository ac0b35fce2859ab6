"""What one MPI call costs from compiled code, by the way it reaches MPI (issue 26: "choose by
measurement"). Each variant runs ``--iterations`` Start + Wait pairs on the same persistent
request, in ``--rounds`` rounds interleaved across variants; per pair, us (the slowest rank's loop
time over the iterations), median (min-max) of the rounds:

  python          a Python loop: ``req.Start(); req.Wait()``
  cython_methods  a Cython loop calling mpi4py's ``Start``/``Wait`` methods (no MPI headers)
  cython_dlsym    a Cython loop, no GIL, through ``MPI_Start``/``MPI_Wait`` pointers resolved with
                  ``dlsym`` from the libmpi mpi4py loaded, the request by address (no MPI headers;
                  one build serves both MPI families)
  cython_libmpi   a Cython loop, no GIL, ``cimport mpi4py.libmpi`` (built with ``mpicc`` against the
                  MPI's ``mpi.h``); when it does not build or import, the JSON says why

Requests: a persistent ``Alltoallv_init`` of 8 B blocks (the flat plan's only call) and a persistent
``Allreduce_init`` of 16 uint64 (the agreement's record).

    python benchmarks/mpi_call/build.py       # needs Cython; the libmpi variant also mpicc
    mpirun -np 2 python benchmarks/bench_mpi_call.py --json mpi_call.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from hxmpi.cli import command_line

from hxmpi.provenance import provenance

HERE = Path(__file__).resolve().parent / "mpi_call"


def requests(comm) -> dict:
    """The two persistent requests the variants run, by name (their buffers kept alive with them)."""
    size = comm.size
    from mpi4py import MPI
    send, recv = np.zeros(size, np.uint64), np.zeros(size, np.uint64)
    counts, displs = np.full(size, 8, np.intc), np.arange(size, dtype=np.intc) * 8
    record, total = np.zeros(16, np.uint64), np.zeros(16, np.uint64)
    keep = (send, recv, counts, displs, record, total)
    return {"alltoallv_8B": (comm.Alltoallv_init([send.view(np.uint8), (counts, displs), MPI.BYTE],
                                                 [recv.view(np.uint8), (counts, displs), MPI.BYTE]), keep),
            "allreduce_16w": (comm.Allreduce_init(record, total, op=MPI.SUM), keep)}


def variants(MPI) -> tuple[dict, dict]:
    """(name -> loop(request, n), name -> why it is missing)."""
    sys.path.insert(0, str(HERE))
    try:
        import calls
    except ImportError as e:
        raise SystemExit(f"bench_mpi_call.py: {e}; build first: python benchmarks/mpi_call/build.py")
    libmpi = [line.split()[-1] for line in open("/proc/self/maps") if "/libmpi.so" in line]
    if not libmpi:
        raise SystemExit("bench_mpi_call.py: no libmpi.so is mapped in this process")
    calls.resolve(libmpi[0].encode())
    ignore = 1 if "MPICH" in MPI.Get_library_version() else 0  # the family's MPI_STATUS_IGNORE

    def python_loop(req, n):
        for _ in range(n):
            req.Start()
            req.Wait()

    found = {"python": python_loop, "cython_methods": calls.loop_methods,
             "cython_dlsym": lambda req, n: calls.loop_dlsym(MPI._addressof(req), n, ignore)}
    missing = {}
    try:
        import calls_libmpi
        found["cython_libmpi"] = calls_libmpi.loop_libmpi
    except (ImportError, ValueError) as e:  # ValueError: mpi4py's object sizes differ from mpi.h's
        missing["cython_libmpi"] = f"{type(e).__name__}: {e}"
    return found, missing


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iterations", type=int, default=20000, help="Start + Wait pairs per round and variant")
    p.add_argument("--rounds", type=int, default=5, help="rounds (variants interleaved in each)")
    p.add_argument("--json", help="write the results here (rank 0)")
    args = p.parse_args(argv)
    if args.iterations < 1 or args.rounds < 1:
        p.error("--iterations and --rounds must be >= 1")
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    loops, missing = variants(MPI)
    times: dict = {}
    for name, (req, _keep) in requests(comm).items():
        for loop in loops.values():
            loop(req, min(args.iterations, 2000))  # warm up
        for _ in range(args.rounds):
            for v, loop in loops.items():
                comm.Barrier()
                t = time.perf_counter()
                loop(req, args.iterations)
                seconds = comm.allreduce(time.perf_counter() - t, op=MPI.MAX)
                times.setdefault(name, {}).setdefault(v, []).append(seconds / args.iterations * 1e6)
        req.Free()
    if comm.rank == 0:
        library = MPI.Get_library_version().splitlines()[0].strip()
        print(f"# {library}, {comm.size} ranks, {args.iterations} pairs x {args.rounds} rounds: us per Start + Wait")
        for name, per in times.items():
            for v, xs in per.items():
                print(f"{name:14s} {v:15s} {np.median(xs):7.3f} ({min(xs):.3f}-{max(xs):.3f})")
        for v, why in missing.items():
            print(f"# {v}: not measured: {why}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"benchmark": "mpi_call", "provenance": provenance(command_line("benchmarks/bench_mpi_call.py", comm.size)),
                           "library": library, "world_size": comm.size, "args": vars(args),
                           "us_per_start_wait": times, "not_measured": missing}, f, indent=1)
    return 0


if __name__ == "__main__":
    from hxmpi.cli import run_main  # an uncaught error on one rank ends the job
    run_main(main, "bench_mpi_call.py")
