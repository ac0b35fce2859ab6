"""``python -m hxmpi`` (or the ``hxmpi`` command): print every rank's topology, BLAS threads, the
MPI library and the hxmpi version; ``--version`` prints the version alone, without starting MPI."""
from __future__ import annotations

import argparse
import json
from typing import NoReturn

from . import __version__

__all__ = ["main", "console"]


def main(argv=None) -> int:
    """Entry point; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m hxmpi", description=__doc__)
    parser.add_argument("--version", action="version", version=f"hxmpi {__version__}")
    parser.add_argument("--ranks-per-node", type=int, default=None,
                        help="virtual nodes of this many consecutive ranks (default: real nodes, "
                             "or env HXMPI_RANKS_PER_NODE)")
    parser.add_argument("--json", action="store_true", help="one JSON object per rank instead of text")
    args = parser.parse_args(argv)
    # Imported only now: importing mpi4py.MPI starts MPI, which --help and --version do not need.
    from mpi4py import MPI

    from .comm.topology import Topology
    from .train.threads import default_threads, thread_pools
    topo = Topology(MPI.COMM_WORLD, ranks_per_node=args.ranks_per_node)
    # The threads the trainer would use by default, next to what the BLAS pools use now.
    threads = {"threads": default_threads(topo.comm), "thread_pools": thread_pools()}
    rows = topo.comm.gather({**topo.describe(), **threads}, root=0)
    if topo.rank == 0:
        if not args.json:
            print(f"hxmpi {__version__}, mpi4py on {MPI.Get_library_version().splitlines()[0].strip()}")
            print(f"MPI standard {'.'.join(map(str, MPI.Get_version()))}; {topo.size} ranks on "
                  f"{topo.num_nodes} nodes, node sizes {list(topo.node_sizes)}")
        for row in rows:
            pools = ", ".join(f"{p['library']} {p['threads']}" for p in row["thread_pools"])
            if args.json:
                print(json.dumps(row))
            else:
                print(f"rank {row['rank']:>4} host {row['host']:<16} node {row['node']:>3} "
                      f"local {row['local_rank']:>2} lane {row['lane']:>2} serves lanes {row['served_lanes']} "
                      f"threads {row['threads']} (BLAS now: {pools or 'none'})")
    topo.free()
    return 0


def console(prog: str = "hxmpi") -> NoReturn:
    """The ``hxmpi`` console command: ``main`` under ``run_main``, so an uncaught error on one
    rank ends the job."""
    from .cli import run_main
    run_main(main, prog)


if __name__ == "__main__":
    console("python -m hxmpi")
