"""Render every committed benchmark result (benchmarks/results/*.json) as Markdown for the docs.

    python benchmarks/report.py OUT_DIR [--results DIR]

writes one fragment per JSON file (and one for the packaged CPU file, ``hxmpi/comm/overhead.json``,
when DIR is the default), ``OUT_DIR/<stem>.md`` (a heading, the command that produced the
file, its tables, and its committed plot if there is one, copied beside the fragment). The docs'
performance pages include these fragments, so every number on them is one a run wrote; the Sphinx
extension ``docs/_ext/hxmpi_docs.py`` runs this at build time. The command comes from the file
when the benchmark recorded it (``command``, ``commands`` or ``args``); otherwise from the README
of the commit before the docs site (645fd19), and the fragment says so.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from statistics import median

RESULTS = Path(__file__).resolve().parent / "results"
#: The measured CPU per path that ships with the package (package data, not under results/).
PACKAGED_CPU = Path(__file__).resolve().parent.parent / "hxmpi" / "comm" / "overhead.json"

#: Commands the README at 645fd19 gave for files that do not record their own (module paths
#: updated to the current layout: ``python -m hxmpi.sim``, ``python -m hxmpi.sim.cluster``).
README_COMMANDS = {
    "osu_1host_np4": "mpirun --allow-run-as-root --oversubscribe -np 4 python benchmarks/osu_alltoallv.py "
                     "-m 8:1048576 -i 500 --iterations-large 100 -c --ranks-per-node 2",
    "osu_cluster_221": "python -m hxmpi.sim.cluster up --hosts 3 --slots 2,2,1; python -m hxmpi.sim.cluster run -n 5 "
                       "-- python benchmarks/osu_alltoallv.py -m 8:1048576 -i 200 --iterations-large 50 -c",
    "osu_cluster_221_algos": "python -m hxmpi.sim.cluster run -n 5 -- python benchmarks/osu_alltoallv.py "
                             "-m 8:262144 -i 300 -x 100 --iterations-large 50 -c --json osu.json",
    "osu_cluster_2x2": "python -m hxmpi.sim.cluster up --hosts 2 --slots 2,2; python -m hxmpi.sim.cluster run -n 4 "
                       "-x HXMPI_TUNING=benchmarks/results/tuning_cluster_2x2.json -- python benchmarks/osu_alltoallv.py "
                       "-m 8:1048576 -i 100 -x 10 -c",
    "calibrate_cluster_221": "python -m hxmpi.sim.cluster run -n 5 -- python benchmarks/calibrate.py --node-phase shm "
                             "-m 8:262144 -i 50 --out tuning.json --json calibrate.json",
    "tuning_cluster_221": "python -m hxmpi.sim.cluster run -n 5 -- python benchmarks/calibrate.py --node-phase shm "
                          "-m 8:262144 -i 50 --out tuning.json --json calibrate.json",
    "calibrate_cluster_221_loaded": "python -m hxmpi.sim.cluster run -n 5 -- python benchmarks/calibrate.py "
                                    "--node-phase mpi -m 8:262144 -i 50 --json ...",
    "sim_vs_cluster_221": "python -m hxmpi.sim --compare osu.json --tuning tuning.json --overhead overhead.json "
                          "--json sim_vs.json",
    "sim_vs_cluster_221_calibrate": "python -m hxmpi.sim --compare benchmarks/results/calibrate_cluster_221.json",
    "sim_vs_cluster_221_loaded": "python -m hxmpi.sim --compare benchmarks/results/calibrate_cluster_221_loaded.json",
    "sim_vs_cluster_2x2": "python -m hxmpi.sim --compare benchmarks/results/calibrate_cluster_2x2.json --node-phase mpi",
    "simulate_call_even": "python -m hxmpi.sim --nodes 8,32 --ranks-per-node 8 -m 8:65536 --factor 8 --json ...",
    "simulate_call_uneven": "python -m hxmpi.sim --nodes 8,32 --ranks-per-node 8 -m 8:65536 --factor 8 --uneven "
                            "--json ...",
    "simulate_call_64x8": "python -m hxmpi.sim --nodes 64 --ranks-per-node 8 -m 8:8 --json ...",
    "simulate_call_64x8_uneven": "python -m hxmpi.sim --nodes 64 --ranks-per-node 8 -m 8:8 --uneven --json ...",
    "simulate_call_model_2048_4096": "python -m hxmpi.sim --nodes 256,512 --ranks-per-node 8 -m 8:65536 --factor 8 "
                                     "--json ...",
    "pack": "python benchmarks/bench_pack.py",
    "msg_accounting_221": "python -m hxmpi.sim.cluster run -n 5 -- python benchmarks/msg_accounting.py --block 65536",
    "memory_np2": "python -m hxmpi.data make --out /tmp/big --samples 1500000 --features 64 --shard-mb 32; "
                  "mpirun -np 2 python benchmarks/bench_memory.py /tmp/big",
    "memory_np4": "python -m hxmpi.data make --out /tmp/big --samples 1500000 --features 64 --shard-mb 32; "
                  "mpirun -np 4 python benchmarks/bench_memory.py /tmp/big",
}

SCRIPTS = {"train": "bench_train.py", "straggler": "bench_straggler.py", "staging": "bench_staging.py"}


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


def command_text(stem: str, data: dict) -> str:
    """Where the file came from: its recorded command, or the old README's, said which."""
    if isinstance(data.get("command"), str):
        return f"Command (recorded in the file):\n\n```text\n{data['command']}\n```\n"
    if isinstance(data.get("provenance"), dict) and isinstance(data["provenance"].get("command"), str):
        prov = data["provenance"]
        return (f"Command (recorded in the file; MPI library: {prov.get('mpi')}):"
                f"\n\n```text\n{prov['command']}\n```\n")
    if isinstance(data.get("commands"), list):
        return "Commands (recorded in the file):\n\n```text\n" + "\n".join(data["commands"]) + "\n```\n"
    if isinstance(data.get("args"), dict) and data.get("benchmark") in SCRIPTS:
        flags = " ".join(f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}")
                         for k, v in data["args"].items() if v not in (None, False))
        return (f"Arguments (recorded in the file; launcher not recorded, {data.get('world_size')} ranks):\n\n"
                f"```text\nbenchmarks/{SCRIPTS[data['benchmark']]} {flags}\n```\n")
    if stem in README_COMMANDS:
        return ("Command (not recorded in the file; as the README at 645fd19 gave it, module paths "
                f"updated):\n\n```text\n{README_COMMANDS[stem]}\n```\n")
    if data.get("benchmark") in ("simulate", "simulate-compare") and data.get("source"):
        return f"Command: not recorded; a `python -m hxmpi.sim` run from {data['source']}.\n"
    return "Command: not recorded in the file, nor in the README at 645fd19.\n"


# --------------------------------------------------------------------------------------- renderers
def render_osu(d):
    res = d["results"]
    cols = [k for k in res[0] if isinstance(res[0][k], dict) and "avg_us" in res[0][k]]
    header = ["block"] + cols + (["auto's pick"] if "auto_choice" in res[0] else [])
    rows = []
    for r in res:
        row = [size(r["size"])] + [num(r[c]["avg_us"], 2) if c in r else "-" for c in cols]
        rows.append(row + ([r.get("auto_choice", "")] if "auto_choice" in res[0] else []))
    checked = all(all(r.get("check", {}).values()) for r in res) and "check" in res[0]
    note = (f"Layout {layout(d.get('node_sizes'))}, {d['world_size']} ranks, "
            f"{'uneven' if d.get('uneven') else 'even'} counts; us per call (mean over ranks). "
            + ("Every column was checked against `MPI_Alltoallv` (`-c`): all equal. " if checked else "")
            + f"MPI: {d.get('mpi', '?').split(',')[0].strip(chr(0))}.")
    return note + "\n\n" + table(header, rows)


def render_overhead(d):
    out = [f"Layout {layout(d.get('node_sizes'))}, {d.get('block')} B blocks, Bruck radix {d.get('radix')}; "
           "median over the rounds, us per call."]
    out.append(table(["column", "us"], [(k, num(v, 2)) for k, v in d["median_us"].items()]))
    formula = d.get("cpu_formula", {})
    out.append("CPU per path (`cpu_s_per_call`), us:")
    out.append(table(["key", "us", "formula"],
                     [(k, us(v), formula.get(k, "")) for k, v in d["cpu_s_per_call"].items()]))
    if d.get("stages_us"):
        out.append("Local stages, each timed alone (`--breakdown`), us:")
        out.append(table(["stage", "us"], [(k, num(v, 2)) for k, v in d["stages_us"].items()]))
    return "\n\n".join(out)


def render_overhead_combined(d):
    out = [f"The simulator's default `--overhead` file: CPU per path, {d.get('block')} B blocks, "
           f"deflation {', '.join(f'{k} {v:.3f}' for k, v in d.get('deflation', {}).items())}."]
    src = d.get("source", {})
    out.append(table(["key", "us", "how it was made"],
                     [(k, us(v), src.get(k, "")) for k, v in d["cpu_s_per_call"].items()]))
    inputs = d.get("inputs", [])
    if inputs:
        out.append("Input runs (commands recorded in the file):")
        out.append("```text\n" + "\n".join(i.get("command", i.get("file", "")) for i in inputs) + "\n```")
        keys = list(d["cpu_s_per_call"])
        rows = [(k, *[us(i.get("cpu_s_per_call", {}).get(k)) for i in inputs]) for k in keys]
        out.append("Each input run's own CPU per path, us:")
        out.append(table(["key"] + [f"{i['file']} {layout(i.get('node_sizes'))}" for i in inputs], rows))
        out.append(_ratios_to_bare(inputs))
    return "\n\n".join(out)


def _ratios_to_bare(inputs) -> str:
    """Each column of the input runs over that run's bare call: median (min-max) per layout."""
    layouts = sorted({tuple(i.get("node_sizes") or ()) for i in inputs}, key=len)
    groups = [[i for i in inputs if tuple(i.get("node_sizes") or ()) == lay] for lay in layouts]
    columns = [c for c in inputs[0]["median_us"] if all(c in i["median_us"] for i in inputs)]
    rows = []
    for c in columns:
        cells = []
        for group in groups:
            ratios = [i["median_us"][c] / i["median_us"]["bare"] for i in group]
            cells.append(f"{median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")
        rows.append((c, *cells))
    return ("Each column over the same run's bare call, median (min-max) over the input runs of a layout:\n\n"
            + table(["column"] + [f"x bare, {layout(list(lay))}" for lay in layouts], rows))


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
            bare = [v for v in (get("bare_alltoallv"), get("bare_alltoall")) if v is not None]
            best = min(bare) if bare else None
            plan, one, agr = get("auto_plan"), get("auto"), get("agreement")
            rows.append((layout(r.get("node_sizes") or [r["ranks_per_node"]] * r["nodes"]), size(r["block_bytes"]),
                         src, us(get("bare_alltoallv")), us(get("bare_alltoall")), us(agr),
                         f"{us(one)} ({r.get('auto_pick')})", f"{us(plan)} ({r.get('auto_plan_pick')})",
                         num(plan / best, 2) if plan and best else "-",
                         num((one - agr) / best, 2) if one and agr and best else "-",
                         ", ".join(r.get("timed_out") or []) or ""))
        out.append(table(["layout", "block", "from", "bare Alltoallv", "bare Alltoall", "agreement",
                          "auto one-shot (pick)", "auto plan (pick)", "plan / best bare",
                          "(one-shot - agreement) / best bare", "timed out"], rows))
        fams = ["flat", "hier", "bruck", "hier_bruck"]
        rows = [(layout(r.get("node_sizes") or [r["ranks_per_node"]] * r["nodes"]), size(r["block_bytes"]),
                 *[f"{us(r.get(f'{f}_sim_s'))} / {us(r.get(f'model_{f}_s'))}" for f in fams],
                 *[f"{us(r.get(f'{f}_plan_sim_s'))} / {us(r.get(f'model_{f}_plan_s'))}" for f in fams[1:]])
                for r in recs]
        out.append("Each algorithm, simulated / the cost model's prediction, us:")
        out.append(table(["layout", "block"] + [f"{f} one-shot" for f in fams] + [f"{f} plan" for f in fams[1:]],
                         rows))
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
    if d.get("cpu_s_per_call"):
        out.append("CPU per path used (`cpu_s_per_call`), us: " + ", ".join(
            f"{k} {us(v)}" for k, v in d["cpu_s_per_call"].items()) + ".")
    return "\n\n".join(out)


def render_fit_slingshot(d):
    pub = d["published"]
    out = [f"Published points: {pub['benchmark']}; {pub['machine']}; {pub['source']} ({pub['where']}). "
           f"Fitted on the {', '.join(size(b) for b in d['fit_sizes'])} points of every column, with "
           + "; ".join(f"{p['name']} ({p['source']})" for p in d.get("p2p", [])) + "; every other point checks it."]
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
    rows = [(size(p["block_bytes"]), p["transport"], label.get(p["algorithm"], p["algorithm"]), us(p["published_s"]),
             us(p["model_s"]), pct(p["model_error"]),
             *((us(p["replay_s"]), pct(p["replay_error"])) if replay else ()), "fit" if p["fitted"] else "check")
            for p in d["points"]]
    out.append(table(["block", "transport", "algorithm", "published us", "model us", "model error",
                      *(("replay us", "replay error") if replay else ()), "point"], rows))
    out.append(table(["errors", "mean", "max", "points"],
                     [(k.replace("_", ", "), pct(v["mean_abs_error"]), pct(v["max_abs_error"]), v["points"])
                      for k, v in d["summary"].items()]))
    return "\n\n".join(out)


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


def render_straggler(d):
    rows = []
    for cfg, r in d["results"].items():
        b = r.get("step_breakdown_s", {})
        rows.append((cfg, num(r.get("epoch_time_s")), f"{num(r.get('time_to_target_s'))} ({r.get('epoch_at_target')})",
                     num(b.get("compute", 0) * 1e3), num(b.get("gradient_wait", 0) * 1e3),
                     num(b.get("exchange", 0) * 1e3), "x" + num(r.get("measured_slowdown"))))
    out = [table(["config (update/straggler)", "epoch s", "to target s (epoch)", "compute ms", "wait ms",
                  "exchange ms", "straggler measured"], rows)]
    if d.get("ratios"):
        out.append(table(["measure", "value"], [(k, f"{v:.3g}") for k, v in d["ratios"].items()]))
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


def render_tuning(d):
    return (f"A tuning file (`HXMPI_TUNING`) for layout {layout(d['layout']['node_sizes'])}: mean error of the fit "
            f"{pct(d['mean_abs_rel_error'])}, `auto` right at {d['auto_right']} sizes.\n\n" + _model_rows(d["model"]))


def render_straggler_card(d):
    """The update-policy report card (bench_straggler.py): per condition and mode, median (min-max)
    over runs; then auto against the best forced mode, and async and balanced against sync."""
    a, card = d["args"], d["card"]
    modes = a["modes"].split(",")
    load = d.get("host_load")  # a sentence the benchmark wrote
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
    load = d.get("host_load")
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


RENDERERS = {"osu_alltoallv": render_osu, "mpi_call": render_mpi_call, "overhead": render_overhead,
             "overhead-combined": render_overhead_combined, "pack": render_pack, "msg_accounting": render_msg_accounting, "memory": render_memory,
             "calibrate": render_calibrate, "simulate-compare": render_compare, "simulate": render_simulate,
             "fit_slingshot": render_fit_slingshot,
             "train": render_train, "straggler": render_straggler, "straggler_card": render_straggler_card, "staging": render_staging}


def render(path: Path) -> str:
    """One result file as a Markdown fragment (heading level 3)."""
    data = json.loads(path.read_text())
    kind = data.get("benchmark", "tuning" if "model" in data else None)
    renderer = RENDERERS.get(kind, render_tuning if kind == "tuning" else None)
    if renderer is None:
        raise SystemExit(f"report.py: no renderer for {path.name} (benchmark {kind!r})")
    parts = [f"### `{path.name}`\n", command_text(path.stem, data), renderer(data)]
    if path.with_suffix(".png").exists():
        parts.append(f"![{path.stem}]({path.stem}.png)")
    return "\n\n".join(parts).rstrip() + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="report.py", description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="directory for the Markdown fragments (created)")
    p.add_argument("--results", type=Path, default=RESULTS, help="directory of the result JSON files")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    files = sorted(args.results.glob("*.json")) + ([PACKAGED_CPU] if args.results == RESULTS else [])
    for f in files:
        (args.out / f"{f.stem}.md").write_text(render(f))
        if f.with_suffix(".png").exists():
            shutil.copyfile(f.with_suffix(".png"), args.out / f"{f.stem}.png")
    print(f"report.py: {len(files)} result files rendered into {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
