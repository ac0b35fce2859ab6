"""How much the cost model's newer terms matter: its error against a simulate JSON, old and new structure.

    python benchmarks/model_structure.py benchmarks/results/simulate_call_even.json

"old" is the structure before the SimGrid replays (one latency per peer for flat whatever Open MPI
runs, no per-message cost, three copies), with the same platform numbers; its latencies are what
a ping-pong measures (a + 2o), as calibrate.py measured them then. "new" is hxmpi.comm.costmodel.
"""
from __future__ import annotations

import argparse
import json

import numpy as np

from hxmpi.comm.costmodel import CostModel


def old_structure(m: CostModel, algorithm: str, n: int, g: int, b: float) -> float:
    """Seconds per call by the pre-simulation formulas."""
    p, ai, ae = n * g, m.alpha_intra + 2 * m.msg_overhead, m.alpha_inter + 2 * m.msg_overhead
    if algorithm == "flat":
        return (g - 1) * (ai + b * m.beta_intra) + (p - g) * ae + g * (p - g) * b * m.beta_inter + m.overhead_flat
    return ((n - 1) * ae + g * (p - g) * b * m.beta_inter + (g - 1) * (ai + n * b * m.beta_intra)
            + 3 * p * b * m.beta_copy + m.overhead_hier)


def main(path: str) -> None:
    data = json.load(open(path))
    m = CostModel(**data["model"])
    rows = [r for r in data["records"] if r["hier_sim_s"] is not None]
    old = {(a, i): old_structure(m, a, r["nodes"], r["ranks_per_node"], r["block_bytes"])
           for i, r in enumerate(rows) for a in ("flat", "hier")}
    print(f"# {path}: {len(rows)} points with both algorithms")
    print(f"{'# structure':<12}{'flat mean':>10}{'flat max':>10}{'hier mean':>10}{'hier max':>10}{'right pick':>12}")
    for name, pred in (("old", lambda a, i, r: old[(a, i)]), ("new", lambda a, i, r: r[f"model_{a}_s"])):
        errs = {a: [abs(pred(a, i, r) - r[f"{a}_sim_s"]) / r[f"{a}_sim_s"] for i, r in enumerate(rows)]
                for a in ("flat", "hier")}
        right = sum(("hier" if pred("hier", i, r) < pred("flat", i, r) else "flat") == r["sim_pick"]
                    for i, r in enumerate(rows))
        print(f"{name:<12}" + "".join(f"{f(errs[a]):10.1%}" for a in ("flat", "hier") for f in (np.mean, np.max))
              + f"{right:>8}/{len(rows)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("simulate_json", help="a python -m hxmpi.sim --json file with model and simulated times")
    main(parser.parse_args().simulate_json)
