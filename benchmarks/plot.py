"""Turn benchmark JSON files into PNG plots (needs matplotlib: pip install -e '.[bench]').

    python benchmarks/plot.py benchmarks/results/*.json --out-dir benchmarks/results

One PNG per JSON, named after it: latency vs block size per algorithm (osu_alltoallv), GB/s vs
block size per method (pack), measured vs model (calibrate), loss curves (train), first batch,
wait and wall time per staging mode (staging).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _axes(title: str, xlabel: str, ylabel: str, logx=True, logy=True):
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    return fig, ax


def plot_osu(d: dict):
    fig, ax = _axes(f"Alltoallv, {d['world_size']} ranks, nodes {d['node_sizes']}"
                    + (" (uneven)" if d.get("uneven") else ""), "block size [B]", "latency [us]")
    sizes = [r["size"] for r in d["results"]]
    for col in ("flat", "hier", "auto", "naive"):
        ax.plot(sizes, [r[col]["avg_us"] for r in d["results"]], marker="o", label=col)
    return fig, ax


def plot_pack(d: dict):
    fig, ax = _axes("pack kernel throughput", "block size [B]", "GB/s", logy=False)
    sizes = [r["block_bytes"] for r in d["results"]]
    for k, label in (("hxmpi", "hxmpi copy_blocks"), ("fancy", "numpy fancy index"), ("memcpy", "contiguous copy")):
        ax.plot(sizes, [r[f"{k}_gbps"] for r in d["results"]], marker="o", label=label)
    return fig, ax


def plot_calibrate(d: dict):
    lay = d["layout"]
    fig, ax = _axes(f"cost model vs measured, {lay['nodes']} nodes x {lay['per_node']}",
                    "block size [B]", "time per call [us]")
    for algo in ("flat", "hier"):
        rows = [r for r in d["rows"] if r["algorithm"] == algo]
        line, = ax.plot([r["block"] for r in rows], [r["measured_us"] for r in rows], marker="o",
                        label=f"{algo} measured")
        ax.plot([r["block"] for r in rows], [r["model_us"] for r in rows], ls="--", color=line.get_color(),
                label=f"{algo} model")
    return fig, ax


def plot_train(d: dict):
    fig, ax = _axes(f"MLP on digits, {d['world_size']} ranks", "epoch", "train loss", logx=False)
    for name, r in d["results"].items():
        ax.plot(range(1, len(r["train_loss"]) + 1), r["train_loss"], marker="o", label=name)
    return fig, ax


def plot_staging(d: dict):
    fig, ax = _axes(f"staging at {d['args']['bandwidth']:g} MB/s, {d['world_size']} ranks", "", "seconds",
                    logx=False, logy=False)
    rows = d["results"]
    x = range(len(rows))
    for i, (key, label) in enumerate((("time_to_first_batch_s", "time to first batch"),
                                      ("data_wait_s", "waiting for data"), ("wall_s", "wall time"))):
        ax.bar([j + (i - 1) * 0.27 for j in x], [r[key] for r in rows], width=0.27, label=label)
    ax.set_xticks(list(x), [r["mode"] for r in rows])
    return fig, ax


PLOTTERS = {"osu_alltoallv": plot_osu, "pack": plot_pack, "calibrate": plot_calibrate, "train": plot_train,
            "staging": plot_staging}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", help="benchmark JSON files")
    p.add_argument("--out-dir", default=None, help="where to write PNGs (default: beside each JSON)")
    args = p.parse_args(argv)
    try:
        import matplotlib
    except ImportError:
        print("plot.py: needs matplotlib: pip install -e '.[bench]'", file=sys.stderr)
        return 2
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    for name in args.files:
        path = Path(name)
        data = json.loads(path.read_text())
        kind = data.get("benchmark")
        if kind not in PLOTTERS:
            print(f"plot.py: skipping {path} (benchmark {kind!r} has no plot)", file=sys.stderr)
            continue
        fig, ax = PLOTTERS[kind](data)
        ax.legend()
        fig.tight_layout()
        out = Path(args.out_dir or path.parent) / (path.stem + ".png")
        fig.savefig(out, dpi=100)
        plt.close(fig)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())  # not an MPI program: importing hxmpi here would initialise MPI for nothing
