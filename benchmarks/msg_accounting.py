"""Messages and bytes crossing node boundaries, flat vs hier: last_stats against the wire.

    python -m hxmpi.sim.cluster run -n 4 -- python benchmarks/msg_accounting.py --block 65536 --json acc.json

Per rank, ``HierComm.last_stats`` says how many messages and payload bytes of one call leave the
node. On the emulated cluster, local rank 0 of every host also reads its host's link counters
(``/sys/class/net/<if>/statistics/tx_bytes``, inside the host's namespace) around ``--calls``
calls, so the payload can be checked against what really left the host (TCP/IP headers and the
small agreement collectives add a few percent). On one host there is no link to read.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from mpi4py import MPI

import hxmpi  # before mpi4py: it keeps Open MPI's UCX one-sided component out (docs/staging.md)
from hxmpi.cli import command_line
from hxmpi.provenance import provenance


def tx_bytes(interface: str) -> int:
    """Bytes sent on ``interface`` so far, or -1 if it does not exist here."""
    path = Path(f"/sys/class/net/{interface}/statistics/tx_bytes")
    return int(path.read_text()) if path.exists() else -1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--block", type=int, default=65536, help="bytes per destination rank")
    p.add_argument("--calls", type=int, default=50, help="calls per algorithm for the link counters")
    p.add_argument("--interface", default="eth0", help="host link to read (the cluster's is eth0)")
    p.add_argument("--ranks-per-node", type=int, default=None, help="virtual nodes (default: real nodes)")
    p.add_argument("--json", default=None, help="write results here (rank 0)")
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    hc = hxmpi.HierComm(comm, ranks_per_node=args.ranks_per_node)
    t = hc.topology
    sbuf = np.ones(args.block * comm.size, np.uint8)
    rbuf = np.empty_like(sbuf)
    results = {}
    for algo in ("flat", "hier"):
        hc.Alltoall(sbuf, rbuf, algorithm=algo)
        comm.Barrier()
        before = tx_bytes(args.interface) if t.local_rank == 0 else -1
        comm.Barrier()
        for _ in range(args.calls):
            hc.Alltoall(sbuf, rbuf, algorithm=algo, validate=False)
        comm.Barrier()
        after = tx_bytes(args.interface) if t.local_rank == 0 else -1
        stats = hc.last_stats
        per_rank = comm.allgather(stats["inter_node"])
        node_payload = t.intra.allreduce(stats["inter_node"]["bytes"]) * args.calls
        wire = after - before if before >= 0 else None
        per_node = comm.allgather((t.node, node_payload, wire) if t.local_rank == 0 else None)
        results[algo] = {
            "per_rank_messages": [r["messages"] for r in per_rank],
            "per_rank_bytes": [r["bytes"] for r in per_rank],
            "per_node": [{"node": n, "payload_bytes": pl, "wire_tx_bytes": w} for x in per_node if x
                         for n, pl, w in [x]],
        }
    if comm.rank == 0:
        print(f"# inter-node traffic per call, {comm.size} ranks, nodes {list(t.node_sizes)}, "
              f"{args.block} B blocks; wire = host link tx over {args.calls} calls")
        print(f"{'# algo':<8}{'msgs/rank':>10}{'bytes/rank':>12}{'node payload':>14}{'node wire':>14}{'wire/payload':>14}")
        for algo, r in results.items():
            for node in r["per_node"]:
                wire = node["wire_tx_bytes"]
                ratio = f"{wire / node['payload_bytes']:14.3f}" if wire and node["payload_bytes"] else f"{'n/a':>14}"
                print(f"{algo:<8}{max(r['per_rank_messages']):>10}{max(r['per_rank_bytes']):>12}"
                      f"{node['payload_bytes']:>14}{wire if wire is not None else 'n/a':>14}{ratio}")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"benchmark": "msg_accounting", "provenance": provenance(command_line("benchmarks/msg_accounting.py", comm.size)),
                           "world_size": comm.size, "block": args.block,
                           "node_sizes": list(t.node_sizes), "calls": args.calls, "results": results}, fh, indent=1)
    return 0


if __name__ == "__main__":
    from hxmpi.cli import run_main  # an uncaught error on one rank ends the job
    run_main(main, 'msg_accounting.py')
