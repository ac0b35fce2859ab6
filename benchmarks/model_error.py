"""The cost model's error against SimGrid replays, per algorithm, over committed simulate results.

    python benchmarks/model_error.py --json benchmarks/results/model_error.json [FILE ...]

For every replayed field of every record of the given ``python -m hxmpi.sim --json`` files
(default: every ``benchmarks/results/simulate_*.json`` of that kind), the call it replayed is
priced again by today's ``hxmpi.comm.costmodel`` with the file's own platform (its ``model``), CPU
per path (``cpu_s_per_call``), node phase, counts and radices, and compared with the replayed
time: |model - replay| / replay, per algorithm and mode. The replays are the files' own (each
keeps its provenance); only the model is today's, so the table shows what the model's structure
misses, as the simulator's own summary does, over every point ever replayed. Files whose platform
has no ``mpi_ddt_block`` replayed ``MPI_Alltoall`` as SMPI's own collective, which the model does
not price: their ``MPI_Alltoall`` calls are left out.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from hxmpi.cli import command_line
from hxmpi.comm.costmodel import CostModel, CpuTimes, Pattern, predict_agreement, predict_call
from hxmpi.comm.plan import ALGORITHMS, ALGORITHM
from hxmpi.provenance import provenance
from hxmpi.sim.calls import has_radix, make_counts

RESULTS = Path(__file__).resolve().parent / "results"


def _setting(algorithm: str, value=None) -> int:
    """The setting a replay ran ``algorithm`` with: ``value`` (a record's), else the algorithm's
    default (a Bruck radix or leaders per node of 2, one chunk); 2, unused, where it takes none."""
    if not has_radix(algorithm):
        return 2
    return ALGORITHM[algorithm].setting(None if value is None else int(value))


def _call(label: str) -> tuple[str, int]:
    """(algorithm, setting) of a record's pick label ("bruck/16", "hier/4", "hier": one chunk)."""
    name, _, setting = label.partition("/")
    return name, _setting(name, setting or None)


def fields(rec: dict) -> list[tuple[str, str, str, int]]:
    """(field, algorithm, mode, radix) of each call a record replays."""
    out = [("bare_alltoallv", "flat", "bare", 2), ("bare_alltoall", "alltoall", "bare", 2),
           ("bare_alltoallv_plan", "flat", "bare_plan", 2)]  # MPI's persistent collective
    for a in ALGORITHMS:
        k = _setting(a, rec.get(f"{a}_radix"))  # the radix, leaders or chunks the replay ran
        out.append((a, a, "oneshot", k))
        if a != "flat":
            out.append((f"{a}_plan", a, "plan", k))
    out.append(("auto", *_call(rec["auto_pick"])[:1], "oneshot", _call(rec["auto_pick"])[1]))
    out.append(("auto_plan", *_call(rec["auto_plan_pick"])[:1], "plan", _call(rec["auto_plan_pick"])[1]))
    return out


def priced(data: dict, source: str) -> list[dict]:
    """One row per replayed field of the file's records: the replay, the model, the error."""
    model = CostModel(**data["model"])
    cpu = CpuTimes(data["cpu_s_per_call"], source)
    # A platform without ``mpi_ddt_block`` replayed MPI_Alltoall as SMPI's own collective, a schedule
    # the model does not price (it prices Open MPI's tuned one): those calls are left out.
    smpi_alltoall = "mpi_ddt_block" not in data["model"]
    rows = []
    for rec in data["records"]:
        n, g, b = rec["nodes"], rec["ranks_per_node"], rec["block_bytes"]
        if len(set(rec["node_sizes"])) > 1:
            continue  # the model prices nodes of one size
        pat = Pattern.from_counts(make_counts(n * g, b, rec["uneven"]))
        numpy = bool(rec.get("numpy_call"))
        for field, algo, mode, radix in fields(rec):
            sim = rec.get(f"{field}_sim_s")
            if sim is None or (smpi_alltoall and algo == "alltoall"):
                continue
            model_s = predict_call(model, algo, mode, n, g, pat, data["node_phase"], radix, cpu, numpy)
            rows.append({"source": source, "nodes": n, "ranks_per_node": g, "block_bytes": b,
                         "uneven": rec["uneven"], "field": field, "call": f"{algo}/{radix}" if ALGORITHM.get(
                             algo) and ALGORITHM[algo].radixed else algo, "mode": mode, "sim_s": sim,
                         "model_s": model_s, "rel_error": abs(model_s - sim) / sim})
        if rec.get("agreement_sim_s") is not None:
            spec = ALGORITHM.get(_call(rec["auto_pick"])[0])
            model_s = predict_agreement(model, n, g, spec is not None and spec.hierarchical, numpy,
                                        both=spec is not None and spec.hierarchical and spec.led)
            sim = rec["agreement_sim_s"]
            rows.append({"source": source, "nodes": n, "ranks_per_node": g, "block_bytes": b, "uneven": rec["uneven"],
                         "field": "agreement", "call": "agreement", "mode": "agreement", "sim_s": sim,
                         "model_s": model_s, "rel_error": abs(model_s - sim) / sim})
    return rows


def summary(rows: list[dict]) -> dict:
    """Mean and max error and point count per field kind (the algorithm, "_plan" for plans)."""
    out: dict = {}
    for r in rows:
        out.setdefault(r["field"], []).append(r["rel_error"])
    return {k: {"mean_rel_error": float(np.mean(v)), "max_rel_error": float(np.max(v)), "points": len(v)}
            for k, v in out.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="model_error.py", description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="*", type=Path, help="simulate result files (default: every "
                   "benchmarks/results/simulate_*.json written by python -m hxmpi.sim)")
    p.add_argument("--json", help="write the rows and the summary here")
    args = p.parse_args(argv)
    files = args.files or sorted(RESULTS.glob("simulate_*.json"))
    rows, sources = [], {}
    for f in files:
        data = json.loads(f.read_text())
        if data.get("benchmark") != "simulate" or "cpu_s_per_call" not in data:
            continue
        got = priced(data, f.name)
        if got:  # files of the model alone (worlds above --max-replay-ranks) have no replay
            rows += got
            sources[f.name] = data["provenance"]
    if not rows:
        print("error: no replayed record in the files given", file=sys.stderr)
        return 2
    summ = summary(rows)
    for k, v in summ.items():
        print(f"{k:>22}: mean {v['mean_rel_error']:6.1%}  max {v['max_rel_error']:6.1%}  over {v['points']} points")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"benchmark": "model_error", "provenance": provenance(command_line("benchmarks/model_error.py"),
                                                                           "none (prices SimGrid replays)"),
                       "sources": sources, "summary": summ, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
