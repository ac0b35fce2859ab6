"""What ``python -m hxmpi.sim`` shows: the OSU-style table of a layout's records and the plot."""
from __future__ import annotations

import sys
from typing import Optional

from ..baselines import ratio
from ..comm.plan import ALGORITHMS
from .sweep import REPLAYED

__all__ = ["us", "print_layout", "plot"]


def us(x: Optional[float], width: int = 12) -> str:
    """Seconds ``x`` as microseconds right-aligned in ``width`` characters; "-" for None."""
    return f"{x * 1e6:{width}.1f}" if x is not None else f"{'-':>{width}}"


def print_layout(records: list[dict], out=sys.stdout) -> None:
    """OSU-style table of one layout's records (microseconds): one-shot calls, plans, baselines."""
    r0 = records[0]
    p = sum(r0["node_sizes"])
    shape = "+".join(map(str, r0["node_sizes"])) if len(set(r0["node_sizes"])) > 1 \
        else f"{r0['nodes']} x {r0['ranks_per_node']}"
    how = "BY THE MODEL (not replayed)" if r0["by_model"] else "replayed"
    print(f"# nodes {shape} ({p} ranks), {how}; bare MPI_Alltoallv as Open MPI's {r0['flat_schedule']}, "
          "MPI_Alltoall as Open MPI's tuned decision", file=out)
    # One-shot calls beside MPI's one-shot calls, plans beside MPI's persistent collective.
    cols = (("bare a2av", "bare_alltoallv"), ("bare a2a", "bare_alltoall"), ("agree", "agreement"),
            *((a, a) for a in ALGORITHMS), ("auto", "auto"), ("bare plan", "bare_alltoallv_plan"),
            *((f"{a} plan", f"{a}_plan") for a in ALGORITHMS if a != "flat"), ("auto plan", "auto_plan"))
    widths = [max(12, len(c) + 2) for c, _ in cols]
    print(f"{'# Block [B]':<12}" + "".join(f"{c:>{w}}" for (c, _), w in zip(cols, widths))
          + f"{'auto pick':>14}{'plan pick':>14}  [us]", file=out)
    for r in records:
        if r["by_model"]:
            vals = [r.get(f"model_{k}_s") for _, k in cols]
        else:
            vals = [r.get(f"{k}_sim_s") for _, k in cols]
        print(f"{r['block_bytes']:<12d}" + "".join(us(v, w) for v, w in zip(vals, widths)) +
              f"{r['auto_pick']:>14}{r['auto_plan_pick']:>14}", file=out)
    sim = [r for r in records if not r["by_model"] and None not in (r["auto_sim_s"], r["auto_plan_sim_s"],
                                                                      r["agreement_sim_s"], r["best_bare_sim_s"])]
    for r in records:
        if r["timed_out"]:
            print(f"# {r['block_bytes']} B: replay over --timeout (shown -): {', '.join(r['timed_out'])}", file=out)
        if r.get("not_run"):
            print(f"# {r['block_bytes']} B: not replayed (--only; shown -): {', '.join(r['not_run'])}", file=out)
    if sim:
        plans = [r["auto_plan_sim_s"] / r["plan_baseline_sim_s"] for r in sim if r.get("plan_baseline_sim_s")]
        worst1 = max((r["auto_sim_s"] - r["agreement_sim_s"]) / r["best_bare_sim_s"] for r in sim)
        print(f"# worst auto: plan / best bare MPI call, persistent included "
              f"{f'{max(plans):.2f}' if plans else 'n/a'}, (one-shot - agreement) / best bare one-shot "
              f"{worst1:.2f}", file=out)


def plot(records: list[dict], path: str, title: str) -> None:
    """auto over its baseline per layout vs block size (``hxmpi.baselines``): plans (solid) over the
    best bare MPI call, persistent included; one-shot calls (dashed) over the best bare one-shot
    call; model points (not replayed) use the model on both sides."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault(tuple(r["node_sizes"]), []).append(r)
    for sizes, rows in groups.items():
        label = f"{len(sizes)}x{max(sizes)}" if len(set(sizes)) == 1 else "+".join(map(str, sizes))
        pts = []
        for r in rows:
            times = {k: r.get(f"model_{k}_s" if r["by_model"] else f"{k}_sim_s") for k in REPLAYED}
            plan, one = ratio("auto_plan", times), ratio("auto", times)
            if plan is not None and one is not None:
                pts.append((r["block_bytes"], plan, one))
        if not pts:
            continue
        xs, plan, one = zip(*pts)
        label += " (model)" if rows[0]["by_model"] else ""
        line, = ax.plot(xs, plan, marker="o", label=label)
        ax.plot(xs, one, ls="--", marker=".", color=line.get_color())
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(1.1, color="r", lw=0.6, ls=":")
    ax.set(yscale="log", xlabel="block size [B]", ylabel="auto / best bare MPI (plans: persistent incl.)",
           title=title + "\nsolid: plan, dashed: one-shot (with agreement); red: 1.1")
    ax.set_xscale("log", base=2)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
