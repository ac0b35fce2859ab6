"""Multi-leader all-to-all in the simulator only: does aggregating a node's traffic on fewer
leader ranks pay once the NIC's message rate is modelled?

The family (``leader_trace``): nodes of G ranks, k leaders per node (k divides G). Every rank
packs its blocks into the node's shared window, ordered by destination node and leader group (so
a leader's message to a node is contiguous: no extra copy); a node barrier; leader j exchanges
with leader j of every other node one message carrying its group's blocks (local ranks
j, j + k, ...: G/k ranks) for all G ranks there, G/k * G blocks, posted at once, window to
window; a node barrier; every rank copies its blocks out of the window. k = G is hxmpi's lane
scheme (every rank a leader of its lane, N - 1 messages of G blocks, the design of MPICH's
multi-leader); k < G sends k (N - 1) larger messages per node instead of G (N - 1).

``predict_leaders`` prices the family with the platform's terms and the NIC (``Nic``): a leader's
CPU per message plus the node's NIC time (its message rate and bandwidth, each way), plus
latency, copies and barriers. ``python -m hxmpi.sim.mleader`` sweeps it (32 nodes,
8 to 128 ranks per node, 1 B to 4 KiB) and replays the points given by ``--replay``; every record
has the model and, where replayed, the replay, and the best k against k = G.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from typing import Optional

from ..comm.costmodel import CostModel, CpuTimes
from ..comm.plan import Layout
from ..provenance import provenance
from .actions import Nic, barrier_actions, wait_lines
from .args import command_line
from .calls import node_of_sizes
from .errors import SimulateError
from .platform import Network
from .presets import PRESET_NICS, calibrated_preset
from .replay import replay_traces, simgrid

__all__ = ["LEADER_TAG", "WIN_THRESHOLD", "leader_counts", "leader_trace", "predict_leaders", "sweep", "main"]

LEADER_TAG = 400000
#: Fewer leaders "win" where they are at least this much faster than the lane scheme (fraction).
WIN_THRESHOLD = 0.10


def leader_counts(per_node: int) -> list[int]:
    """The k tried on nodes of ``per_node`` ranks: every power of two below it that divides it, and
    ``per_node`` itself (the lane scheme)."""
    ks = [1 << i for i in range(per_node.bit_length()) if (1 << i) < per_node and per_node % (1 << i) == 0]
    return ks + [per_node]


def _check(per_node: int, leaders: int) -> None:
    if leaders < 1 or per_node % leaders:
        raise SimulateError(f"{leaders} leaders do not divide nodes of {per_node} ranks")


def leader_trace(layout: Layout, block: int, rank: int, leaders: int, model: CostModel, cpu_s: float = 0.0) -> list[str]:
    """Time-independent trace of ``rank`` in one call of the family with ``leaders`` leaders per
    node and ``block``-byte blocks; ``cpu_s``: the call's fixed CPU seconds (hxmpi's per path)."""
    n, g, p = layout.num_nodes, layout.max_node_size, layout.size
    _check(g, leaders)
    node, local = int(layout.node_of[rank]), int(layout.local_of[rank])
    copy = p * block * model.beta_copy
    lines = [f"{rank} init"] + ([f"{rank} sleep {cpu_s:.12g}"] if cpu_s > 0 else [])
    lines += [f"{rank} sleep {copy:.12g}"] + barrier_actions(rank, layout)
    if local < leaders and n > 1:
        nbytes = (g // leaders) * g * block
        peers = [int(layout.members[m][local]) for m in range(n) if m != node]
        posted = [f"{rank} irecv {q} {LEADER_TAG} {nbytes}" for q in peers] + \
                 [f"{rank} isend {q} {LEADER_TAG} {nbytes}" for q in peers]
        lines += posted + wait_lines(posted)
    lines += barrier_actions(rank, layout) + [f"{rank} sleep {copy:.12g}", f"{rank} finalize"]
    return lines


def predict_leaders(nodes: int, per_node: int, block: float, leaders: int, model: CostModel, nic: Optional[Nic],
                    cpu_s: float = 0.0) -> float:
    """Predicted seconds of one call of the family: fixed CPU, two copies of P blocks, two node
    barriers (ceil(log2 G) rounds of an intra-node message each), and the leaders' exchange: the
    inter-node latency, a leader's CPU for its 2 (N - 1) messages and the node's NIC time each way
    (k (N - 1) messages at its rate, G (P - G) blocks at its bandwidth)."""
    _check(per_node, leaders)
    n, g = nodes, per_node
    p = n * g
    o_send, o_recv = (nic or Nic(1.0, 1.0)).overheads(model.msg_overhead)
    rounds = math.ceil(math.log2(g)) if g > 1 else 0
    barrier = rounds * (model.alpha_intra + o_send + o_recv + model.beta_intra)
    t = cpu_s + 2 * p * block * model.beta_copy + 2 * barrier
    if n == 1:
        return t
    msgs = n - 1
    nbytes = (g // leaders) * g * block
    leader_cpu = msgs * (o_send + o_recv)
    bw = nic.bandwidth if nic else 1 / model.beta_inter
    wire = leaders * msgs * (nbytes + (nic.surcharge if nic else 0)) / bw
    # They add: the replay queues a node's messages at its NIC behind the leaders' posting.
    return t + model.alpha_inter + leader_cpu + wire + nbytes / bw


def sweep(nodes: int, per_node_list, blocks, model: CostModel, nic: Optional[Nic], cpu_s: float) -> list[dict]:
    """One record per (ranks per node, block): the model's seconds for every k, the best k, and
    the lane scheme's (k = G) seconds."""
    out = []
    for g in per_node_list:
        for b in blocks:
            ks = leader_counts(g)
            model_s = {k: predict_leaders(nodes, g, b, k, model, nic, cpu_s) for k in ks}
            best = min(ks, key=lambda k: model_s[k])
            out.append({"nodes": nodes, "ranks_per_node": g, "block_bytes": b,
                        "model_s": {str(k): v for k, v in model_s.items()}, "model_best_k": best,
                        "model_lane_over_best": model_s[g] / model_s[best]})
    return out


def _replay(nodes: int, per_node: int, block: int, leaders: int, model: CostModel, nic: Optional[Nic], cpu_s: float,
            timeout: float, sg) -> tuple[float, float]:
    layout = Layout(node_of_sizes([per_node] * nodes))
    traces = (leader_trace(layout, block, r, leaders, model, cpu_s) for r in range(layout.size))
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hxmpi-mleader-") as tmp:
        sim = replay_traces(layout, traces, model, Network(), tmp, timeout, sg, f"{leaders} leaders", nic)
    return sim, time.perf_counter() - t0


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def main(argv=None) -> int:
    """``python -m hxmpi.sim.mleader``: the sweep; returns the exit code."""
    ap = argparse.ArgumentParser(prog="python -m hxmpi.sim.mleader", description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=32, help="nodes (default 32)")
    ap.add_argument("--ranks-per-node", default="8,16,32,64,128", help="comma-separated (default 8,16,32,64,128)")
    ap.add_argument("--blocks", default="1,8,64,512,4096", help="block bytes, comma-separated (default 1,8,64,512,4096)")
    ap.add_argument("--nic-rate", type=float, help="the NIC's messages/s per node (default: the slingshot preset's)")
    ap.add_argument("--no-nic", action="store_true", help="no NIC: message costs per rank only")
    ap.add_argument("--replay", action="append", default=[], metavar="GxB",
                    help="also replay every k at G ranks per node and B-byte blocks, e.g. 32x8 (repeatable)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per replay (default 1800)")
    ap.add_argument("--smpirun", help="the SimGrid smpirun to replay with (as python -m hxmpi.sim)")
    ap.add_argument("--json", help="write the records here")
    args = ap.parse_args(argv)
    model, _ = calibrated_preset()
    nic = None if args.no_nic else PRESET_NICS["slingshot"]
    if nic is not None and args.nic_rate:
        nic = Nic(args.nic_rate, nic.bandwidth, nic.send_share)
    cpu_s = CpuTimes.load(None)("hier_plan")
    prov = provenance(command_line(argv, "hxmpi.sim.mleader"), "none")
    records = sweep(args.nodes, _ints(args.ranks_per_node), _ints(args.blocks), model, nic, cpu_s)
    sg = simgrid(args.smpirun) if args.replay else None
    if sg:
        prov["mpi"] = sg.label
    for spec in args.replay:
        g, _, b = spec.lower().partition("x")
        rec = next((r for r in records if r["ranks_per_node"] == int(g) and r["block_bytes"] == int(b)), None)
        if rec is None:
            print(f"error: --replay {spec}: not a point of the sweep", file=sys.stderr)
            return 2
        rec["replay_s"], rec["replay_wall_s"] = {}, {}
        for k in leader_counts(int(g)):
            sim, wall = _replay(args.nodes, int(g), int(b), k, model, nic, cpu_s, args.timeout, sg)
            rec["replay_s"][str(k)], rec["replay_wall_s"][str(k)] = sim, round(wall, 2)
            print(f"# replayed {args.nodes}x{g}, {b} B, k={k}: {sim * 1e6:.1f} us (wall {wall:.0f} s)", flush=True)
        best = min(rec["replay_s"], key=rec["replay_s"].get)
        rec["replay_best_k"], rec["replay_lane_over_best"] = int(best), rec["replay_s"][g] / rec["replay_s"][best]
    print(f"# {args.nodes} nodes, NIC {'off' if nic is None else f'{nic.msg_rate / 1e6:.4g} M msg/s'}: "
          "lane scheme (k = G) / best k, by the model (and the replay)")
    print(f"{'# G':<6}{'block':>7}{'best k':>8}{'lane/best':>11}{'replay k':>10}{'lane/best':>11}")
    for r in records:
        rep = (f"{r['replay_best_k']:>10}{r['replay_lane_over_best']:11.2f}" if "replay_s" in r else "")
        print(f"{r['ranks_per_node']:<6}{r['block_bytes']:>7}{r['model_best_k']:>8}{r['model_lane_over_best']:11.2f}{rep}")
    wins = [r for r in records if r["model_lane_over_best"] >= 1 + WIN_THRESHOLD]
    print(f"# fewer leaders win by {WIN_THRESHOLD:.0%} or more (model) at {len(wins)} of {len(records)} points")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"benchmark": "simulate-mleader", "provenance": prov, "nodes": args.nodes,
                       "nic": None if nic is None else nic.__dict__, "model": model.__dict__, "cpu_s": cpu_s,
                       "win_threshold": WIN_THRESHOLD, "records": records}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
