"""The coarse replay of linear world phases against the full replay, and what it costs.

    python benchmarks/coarse_check.py --shape 8x16 --shape 16x8 -m 8:512 \
        --against benchmarks/results/simulate_1024_128x8_8.json \
        --against benchmarks/results/simulate_1024_32x32_8.json --json benchmarks/results/coarse_check.json

For every ``--shape`` and block size, bare ``MPI_Alltoallv`` and a flat one-shot call (both
linear where Open MPI's rule makes them so) are replayed in full and coarsely
(``hxmpi.sim.actions.coarse_actions``) on the ``slingshot`` preset with its NIC; each row gives
both simulated times, their difference and both wall times. ``--against`` takes a committed
``python -m hxmpi.sim`` result of a world too large to replay in full here: its full replays
(without a NIC, as it was made) are compared with coarse replays of the same fields on its
platform (its ``model``) with its CPU per path.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

from hxmpi.cli import command_line
from hxmpi.comm.costmodel import CostModel, CpuTimes
from hxmpi.comm.plan import Layout
from hxmpi.provenance import provenance
from hxmpi.sim.args import block_sizes
from hxmpi.sim.calls import Call, make_counts, node_of_sizes
from hxmpi.sim.platform import Network
from hxmpi.sim.presets import PRESET_NICS, calibrated_preset
from hxmpi.sim.replay import replay, simgrid

#: The fields compared: (record field, the call replayed).
FIELDS = (("bare_alltoallv", Call("flat", "bare")), ("flat", Call("flat")))


def _timed(layout, counts, call, model, nic, cpu, coarse, sg) -> tuple[float, float]:
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hxmpi-coarse-") as tmp:
        sim = replay(layout, counts, call, "shm", model, Network(), tmp, cpu=cpu, sg=sg, nic=nic, coarse=coarse)
    return sim, time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", action="append", default=[], help="NxG, replayed in full and coarsely (repeatable)")
    ap.add_argument("-m", "--message-size", default="8:4096", help="MIN:MAX block bytes (default 8:4096)")
    ap.add_argument("--factor", type=int, default=8, help="step between block sizes (default 8)")
    ap.add_argument("--against", action="append", default=[], help="a python -m hxmpi.sim --json result: its "
                    "full replays against coarse ones (repeatable)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    model, _ = calibrated_preset()
    nic, sg = PRESET_NICS["slingshot"], simgrid()
    prov = provenance(command_line("benchmarks/coarse_check.py"), sg.label)
    rows = []
    print(f"{'# layout':<10}{'block':>7}{'field':>16}{'full us':>10}{'coarse us':>11}{'diff':>8}"
          f"{'full wall s':>13}{'coarse wall s':>15}")

    def show(r):
        full_wall = "-" if r["full_wall_s"] is None else f"{r['full_wall_s']:.1f}"
        print(f"{r['layout']:<10}{r['block_bytes']:>7}{r['field']:>16}{r['full_s'] * 1e6:10.1f}{r['coarse_s'] * 1e6:11.1f}"
              f"{r['rel_diff']:8.1%}{full_wall:>13}{r['coarse_wall_s']:15.1f}", flush=True)
    for shape in args.shape:
        n, _, g = shape.lower().partition("x")
        layout = Layout(node_of_sizes([int(g)] * int(n)))
        for b in block_sizes(args.message_size, args.factor):
            counts = make_counts(layout.size, b, False)
            for field, call in FIELDS:
                full, full_wall = _timed(layout, counts, call, model, nic, None, False, sg)
                coarse, coarse_wall = _timed(layout, counts, call, model, nic, None, True, sg)
                rows.append({"layout": shape, "block_bytes": b, "field": field, "nic": True, "full_s": full,
                             "coarse_s": coarse, "rel_diff": (coarse - full) / full, "full_wall_s": full_wall,
                             "coarse_wall_s": coarse_wall, "full_from": "replayed here"})
                show(rows[-1])
    for path in args.against:
        with open(path) as fh:
            d = json.load(fh)
        cpu = CpuTimes.parse(json.dumps({"cpu_s_per_call": d["cpu_s_per_call"]}), path)
        platform = CostModel(**d["model"])  # the platform it was replayed on
        for rec in d["records"]:
            layout = Layout(node_of_sizes(rec["node_sizes"]))
            counts = make_counts(layout.size, rec["block_bytes"], rec["uneven"])
            for field, call in FIELDS:
                full = rec.get(f"{field}_sim_s")
                if full is None:
                    continue
                coarse, coarse_wall = _timed(layout, counts, call, platform, None, cpu, True, sg)
                rows.append({"layout": f"{rec['nodes']}x{rec['ranks_per_node']}", "block_bytes": rec["block_bytes"],
                             "field": field, "nic": False, "full_s": full, "coarse_s": coarse,
                             "rel_diff": (coarse - full) / full, "full_wall_s": rec["replay_s"].get(
                                 "flat bare" if field == "bare_alltoallv" else "flat oneshot"),
                             "coarse_wall_s": coarse_wall, "full_from": path})
                show(rows[-1])
    if rows:
        print(f"# largest |coarse - full| / full: {max(abs(r['rel_diff']) for r in rows):.1%} over {len(rows)} rows")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"benchmark": "coarse_check", "provenance": prov, "simgrid": sg.version,
                       "nic": nic.__dict__, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
