"""Fit the simulator's ``slingshot`` preset to Open MPI's published all-to-all timings.

    python benchmarks/fit_slingshot.py --replay --json benchmarks/results/fit_slingshot.json \
        --preset-out hxmpi/sim/slingshot.json

The published points (``PUBLISHED``): OSU's ``osu_alltoall`` on 4 nodes x 48 ranks, Slingshot-11
(libfabric 1.20.1, CXI provider) with XPMEM, from Open MPI pull request 12387 (coll/han's
alltoall), in two transports: ``mtl`` (mtl/ofi: every message, inside a node too, through the
NIC) and ``btl`` (btl/ofi between nodes, the sm BTL inside one), each with HAN's
``alltoall_using_smsc`` and without HAN. Without HAN, Open MPI's tuned component runs
``MPI_Alltoall`` of blocks under 1 KiB on 192 ranks as its modified Bruck (its fixed decision
rule), so that column is replayed as ``ompi_bruck``, and HAN's as ``han_alltoall``
(``hxmpi.sim.reference`` says what each does).

The model of each point is linear in the platform's parameters (``CostModel``: latencies,
seconds per byte, the CPU per message) and in two CPU costs of Open MPI's code paths
(``RefCpu``); the two transports share every parameter except that ``mtl`` sends a node's
messages through the NIC (intra-node latency and bandwidth are the inter-node ones). A weighted
non-negative least-squares fit (relative error) on the ``FIT_SIZES`` points of every column; the
other sizes check it. ``--replay`` replays every point in SimGrid on the fitted platform and
reports the replay's error too. ``--preset-out`` writes the preset file ``python -m hxmpi.sim
--preset slingshot`` reads.

The NIC (``--replay`` only): HPE's Slingshot benchmarking guide reports ``osu_mbw_mr`` with 1 B
messages at about 2.2 M messages/s per rank, growing linearly to 43.5 M/s per node at 20 ranks
per node (``PUBLISHED_NIC``). The per-rank rate fixes how a message's CPU splits between sender
and receiver (``Nic.send_share``: the sender's part that makes one pair's windows run at 2.2 M/s,
the table fixes only the sum); the curve, still linear at 20 ranks, bounds the node's message
rate from below: ``nic_msg_rate`` is the smallest of ``NIC_RATES`` whose replay of 20 pairs is
within ``NIC_TOLERANCE`` of 43.5 M/s (the slowest NIC the published curve allows).
``nic_bandwidth`` is the link's fitted bandwidth. Every point of the curve is replayed
(``reference.mbw_mr_trace``) and its error reported; 32 to 128 pairs show where the NIC caps it.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import fields, replace

import numpy as np

from hxmpi.cli import command_line
from hxmpi.comm.costmodel import CostModel
from hxmpi.comm.plan import Layout
from hxmpi.provenance import provenance
from hxmpi.sim.reference import (
    MBW_WINDOW,
    REF_FIELDS,
    RefCpu,
    mbw_mr_trace,
    predict_reference,
    reference_features,
    reference_trace,
)
from hxmpi.sim.actions import Nic
from hxmpi.sim.calls import node_of_sizes
from hxmpi.sim.platform import Network
from hxmpi.sim.replay import replay_traces, simgrid

SOURCE = "https://github.com/open-mpi/ompi/pull/12387"
PUBLISHED = {
    "source": SOURCE,
    "where": "comment by edgargabriel, 2024-06-12 (coll/han: Add alltoall algorithm)",
    "machine": "4 nodes x 48 processes (192), Slingshot-11, libfabric 1.20.1, XPMEM",
    "benchmark": "OSU MPI All-to-All Personalized Exchange Latency Test v7.2 (osu_alltoall), MPI_CHAR, avg latency",
    "columns": {
        "mtl/han": "mtl/ofi (cxi), HAN alltoall_using_smsc",
        "mtl/bare": "mtl/ofi (cxi), without HAN (tuned: modified Bruck at 192 ranks, blocks < 1 KiB)",
        "btl/han": "btl/ofi (cxi) + sm, HAN alltoall_using_smsc",
        "btl/bare": "btl/ofi (cxi) + sm, without HAN (tuned: modified Bruck)",
    },
    # block bytes: (mtl/han, mtl/bare, btl/han, btl/bare), microseconds; 128 B: the two mtl
    # columns only (the thread's table is cut there in the copy this fit was made from).
    "us": {1: (100.92, 271.86, 82.11, 263.98), 2: (98.27, 274.35, 82.50, 268.71),
           4: (98.58, 305.49, 90.40, 273.53), 8: (109.88, 299.68, 90.48, 275.52),
           16: (112.29, 299.36, 91.08, 277.94), 32: (113.56, 302.20, 92.22, 282.38),
           64: (114.49, 334.46, 94.11, 349.93), 128: (132.85, 417.54, None, None)},
}
#: Point-to-point measurements published elsewhere that pin what the all-to-all table cannot
#: separate (the link's bandwidth; a node's shared-memory latency): each with the model's
#: coefficients of the time it reports. Fitted with the table's points.
PUBLISHED_P2P = [
    {"name": "osu_bw, 2 MiB, Slingshot-11 (Open MPI mtl/ofi, libfabric 2.0)", "published_s": 2097152 / 22587.12e6,
     "source": "https://github.com/ofiwg/libfabric/issues/11392", "features": {"beta_inter": 2097152.0}},
    {"name": "osu_latency, 1 B, shared memory (libfabric shm), AMD EPYC node (hpc6a)", "published_s": 0.36e-6,
     "source": "https://github.com/ofiwg/libfabric/pull/8680",
     "features": {"alpha_intra": 1.0, "msg_overhead": 2.0, "beta_intra": 1.0}},
]
PUBLISHED_NIC = {
    "source": "HPE Slingshot performance benchmarking guide (osu_mbw_mr, 1 B messages, Slingshot-11)",
    "per_rank_msg_rate": 2.2e6, "per_node_msg_rate": 43.5e6, "ranks_per_node": 20,
    "also": "a ConnectX-6 adapter is rated at 215 M messages/s (NVIDIA's product brief)",
}
#: Ranks per node of the replayed osu_mbw_mr curve: the published range, then beyond it.
NIC_PAIRS = (1, 2, 4, 8, 16, 20, 32, 64, 128)
#: Node message rates tried, smallest first (messages/s): multiples of the published 43.5 M/s.
NIC_RATES = tuple(43.5e6 * f for f in (1.0, 1.1, 1.2, 1.35, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0))
#: How close the replay of 20 pairs must come to the published 43.5 M/s for a rate to fit it.
NIC_TOLERANCE = 0.05
#: Windows per osu_mbw_mr replay.
NIC_ITERATIONS = 20
COLUMNS = (("mtl", "han_alltoall"), ("mtl", "ompi_bruck"), ("btl", "han_alltoall"), ("btl", "ompi_bruck"))
NODES, PER_NODE = 4, 48
#: Block sizes whose points are fitted; every other published point checks the fit.
FIT_SIZES = (1, 8, 64)
#: Parameters left out of the fit: no published point depends on them (CostModel's per-call
#: fixed costs of hxmpi's own paths, and an oversubscribed backbone on 4 nodes). The model's
#: ``mpi_ddt_block`` is the reference's ``ddt_block``, fitted once as that and copied over.
PINNED = {"overhead_flat": 0.0, "overhead_hier": 0.0, "beta_backbone": 0.0, "mpi_ddt_block": 0.0}
NAMES = [f.name for f in fields(CostModel)] + list(REF_FIELDS)


def transport_model(model: CostModel, transport: str) -> CostModel:
    """The platform of one transport: ``mtl`` sends a node's own messages through the NIC."""
    return replace(model, alpha_intra=model.alpha_inter, beta_intra=model.beta_inter) if transport == "mtl" else model


def features(transport: str, algorithm: str, block: int) -> np.ndarray:
    """Coefficients of ``NAMES`` in the predicted seconds of one published point."""
    f = reference_features(algorithm, NODES, PER_NODE, block)
    if transport == "mtl":
        f["alpha_inter"] += f.pop("alpha_intra")
        f["beta_inter"] += f.pop("beta_intra")
        f["alpha_intra"] = f["beta_intra"] = 0.0
    return np.array([f[k] for k in NAMES])


def nnls(a: np.ndarray, y: np.ndarray, iters: int = 200) -> np.ndarray:
    """Lawson-Hanson non-negative least squares: argmin |a x - y| with x >= 0."""
    n = a.shape[1]
    x, passive = np.zeros(n), np.zeros(n, bool)
    for _ in range(iters):
        w = a.T @ (y - a @ x)
        if passive.all() or w[~passive].max(initial=0.0) <= 1e-12 * np.abs(a.T @ y).max():
            break
        passive[np.argmax(np.where(passive, -np.inf, w))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], y, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            step = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + step * (z - x)
            passive &= x > 1e-18
    return x


def points() -> list[dict]:
    """Every published point: transport, algorithm, block bytes, seconds, fitted or checking."""
    out = []
    for block, row in PUBLISHED["us"].items():
        for (transport, algo), us in zip(COLUMNS, row):
            if us is not None:
                out.append({"transport": transport, "algorithm": algo, "block_bytes": block,
                            "published_s": us * 1e-6, "fitted": block in FIT_SIZES})
    return out


def point_features(p: dict) -> np.ndarray:
    """Coefficients of ``NAMES`` for a table point or a point-to-point one."""
    if "features" in p:
        return np.array([p["features"].get(k, 0.0) for k in NAMES])
    return features(p["transport"], p["algorithm"], p["block_bytes"])


def fit(pts: list[dict]) -> tuple[CostModel, RefCpu]:
    """The weighted NNLS fit of every parameter not in ``PINNED`` to the fitted points and the
    point-to-point ones."""
    rows = [p for p in pts if p["fitted"]] + PUBLISHED_P2P
    a = np.array([point_features(p) for p in rows])
    y = np.array([p["published_s"] for p in rows])
    free = [i for i, k in enumerate(NAMES) if k not in PINNED]
    theta = np.zeros(len(NAMES))
    theta[free] = nnls(a[:, free] / y[:, None], np.ones(len(y)))
    values = dict(zip(NAMES, theta.tolist()))
    values.update(PINNED, mpi_ddt_block=values["ddt_block"])
    model = CostModel(**{k: values[k] for k in CostModel.__dataclass_fields__})
    return model, RefCpu(**{k: values[k] for k in REF_FIELDS})


def published_rate(pairs: int) -> float:
    """The published osu_mbw_mr rate of a node with ``pairs`` ranks sending (messages/s): linear
    from 2.2 M/s per rank to 43.5 M/s at 20 (None beyond 20: not published)."""
    if pairs > PUBLISHED_NIC["ranks_per_node"]:
        return None
    if pairs == PUBLISHED_NIC["ranks_per_node"]:
        return PUBLISHED_NIC["per_node_msg_rate"]
    return pairs * PUBLISHED_NIC["per_rank_msg_rate"]


def mbw_rate(pairs: int, model: CostModel, nic: Nic) -> float:
    """A node's replayed osu_mbw_mr rate with ``pairs`` ranks sending 1 B messages (messages/s)."""
    layout = Layout(node_of_sizes([pairs, pairs]))
    traces = (mbw_mr_trace(r, pairs, 1, NIC_ITERATIONS) for r in range(layout.size))
    with tempfile.TemporaryDirectory(prefix="hxmpi-fit-") as tmp:
        sim = replay_traces(layout, traces, model, Network(), tmp, what="osu_mbw_mr", nic=nic)
    return pairs * NIC_ITERATIONS * MBW_WINDOW / sim


def fit_nic(model: CostModel) -> tuple[Nic, list[dict]]:
    """The NIC (see the module's docstring) and the replayed curve, each point with its error."""
    one = 1 / PUBLISHED_NIC["per_rank_msg_rate"]  # seconds per message of one pair
    # Per message of a window: the sender's CPU, and the acknowledgement's two latencies.
    share = min(1.0, max(0.5, (one - 2 * model.alpha_inter / MBW_WINDOW) / (2 * model.msg_overhead)))
    top, nic = PUBLISHED_NIC["ranks_per_node"], None
    for rate in NIC_RATES:
        nic = Nic(rate, 1 / model.beta_inter, share)
        if mbw_rate(top, model, nic) >= (1 - NIC_TOLERANCE) * PUBLISHED_NIC["per_node_msg_rate"]:
            break
    curve = []
    for pairs in NIC_PAIRS:
        sim, pub = mbw_rate(pairs, model, nic), published_rate(pairs)
        curve.append({"ranks_per_node": pairs, "replay_msg_rate": sim, "replay_per_rank": sim / pairs,
                      "published_msg_rate": pub, "error": None if pub is None else (sim - pub) / pub})
    return nic, curve


def replay_point(p: dict, model: CostModel, cpu: RefCpu, nic: Nic = None) -> tuple[float, float]:
    """(simulated seconds, wall seconds) of one published point replayed in SimGrid."""
    layout = Layout(node_of_sizes([PER_NODE] * NODES))
    platform = transport_model(model, p["transport"])
    traces = (reference_trace(p["algorithm"], layout, p["block_bytes"], r, platform, cpu) for r in range(layout.size))
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hxmpi-fit-") as tmp:
        sim = replay_traces(layout, traces, platform, Network(), tmp, what=p["algorithm"], nic=nic)
    return sim, time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replay", action="store_true", help="replay every published point in SimGrid as well")
    ap.add_argument("--json", help="write the fit, its sources and every point's errors here")
    ap.add_argument("--preset-out", help="write the preset file (model and Open MPI CPU costs) here")
    args = ap.parse_args(argv)
    pts = points()
    model, cpu = fit(pts)
    for p in pts:
        p["model_s"] = predict_reference(p["algorithm"], NODES, PER_NODE, p["block_bytes"],
                                         transport_model(model, p["transport"]), cpu)
        p["model_error"] = (p["model_s"] - p["published_s"]) / p["published_s"]
        # The part of the model that is Open MPI's own CPU per block (datatypes, HAN's copies), not the network.
        f = dict(zip(NAMES, features(p["transport"], p["algorithm"], p["block_bytes"])))
        p["reference_cpu_s"] = float(sum(f[k] * getattr(cpu, k) for k in REF_FIELDS))
    sg = simgrid() if args.replay else None
    nic, curve = None, []
    if args.replay:
        nic, curve = fit_nic(model)
        for p in pts:
            # mtl sends a node's own messages through the NIC too; the NIC's message rate applies
            # between nodes only in either transport (the replay's surcharge is inter-node).
            p["replay_s"], p["replay_wall_s"] = replay_point(p, model, cpu, nic)
            p["replay_error"] = (p["replay_s"] - p["published_s"]) / p["published_s"]
    print(f"# fitted on blocks {', '.join(map(str, FIT_SIZES))} B of every column; the rest check it")
    for k in NAMES:
        v = {**model.__dict__, **cpu.__dict__}[k]
        unit = "GB/s" if k.startswith("beta") else "us"
        shown = (1e-9 / v if v else float("inf")) if k.startswith("beta") else v * 1e6
        print(f"#   {k:<14} {shown:10.4g} {unit}" + ("  (pinned)" if k in PINNED else ""))
    print(f"{'# Block [B]':<12}{'transport':>10}{'algorithm':>14}{'published':>11}{'model':>9}{'error':>8}"
          + (f"{'replay':>9}{'error':>8}" if args.replay else "") + "  fit?  [us]")
    for p in pts:
        line = (f"{p['block_bytes']:<12d}{p['transport']:>10}{p['algorithm']:>14}{p['published_s'] * 1e6:11.1f}"
                f"{p['model_s'] * 1e6:9.1f}{p['model_error']:8.1%}")
        if args.replay:
            line += f"{p['replay_s'] * 1e6:9.1f}{p['replay_error']:8.1%}"
        print(line + ("   fit" if p["fitted"] else "   check"))
    if nic:
        print(f"# NIC: {nic.msg_rate / 1e6:.4g} M messages/s per node, {nic.bandwidth / 1e9:.4g} GB/s, "
              f"sender pays {nic.send_share:.0%} of a message's CPU; osu_mbw_mr 1 B replayed:")
        for c in curve:
            pub = "-" if c["published_msg_rate"] is None else f"{c['published_msg_rate'] / 1e6:.1f}"
            err = "" if c["error"] is None else f"{c['error']:8.1%}"
            print(f"#   {c['ranks_per_node']:4d} ranks/node: {c['replay_msg_rate'] / 1e6:7.2f} M/s "
                  f"({c['replay_per_rank'] / 1e6:.2f} per rank), published {pub}{err}")
    summary = {}
    for kind in ("model", "replay") if args.replay else ("model",):
        for group in ("fitted", "check"):
            errs = [abs(p[f"{kind}_error"]) for p in pts if p["fitted"] == (group == "fitted")]
            summary[f"{kind}_{group}"] = {"mean_abs_error": float(np.mean(errs)), "max_abs_error": float(np.max(errs)),
                                          "points": len(errs)}
            print(f"# {kind} on {group} points: mean |error| {np.mean(errs):.1%}, max {np.max(errs):.1%} "
                  f"over {len(errs)}")
    label = sg.label if sg else "none"
    record = {"benchmark": "fit_slingshot", "provenance": provenance(command_line("benchmarks/fit_slingshot.py"), label),
              "published": {k: v for k, v in PUBLISHED.items() if k != "us"}, "nodes": NODES, "ranks_per_node": PER_NODE,
              "fit_sizes": list(FIT_SIZES), "p2p": PUBLISHED_P2P, "pinned": PINNED, "model": model.__dict__, "reference_cpu": cpu.__dict__,
              "simgrid": sg.version if sg else None, "summary": summary, "points": pts,
              "nic": None if nic is None else {"published": PUBLISHED_NIC, "msg_rate": nic.msg_rate,
                                                "bandwidth": nic.bandwidth, "send_share": nic.send_share,
                                                "rates_tried": list(NIC_RATES), "tolerance": NIC_TOLERANCE,
                                                "curve": curve}}
    if nic:
        record["nic"]["max_abs_error"] = max(abs(c["error"]) for c in curve if c["error"] is not None)
    preset_model = dict(model.__dict__)
    if nic:
        preset_model.update(nic_msg_rate=nic.msg_rate, nic_bandwidth=nic.bandwidth, nic_send_share=nic.send_share)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(record, fh, indent=1)
    if args.preset_out:
        with open(args.preset_out, "w") as fh:
            json.dump({"preset": "slingshot", "provenance": record["provenance"], "source": SOURCE,
                       "fit": "benchmarks/fit_slingshot.py", "model": preset_model,
                       "reference_cpu": cpu.__dict__}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
