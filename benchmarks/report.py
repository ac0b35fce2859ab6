"""Render every committed benchmark result (benchmarks/results/*.json) as Markdown for the docs.

    python benchmarks/report.py OUT_DIR [--results DIR]
    python benchmarks/report.py --readme README.md      # the README's results block

writes one fragment per JSON file (and one for the packaged CPU file, ``hxmpi/comm/overhead.json``,
when DIR is the default), ``OUT_DIR/<stem>.md``: a heading, the file's provenance (the command
that made it, date, version, MPI library, cores), its tables, and its committed plot if
there is one, copied beside the fragment. The docs' performance pages include these fragments, so
every number on them is one a run wrote; the Sphinx extension ``docs/_ext/hxmpi_docs.py`` runs
this at build time. A file without a provenance record, or of a kind no renderer knows, is refused.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path
from statistics import median

from hxmpi.baselines import BARE_PLAN, BASELINE_WORDS, BASELINES, baseline, is_plan, ratio

RESULTS = Path(__file__).resolve().parent / "results"
#: The measured CPU per path that ships with the package (package data, not under results/).
PACKAGED_CPU = Path(__file__).resolve().parent.parent / "hxmpi" / "comm" / "overhead.json"

# ----------------------------------------------------------------------------------------- helpers
def table(header, rows) -> str:
    """A Markdown table; numbers right-aligned."""
    def cell(v):
        return "" if v is None else str(v).replace("|", "\\|")
    out = ["| " + " | ".join(header) + " |",
           "| " + " | ".join("---:" if i else "---" for i in range(len(header))) + " |"]
    out += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(out)


def num(v, digits=1) -> str:
    """A number as the tables show it: None as "-", floats with ``digits`` decimals."""
    if v is None:
        return "-"
    if isinstance(v, dict) and "median" in v:  # a statistic over repeats
        return f"{num(v['median'], digits)} ({num(v['min'], digits)}-{num(v['max'], digits)})"
    if isinstance(v, bool) or isinstance(v, int):
        return str(v)
    return f"{v:.{digits}f}"


def us(seconds, digits=1) -> str:
    return "-" if seconds is None else num(seconds * 1e6, digits)


def size(b: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= scale and b % scale == 0:
            return f"{b // scale} {unit}"
    return f"{b} B"


def layout(node_sizes) -> str:
    if node_sizes and len(set(node_sizes)) == 1:
        return f"{len(node_sizes)} x {node_sizes[0]}"
    return "+".join(str(g) for g in node_sizes or [])


def pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


#: A wrapper that only serialised timing runs on the machine that made a file (a lock), not part
#: of what ran: left out of the command shown.
_LOCK_WRAPPER = re.compile(r"\bflock (?:-\w+ )*\S+ ")
#: An absolute path into a checkout of the repository (any machine's): shown relative to its root.
_IN_REPOSITORY = re.compile(r"(?<![\w.$/])/(?:[\w.+-]+/)+?((?:benchmarks|hxmpi|tests|docs|examples|csrc)/)")
#: An absolute path of the machine's scratch space: shown under a placeholder the reader picks.
_SCRATCH_PATH = re.compile(r"(?<![\w.$/])/(?:tmp|work|scratch)/")
SCRATCH = "$SCRATCH/"
#: A commit named in a result's own notes ("code at 1a2b3c4"): the file's provenance holds it.
_NOTED_COMMIT = re.compile(r"\bcode at [0-9a-f]{7,40}\b")


def shown_command(command: str) -> str:
    """A recorded command as the pages show it: without lock wrappers, with paths inside the
    repository relative to it and other machine paths under ``$SCRATCH``."""
    command = _IN_REPOSITORY.sub(r"\1", _LOCK_WRAPPER.sub("", command))
    return _SCRATCH_PATH.sub(SCRATCH, command)


def shown_note(text: str) -> str:
    """A result's note (``host_load``) as the pages show it: a commit it names is the file's
    provenance's, so the note points there instead of printing a hash."""
    return _NOTED_COMMIT.sub("code at the commit its provenance records", text)


def provenance_text(name: str, data: dict) -> str:
    """Where a result came from (its ``provenance`` record, ``hxmpi.provenance``): the command that
    made it, then the date, hxmpi version, MPI library and cores. The commit stays in the file
    (the page says whether one is recorded): pages carry no hashes. A file without a provenance
    record is refused: every result says where it came from."""
    prov = data.get("provenance")
    if not isinstance(prov, dict) or not prov.get("command") or not prov.get("commit"):
        raise SystemExit(f"report.py: {name} has no provenance (command and commit); "
                         "rerun it with a script that writes one (hxmpi.provenance)")
    commit, mpi = prov["commit"], str(prov.get("mpi", "unknown")).split(",")[0].strip()
    if commit == "unknown":
        source = "commit unknown"
    elif prov.get("commit_source"):
        source = "commit recovered afterwards from git history (in the file)"
    else:
        source = ("commit recorded in the file" + (" (with uncommitted code changes)" if prov.get("dirty") is True
                                                  else ""))
    facts = [source, f"{prov.get('date', 'unknown')[:10]}", f"hxmpi {prov.get('version', 'unknown')}".replace(
                 "hxmpi unknown", "hxmpi version unknown"),
             mpi if mpi not in ("unknown", "none") else f"MPI {mpi}", f"{prov.get('cores', 'unknown')} cores"]
    recorded = "version" if commit != "unknown" else "commit, version"
    head = (f"Made by (a file from before provenance records: the command it recorded; {recorded} and "
            "MPI library not recorded; dated when git recorded it):" if prov.get("backfilled") else "Made by:")
    command = shown_command(prov["command"])
    scratch = f"\n\n(`{SCRATCH}`: a scratch directory of your choice.)" if SCRATCH in command else ""
    return f"{head}\n\n```text\n{command}\n```{scratch}\n\n" + "; ".join(facts) + ".\n"


# --------------------------------------------------------------------------------------- renderers
def _ratio_cell(v) -> str:
    """A ratio to a baseline as the tables show it; n/a where the file has no baseline for it."""
    return NA if v is None else f"{v:.2f}"


#: What a table shows where a file has no baseline for a column (made before it was measured).
NA = "n/a"


def render_osu(d):
    """osu_alltoallv.py's table: one-shot columns beside bare, plans beside bare-plan (MPI's
    persistent MPI_Alltoallv_init; n/a in files made before it was measured), then each column
    over its baseline (``hxmpi.baselines``)."""
    res = d["results"]
    cols = [k for k in res[0] if isinstance(res[0][k], dict) and "avg_us" in res[0][k]]
    persistent = BARE_PLAN
    oneshot = [c for c in cols if c != persistent and not is_plan(c)]
    cols = oneshot + [persistent] + [c for c in cols if is_plan(c)]
    header = ["block"] + cols + (["auto's pick"] if "auto_choice" in res[0] else [])
    rows, ratios = [], []
    for r in res:
        times = {c: r[c]["avg_us"] for c in cols if c in r}
        row = [size(r["size"])] + [num(times[c], 2) if c in times else NA for c in cols]
        rows.append(row + ([r.get("auto_choice", "")] if "auto_choice" in res[0] else []))
        ratios.append([size(r["size"])] + [_ratio_cell(ratio(c, times)) for c in cols if c != "bare"])
    checked = all(all(r.get("check", {}).values()) for r in res) and "check" in res[0]
    note = (f"Layout {layout(d.get('node_sizes'))}, {d['world_size']} ranks, "
            f"{'uneven' if d.get('uneven') else 'even'} counts; us per call (mean over ranks): one-shot calls "
            f"beside `bare` (`MPI_Alltoallv`), plans beside `{persistent}` (MPI's persistent `MPI_Alltoallv_init`, "
            "Start + Wait). "
            + ("Every column was checked against `MPI_Alltoallv` (`-c`): all equal. " if checked else "")
            + f"MPI: {d.get('mpi', '?').split(',')[0].strip(chr(0))}.")
    why = (f"Each column over its baseline: one-shot calls (and `{persistent}`) over `bare`, plans over the faster "
           f"of `bare` and `{persistent}`" + (f" ({NA}: this file has no `{persistent}` column; rerun it)"
                                               if persistent not in res[0] else "") + ":")
    return "\n\n".join([note, table(header, rows), why, table(["block"] + [c for c in cols if c != "bare"], ratios)])


def render_overhead(d):
    m = d["median_us"]
    out = [f"Layout {layout(d.get('node_sizes'))}, {d.get('block')} B blocks, Bruck radix {d.get('radix')}; "
           "median over the rounds, us per call; x base: plans (`A-plan`) over the faster of `bare` and `bare-plan` "
           "(MPI's persistent `MPI_Alltoallv_init`), every other column over `bare`."]
    out.append(table(["column", "us", "x base"], [(k, num(v, 2), _ratio_cell(ratio(k, m))) for k, v in m.items()]))
    formula = d.get("cpu_formula", {})
    out.append("CPU per path (`cpu_s_per_call`), us:")
    out.append(table(["key", "us", "formula"],
                     [(k, us(v), formula.get(k, "")) for k, v in d["cpu_s_per_call"].items()]))
    if d.get("stages_us"):
        out.append("Local stages, each timed alone (`--breakdown`), us:")
        out.append(table(["stage", "us"], [(k, num(v, 2)) for k, v in d["stages_us"].items()]))
    return "\n\n".join(out)


def render_overhead_alltoallw(d):
    head = (f"Layout {layout(d.get('node_sizes'))}, {d['world_size']} ranks, node phase {d.get('node_phase')}, "
            f"HierComm algorithm {d.get('algorithm')}; the same specs every call; us per call (mean over ranks, "
            f"median of {d.get('repeats')} rounds). Pencil (n0, n1, nz): float32 items, n0 runs per peer.")
    rows = []
    for block, b in d["blocks"].items():
        m, r = b["median_us"], b["ratios"]
        ran = b["paths"].get("w-pencil", ["?"])[0]
        rows.append([size(int(block)), "x".join(map(str, b["pencil"]))] + [num(m[c], 2) for c in m]
                    + [num(r["w-basic / v-basic"], 2) + "x", num(r["w-pencil / w-pencil-comm"], 2) + "x", ran])
    cols = list(next(iter(d["blocks"].values()))["median_us"])
    return head + "\n\n" + table(["per peer", "pencil"] + cols + ["w-basic / v-basic", "w-pencil / w-pencil-comm",
                                                                "ran"], rows)


def render_overhead_combined(d):
    out = [f"The simulator's default `--overhead` file: CPU per path, {d.get('block')} B blocks, "
           f"deflation {', '.join(f'{k} {v:.3f}' for k, v in d.get('deflation', {}).items())}."]
    src = d.get("source", {})
    out.append(table(["key", "us", "how it was made"],
                     [(k, us(v), src.get(k, "")) for k, v in d["cpu_s_per_call"].items()]))
    inputs = d.get("inputs", [])
    if inputs:
        out.append("Input runs (as the file records them):")
        out.append("```text\n" + "\n".join(shown_command((i.get("provenance") or {}).get("command") or i["file"])
                                            for i in inputs) + "\n```")
        keys = list(d["cpu_s_per_call"])
        rows = [(k, *[us(i.get("cpu_s_per_call", {}).get(k)) for i in inputs]) for k in keys]
        out.append("Each input run's own CPU per path, us:")
        out.append(table(["key"] + [f"{i['file']} {layout(i.get('node_sizes'))}" for i in inputs], rows))
        out.append(_ratios_to_bare(inputs))
    return "\n\n".join(out)


def _ratios_to_bare(inputs) -> str:
    """Each column of the input runs over that run's baseline (plans over the faster of bare and
    bare-plan, the rest over bare; ``hxmpi.baselines``): median (min-max) per layout."""
    layouts = sorted({tuple(i.get("node_sizes") or ()) for i in inputs}, key=len)
    groups = [[i for i in inputs if tuple(i.get("node_sizes") or ()) == lay] for lay in layouts]
    columns = [c for c in inputs[0]["median_us"] if all(c in i["median_us"] for i in inputs)]
    rows = []
    for c in columns:
        cells = []
        for group in groups:
            ratios = [ratio(c, i["median_us"]) for i in group]
            cells.append(NA if None in ratios else f"{median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")
        rows.append((c, *cells))
    return ("Each column over the same run's baseline (plans over the faster of `bare` and `bare-plan`, the rest "
            "over `bare`), median (min-max) over the input runs of a layout:\n\n"
            + table(["column"] + [f"x base, {layout(list(lay))}" for lay in layouts], rows))


def render_pack(d):
    rows = [(size(r["block_bytes"]), num(r["hxmpi_gbps"], 2), num(r["fancy_gbps"], 2), num(r["memcpy_gbps"], 2),
             num(r["vs_memcpy"], 2), num(r["vs_fancy"], 1)) for r in d["results"]]
    return (f"Gather equal blocks into one buffer, {d['total_bytes'] >> 20} MiB in all.\n\n"
            + table(["block", "hxmpi GB/s", "numpy fancy index GB/s", "contiguous copy GB/s", "x copy bound",
                     "x fancy"], rows))


def render_msg_accounting(d):
    rows = []
    for alg, r in d["results"].items():
        ratios = ", ".join(f"{n['wire_tx_bytes'] / n['payload_bytes']:.3f}" for n in r["per_node"])
        rows.append((alg, max(r["per_rank_messages"]), max(r["per_rank_bytes"]), ratios))
    return (f"Layout {layout(d['node_sizes'])}, {size(d['block'])} blocks, {d['calls']} calls; `last_stats` "
            "against the bytes the host links sent.\n\n"
            + table(["algorithm", "inter-node messages/rank (max)", "payload bytes/rank (max)",
                     "wire / payload, per host"], rows))


def render_memory(d):
    return table(["ranks", "nodes", "dataset MiB", "node memory growth MiB", "growth / dataset"],
                 [(d["world_size"], d["num_nodes"], num(d["dataset_bytes"] / 2**20), num(d["growth_bytes"] / 2**20),
                   num(d["growth_per_dataset"], 2))])


def _model_rows(m):
    units = {"alpha": ("us", 1e6), "beta": ("GB/s", None), "overhead": ("us", 1e6), "msg": ("us", 1e6)}
    rows = []
    for k, v in m.items():
        kind = k.split("_")[0]
        unit, scale = units.get(kind, ("", 1))
        if kind == "beta":
            rows.append((k, "-" if not v else num(1e-9 / v, 2), "GB/s"))
        else:
            rows.append((k, num(v * scale, 2), unit))
    return table(["parameter", "value", "unit"], rows)


def render_calibrate(d):
    out = [f"Layout {layout(d['layout']['node_sizes'])}; mean error of the fit {pct(d['mean_abs_rel_error'])}; "
           f"`auto` right at {d['auto_right']} sizes" + (f"; node phase {d['node_phase']}" if d.get("node_phase") else "")
           + "."]
    out.append(_model_rows(d["model"]))
    if d.get("rows"):
        algs = sorted({r["algorithm"] for r in d["rows"]})
        by = {(r["algorithm"], r["block"]): r for r in d["rows"]}
        blocks = sorted({r["block"] for r in d["rows"]})
        header = ["block"] + [f"{a} {w}" for a in algs for w in ("measured us", "model us")]
        rows = [[size(b)] + [num(by[a, b][w], 1) if (a, b) in by else "-" for a in algs
                             for w in ("measured_us", "model_us")] for b in blocks]
        out.append(table(header, rows))
    if d.get("projection"):
        out.append("Projected crossover (hier faster below this block size; 0: never):")
        out.append(table(["nodes", "ranks per node", "crossover bytes"],
                         [(p["nodes"], p["per_node"], num(p["crossover_bytes"], 0)) for p in d["projection"]]))
    return "\n\n".join(out)


def render_compare(d):
    out = [f"Replay of `{d['source']}` (layout {layout(d['layout']['node_sizes'])}, node phase "
           f"{d.get('node_phase')}). Mean |simulated - measured| / measured per column:"]
    out.append(table(["column", "mean error"], [(k, pct(v)) for k, v in d["summary"].items()]))
    by = {}
    for r in d["rows"]:
        by.setdefault(r["block_bytes"], {})[r["algorithm"]] = r
    algs = list(dict.fromkeys(r["algorithm"] for r in d["rows"]))
    header = ["block"] + [f"{a} {w}" for a in algs for w in ("measured us", "simulated us")]
    rows = [[size(b)] + [x for a in algs for x in ((us(by[b][a]["measured_s"]), us(by[b][a]["sim_s"]))
                                                   if a in by[b] else ("-", "-"))] for b in sorted(by)]
    out.append(table(header, rows))
    return "\n\n".join(out)


def render_simulate(d):
    recs = d["records"]
    out = [f"Platform: {d['source']}, {d['network']} network (oversubscription {d['oversubscription']}), "
           f"node phase {d['node_phase']}, {'uneven' if d['uneven'] else 'even'} counts; us per call."]
    if d.get("note"):
        out[0] += " " + d["note"] + "."
    if d.get("runs"):
        out.append("Merged from: " + ", ".join(f"`{r}`" for r in d["runs"]) + ".")
    if "auto_sim_s" in recs[0] or "model_auto_s" in recs[0]:
        rows = []
        for r in recs:
            src = "model" if r.get("by_model") else "sim"
            get = (lambda k: r.get(f"model_{k}_s")) if r.get("by_model") else (lambda k: r.get(f"{k}_sim_s"))
            times = {k: get(k) for k in (*BASELINES, "auto", "auto_plan")}
            plan, one, agr, bare_plan = get("auto_plan"), get("auto"), get("agreement"), get("bare_alltoallv_plan")
            best = baseline("auto", times)
            rows.append((layout(r.get("node_sizes") or [r["ranks_per_node"]] * r["nodes"]), size(r["block_bytes"]),
                         src, us(get("bare_alltoallv")), us(get("bare_alltoall")), us(agr),
                         f"{us(one)} ({r.get('auto_pick')})",
                         num((one - agr) / best, 2) if one and agr and best else "-",
                         us(bare_plan) if "bare_alltoallv_plan_sim_s" in r else NA,
                         f"{us(plan)} ({r.get('auto_plan_pick')})", _ratio_cell(ratio("auto_plan", times)),
                         ", ".join(r.get("timed_out") or []) or ""))
        out.append(table(["layout", "block", "from", "bare Alltoallv", "bare Alltoall", "agreement",
                          "auto one-shot (pick)", "(one-shot - agreement) / best bare one-shot",
                          "bare Alltoallv_init (MPI's plan)", "auto plan (pick)",
                          "plan / best bare, persistent incl.", "timed out"], rows))
        out.append(f"One-shot calls are set against {BASELINE_WORDS['oneshot']}, plans against {BASELINE_WORDS['plan']}"
                   + (f"; {NA}: this file has no MPI persistent call (made before it was simulated; rerun it)"
                      if not any("bare_alltoallv_plan_sim_s" in r for r in recs) else "") + ".")
        fams = ["flat", "hier", "bruck", "hier_bruck"]
        rows = [(layout(r.get("node_sizes") or [r["ranks_per_node"]] * r["nodes"]), size(r["block_bytes"]),
                 *[f"{us(r.get(f'{f}_sim_s'))} / {us(r.get(f'model_{f}_s'))}" for f in fams],
                 f"{us(r.get('bare_alltoallv_plan_sim_s'))} / {us(r.get('model_bare_alltoallv_plan_s'))}"
                 if "model_bare_alltoallv_plan_s" in r else NA,
                 *[f"{us(r.get(f'{f}_plan_sim_s'))} / {us(r.get(f'model_{f}_plan_s'))}" for f in fams[1:]])
                for r in recs]
        out.append("Each algorithm, simulated / the cost model's prediction, us:")
        out.append(table(["layout", "block"] + [f"{f} one-shot" for f in fams] + ["bare Alltoallv_init"]
                         + [f"{f} plan" for f in fams[1:]], rows))
    else:
        rows = [(layout(r.get("node_sizes") or [r["ranks_per_node"]] * r["nodes"]), size(r["block_bytes"]),
                 us(r.get("flat_sim_s")), us(r.get("hier_sim_s")), us(r.get("model_flat_s")),
                 us(r.get("model_hier_s")), r.get("model_pick"), r.get("sim_pick"), r.get("flat_schedule"))
                for r in recs]
        out.append(table(["layout", "block", "flat sim", "hier sim", "flat model", "hier model", "model pick",
                          "sim pick", "flat schedule"], rows))
    summ = d.get("summary") or {}
    errs = [(k, pct(v.get("mean_rel_error")), pct(v.get("max_rel_error")), v.get("points"))
            for k, v in summ.items() if isinstance(v, dict)]
    if errs:
        out.append("The cost model against the simulation, per algorithm:")
        out.append(table(["algorithm", "mean error", "max error", "points"], errs))
    rest = {k: v for k, v in summ.items() if not isinstance(v, dict)}
    if rest:
        out.append(table(["summary", "value"], [(k, num(v, 2) if isinstance(v, float) else v)
                                               for k, v in rest.items()]))
    walls = [r for r in recs if r.get("replay_s")]
    if walls:
        out.append(f"What the replays cost (wall seconds{', SimGrid ' + d['simgrid'] if d.get('simgrid') else ''}; "
                   f"on a {d['provenance'].get('cores', '?')}-core machine, which other jobs may have shared):")
        rows = []
        for r in walls:
            slowest = max(r["replay_s"], key=r["replay_s"].get)
            rows.append((layout(r.get("node_sizes") or [r["ranks_per_node"]] * r["nodes"]), size(r["block_bytes"]),
                         len(r["replay_s"]), num(sum(r["replay_s"].values()), 1),
                         f"{slowest} ({num(r['replay_s'][slowest], 1)})"))
        out.append(table(["layout", "block", "replays", "wall s, all", "slowest replay (s)"], rows))
    if d.get("cpu_s_per_call"):
        out.append("CPU per path used (`cpu_s_per_call`), us: " + ", ".join(
            f"{k} {us(v)}" for k, v in d["cpu_s_per_call"].items()) + ".")
    return "\n\n".join(out)


def render_model_error(d):
    """``model_error.py``'s file: the cost model's error against every replay, per call kind."""
    out = ["Today's cost model against the replays of the files below (each file's platform, CPU per path and "
           "counts); |model - replay| / replay per call kind (one-shot calls, plans `_plan`, bare MPI calls, the "
           "agreement, and auto's picks):"]
    rows = [(k, pct(v["mean_rel_error"]), pct(v["max_rel_error"]), v["points"]) for k, v in d["summary"].items()]
    out.append(table(["call", "mean error", "max error", "points"], rows))
    worst: dict = {}
    for r in d["rows"]:
        key = (r["source"], r["nodes"], r["ranks_per_node"])
        if r["rel_error"] > worst.get(key, (0.0,))[0]:
            worst[key] = (r["rel_error"], r["field"], r["block_bytes"])
    out.append("The worst point of each layout:")
    out.append(table(["replays from", "layout", "worst call", "block", "error"],
                     [(f"`{src}`", f"{n}x{g}", f, size(b), pct(e)) for (src, n, g), (e, f, b) in worst.items()]))
    return "\n\n".join(out)


def _p2p_rows(d):
    """The point-to-point measurements the fit also uses: each as published (a time, and for a
    bandwidth point, bytes over that time), the parameters it pins, and where it was published."""
    rows = []
    for p in d.get("p2p", []):
        feats = p.get("features", {})
        rate = [f"{b / p['published_s'] / 1e9:.1f} GB/s" for k, b in feats.items() if k == "beta_inter"]
        rows.append((p["name"], us(p["published_s"], 2), ", ".join(rate) or "-", ", ".join(feats), p["source"]))
    return rows


def render_fit_slingshot(d):
    pub = d["published"]
    out = [f"Published points: {pub['benchmark']}; {pub['machine']}; {pub['source']} ({pub['where']}). "
           f"Fitted on the {', '.join(size(b) for b in d['fit_sizes'])} points of every column and the "
           "point-to-point measurements below; every other point checks it."]
    out.append(table(["point-to-point measurement", "published us", "as a rate", "pins", "source"], _p2p_rows(d)))
    names = {"alpha_intra": ("intra-node latency", "us"), "beta_intra": ("intra-node bandwidth", "GB/s"),
             "alpha_inter": ("inter-node latency", "us"), "beta_inter": ("inter-node bandwidth", "GB/s"),
             "beta_copy": ("copy bandwidth", "GB/s"), "msg_overhead": ("CPU per message (send or receive)", "us"),
             "ddt_block": ("Open MPI Bruck: datatype CPU per block per round", "us"),
             "han_block": ("HAN: CPU per block copied from a node peer", "us")}
    values = {**d["model"], **d["reference_cpu"]}
    rows = [(k, what, num(1e-9 / values[k], 2) if unit == "GB/s" and values[k] else num(values[k] * 1e6, 3), unit)
            for k, (what, unit) in names.items()]
    out.append(table(["parameter", "what", "fitted", "unit"], rows))
    label = {"han_alltoall": "HAN alltoall_using_smsc", "ompi_bruck": "without HAN (tuned: modified Bruck)"}
    replay = "replay_s" in d["points"][0]
    cpu = "reference_cpu_s" in d["points"][0]
    rows = [(size(p["block_bytes"]), p["transport"], label.get(p["algorithm"], p["algorithm"]), us(p["published_s"]),
             us(p["model_s"]), pct(p["model_error"]),
             *((f"{us(p['reference_cpu_s'])} ({pct(p['reference_cpu_s'] / p['published_s'])})",) if cpu else ()),
             *((us(p["replay_s"]), pct(p["replay_error"])) if replay else ()), "fit" if p["fitted"] else "check")
            for p in d["points"]]
    out.append(table(["block", "transport", "algorithm", "published us", "model us", "model error",
                      *(("of which Open MPI's CPU per block, us (of published)",) if cpu else ()),
                      *(("replay us", "replay error") if replay else ()), "point"], rows))
    out.append(table(["errors", "mean", "max", "points"],
                     [(k.replace("_", ", "), pct(v["mean_abs_error"]), pct(v["max_abs_error"]), v["points"])
                      for k, v in d["summary"].items() if isinstance(v, dict)]))
    if replay:
        out.append(f"The {len(d['points'])} replays (SimGrid {d.get('simgrid')}) took "
                   f"{num(sum(p['replay_wall_s'] for p in d['points']), 0)} s of wall time in all.")
    nic = d.get("nic")
    if nic:
        out.append(f"The NIC ({nic['published']['source']}; {nic['published']['also']}): "
                   f"`nic_msg_rate` {num(nic['msg_rate'] / 1e6, 2)} M messages/s per node each way (the smallest rate "
                   f"tried whose replay of {nic['published']['ranks_per_node']} pairs comes within "
                   f"{pct(nic['tolerance'])} of the published rate), `nic_bandwidth` {num(nic['bandwidth'] / 1e9, 2)} "
                   f"GB/s (the link's), the sender paying {pct(nic['send_share'])} of a message's CPU. "
                   "osu_mbw_mr with 1 B messages, replayed on 2 nodes:")
        out.append(table(["ranks per node", "replay M msg/s per node", "per rank", "published M msg/s", "error"],
                         [(c["ranks_per_node"], num(c["replay_msg_rate"] / 1e6, 2), num(c["replay_per_rank"] / 1e6, 2),
                           "-" if c["published_msg_rate"] is None else num(c["published_msg_rate"] / 1e6, 1),
                           pct(c["error"])) for c in nic["curve"]]))
    return "\n\n".join(out)


def _ratio(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def _nic_floor(r, nic):
    """Seconds a node's NIC needs for the bytes its ranks send to other nodes (even nodes), or None."""
    if not nic or len(set(r["node_sizes"])) != 1 or r["nodes"] < 2:
        return None
    g, p = r["ranks_per_node"], sum(r["node_sizes"])
    return g * (p - g) * r["block_bytes"] / nic["bandwidth"]


def _lower_bound_of(d) -> str:
    """The bare calls a scale file's lower bound is the fastest of, as its records name them."""
    return " / ".join(sorted({r.get("lower_bound_of", "MPI_Alltoallv and MPI_Alltoall") for r in d["records"]}))


def render_scale(d):
    """The scale table: hxmpi's one-shot and plan against Open MPI's tuned decision and HAN (each
    replayed with its fitted CPU per block) and the CPU-free lower bound."""
    nic = d.get("nic")
    out = [f"Preset slingshot, SimGrid {d.get('simgrid')}, NIC "
           + ("off" if not nic else f"{num(nic['msg_rate'] / 1e6, 2)} M messages/s and "
              f"{num(nic['bandwidth'] / 1e9, 2)} GB/s per node")
           + (", linear world phases replayed coarsely" if d.get("coarse") else "")
           + ". Microseconds per call; \"from\" says whether the row is replayed or given by the models. "
           "Open MPI tuned and HAN carry Open MPI's fitted CPU per block; the lower bound (the fastest of the bare "
           f"calls {_lower_bound_of(d)}) carries none."]
    rows = []
    for r in d["records"]:
        rows.append((layout(r["node_sizes"]), size(r["block_bytes"]), us(r["auto_s"]), us(r["auto_plan_s"]),
                     f"{us(r['ompi_tuned_s'])} ({r['ompi_tuned_schedule'].replace('ompi_', '')})", us(r["han_s"]),
                     us(r["lower_bound_s"]), us(_nic_floor(r, nic)), _ratio(r["auto_vs_ompi_tuned"]),
                     _ratio(r["auto_plan_vs_lower_bound"]), f"{r['auto_pick']} / {r['auto_plan_pick']}",
                     "model" if r["by_model"] else "replay"))
    out.append(table(["layout", "block", "hxmpi one-shot us", "hxmpi plan us", "Open MPI tuned + CPU us (runs)",
                      "HAN + CPU us", "lower bound us", "NIC floor us", "one-shot / tuned", "plan / lower bound",
                      "auto picks", "from"], rows))
    if nic:
        out.append("NIC floor: the bytes a node's ranks send to other nodes over the NIC's bandwidth, the time "
                   "no schedule can beat (messages and latency left out).")
    if any(r.get("lower_bound_of") == "MPI_Alltoall" for r in d["records"]):
        out.append("Bare MPI_Alltoallv was not replayed here (`--no-alltoallv`): the lower bound is Open MPI's "
                   "tuned MPI_Alltoall without CPU.")
    elif not all("MPI_Alltoallv_init" in r.get("lower_bound_of", "") for r in d["records"]):
        out.append("This file's lower bound leaves out MPI's persistent MPI_Alltoallv_init (made before it was "
                   "replayed; rerun it): its plan / lower bound is against one-shot calls only.")
    if d.get("complete") is False:
        out.append("The sweep was stopped before its last rows: the table holds the rows it replayed.")
    errs = d.get("model_errors", {})
    if any(e["points"] for e in errs.values()):
        out.append("The models against the replays above (|model - replay| / replay):")
        out.append(table(["column", "mean", "max", "points"],
                         [(k, pct(e["mean_rel_error"]), pct(e["max_rel_error"]), e["points"])
                          for k, e in errs.items() if e["points"]]))
    walls = [(layout(r["node_sizes"]), size(r["block_bytes"]), num(sum(r["replay_s"].values()), 0),
              num(max(r["replay_s"].values()), 0)) for r in d["records"] if r["replay_s"]]
    if walls:
        out.append("Wall time of each row's replays (shared machine), s:")
        out.append(table(["layout", "block", "all replays s", "slowest s"], walls))
    return "\n\n".join(out)


def render_coarse_check(d):
    """The coarse replay of linear world phases against the full replay."""
    rows = [(r["layout"], size(r["block_bytes"]), r["field"], "on" if r["nic"] else "off", us(r["full_s"]),
             us(r["coarse_s"]), pct(r["rel_diff"]), "-" if r["full_wall_s"] is None else num(r["full_wall_s"], 1),
             num(r["coarse_wall_s"], 1), "here" if r["full_from"] == "replayed here" else Path(r["full_from"]).name)
            for r in d["rows"]]
    return table(["layout", "block", "field", "NIC", "full us", "coarse us", "coarse - full", "full wall s",
                  "coarse wall s", "full replay from"], rows)


def render_train(d):
    res = d["results"]
    if "speedup" in res:
        rows = [(fw, num(res[fw].get("time_to_target_s")), num(res[fw].get("samples_per_s")))
                for fw in ("hxmpi", "ddp") if fw in res]
        sp = res["speedup"]
        rows.append(("speed-up (DDP / hxmpi)",) + tuple(num(v, 2) + "x" if isinstance(v, float) else str(v)
                                                         for v in list(sp.values())[:2]))
        out = [table(["framework", "time to target s, median (min-max)", "samples/s, median (min-max)"], rows)]
    else:
        rows = [(fw, num(r.get("time_to_target_s"), 2), r.get("epoch_at_target"), num(r.get("samples_per_s"), 0),
                 num(r.get("test_accuracy"), 4), num(r.get("train_time_s"), 2))
                for fw, r in res.items() if isinstance(r, dict)]
        out = [table(["framework", "time to target s", "epoch at target", "samples/s", "test accuracy",
                      "train s"], rows)]
    if d.get("step_breakdown_s"):
        out.append("Where hxmpi's step goes (ms, median over runs, mean over ranks): " + ", ".join(
            f"{k} {num(v * 1e3, 2)}" for k, v in d["step_breakdown_s"].items()) + ".")
    return "\n\n".join(out)


def render_staging(d):
    a = d["args"]
    rows = [(r["mode"], num(r["time_to_first_batch_s"], 2), num(r["train_time_s"], 2), num(r["data_wait_s"], 2),
             pct(r["data_wait_fraction"]), num(r["wall_s"], 2), num(r["test_accuracy"], 4),
             num(r["bytes_downloaded"] / 1e6, 1), num(r["consumption_mb_per_s"], 1)) for r in d["results"]]
    return (f"Store capped at {a.get('bandwidth')} MB/s, {a.get('samples')} samples x {a.get('features')} features, "
            f"{a.get('epochs')} epochs, cache limit {a.get('cache_limit')}, prefetch {a.get('prefetch')}.\n\n"
            + table(["mode", "first batch s", "train s", "waiting s", "waiting %", "wall s", "test acc",
                     "MB fetched", "consumed MB/s"], rows))


def render_straggler_card(d):
    """The update-policy report card (bench_straggler.py): per condition and mode, median (min-max)
    over runs; then auto against the best forced mode, and async and balanced against sync."""
    a, card = d["args"], d["card"]
    modes = a["modes"].split(",")
    load = shown_note(d.get("host_load") or "")  # a sentence the benchmark wrote
    head = (f"MLP {a['hidden']}, np {d['world_size']} (`--ranks-per-node {a['ranks_per_node']}`), batch "
            f"{a['batch_size']}, {a['epochs']} epochs, seed {a['seed']}, target {a['target']}, straggler "
            f"x{a['factor']:g}, {a['runs']} runs per cell: median (min-max)"
            + (f"; host: {load}" if load else "") + ".")
    rows = [(c, m + (" (best forced)" if m == row["best_forced"] else ""),
             num(row["cells"][m]["time_to_target_s"], 2), num(row["cells"][m]["final_accuracy"], 4),
             num(row["cells"][m]["epoch_time_s"], 2)) for c, row in card.items() for m in modes]
    signed = (lambda v: "-" if v is None else f"{v:+.4f}")
    ratios = [(c, num(row.get("auto_time_ratio"), 2), num(row.get("auto_time_ratio_paired"), 2),
               signed(row.get("auto_accuracy_diff")), signed(row.get("async_minus_sync_accuracy")),
               num(row.get("balanced_over_sync_epoch"), 2)) for c, row in card.items()]
    return "\n\n".join([head, table(["condition", "mode", "time to target s", "final accuracy", "epoch s"], rows),
                         table(["condition", "auto time / best forced", "paired by run", "auto - best forced accuracy",
                                "async - sync accuracy", "balanced / sync epoch"], ratios)])


def render_mpi_call(d):
    """bench_mpi_call.py: us per Start + Wait of a persistent request by the way compiled code
    reaches MPI, median (min-max) over rounds, with each variant's ratio to the Python loop."""
    load = shown_note(d.get("host_load") or "")
    head = (f"{d['library']}; {d['world_size']} ranks, {d['args']['iterations']} Start + Wait pairs x "
            f"{d['args']['rounds']} rounds, variants interleaved; us per pair, median (min-max)"
            + (f"; host: {load}" if load else "") + ".")
    out = [head]
    for request, per in d["us_per_start_wait"].items():
        py = median(per["python"])
        rows = [(v, f"{num(median(xs), 3)} ({num(min(xs), 3)}-{num(max(xs), 3)})",
                 num(median(xs) / py, 2)) for v, xs in per.items()]
        out.append(table([f"{request}: variant", "us per Start + Wait", "/ python"], rows))
    out += [f"Not measured: `{v}`: {why}" for v, why in d.get("not_measured", {}).items()]
    return "\n\n".join(out)


def render_suite(d):
    """bench_suite.py: what the README's test command cost, per run of tests/run.py."""
    total = d.get("total") or {}
    head = (f"{'The README' + chr(39) + 's test command' if d.get('readme_command') else 'The command'} "
            f"(`{d['measured_command']}`): exit {d['exit_code']} after {d['wall_s']:.0f} s, "
            f"{d['tests_s']:.0f} s of them in tests/run.py's runs; peak memory of the whole job "
            f"{d['peak_pss_bytes'] / 2**30:.2f} GiB (proportional set size); "
            f"{total.get('passed', '?')} passed, {total.get('failed', '?')} failed, {total.get('skipped', 0)} skipped.")
    rows = [(r["run"], r["status"], num(r["seconds"]), r.get("passed", 0), r.get("failed", 0) + r.get("errors", 0),
             r.get("skipped", 0)) for r in d["runs"]]
    return head + "\n\n" + table(["run", "status", "seconds", "passed", "failed", "skipped"], rows)


def render_overlap(d):
    """bench_overlap.py: each mode's us per iteration, median (min-max) over rounds, with its CPU
    (process and progress thread) and the cores it kept busy; then the ratios."""
    a = d["args"]
    cal = d["calibration_s"]
    head = (f"{d['library'].split(',')[0]}; {d['world_size']} ranks on {d['cores']} cores (load average before the run "
            f"{num(d['load_average'][0], 2)}), {size(a['block'])} blocks, virtual nodes of "
            f"{a.get('ranks_per_node') or 'the host'}, algorithm {d['algorithm']}; compute: "
            f"{d['compute_chunks']} products of {a['matrix']}-square float64 matrices, sized to the blocking exchange "
            f"alone ({us(cal['exchange'])} us at calibration); {a['iterations']} iterations x {a['rounds']} rounds, "
            "modes interleaved; us per iteration, median (min-max) over rounds.")
    rows = [(m, num({k: v * 1e6 for k, v in s.items()}), num(d["cpu_us_per_iteration"][m]),
             num(d["progress_thread_cpu_us_per_iteration"][m]), pct(d["cores_busy"][m]))
            for m, s in d["seconds"].items()]
    ratios = [(k, num(v, 2) + "x") for k, v in d["ratios"].items()]
    return "\n\n".join([head, table(["mode", "us per iteration", "CPU us (process)", "CPU us (progress thread)",
                                       "cores busy"], rows),
                         "Ratios: `immediate_*` is a nonblocking call waited for at once over the blocking call "
                         "(1.00x: no toll); `overlap_*` and `chunked_*` are the overlapped time over compute and "
                         "exchange run in turn (below 1.00x the overlap gains; `chunked` calls Test() between the "
                         "compute's chunks):",
                         table(["ratio", "value"], ratios)])


RENDERERS = {"suite": render_suite, "osu_alltoallv": render_osu, "mpi_call": render_mpi_call, "overhead": render_overhead,
             "overhead-alltoallw": render_overhead_alltoallw, "overhead-combined": render_overhead_combined, "pack": render_pack, "msg_accounting": render_msg_accounting, "memory": render_memory,
             "calibrate": render_calibrate, "simulate-compare": render_compare, "simulate": render_simulate,
             "fit_slingshot": render_fit_slingshot, "train": render_train, "straggler_card": render_straggler_card, "staging": render_staging,
             "overlap": render_overlap, "model_error": render_model_error, "simulate-scale": render_scale,
             "coarse_check": render_coarse_check}


def render(path: Path) -> str:
    """One result file as a Markdown fragment (heading level 3)."""
    data = json.loads(path.read_text())
    kind = data.get("benchmark")
    renderer = RENDERERS.get(kind)
    if renderer is None:
        raise SystemExit(f"report.py: no renderer for {path.name} (benchmark {kind!r})")
    parts = [f"### `{path.name}`\n", provenance_text(path.name, data), renderer(data)]
    if path.with_suffix(".png").exists():
        parts.append(f"![{path.stem}]({path.stem}.png)")
    return "\n\n".join(parts).rstrip() + "\n"


# ------------------------------------------------------------------------------ headline numbers
# The README's results and the performance index's summary: each sentence's numbers are read from
# its result file here, so the text cannot drift from the file (tests/test_docs.py compares the
# README with this output; ``--readme README.md`` rewrites its block).

def _marks(name: str) -> tuple[str, str]:
    """The markers around a generated README block."""
    return (f"<!-- {name}: written from benchmarks/results by python benchmarks/report.py --readme README.md; "
            "do not edit -->", f"<!-- end of {name} -->")


def _load(results: Path, name: str) -> dict:
    return json.loads((results / name).read_text())


def _sim_record(d: dict, nodes: int, per_node: int, block: int) -> dict:
    return next(r for r in d["records"] if (r["nodes"], r["ranks_per_node"], r["block_bytes"]) == (nodes, per_node, block))


#: The simulator's preset the README quotes: the one calibrated to published timings.
CALIBRATED = "preset slingshot"
#: The bare MPI call behind each baseline field (``hxmpi.baselines``), as the sentences name it.
CALLED = {"bare": "MPI_Alltoallv", "bare_alltoallv": "MPI_Alltoallv", "bare_alltoall": "MPI_Alltoall",
          "bare-plan": "MPI_Alltoallv_init", "bare_alltoallv_plan": "MPI_Alltoallv_init"}


def _calibrated(d: dict, name: str) -> dict:
    """A simulate file the README may quote: made on the calibrated preset, or refused."""
    if d.get("source") != CALIBRATED:
        raise SystemExit(f"report.py: the README quotes {CALIBRATED} results only; {name} is {d.get('source')!r}")
    return d


def _against(name: str, times: dict) -> tuple[float, str]:
    """(the time column ``name`` is set against, the words for it, naming the call): its baseline
    (``hxmpi.baselines``); for a plan in a file made before MPI's persistent call was run, the best
    bare one-shot call, said so."""
    base = baseline(name, times)
    if base is not None:
        words = "the best bare MPI call, persistent included," if is_plan(name) else "the best bare one-shot MPI call,"
    else:
        base = baseline("bare", times)
        words = "the best bare one-shot MPI call (MPI's persistent `MPI_Alltoallv_init` is not in this file),"
    return base, f"{words} `{CALLED[next(k for k in CALLED if times.get(k) == base)]}`"


def _sim_times(r: dict) -> dict:
    return {k: r.get(f"{k}_sim_s") for k in (*BASELINES, "auto", "auto_plan")}


def _sim_even(results: Path) -> tuple[str, str]:
    name = "simulate_costmodel.json"
    d = _calibrated(_load(results, name), name)
    r = _sim_record(d, 8, 8, 512)
    times = _sim_times(r)
    plan = r["auto_plan_sim_s"]
    base, words = _against("auto_plan", times)
    return (f"**Simulated 64 ranks (8 nodes x 8), 512 B blocks, even counts** (SimGrid, slingshot preset: "
            f"calibrated to Open MPI's published timings; hxmpi's measured CPU per call): `auto`'s persistent "
            f"plan ({r['auto_plan_pick']}) takes **{plan / base:.2f}x** {words} ({plan * 1e6:.1f} against "
            f"{base * 1e6:.1f} us).", "scale")


def _sim_skewed(results: Path) -> tuple[str, str]:
    name = "simulate_slingshot_8x8_uneven.json"
    d = _calibrated(_load(results, name), name)
    r = _sim_record(d, 8, 8, 8)
    times = _sim_times(r)
    plan, one, agr = r["auto_plan_sim_s"], r["auto_sim_s"], r["agreement_sim_s"]
    base, words = _against("auto_plan", times)
    base1, words1 = _against("auto", times)
    return (f"**Simulated 64 ranks (8 nodes x 8), 8 B blocks, skewed (Zipf-like) counts** (slingshot preset): "
            f"`auto`'s plan ({r['auto_plan_pick']}) takes **{plan / base:.2f}x** {words} ({plan * 1e6:.1f} against "
            f"{base * 1e6:.1f} us); a one-shot call, agreement included, {one / base1:.2f}x {words1} "
            f"({one * 1e6:.1f} against {base1 * 1e6:.1f} us; its agreement {agr * 1e6:.1f} us).", "scale")


def _osu_row(d: dict, size: int) -> dict:
    return next(r for r in d["results"] if r["size"] == size)


def _osu_times(r: dict) -> dict:
    """An osu_alltoallv row's columns: us per call."""
    return {c: v["avg_us"] for c, v in r.items() if isinstance(v, dict) and "avg_us" in v}


def _cluster(results: Path) -> tuple[str, str]:
    d = _load(results, "osu_cluster_221.json")
    r = _osu_row(d, 8)
    times = _osu_times(r)
    plan, flat = times["hier-plan"], times["flat"]
    base, words = _against("hier-plan", times)
    base1, words1 = _against("flat", times)
    return (f"**Emulated 3-host cluster (2+2+1 ranks over TCP), 8 B blocks**: the hierarchical persistent "
            f"request takes **{plan / base:.2f}x** {words} ({plan:.2f} against {base:.2f} us); a one-shot call pays "
            f"the agreement on top (flat, same pattern every call, {flat / base1:.2f}x {words1}, {flat:.2f} us).",
            "exchange")


def _overhead(results: Path) -> tuple[str, str]:
    d = _load(results, "overhead_np4.json")
    m = d["median_us"]
    return (f"**One host, {layout(d['node_sizes'])} ranks (oversubscribed), 8 B blocks**: a one-shot `Alltoallv` "
            f"runs whole in compiled code, agreement included. With a new count pattern every call, flat takes "
            f"**{m['flat-new'] / m['bare']:.2f}x** a bare `MPI_Alltoallv` ({m['flat-new']:.2f} against {m['bare']:.2f} "
            f"us), with the same pattern every call {m['flat-repeat'] / m['bare']:.2f}x ({m['flat-repeat']:.2f} us; one "
            f"persistent Allreduce and one persistent Alltoallv take {m['floor']:.2f} us); a hierarchical call with a "
            f"new pattern {m['hier-new']:.2f} us.", "exchange")


def _ddp(results: Path) -> tuple[str, str]:
    small, lasting = _load(results, "train_np2_120k.json"), _load(results, "train_lasting_np2_fused_sgd.json")

    def times(d):
        return d["results"]["hxmpi"]["time_to_target_s"]["median"], d["results"]["ddp"]["time_to_target_s"]["median"]
    (h1, d1), (h2, d2) = times(small), times(lasting)
    a, b = small["args"], lasting["args"]
    return (f"**Training against PyTorch DDP, np 2, medians of {a['repeats']} runs**: on a 120,000-sample store (MLP "
            f"{a['hidden']}, runs of about {d1:.0f} s) hxmpi reaches the target accuracy **{d1 / h1:.2f}x** sooner "
            f"({h1:.1f} against {d1:.1f} s); on a lasting workload (MLP {b['hidden']}, runs of about {h2:.0f} s) "
            f"{d2 / h2:.2f}x ({h2:.1f} against {d2:.1f} s), where numpy's matrix products, slower than torch's, set "
            f"the pace.", "training")


def _card(results: Path) -> tuple[str, str]:
    d = _load(results, "straggler_card_np2_120k_eval25.json")
    row, a = d["card"]["x3"], d["args"]
    auto, best = row["cells"]["auto"], row["cells"][row["best_forced"]]
    t_auto, t_best = auto["time_to_target_s"]["median"], best["time_to_target_s"]["median"]
    return (f"**The update policy's report card, np 2, one rank x{a['factor']:g}**: `--update auto` reaches the "
            f"target in **{row['auto_time_ratio']:.2f}x** the time of the best forced mode ({row['best_forced']}; "
            f"{t_auto:.2f} against {t_best:.2f} s), its final accuracy {row['auto_accuracy_diff']:+.4f} from it; "
            f"balanced sync's epoch is {row['balanced_over_sync_epoch']:.2f}x sync's.", "training")


def _staging(results: Path) -> tuple[str, str]:
    d = _load(results, "staging.json")
    by, a = {r["mode"]: r for r in d["results"]}, d["args"]
    dist, mem = by["distributed"], by["memory"]
    return (f"**Staging from a store capped at {a['bandwidth']:g} MB/s** ({d['world_size']} nodes, "
            f"{dist['train_bytes'] / 1e6:.0f} MB train split): distributed staging has its first batch after "
            f"**{dist['time_to_first_batch_s'] / mem['time_to_first_batch_s']:.2f}x** the time of staging "
            f"everything in memory first ({dist['time_to_first_batch_s']:.2f} against "
            f"{mem['time_to_first_batch_s']:.2f} s), waiting for data {pct(dist['data_wait_fraction'])} of the "
            f"training time.", "training")


HEADLINES = (_sim_even, _sim_skewed, _cluster, _overhead, _ddp, _card, _staging)
#: The performance index's fragment of the headline numbers (``OUT_DIR/headlines.md``).
HEADLINES_STEM = "headlines"
PAGE_TITLES = {"scale": "At scale", "exchange": "The exchange", "training": "Training and staging"}


def headlines(results: Path = RESULTS, pages: str = "docs/performance/") -> str:
    """The headline results as Markdown bullets, each linking to the performance page (under
    ``pages``) that renders its file."""
    bullets = []
    for make in HEADLINES:
        text, page = make(results)
        bullets.append(f"- {text} [{PAGE_TITLES[page]}]({pages}{page}.md).")
    return "\n".join(bullets) + "\n"


#: The comparison page's fragment (``OUT_DIR/comparison.md``): hxmpi beside the alternatives.
COMPARISON_STEM = "comparison"


def comparison(results: Path = RESULTS) -> str:
    """hxmpi beside what a user would otherwise run, one row per comparison a result file holds,
    each labelled measured (this project's runs), projected (SimGrid replays) or published (another
    project's measurement), with its file; alternatives no file measures are listed as such."""
    rows = []

    def row(against, setting, kind, ours, theirs, file):
        ratio = "-" if ours is None or theirs is None else f"{ours / theirs:.2f}x"
        rows.append((against, setting, kind, "-" if ours is None else f"{ours:.1f}",
                     "-" if theirs is None else f"{theirs:.1f}", ratio, f"`{file}`" if file else "-"))
    o = _load(results, "overhead_np4.json")
    m, where = o["median_us"], f"one host, {layout(o['node_sizes'])} ranks (oversubscribed), {o['block']} B blocks"
    row("mpi4py `comm.Alltoallv`", f"{where}; one-shot call, a new count pattern every call", "measured",
        m["flat-new"], m["bare"], "overhead_np4.json")
    row("mpi4py `comm.Alltoallv`", f"{where}; one-shot call, the same pattern every call", "measured",
        m["flat-repeat"], m["bare"], "overhead_np4.json")
    u = _load(results, "osu_1host_np4.json")
    times = _osu_times(_osu_row(u, 8))
    plans = {k: v for k, v in times.items() if is_plan(k)}
    best = min(plans, key=plans.get)
    base, words = _against(best, times)
    row(f"mpi4py: {words}", f"one host, {layout(u['node_sizes'])} ranks, 8 B blocks; persistent request "
        f"(fastest: {best})", "measured", plans[best], base, "osu_1host_np4.json")
    c = _load(results, "osu_cluster_221.json")
    times = _osu_times(_osu_row(c, 8))
    base, words = _against("hier-plan", times)
    row(f"MPI over TCP: {words}", f"emulated cluster, {layout(c['node_sizes'])} ranks on 3 hosts, 8 B blocks; "
        "hier persistent request", "measured", times["hier-plan"], base, "osu_cluster_221.json")
    for name in ("simulate_1024_128x8_8.json", "simulate_1024_32x32_8.json"):
        d = _load(results, name)
        r = d["records"][0]
        base, words = _against("auto_plan", _sim_times(r))
        row(f"Open MPI's default algorithms: {words}",
            f"{r['nodes']} x {r['ranks_per_node']} ranks, {r['block_bytes']} B blocks, "
            f"{d['source'].replace('preset ', '')} preset; auto's persistent plan ({r['auto_plan_pick']})",
            "projected (SimGrid)", r["auto_plan_sim_s"] * 1e6, base * 1e6, name)
    f = _load(results, "fit_slingshot.json")
    pub = {(p["algorithm"], p["transport"]): p["published_s"] for p in f["points"] if p["block_bytes"] == 8}
    if ("han_alltoall", "mtl") in pub and ("ompi_bruck", "mtl") in pub:
        row("Open MPI HAN against Open MPI tuned (no hxmpi run at this layout)",
            f"{f['nodes']} x {f['ranks_per_node']} ranks, Slingshot-11, 8 B blocks: HAN (left) and tuned Bruck "
            "(right)", "published (Open MPI's)", pub[("han_alltoall", "mtl")] * 1e6, pub[("ompi_bruck", "mtl")] * 1e6,
            "fit_slingshot.json")
    t = _load(results, "train_np2_120k.json")
    h, dd = (t["results"][k]["time_to_target_s"]["median"] for k in ("hxmpi", "ddp"))
    row("PyTorch DDP (training, not `all_to_all_single`)", f"np {t['world_size']}, MLP {t['args']['hidden']}, "
        "time to target accuracy, s", "measured", h, dd, "train_np2_120k.json")
    row("MPICH's `MPI_Alltoallv`", "no timing file: the test suite runs on MPICH (correctness only)",
        "not measured", None, None, None)
    row("`torch.distributed.all_to_all_single`", "no timing file", "not measured", None, None, None)
    return table(["against", "setting", "kind", "hxmpi (us, or s)", "the other (us, or s)", "hxmpi / other",
                  "file"], rows) + "\n"


#: The measured run of the README's test command (``benchmarks/bench_suite.py``); the contributing
#: page includes its fragment, which says so where no run is committed yet.
SUITE_STEM = "suite"
NOT_MEASURED = "No measured run of the test command is committed yet (`benchmarks/bench_suite.py` makes one).\n"


def suite_cost(results: Path = RESULTS) -> str:
    """What the README's test command costs, from ``suite.json`` (``benchmarks/bench_suite.py``)."""
    if not (results / f"{SUITE_STEM}.json").exists():
        return NOT_MEASURED
    d = _load(results, f"{SUITE_STEM}.json")
    by = {r["run"]: r for r in d["runs"]}
    mpi = [r for r in d["runs"] if r["run"].startswith("mpi")]
    total, prov = d["total"], d["provenance"]
    return (f"Measured on a {prov['cores']}-core Linux machine ({prov['mpi'].split(',')[0]}): "
            f"the whole command took **{d['wall_s'] / 60:.0f} minutes**, of which the serial tests "
            f"{by['serial']['seconds'] / 60:.0f} minutes and the MPI runs at {mpi[0]['run'][-1]} to "
            f"{mpi[-1]['run'][-1]} ranks {sum(r['seconds'] for r in mpi) / 60:.0f} minutes; the whole job peaked at "
            f"**{d['peak_pss_bytes'] / 2**30:.1f} GiB** of memory; it ended with {total['passed']} passed, "
            f"{total['failed']} failed, {total['skipped']} skipped ([the run](docs/contributing/index.md#tests)).\n")


#: The README's generated blocks: name -> what fills it.
README_BLOCKS = {"results": headlines, "test cost": suite_cost}


def write_readme(path: Path, results: Path = RESULTS) -> None:
    """Rewrite every generated block of the README at ``path`` (``README_BLOCKS``)."""
    text = path.read_text()
    for name, make in README_BLOCKS.items():
        begin, end = _marks(name)
        start, stop = text.index(begin) + len(begin), text.index(end)
        text = text[:start] + "\n" + make(results) + text[stop:]
    path.write_text(text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="report.py", description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, nargs="?", help="directory for the Markdown fragments (created)")
    p.add_argument("--results", type=Path, default=RESULTS, help="directory of the result JSON files")
    p.add_argument("--readme", type=Path, default=None, help="rewrite this README's results block "
                   "(the headline numbers, read from the result files)")
    args = p.parse_args(argv)
    if args.out is None and args.readme is None:
        p.error("give OUT_DIR, --readme README.md, or both")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        files = sorted(args.results.glob("*.json")) + ([PACKAGED_CPU] if args.results == RESULTS else [])
        for f in files:
            (args.out / f"{f.stem}.md").write_text(render(f))
            if f.with_suffix(".png").exists():
                shutil.copyfile(f.with_suffix(".png"), args.out / f"{f.stem}.png")
        if args.results == RESULTS:  # the headline numbers, for the performance index
            (args.out / f"{HEADLINES_STEM}.md").write_text(headlines(args.results, pages=""))
            (args.out / f"{COMPARISON_STEM}.md").write_text(comparison(args.results))
            if not (args.results / f"{SUITE_STEM}.json").exists():
                (args.out / f"{SUITE_STEM}.md").write_text(NOT_MEASURED)
        print(f"report.py: {len(files)} result files rendered into {args.out}", file=sys.stderr)
    if args.readme is not None:
        write_readme(args.readme, args.results)
        print(f"report.py: the results block of {args.readme} rewritten", file=sys.stderr)
    return 0

if __name__ == "__main__":
    sys.exit(main())
