"""The simulator's experiments: one record per layout and block size (``simulate_point``: whole
calls replayed beside the bare MPI baselines and the model), their summary, and the replay of a
measured report (``compare_measured``)."""
from __future__ import annotations

import math
import os
import tempfile
import time
from typing import Optional, Sequence

import numpy as np

from ..baselines import baseline
from ..comm.costmodel.agreement import predict_agreement
from ..comm.costmodel.collectives import alltoallv_algorithm
from ..comm.costmodel.cpu import CpuTimes
from ..comm.costmodel.model import CostModel
from ..comm.costmodel.pattern import Pattern
from ..comm.costmodel.pick import RADICES, choose_call, predict_call, settings_of
from ..comm.plan import ALGORITHM, ALGORITHMS, Layout
from .actions import Nic
from .calls import Call, has_radix, make_counts, needs_hierarchy, node_of_sizes
from .errors import ReplayTimeout
from .platform import Network
from .replay import replay, simgrid
from .simgrid import SimGrid

__all__ = ["DEFAULT_MAX_REPLAY_RANKS", "REPLAYED", "simulate_point", "summarize", "crossover", "osu_calls",
           "compare_measured"]

#: Replays above this many ranks are skipped (the point is given by the model, marked so).
DEFAULT_MAX_REPLAY_RANKS = 1024


#: The replayed fields of a record (``<name>_sim_s``), in replay order; ``--only`` picks among them.
#: ``bare_alltoallv_plan``: MPI's persistent collective (``Call`` mode "bare_plan"); Open MPI runs
#: ``MPI_Alltoall_init`` as the same messages, so it stands for both.
REPLAYED = ("bare_alltoallv", "bare_alltoall", "bare_alltoallv_plan",
            *(f for a in ALGORITHMS for f in ((a,) if a == "flat" else (a, f"{a}_plan"))),
            "auto", "auto_plan", "agreement")


def _replayer(layout, counts, node_phase, model, network, base, timeout, cpu, rec: dict, sg: SimGrid,
              nic: Optional[Nic] = None, coarse: bool = False):
    """Replay each distinct Call once (cached); wall seconds go to ``rec["replay_s"]``, and a replay
    that times out gives None and is named in ``rec["timed_out"]`` (the sweep goes on)."""
    done: dict = {}

    def run(call: Call) -> Optional[float]:
        key = (call.label, call.mode, call.numpy)
        if key not in done:
            t0 = time.perf_counter()
            name = f"{call.label} {call.mode}"
            try:
                done[key] = replay(layout, counts, call, node_phase, model, network,
                                   os.path.join(base, f"{call.label.replace('/', '-')}-{call.mode}"), timeout, cpu,
                                   sg, nic, coarse)
            except ReplayTimeout:
                done[key] = None
                rec["timed_out"].append(name)
            rec["replay_s"][name] = round(time.perf_counter() - t0, 3)
        return done[key]
    return run


def simulate_point(sizes: Sequence[int], block: int, model: CostModel, network: Network,
                   node_phase: str = "shm", uneven: bool = False, workdir: Optional[str] = None,
                   timeout: Optional[float] = None, cpu: Optional[CpuTimes] = None, numpy: bool = False,
                   max_replay_ranks: int = DEFAULT_MAX_REPLAY_RANKS, only: Optional[Sequence[str]] = None,
                   sg: Optional[SimGrid] = None, nic: Optional[Nic] = None, coarse: bool = False,
                   chunks: Optional[int] = None) -> dict:
    """One JSON record: whole calls replayed (one-shot and plan), the bare MPI baselines, the model.

    One-shot calls pay the agreement (``agreement_steps``) and hxmpi's CPU per call (``cpu``);
    plans pay their CPU only. MPI's own calls are replayed bare: ``bare_alltoallv`` and
    ``bare_alltoall`` (one-shot) and ``bare_alltoallv_plan`` (its persistent collective); a replayed
    record's ``best_bare_sim_s`` is what one-shot calls are set against, ``plan_baseline_sim_s``
    what plans are (``hxmpi.baselines``: the best bare call, persistent included). ``*_sim_s`` of hier variants are None where the layout is
    degenerate (hxmpi runs flat there); ``bare_alltoall_sim_s`` is None for uneven counts. Worlds
    above ``max_replay_ranks`` are not replayed: every ``*_sim_s`` is None and ``by_model`` is true.
    ``only``: replay just these fields (``REPLAYED`` names, e.g. "auto"); the others stay None and
    are listed in ``not_run``. ``sg``: the SimGrid to replay with (default ``simgrid()``), named in
    the record's ``simgrid``. ``nic``: the platform's NIC (``Nic``); ``coarse``: replay linear
    world phases coarsely (``coarse_actions``), recorded in the record's ``coarse``. ``chunks``: the
    pipelined node phase's chunks of the lanes ("hier"; recorded as ``hier_radix``) instead of the
    model's pick among 1, 2, 4 and 8.
    """
    layout = Layout(node_of_sizes(sizes))
    counts = make_counts(layout.size, block, uneven)
    pattern = Pattern.from_counts(counts)
    n, g, p = layout.num_nodes, layout.max_node_size, layout.size
    cpu = cpu or CpuTimes.fixed(model)
    hier_ok = layout.hier_possible
    sizes = layout.node_sizes  # the model prices the layout itself, as HierComm's auto does
    pick = lambda mode: choose_call(model, mode, n, g, pattern, node_phase, cpu, numpy, sizes=sizes)  # noqa: E731
    auto, auto_plan = pick("oneshot"), pick("plan")
    tried = lambda a: RADICES if ALGORITHM[a].radixed else (chunks,) if chunks and ALGORITHM[a].chunked \
        else settings_of(a, layout.node_sizes, node_phase=node_phase)  # noqa: E731
    radix = {a: min(tried(a), key=lambda k: predict_call(model, a, "plan", n, g, pattern, node_phase, k, cpu,
                                                        sizes=sizes))
             if has_radix(a) else None for a in ALGORITHMS}
    model_s = lambda algo, mode, k=None: predict_call(model, algo, mode, n, g, pattern, node_phase, k, cpu,  # noqa: E731
                                                      numpy, sizes)
    usable = [a for a in ALGORITHMS if (hier_ok or not needs_hierarchy(a))
              and not (ALGORITHM[a].led and node_phase != "shm")]
    rec = {"nodes": n, "ranks_per_node": g, "node_sizes": list(layout.node_sizes), "block_bytes": block,
           "uneven": uneven, "by_model": p > max_replay_ranks,
           **{f"{a}_radix": radix[a] for a in ALGORITHMS if has_radix(a)},
           "auto_pick": Call(auto[0], radix=auto[1]).label, "auto_plan_pick": Call(auto_plan[0], radix=auto_plan[1]).label,
           "model_auto_s": auto[2], "model_auto_plan_s": auto_plan[2],
           "model_bare_alltoallv_s": model_s("flat", "bare"),
           "model_bare_alltoallv_plan_s": model_s("flat", "bare_plan"),
           "model_bare_alltoall_s": model_s("alltoall", "bare") if pattern.uniform else None,
           "model_agreement_s": predict_agreement(model, n, g, Call(auto[0]).hier, numpy)}
    for a in ALGORITHMS:
        rec[f"model_{a}_s"] = model_s(a, "oneshot", radix[a]) if a in usable else None
        if a != "flat":
            rec[f"model_{a}_plan_s"] = model_s(a, "plan", radix[a]) if a in usable else None
    rec.update({"model_pick": auto[0], "flat_schedule": alltoallv_algorithm(p), "numpy_call": numpy})
    rec.update({f"{k}_sim_s": None for k in REPLAYED})
    rec["replay_s"], rec["timed_out"], rec["not_run"] = {}, [], []
    rec["simgrid"] = None
    rec["coarse"], rec["nic"] = coarse, None if nic is None else dict(nic.__dict__)
    if rec["by_model"]:
        return rec
    sg = sg or simgrid()
    rec["simgrid"] = sg.version
    tmp = tempfile.TemporaryDirectory(prefix="hxmpi-sim-") if workdir is None else None
    base = tmp.name if tmp else workdir
    replayer = _replayer(layout, counts, node_phase, model, network, base, timeout, cpu, rec, sg, nic, coarse)
    rec["not_run"] = [k for k in REPLAYED if only is not None and k not in only]

    def run(call: Call, field: str) -> Optional[float]:
        return None if field in rec["not_run"] else replayer(call)
    try:
        rec["bare_alltoallv_sim_s"] = run(Call("flat", "bare"), "bare_alltoallv")
        if pattern.uniform:
            rec["bare_alltoall_sim_s"] = run(Call("alltoall", "bare"), "bare_alltoall")
        # flat's exchange timed out bare: flat calls (the same exchange and more) are not repeated
        slow = "flat bare" in rec["timed_out"]
        if slow:
            rec["timed_out"].append("flat bare_plan (not run: its messages timed out bare)")
        else:
            rec["bare_alltoallv_plan_sim_s"] = run(Call("flat", "bare_plan"), "bare_alltoallv_plan")
        for a in usable:
            if a == "flat" and slow:
                rec["timed_out"].append("flat oneshot (not run: its exchange timed out bare)")
                continue
            rec[f"{a}_sim_s"] = run(Call(a, radix=radix[a], numpy=numpy), a)
            if a != "flat":
                rec[f"{a}_plan_sim_s"] = run(Call(a, "plan", radix[a]), f"{a}_plan")
        if not (slow and auto[0] == "flat"):
            rec["auto_sim_s"] = run(Call(auto[0], radix=auto[1], numpy=numpy), "auto")
        if not (slow and auto_plan[0] == "flat"):
            rec["auto_plan_sim_s"] = run(Call(auto_plan[0], "plan", auto_plan[1]), "auto_plan")
        rec["agreement_sim_s"] = run(Call(auto[0], "agreement", auto[1], numpy), "agreement")
    finally:
        if tmp:
            tmp.cleanup()
    flat, hier = rec["flat_sim_s"], rec["hier_sim_s"]
    rec["sim_pick"] = None if flat is None and hier is None else \
        ("flat" if hier is None or (flat is not None and flat <= hier) else "hier")
    replayed = {k: rec[f"{k}_sim_s"] for k in REPLAYED}
    rec["best_bare_sim_s"] = baseline("auto", replayed)  # what one-shot calls are set against
    rec["plan_baseline_sim_s"] = baseline("auto_plan", replayed)  # plans: persistent included
    sims = {k: rec[f"{k}_sim_s"] for k in ALGORITHMS}
    rec["sim_best"] = min(((v, k) for k, v in sims.items() if v is not None), default=(None, None))[1]
    return rec


def summarize(records: list[dict]) -> dict:
    """Model error against the simulation per algorithm (whole calls), right picks, and the targets:
    the worst auto plan over its baseline (``plan_vs_plan_baseline_max``: the best bare call,
    persistent included) and the worst one-shot call, less its agreement, over the best bare one-shot."""
    out = {}
    pairs = {k: (f"model_{k}_s", f"{k}_sim_s") for k in REPLAYED if k != "agreement"}
    for algo, (km, ks) in pairs.items():
        errs = [abs(r[km] - r[ks]) / r[ks] for r in records if r.get(ks) is not None and r.get(km) is not None]
        out[algo] = {"mean_rel_error": float(np.mean(errs)) if errs else None,
                     "max_rel_error": float(np.max(errs)) if errs else None, "points": len(errs)}
    sim = [r for r in records if None not in (r.get("auto_sim_s"), r.get("auto_plan_sim_s"), r.get("agreement_sim_s"),
                                                r.get("best_bare_sim_s"))]
    # Right pick: the model's one-shot pick is within 5% of the fastest replayed hxmpi algorithm.
    best = lambda r: min(r[f"{k}_sim_s"] for k in ALGORITHMS if r.get(f"{k}_sim_s") is not None)  # noqa: E731
    out["auto_right"] = sum(r["auto_sim_s"] <= 1.05 * best(r) for r in sim)
    out["auto_points"] = len(sim)
    # Plans against the best bare call, persistent included; one-shot calls against the best one-shot.
    out["plan_vs_plan_baseline_max"] = max((r["auto_plan_sim_s"] / r["plan_baseline_sim_s"] for r in sim
                                            if r.get("plan_baseline_sim_s")), default=None)
    out["oneshot_minus_agreement_vs_best_bare_max"] = max(
        ((r["auto_sim_s"] - r["agreement_sim_s"]) / r["best_bare_sim_s"] for r in sim), default=None)
    return out


def crossover(records: list[dict], key_flat: str = "flat_sim_s", key_hier: str = "hier_sim_s") -> Optional[float]:
    """Block size (B) where hier stops beating flat, interpolated in log-log between sweep points.

    None if hier wins at every simulated size, 0 if it never wins.
    """
    rows = sorted((r for r in records if r[key_hier] is not None), key=lambda r: r["block_bytes"])
    if not rows:
        return 0.0
    ratios = [math.log(r[key_hier] / r[key_flat]) for r in rows]  # < 0 where hier wins
    if ratios[0] >= 0:
        return 0.0
    for (r0, q0), (r1, q1) in zip(zip(rows, ratios), zip(rows[1:], ratios[1:])):
        if q1 >= 0:
            x0, x1 = math.log(r0["block_bytes"]), math.log(r1["block_bytes"])
            return math.exp(x0 + (x1 - x0) * q0 / (q0 - q1))
    return None


def osu_calls(report: dict) -> dict:
    """Column of an ``osu_alltoallv.py --json`` report -> the Call it measured: "bare" (MPI_Alltoallv),
    "bare-plan" (MPI's persistent MPI_Alltoallv_init),
    A (one-shot, same specs every call: plan-cache hits), "A-new" (a new pattern every call: misses),
    "A-plan" (persistent requests), for the algorithms A the report has; "auto" and "naive" are left out."""
    radix = int(report.get("radix", 2))
    calls = {}
    for col, v in report["results"][0].items():
        if not (isinstance(v, dict) and "avg_us" in v):
            continue
        algo, _, kind = col.rpartition("-") if "-" in col else (col, "", "hit")
        if col == "bare":
            calls[col] = Call("flat", "bare")
        elif col == "bare-plan":
            calls[col] = Call("flat", "bare_plan")
        elif algo in ALGORITHMS:
            calls[col] = Call(algo, {"hit": "hit", "new": "oneshot", "plan": "plan"}[kind], radix)
    return calls


def compare_measured(report: dict, model: CostModel, network: Network, node_phase: str,
                     cpu: Optional[CpuTimes] = None, sg: Optional[SimGrid] = None) -> list[dict]:
    """Simulate the layout and block sizes of a measured report; rows with both times.

    ``report``: a ``calibrate.py --json`` report (its flat and hier rows, one-shot calls, with its
    fitted fixed costs), or an ``osu_alltoallv.py --json`` report (every column ``osu_calls`` maps,
    with ``cpu``: hxmpi's CPU per path)."""
    if report.get("benchmark") == "osu_alltoallv":
        layout = Layout(node_of_sizes(report["node_sizes"]))
        todo = [(col, call, r["size"], r[col]["avg_us"]) for r in report["results"]
                for col, call in osu_calls(report).items()]
    else:
        layout = Layout(node_of_sizes(report["layout"]["node_sizes"]))
        todo = [(r["algorithm"], Call(r["algorithm"]), r["block"], r["measured_us"]) for r in report["rows"]]
    rows = []
    for col, call, block, measured_us in todo:
        with tempfile.TemporaryDirectory(prefix="hxmpi-sim-") as tmp:
            sim = replay(layout, make_counts(layout.size, block, False), call, node_phase, model, network, tmp,
                         cpu=cpu, sg=sg)
        rows.append({"algorithm": col, "block_bytes": block, "measured_s": measured_us * 1e-6,
                     "sim_s": sim, "rel_error": abs(sim - measured_us * 1e-6) / (measured_us * 1e-6)})
    return rows
