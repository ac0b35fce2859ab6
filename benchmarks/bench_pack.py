"""Packing kernel throughput: hxmpi copy_blocks vs numpy fancy indexing vs a contiguous copy.

    python benchmarks/bench_pack.py --total-mb 64 --json pack.json

For each block size, the same number of bytes is gathered from scattered blocks (every other
block of a source twice the size) into one contiguous buffer:
- ``hxmpi``: ``copy_blocks`` (Cython, nogil, memcpy per block);
- ``fancy``: ``src[index]`` with a precomputed int64 byte index (numpy fancy indexing);
- ``memcpy``: ``np.copyto`` of one contiguous buffer of the same size (the bound).
GB/s = bytes moved / best time of ``--repeat`` runs.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
from hxmpi.cli import command_line
from hxmpi.provenance import provenance
from hxmpi.comm._packing import copy_blocks


def best_time(fn, repeat: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(block: int, total: int, repeat: int) -> dict:
    nblocks = max(1, total // block)
    nbytes = nblocks * block
    src = np.random.default_rng(0).integers(0, 256, 2 * nbytes, dtype=np.uint8)
    dst = np.empty(nbytes, np.uint8)
    src_off = np.arange(nblocks, dtype=np.int64) * 2 * block
    dst_off = np.arange(nblocks, dtype=np.int64) * block
    length = np.full(nblocks, block, dtype=np.int64)
    index = (src_off[:, None] + np.arange(block, dtype=np.int64)[None, :]).ravel()
    flat = src[:nbytes]
    out = {"block_bytes": block, "bytes": nbytes}
    out["hxmpi_s"] = best_time(lambda: copy_blocks(src, src_off, dst, dst_off, length), repeat)
    assert np.array_equal(dst, src[index])
    out["fancy_s"] = best_time(lambda: np.take(src, index, out=dst), repeat)
    out["memcpy_s"] = best_time(lambda: np.copyto(dst, flat), repeat)
    for k in ("hxmpi", "fancy", "memcpy"):
        out[f"{k}_gbps"] = nbytes / out[f"{k}_s"] / 1e9
    out["vs_memcpy"] = out["hxmpi_gbps"] / out["memcpy_gbps"]
    out["vs_fancy"] = out["hxmpi_gbps"] / out["fancy_gbps"]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--min", type=int, default=8, help="smallest block, bytes")
    p.add_argument("--max", type=int, default=1 << 20, help="largest block, bytes")
    p.add_argument("--total-mb", type=float, default=64, help="bytes packed per measurement, MiB")
    p.add_argument("--repeat", type=int, default=5, help="timed runs; the best counts")
    p.add_argument("--json", default=None, help="write results here")
    args = p.parse_args(argv)
    total = int(args.total_mb * 2**20)
    sizes = [s for s in (2 ** k for k in range(0, 31)) if args.min <= s <= args.max]
    print("# hxmpi pack benchmark: gather of equal blocks into one buffer")
    print(f"{'# Block [B]':<12}{'hxmpi GB/s':>12}{'fancy GB/s':>12}{'memcpy GB/s':>13}{'x memcpy':>10}{'x fancy':>10}")
    rows = []
    for s in sizes:
        r = measure(s, total, args.repeat)
        rows.append(r)
        print(f"{s:<12d}{r['hxmpi_gbps']:12.2f}{r['fancy_gbps']:12.2f}{r['memcpy_gbps']:13.2f}"
              f"{r['vs_memcpy']:10.2f}{r['vs_fancy']:10.1f}", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"benchmark": "pack", "provenance": provenance(command_line("benchmarks/bench_pack.py")),
                       "total_bytes": total, "results": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    from hxmpi.cli import run_main  # an uncaught error on one rank ends the job
    run_main(main, 'bench_pack.py')
