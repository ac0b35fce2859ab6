"""Dataset staging policy (docs/method.md, section 2): memory mode or distributed mode, chosen by capacity.

Capacity is the train split's bytes from the store's index; rank 0 reads the index once and
broadcasts it (never one request per rank).

- **Memory mode** (capacity below ``threshold``; default a quarter of the node's ``MemAvailable``):
  the node leader downloads every shard in parallel threads, each verified (size, sha256) into the
  node cache directory, then fills one MPI shared-memory window (``Win.Allocate_shared``); every
  rank of the node reads that single copy.
- **Distributed mode**: train shards are assigned to nodes, disjoint and balanced by bytes. An
  epoch runs in *windows*: window t holds the t-th shard (in a per-epoch seeded order) of every
  node. The node leader's ``ShardCache`` stages the node's shards onto local storage ahead of the
  current window (``prefetch`` shards) within ``cache_limit`` bytes; when a window starts, each rank
  of the node reads its slice of the node's shard into memory, and the global shuffle
  (``shuffle.ShardStream``) spreads the window's samples over all ranks. The test split is small
  and evaluated every epoch, so it is held in node shared memory as in memory mode.

Any failure is agreed on collectively and raised on every rank: an index read, a download (any
exception of any download thread), a cache directory another live run holds (``data.lock``), and
every loaded shard whose rows, feature shape, dtypes or labels disagree with the index
(``store.check_shard``, naming the shard and its URL), also while a node's shared window is
being filled after the ranks have agreed on its size.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
from mpi4py import MPI

from ..errors import agree
from ..runlog import Progress
from ..schema import SETTINGS, check, check_fields, default, parse_bytes  # noqa: F401 - parse_bytes: public here too
from . import Dataset
from .cache import ShardCache
from .lock import CacheDirBusy, hold_cache_dir
from .sources import FetchError, FetchStats, Source, fetch_verified, open_source
from .store import StoreError, capacity, check_shard, load_shard

__all__ = ["StagingConfig", "default_capacity_threshold", "choose_mode", "default_cache_dir",
           "assign_shards", "cache_limit", "read_index", "DistributedTrain", "stage"]

STAGING_MODES = SETTINGS["staging"].choices


@dataclass
class StagingConfig:
    """How to stage a store: the staging settings (``hxmpi.schema.SETTINGS`` names them and gives their
    defaults and ranges, checked when this is built); sizes in bytes, times in seconds."""
    staging: str = default("staging")
    capacity_threshold: Optional[int] = default("capacity_threshold")  # memory mode below this train capacity
    cache_dir: Optional[str] = default("cache_dir")
    cache_limit: Optional[int] = default("cache_limit")  # distributed mode: local storage bound per node
    prefetch_shards: int = default("prefetch_shards")  # distributed mode: shards staged ahead of the one in use
    retries: int = default("retries")
    timeout: float = default("timeout")
    fetch_workers: int = default("fetch_workers")
    progress: bool = False  # rank 0 reports download progress on stderr

    def __post_init__(self):
        check_fields(self)


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
    check("staging", forced)
    if forced != "auto":
        return forced
    return "memory" if train_bytes < threshold else "distributed"


def default_cache_dir() -> str:
    """Per-job node-local directory under $TMPDIR."""
    job = os.environ.get("OMPI_COMM_WORLD_JOBID") or os.environ.get("SLURM_JOB_ID") or str(os.getppid())
    return os.path.join(tempfile.gettempdir(), f"hxmpi-cache-{job}")


def assign_shards(sizes: Sequence[int], nodes: int) -> list[list[int]]:
    """Disjoint shard ids per node, balanced by bytes (largest first onto the lightest node)."""
    load, out = [0] * nodes, [[] for _ in range(nodes)]
    for s in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        k = min(range(nodes), key=lambda j: (load[j], j))
        out[k].append(s)
        load[k] += sizes[s]
    return [sorted(ids) for ids in out]


def cache_limit(requested: Optional[int], node_shard_bytes: Sequence[int], largest: int,
                node_dir: Path) -> tuple[int, Optional[str]]:
    """(limit, problem): the requested bound must hold the store's largest shard; by default a node
    keeps all its shards, or 90% of the free disk if that is less (and still holds its largest)."""
    if requested is not None:
        if requested < largest:
            return requested, f"cache_limit {requested} B is below the largest shard ({largest} B) of the store"
        return requested, None
    node_dir.mkdir(parents=True, exist_ok=True)
    room = int(0.9 * shutil.disk_usage(node_dir).free)
    if room < max(node_shard_bytes, default=0):
        return room, (f"{node_dir} has room for {room} B, less than the largest shard of this node "
                      f"({max(node_shard_bytes)} B); free space or set cache_dir elsewhere")
    return min(sum(node_shard_bytes), room), None


def read_index(location: str, comm: MPI.Intracomm, cfg: StagingConfig) -> tuple[Source, dict]:
    """Rank 0 reads the store's index; every rank gets it (collective)."""
    source = open_source(location)
    problem, index = None, None
    if comm.rank == 0:
        try:
            index = source.read_index(cfg.timeout, cfg.retries)
            for split in ("train", "test"):
                if split not in index["splits"]:
                    problem = f"{location}: the store has no {split!r} split"
        except Exception as exc:  # noqa: BLE001 - rank 0 alone must never leave the others waiting
            problem = str(exc) if isinstance(exc, (FetchError, ValueError)) else f"{type(exc).__name__}: {exc}"
    agree(comm, problem, FetchError)
    return source, comm.bcast(index, root=0)


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

    def free(self) -> None:
        """Release the window (collective over the node); the arrays must not be used afterwards."""
        self.arrays = {}
        self.win.Free()


def _fetch_all(source: Source, files: list[dict], node_dir: Path, cfg: StagingConfig, stats: FetchStats,
               report: bool) -> None:
    """Fetch ``files`` in parallel threads, verified; with ``report``, show the bytes downloaded."""
    progress = Progress(sum(f["bytes"] for f in files), "staging", "B", enabled=report)

    def one(f):
        own = FetchStats()  # per file: threads must not update shared counters
        fetch_verified(source, f, str(node_dir), cfg.retries, cfg.timeout, stats=own)
        return own

    with ThreadPoolExecutor(max_workers=cfg.fetch_workers) as pool:
        f_bytes = {pool.submit(one, f): f["bytes"] for f in files}
        for i, fut in enumerate(as_completed(f_bytes), 1):
            own = fut.result()
            stats.add(own)
            # Files from the cache count as done: the bar reaches its total either way.
            progress.update(f_bytes[fut], f"{i}/{len(files)} files, {stats.cache_hits} from cache")
    progress.close()


def _stage_in_memory(source: Source, index: dict, splits: Sequence[str], comm: MPI.Intracomm,
                     intra: MPI.Intracomm, node_dir: Path, cfg: StagingConfig, stats: FetchStats):
    """Leaders download ``splits`` whole and fill the node's shared window (collective)."""
    problem = None
    if intra.rank == 0:
        files = [f for split in splits for s in index["splits"][split]["shards"] for f in s["files"].values()]
        try:
            _fetch_all(source, files, node_dir, cfg, stats, report=cfg.progress and comm.rank == 0)
        except Exception as exc:  # noqa: BLE001 - any thread's failure is this node's, agreed below
            problem = str(exc) if isinstance(exc, OSError) else f"{type(exc).__name__}: {exc}"
    agree(comm, problem, FetchError)
    feature_shape = tuple(index["feature_shape"])
    shapes, dtypes = {}, {}
    for split in splits:
        n = index["splits"][split]["samples"]
        shapes[f"X_{split}"], dtypes[f"X_{split}"] = (n, *feature_shape), np.float32
        shapes[f"y_{split}"], dtypes[f"y_{split}"] = (n,), np.int64
    shared = _SharedArrays(intra, shapes, dtypes)
    problem = _fill(shared, source, index, splits, node_dir) if intra.rank == 0 else None
    try:  # the window is filled (or failed everywhere) before anyone reads it
        agree(comm, problem, StoreError)
    except StoreError:
        shared.free()
        raise
    return shared


def _fill(shared: _SharedArrays, source: Source, index: dict, splits: Sequence[str], node_dir: Path) -> Optional[str]:
    """Copy the staged shards into the node window, each checked against the index; the problem or None."""
    try:
        for split in splits:
            lo = 0
            for shard in index["splits"][split]["shards"]:
                X, y = load_shard(str(node_dir), shard)
                problem = check_shard(X, y, index, shard, source.url(shard["files"]["x"]["name"]))
                if problem:
                    return problem
                shared.arrays[f"X_{split}"][lo:lo + len(y)] = X
                shared.arrays[f"y_{split}"][lo:lo + len(y)] = y
                lo += len(y)
    except Exception as exc:  # noqa: BLE001 - after the agreement on the window: agreed again, never lost
        return f"filling the node's shared window from {node_dir} failed: {type(exc).__name__}: {exc}"
    return None


class DistributedTrain:
    """The train split spread over nodes and streamed window by window (see the module docstring)."""

    def __init__(self, source: Source, index: dict, assignment: list[list[int]], comm: MPI.Intracomm,
                 intra: MPI.Intracomm, node: int, seed: int, epochs: range, node_dir: Path, limit: int,
                 cfg: StagingConfig):
        self.comm, self.intra, self.node, self.num_nodes, self.seed = comm, intra, node, len(assignment), seed
        self.source, self.index = source, index
        self.shards = index["splits"]["train"]["shards"]
        self.feature_shape = tuple(index["feature_shape"])
        self.assignment = assignment  # shard ids per node, from assign_shards
        self.mine = self.assignment[node]
        self.epochs, self.limit = epochs, limit
        self.wait_s = 0.0  # this rank's time blocked on staging
        self.cache = None
        problem = None
        if intra.rank == 0:
            uses = [s for e in epochs for s in self.node_order(node, e)]
            try:
                self.cache = ShardCache(source, self.shards, uses, str(node_dir), limit, cfg.prefetch_shards,
                                        cfg.fetch_workers, cfg.retries, cfg.timeout)
            except Exception as exc:  # noqa: BLE001 - agreed below
                problem = f"node {node}: cannot set up the cache in {node_dir}: {exc}"
        try:
            agree(comm, problem, FetchError)
        except FetchError:
            self.close()  # other nodes' download threads stop too
            raise

    def node_order(self, node: int, epoch: int) -> list[int]:
        """The order in which ``node`` reads its shards in ``epoch`` (seeded)."""
        ids = self.assignment[node]
        return [ids[i] for i in np.random.default_rng([self.seed, epoch, node, 0x5A4D]).permutation(len(ids))]

    def windows(self, epoch: int) -> list[list[Optional[int]]]:
        """Per window, every node's shard id (None once a node has run out of shards)."""
        orders = [self.node_order(k, epoch) for k in range(self.num_nodes)]
        depth = max(map(len, orders), default=0)
        return [[o[t] if t < len(o) else None for o in orders] for t in range(depth)]

    def window_sizes(self, epoch: int) -> list[int]:
        """Samples in each window of ``epoch``."""
        return [sum(self.shards[s]["samples"] for s in w if s is not None) for w in self.windows(epoch)]

    def load(self, epoch: int, t: int, window: list[Optional[int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """This rank's slice of its node's shard in window ``t``: (X, y, window indices) (collective)."""
        s = window[self.node]
        q = (epoch - self.epochs.start) * len(self.mine) + t
        problem, paths = None, None
        t0 = time.perf_counter()
        if s is not None and self.cache is not None:
            try:
                paths = [str(p) for p in self.cache.acquire(q)]
            except FetchError as exc:
                problem = str(exc)
        waited = time.perf_counter() - t0
        problem, paths = self.intra.bcast((problem, paths), root=0)  # the file is there for the node
        empty = np.empty((0, *self.feature_shape), np.float32), np.empty(0, np.int64), np.empty(0, np.int64)
        X, y, idx = empty
        t0 = time.perf_counter()
        if s is not None and problem is None:
            shard = self.shards[s]
            try:
                Xs, ys = np.load(paths[0], mmap_mode="r"), np.load(paths[1], mmap_mode="r")
                problem = check_shard(Xs, ys, self.index, shard, self.source.url(shard["files"]["x"]["name"]))
                if problem is None:
                    n, g, r = len(ys), self.intra.size, self.intra.rank
                    lo, hi = r * n // g, (r + 1) * n // g
                    X, y = np.array(Xs[lo:hi]), np.array(ys[lo:hi], dtype=np.int64)
                    offset = sum(self.shards[w]["samples"] for w in window[:self.node] if w is not None)
                    idx = np.arange(offset + lo, offset + hi, dtype=np.int64)
            except Exception as exc:  # noqa: BLE001 - agreed below
                problem = f"node {self.node}: cannot read staged shard {shard['name']}: {type(exc).__name__}: {exc}"
        # Data wait: the leader blocked on its download plus this rank's read; waiting for peers
        # in the bcast is step-time skew, not data, and is left out.
        self.wait_s += waited + time.perf_counter() - t0
        self.intra.Barrier()  # every rank of the node holds its slice: the file may be evicted
        try:
            agree(self.comm, problem, FetchError)
        except FetchError:
            self.close()
            raise
        # Only now, with the window loaded everywhere, may prefetching take bandwidth again.
        if s is not None and self.cache is not None:
            self.cache.release(q)
        return X, y, idx

    def stats(self) -> dict:
        """Staging counters summed over nodes (collective): shards/bytes staged, hits, evictions."""
        c = self.cache
        summed = ("shards_staged", "bytes_staged", "cache_hits", "evictions")
        total = np.array([c.stats[k] if c else 0 for k in summed] + [c.fetch_stats.retries if c else 0], np.int64)
        self.comm.Allreduce(MPI.IN_PLACE, total, op=MPI.SUM)
        # The fullest node's peak local storage and the slowest rank's wait.
        peak_wait = np.array([c.stats["max_used_bytes"] if c else 0, self.wait_s], np.float64)
        self.comm.Allreduce(MPI.IN_PLACE, peak_wait, op=MPI.MAX)
        peak, wait = peak_wait
        return {**{k: int(v) for k, v in zip(summed, total[:-1], strict=True)}, "retries": int(total[-1]),
                "max_used_bytes": int(peak), "data_wait_s": float(wait)}

    def seek(self, epoch: int) -> None:
        """Training resumes at ``epoch``: stage from its first shard on."""
        if self.cache is not None:
            self.cache.seek((epoch - self.epochs.start) * len(self.mine))

    def close(self) -> None:
        """Stop this node's download threads."""
        if self.cache is not None:
            self.cache.close()


def stage(location: str, comm: MPI.Intracomm, intra: MPI.Intracomm, node: int, num_nodes: int,
          cfg: StagingConfig, seed: int = 0, epochs: range = range(1)) -> tuple[Dataset, dict]:
    """Stage the store at ``location`` for training (collective); returns (dataset, staging record).

    Memory mode: the dataset's arrays are views into the node's shared window. Distributed mode:
    ``dataset.X_train`` is None and ``dataset.train_stream`` streams the train split for ``epochs``.
    """
    t0 = time.perf_counter()
    source, index = read_index(location, comm, cfg)
    # Rank 0's threshold for everyone: nodes may differ in free memory, the decision must not.
    threshold = comm.bcast(default_capacity_threshold() if cfg.capacity_threshold is None else cfg.capacity_threshold, root=0)
    mode = choose_mode(capacity(index), threshold, cfg.staging)
    stats = FetchStats()
    node_dir = Path(cfg.cache_dir or default_cache_dir()) / f"node{node}"
    problem, lock = None, None
    if intra.rank == 0:  # one live run per cache directory (see data.lock)
        try:
            lock = hold_cache_dir(node_dir)
        except OSError as exc:
            problem = str(exc)
    agree(comm, problem, CacheDirBusy)
    shared = None
    try:
        if mode == "distributed":  # a bad limit fails before any download
            shards = index["splits"]["train"]["shards"]
            assignment = assign_shards([s["bytes"] for s in shards], num_nodes)
            limit, problem = cache_limit(cfg.cache_limit, [shards[s]["bytes"] for s in assignment[node]],
                                         max((s["bytes"] for s in shards), default=0), node_dir)
            agree(comm, problem, ValueError)
        splits = ("train", "test") if mode == "memory" else ("test",)
        shared = _stage_in_memory(source, index, splits, comm, intra, node_dir, cfg, stats)
        stream = None
        if mode == "distributed":
            stream = DistributedTrain(source, index, assignment, comm, intra, node, seed, epochs, node_dir, limit,
                                      cfg)
    except BaseException:  # every error above is agreed, so every rank frees the window collectively
        if shared is not None:
            shared.free()
        if lock is not None:
            lock.release()
        raise
    a = shared.arrays
    # The default per-job directory goes when the data does (removed by the node's leader).
    scratch = node_dir if cfg.cache_dir is None and intra.rank == 0 else None
    dataset = Dataset(location, a.get("X_train"), a.get("y_train"), a["X_test"], a["y_test"],
                      int(index["classes"]), n_features=int(np.prod(index["feature_shape"])),
                      train_stream=stream, train_samples=int(index["splits"]["train"]["samples"]),
                      shared=shared, scratch=scratch, lock=lock)
    leaders = comm.allreduce(1 if intra.rank == 0 else 0)
    info = {"event": "staging", "mode": mode, "capacity_bytes": capacity(index), "threshold_bytes": threshold,
            "bytes_downloaded": comm.allreduce(stats.bytes), "files_downloaded": comm.allreduce(stats.files),
            "cache_hits": comm.allreduce(stats.cache_hits), "retries": comm.allreduce(stats.retries),
            "shared_bytes_per_node": comm.allreduce(shared.local_bytes) // max(1, leaders),
            "cache_dir": str(node_dir.parent), "train_samples": dataset.train_samples,
            "train_shards": len(index["splits"]["train"]["shards"]),
            "staging_s": comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)}
    if stream is not None:
        info.update(cache_limit_bytes=comm.allreduce(stream.limit, op=MPI.MIN), prefetch_shards=cfg.prefetch_shards,
                    shards_per_node=[len(ids) for ids in stream.assignment],
                    bytes_per_node=[sum(stream.shards[s]["bytes"] for s in ids) for ids in stream.assignment])
    return dataset, info
