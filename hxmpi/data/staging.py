"""Dataset staging policy (source B, first part): memory mode.

Capacity is the train split's bytes from the store's index. Below ``capacity_threshold`` (default:
a quarter of the node's available memory, ``MemAvailable`` in /proc/meminfo) the store goes whole
into node memory: rank 0 reads the index once and broadcasts it; one rank per node (the node
leader) downloads every shard in parallel threads, each verified by size and sha256 into the node
cache directory; the leader then fills one MPI shared-memory window (``Win.Allocate_shared``) and
every rank of the node reads that single copy. Any failure is agreed on collectively and raised on
every rank.

Distributed mode (shards spread over nodes and staged ahead of training) is not built yet: a store
at or above the threshold raises a clear error unless ``staging="memory"`` forces memory mode.
"""
from __future__ import annotations

import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

import numpy as np
from mpi4py import MPI

from ..errors import agree
from . import Dataset
from .sources import FetchError, FetchStats, fetch_verified, open_source
from .store import capacity, load_shard

STAGING_MODES = ("auto", "memory", "distributed")


def default_capacity_threshold() -> int:
    """A quarter of this node's available memory, in bytes (8 GiB where /proc/meminfo is absent)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 // 4
    except OSError:
        pass
    return 8 << 30


def choose_mode(train_bytes: int, threshold: int, forced: str = "auto") -> str:
    """"memory" or "distributed" for a train split of ``train_bytes``."""
    if forced not in STAGING_MODES:
        raise ValueError(f"--staging must be one of {STAGING_MODES}, got {forced!r}")
    if forced != "auto":
        return forced
    return "memory" if train_bytes < threshold else "distributed"


def default_cache_dir() -> str:
    """Per-job node-local directory under $TMPDIR."""
    job = os.environ.get("OMPI_COMM_WORLD_JOBID") or os.environ.get("SLURM_JOB_ID") or str(os.getppid())
    return os.path.join(tempfile.gettempdir(), f"hxmpi-cache-{job}")


class _SharedArrays:
    """numpy arrays laid out in one shared window per node; keeps the window alive."""

    def __init__(self, intra: MPI.Intracomm, shapes: dict[str, tuple], dtypes: dict[str, np.dtype]):
        offsets, total = {}, 0
        for name, shape in shapes.items():
            total = -(-total // 64) * 64  # 64-byte alignment per array
            offsets[name] = total
            total += int(np.prod(shape)) * np.dtype(dtypes[name]).itemsize
        leader = intra.rank == 0
        self.win = MPI.Win.Allocate_shared(max(total, 1) if leader else 0, 1, comm=intra)
        buf, _ = self.win.Shared_query(0)
        raw = np.frombuffer(buf, dtype=np.uint8)
        self.local_bytes = max(total, 1) if leader else 0
        self.arrays = {name: raw[offsets[name]:offsets[name] + int(np.prod(shape)) * np.dtype(dtypes[name]).itemsize]
                       .view(dtypes[name]).reshape(shape) for name, shape in shapes.items()}


def stage(location: str, comm: MPI.Intracomm, intra: MPI.Intracomm, node: int, staging: str = "auto",
          threshold: Optional[int] = None, cache_dir: Optional[str] = None, retries: int = 3,
          timeout: float = 30.0, workers: int = 8) -> tuple[Dataset, dict]:
    """Stage the store at ``location`` for training (collective); returns (dataset, staging record).

    The dataset's arrays are views into the node's shared window.
    """
    if staging not in STAGING_MODES:
        raise ValueError(f"--staging must be one of {STAGING_MODES}, got {staging!r}")
    source = open_source(location)
    problem, index = None, None
    if comm.rank == 0:
        try:
            index = source.read_index(timeout, retries)
        except (FetchError, ValueError) as exc:
            problem = str(exc)
    agree(comm, problem, FetchError)
    index = comm.bcast(index, root=0)
    for split in ("train", "test"):
        if split not in index["splits"]:
            raise FetchError(f"{location}: the store has no {split!r} split")
    threshold = default_capacity_threshold() if threshold is None else threshold
    # Rank 0's threshold for everyone: nodes may differ in free memory, the decision must not.
    threshold = comm.bcast(threshold, root=0)
    mode = choose_mode(capacity(index), threshold, staging)
    if mode == "distributed":
        raise ValueError(f"{location}: train capacity {capacity(index)} B is at or above the threshold "
                         f"{threshold} B, and distributed staging is not available yet; force memory "
                         f"mode with --staging memory, or raise --capacity-threshold")
    stats = FetchStats()
    node_dir = Path(cache_dir or default_cache_dir()) / f"node{node}"
    problem = None
    if intra.rank == 0:
        files = [f for split in ("train", "test") for s in index["splits"][split]["shards"]
                 for f in s["files"].values()]
        try:
            with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
                list(pool.map(lambda f: fetch_verified(source, f, str(node_dir), retries, timeout, stats=stats),
                              files))
        except (FetchError, OSError) as exc:
            problem = str(exc)
    agree(comm, problem, FetchError)

    feature_shape = tuple(index["feature_shape"])
    n = {split: index["splits"][split]["samples"] for split in ("train", "test")}
    shapes = {"X_train": (n["train"], *feature_shape), "y_train": (n["train"],),
              "X_test": (n["test"], *feature_shape), "y_test": (n["test"],)}
    dtypes = {"X_train": np.float32, "y_train": np.int64, "X_test": np.float32, "y_test": np.int64}
    shared = _SharedArrays(intra, shapes, dtypes)
    if intra.rank == 0:
        for split in ("train", "test"):
            lo = 0
            for shard in index["splits"][split]["shards"]:
                X, y = load_shard(str(node_dir), shard)
                shared.arrays[f"X_{split}"][lo:lo + len(y)] = X
                shared.arrays[f"y_{split}"][lo:lo + len(y)] = y
                lo += len(y)
    intra.Barrier()  # the window is filled before anyone reads it
    a = shared.arrays
    dataset = Dataset(location, a["X_train"], a["y_train"], a["X_test"], a["y_test"], int(index["classes"]))
    dataset._shared = shared  # keep the window alive as long as the arrays
    info = {"event": "staging", "mode": "memory", "capacity_bytes": capacity(index), "threshold_bytes": threshold,
            "bytes_downloaded": comm.allreduce(stats.bytes), "files_downloaded": comm.allreduce(stats.files),
            "cache_hits": comm.allreduce(stats.cache_hits), "retries": comm.allreduce(stats.retries),
            "shared_bytes_per_node": comm.allreduce(shared.local_bytes) // max(1, comm.allreduce(
                1 if intra.rank == 0 else 0)),
            "cache_dir": str(node_dir.parent)}
    return dataset, info
