"""``python -m hxmpi.data``: write datasets in the store format.

    python -m hxmpi.data make --out DIR [--samples N --features F --classes C --shard-mb M --seed S ...]
    python -m hxmpi.data convert digits --out DIR
    python -m hxmpi.data info DIR_OR_URL
"""
from __future__ import annotations

import argparse
import sys

from . import load_digits
from .sources import FetchError, open_source
from .store import StoreError, capacity, make_synthetic, split_train_test, write_store


def main(argv=None) -> int:
    """Entry point; returns the exit code."""
    p = argparse.ArgumentParser(prog="python -m hxmpi.data", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make", help="write a learnable synthetic dataset (Gaussian clusters)")
    mk.add_argument("--out", required=True, help="store directory to write")
    mk.add_argument("--samples", type=int, default=20000, help="samples in total (train + test)")
    mk.add_argument("--features", type=int, default=64, help="features per sample")
    mk.add_argument("--classes", type=int, default=10, help="classes")
    mk.add_argument("--shard-mb", type=float, default=64.0, help="target shard size, MiB")
    mk.add_argument("--seed", type=int, default=0, help="seed")
    mk.add_argument("--test-fraction", type=float, default=0.2, help="fraction held out as the test split")
    mk.add_argument("--separation", type=float, default=3.5,
                    help="distance scale of the cluster centres in units of the noise (lower is harder)")
    mk.add_argument("--clusters-per-class", type=int, default=4,
                    help="Gaussian clusters per class (1: linearly separable classes, learnt in one epoch)")
    mk.add_argument("--informative", type=int, default=6,
                    help="features that carry the cluster centres; the rest are noise")
    cv = sub.add_parser("convert", help="write a bundled dataset in the store format")
    cv.add_argument("name", choices=["digits"], help="bundled dataset")
    cv.add_argument("--out", required=True, help="store directory to write")
    cv.add_argument("--shard-mb", type=float, default=0.05, help="target shard size, MiB")
    cv.add_argument("--seed", type=int, default=0, help="seed of the train/test split")
    info = sub.add_parser("info", help="print a store's splits, shards and capacity")
    info.add_argument("location", help="store directory or URL")
    args = p.parse_args(argv)
    try:
        if args.cmd == "make":
            X, y = make_synthetic(args.samples, args.features, args.classes, args.seed, args.separation,
                                  args.clusters_per_class, args.informative)
            index = write_store(args.out, split_train_test(X, y, args.test_fraction, args.seed), args.classes,
                                args.shard_mb)
        elif args.cmd == "convert":
            X, y = load_digits()
            index = write_store(args.out, split_train_test(X, y, 0.2, args.seed), 10, args.shard_mb)
        else:
            index = open_source(args.location).read_index()
        print(f"features {tuple(index['feature_shape'])}, {index['classes']} classes, {index['dtype']} features, "
              f"{index.get('label_dtype', 'int64')} labels")
        for split, s in index["splits"].items():
            print(f"{split}: {s['samples']} samples in {len(s['shards'])} shards, {s['bytes']} bytes")
        print(f"capacity (train bytes): {capacity(index)}")
    except (StoreError, FetchError, OSError) as exc:
        print(f"python -m hxmpi.data: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    from ..cli import run_main  # an uncaught error on one rank ends the job
    run_main(main, 'python -m hxmpi.data')
