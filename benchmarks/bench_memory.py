"""Node memory of memory-mode staging: one shared copy per node, not one per rank.

    python -m hxmpi.data make --out /tmp/big --samples 1500000 --features 64 --shard-mb 32
    mpirun -np 4 python benchmarks/bench_memory.py /tmp/big --json memory.json

Every rank reads its proportional set size (``Pss`` in /proc/self/smaps_rollup: shared pages are
split among the processes that map them, so the ranks' sum is the node's real use) before and after
``stage()``; rank 0 prints the growth against the dataset's bytes. One node: run it without
``--ranks-per-node``, on one host.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path


def pss_bytes() -> int:
    """This process's proportional set size, in bytes."""
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no Pss in /proc/self/smaps_rollup")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("store", help="store directory or URL")
    p.add_argument("--json", default=None, help="write results here (rank 0)")
    args = p.parse_args(argv)

    from mpi4py import MPI

    from hxmpi.cli import command_line
    from hxmpi.comm.topology import Topology
    from hxmpi.data.staging import StagingConfig, stage
    from hxmpi.provenance import provenance
    comm = MPI.COMM_WORLD
    topo = Topology(comm)
    cache = comm.bcast(tempfile.mkdtemp(prefix="hxmpi-bench-cache-") if comm.rank == 0 else None)
    comm.Barrier()
    before = comm.allreduce(pss_bytes())
    data, info = stage(args.store, comm, topo.intra, topo.node, topo.num_nodes,
                       StagingConfig(staging="memory", cache_dir=cache))
    touched = float(data.X_train[::1024].sum())  # every rank reads the data
    comm.Barrier()
    after = comm.allreduce(pss_bytes())
    dataset = sum(a.nbytes for a in (data.X_train, data.y_train, data.X_test, data.y_test))
    data.close()
    if comm.rank == 0:
        import shutil
        shutil.rmtree(cache, ignore_errors=True)
        growth = after - before
        result = {"benchmark": "memory", "provenance": provenance(command_line("benchmarks/bench_memory.py", comm.size)),
                  "world_size": comm.size, "num_nodes": topo.num_nodes,
                  "dataset_bytes": dataset, "pss_before": before, "pss_after": after, "growth_bytes": growth,
                  "growth_per_dataset": growth / dataset, "checksum": touched}
        print(f"# memory-mode staging, {comm.size} ranks on {topo.num_nodes} node(s)")
        print(f"{'# dataset MiB':<16}{'node PSS growth MiB':>21}{'growth / dataset':>18}")
        print(f"{dataset / 2**20:<16.1f}{growth / 2**20:>21.1f}{growth / dataset:>18.2f}")
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    from hxmpi.cli import run_main  # an uncaught error on one rank ends the job
    run_main(main, 'bench_memory.py')
