"""The dataset store format: ``index.json`` plus uncompressed ``.npy`` shard pairs.

A store is a directory (or the same tree behind a URL)::

    index.json
    train-00000-x.npy  train-00000-y.npy  ...   features (float32) and labels (int64) per shard
    test-00000-x.npy   test-00000-y.npy   ...

``index.json`` (format 1)::

    {"format": 1, "dtype": "float32", "label_dtype": "int64", "feature_shape": [F], "classes": C,
     "splits": {"train": {"samples": N, "bytes": B, "shards": [
         {"name": "train-00000", "samples": n, "bytes": b,
          "files": {"x": {"name": "train-00000-x.npy", "bytes": ..., "sha256": "..."},
                    "y": {"name": "train-00000-y.npy", "bytes": ..., "sha256": "..."}}}, ...]}, ...}}

``bytes`` counts file bytes (headers included); a split's ``bytes`` is its capacity.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Optional

import numpy as np

from ..errors import HxmpiError

__all__ = ["StoreError", "sha256_file", "write_store", "parse_index", "load_shard", "check_shard",
           "make_synthetic", "split_train_test", "capacity"]

FORMAT_VERSION = 1
INDEX = "index.json"


class StoreError(HxmpiError, ValueError):
    """A malformed store or index."""


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def _save_npy(path: Path, array: np.ndarray) -> dict:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        np.save(fh, array, allow_pickle=False)
    os.replace(tmp, path)
    return {"name": path.name, "bytes": path.stat().st_size, "sha256": sha256_file(path)}


def write_store(out: str, splits: dict[str, tuple[np.ndarray, np.ndarray]], classes: int,
                shard_mb: float = 64.0) -> dict:
    """Write ``splits`` ({name: (X, y)}) as shards of about ``shard_mb`` MiB; returns the index."""
    if shard_mb <= 0:
        raise StoreError(f"shard size must be > 0 MiB, got {shard_mb}")
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    first = next(iter(splits.values()))[0]
    index = {"format": FORMAT_VERSION, "dtype": "float32", "label_dtype": "int64",
             "feature_shape": list(first.shape[1:]), "classes": int(classes), "splits": {}}
    for split, (X, y) in splits.items():
        X = np.ascontiguousarray(X, dtype=np.float32)
        y = np.ascontiguousarray(y, dtype=np.int64)
        if X.shape[0] != y.shape[0] or list(X.shape[1:]) != index["feature_shape"]:
            raise StoreError(f"split {split!r}: X {X.shape} and y {y.shape} do not fit the store")
        row = X[0].nbytes + 8 if X.shape[0] else 1
        per_shard = max(1, int(shard_mb * 2**20 // row))
        shards = []
        for i, lo in enumerate(range(0, max(X.shape[0], 1), per_shard)):
            hi = min(lo + per_shard, X.shape[0])
            name = f"{split}-{i:05d}"
            files = {"x": _save_npy(root / f"{name}-x.npy", X[lo:hi]),
                     "y": _save_npy(root / f"{name}-y.npy", y[lo:hi])}
            shards.append({"name": name, "samples": hi - lo, "files": files,
                           "bytes": files["x"]["bytes"] + files["y"]["bytes"]})
        index["splits"][split] = {"samples": int(X.shape[0]), "bytes": sum(s["bytes"] for s in shards),
                                  "shards": shards}
    tmp = root / (INDEX + ".tmp")
    tmp.write_text(json.dumps(index, indent=1))
    os.replace(tmp, root / INDEX)  # the index appears last: a store with an index is complete
    return index


def parse_index(text: str, where: str = "index.json") -> dict:
    """Parse and check an index; StoreError names the problem and ``where``."""
    try:
        index = json.loads(text)
    except json.JSONDecodeError as exc:
        raise StoreError(f"{where}: not JSON ({exc})") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT_VERSION:
        raise StoreError(f"{where}: unsupported format {index.get('format') if isinstance(index, dict) else None!r}"
                         f" (this hxmpi reads format {FORMAT_VERSION})")
    for key in ("dtype", "feature_shape", "classes", "splits"):
        if key not in index:
            raise StoreError(f"{where}: missing {key!r}")
    for split, info in index["splits"].items():
        listed = sum(int(shard.get("samples", 0)) for shard in info.get("shards", []))
        if listed != info.get("samples"):
            raise StoreError(f"{where}: split {split!r} says {info.get('samples')} samples, its shards {listed}")
        for shard in info.get("shards", []):
            for part in ("x", "y"):
                f = shard.get("files", {}).get(part, {})
                if not {"name", "bytes", "sha256"} <= set(f):
                    raise StoreError(f"{where}: shard {shard.get('name')!r} of {split!r} lacks file {part!r} details")
    return index


def load_shard(directory: str, shard: dict) -> tuple[np.ndarray, np.ndarray]:
    """Memory-map one shard's arrays from a local directory."""
    d = Path(directory)
    return (np.load(d / shard["files"]["x"]["name"], mmap_mode="r"),
            np.load(d / shard["files"]["y"]["name"], mmap_mode="r"))


def check_shard(X: np.ndarray, y: np.ndarray, index: dict, shard: dict, url: str) -> Optional[str]:
    """What is wrong with a loaded shard (X, y) against its index entry, or None if nothing.

    Checks the row count, feature shape, dtypes and label range (reading the labels; memory-mapped
    arrays are fine). The message names the shard and ``url``.
    """
    where = f"shard {shard.get('name')} ({url})"
    want_rows, want_shape = int(shard["samples"]), tuple(index["feature_shape"])
    if X.shape[0] != len(y):
        return f"{where}: holds {X.shape[0]} rows of features but {len(y)} labels"
    if len(y) != want_rows:
        return f"{where}: holds {len(y)} rows, the index says {want_rows}"
    if tuple(X.shape[1:]) != want_shape:
        return f"{where}: features {tuple(X.shape[1:])}, the index says {want_shape}"
    if X.dtype != np.dtype(index["dtype"]):
        return f"{where}: features are {X.dtype}, the index says {index['dtype']}"
    label_dtype = index.get("label_dtype", "int64")
    if y.dtype != np.dtype(label_dtype):
        return f"{where}: labels are {y.dtype}, the index says {label_dtype}"
    if len(y):
        lo, hi = int(y.min()), int(y.max())
        if lo < 0 or hi >= int(index["classes"]):
            return f"{where}: label {lo if lo < 0 else hi} outside [0, {index['classes']})"
    return None


def make_synthetic(samples: int, features: int, classes: int, seed: int, separation: float = 3.0,
                   clusters: int = 1, informative: Optional[int] = None) -> tuple[np.ndarray, np.ndarray]:
    """A learnable set: ``clusters`` Gaussian clusters per class with unit noise, their centres
    ``separation`` apart (in noise units) in the first ``informative`` features (default: all);
    the other features are noise. Several clusters per class in few dimensions make the classes
    not linearly separable, so a model keeps learning over several epochs."""
    if samples < 1 or features < 1 or classes < 2 or clusters < 1:
        raise StoreError(f"need samples >= 1, features >= 1, classes >= 2, clusters >= 1; "
                         f"got {samples}, {features}, {classes}, {clusters}")
    informative = features if informative is None else min(informative, features)
    if informative < 1:
        raise StoreError(f"need informative features >= 1, got {informative}")
    rng = np.random.default_rng(seed)
    centres = np.zeros((classes * clusters, features))
    centres[:, :informative] = rng.standard_normal((classes * clusters, informative)) * separation / np.sqrt(2)
    component = rng.integers(0, classes * clusters, samples)
    y = component % classes
    X = (centres[component] + rng.standard_normal((samples, features))).astype(np.float32)
    return X, y.astype(np.int64)


def split_train_test(X: np.ndarray, y: np.ndarray, test_fraction: float, seed: int,
                     ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{"train": ..., "test": ...} by a seeded permutation."""
    order = np.random.default_rng([seed, 1]).permutation(X.shape[0])
    n_test = int(round(test_fraction * X.shape[0]))
    return {"train": (X[order[n_test:]], y[order[n_test:]]), "test": (X[order[:n_test]], y[order[:n_test]])}


def capacity(index: dict, split: str = "train") -> int:
    """The split's bytes (the staging policy's 'capacity')."""
    try:
        return int(index["splits"][split]["bytes"])
    except KeyError:
        raise StoreError(f"store has no split {split!r}") from None

