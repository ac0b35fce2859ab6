"""Train on your own array data: save features and labels as .npy files (or take them from an
.npz), open them memory-mapped, write them as an hxmpi store, and train on it with the same
settings as ``python -m hxmpi.train --dataset STORE``. The summary is printed as JSON.

Run: mpirun -np 4 python -m mpi4py examples/train_own_data.py [WORKDIR]
"""
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

import hxmpi  # noqa: F401  (first: see the how-to on routing mpi4py code)
from mpi4py import MPI
from hxmpi.data.store import write_store
from hxmpi.train.command import main

comm = MPI.COMM_WORLD
work = None
if comm.rank == 0:
    work = Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="hxmpi-own-"))
    work.mkdir(parents=True, exist_ok=True)
    # Your data: here two Gaussian blobs per class in 16 features, 3 classes, 3000 samples.
    rng = np.random.default_rng(0)
    centres = rng.normal(scale=3.0, size=(6, 16))
    which = rng.integers(0, 6, 3000)
    np.save(work / "features.npy", (centres[which] + rng.normal(size=(3000, 16))).astype(np.float32))
    np.save(work / "labels.npy", which % 3)
    # Arrays on disk open memory-mapped: nothing is read into memory until it is written out.
    X = np.load(work / "features.npy", mmap_mode="r")  # with an .npz: np.load(f)["X"]
    y = np.load(work / "labels.npy", mmap_mode="r")
    split = 2400  # the first 2400 samples train, the rest test
    write_store(str(work / "store"), {"train": (X[:split], y[:split]), "test": (X[split:], y[split:])},
                classes=3, shard_mb=0.05)
work = comm.bcast(str(work) if work else None)  # every rank trains from the same store

# The same settings as: python -m hxmpi.train --dataset STORE --epochs 5 --quiet --log LOG
log = f"{work}/run.jsonl"
rc = main(["--dataset", f"{work}/store", "--epochs", "5", "--quiet", "--log", log])
assert rc == 0
if comm.rank == 0:
    summary = json.loads(Path(log).read_text().splitlines()[-1])
    print("test_accuracy", round(summary["test_accuracy"], 3))
    print("train own data ok" if summary["test_accuracy"] > 0.8 else "accuracy too low")
