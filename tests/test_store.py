"""Store format and verified fetching, against a real HTTP server on 127.0.0.1 with injected faults."""
import json
import subprocess
import sys

import numpy as np
import pytest
from support import FaultServer

from hxmpi.data.sources import FetchError, FetchStats, fetch_verified, open_source
from hxmpi.data.store import (
    StoreError,
    capacity,
    load_shard,
    make_synthetic,
    parse_index,
    split_train_test,
    write_store,
)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    X, y = make_synthetic(3000, 16, 4, seed=1)
    index = write_store(str(root), split_train_test(X, y, 0.2, 1), 4, shard_mb=0.05)
    return root, index, X, y


@pytest.fixture
def server(store):
    srv = FaultServer(store[0])
    yield srv
    srv.close()


def shard_files(index, split="train"):
    return [f for s in index["splits"][split]["shards"] for f in s["files"].values()]


def test_store_roundtrip(store, tmp_path):
    root, index, X, y = store
    assert index["splits"]["train"]["samples"] == 2400 and len(index["splits"]["train"]["shards"]) > 3
    assert capacity(index) == sum(s["bytes"] for s in index["splits"]["train"]["shards"])
    parts = [load_shard(str(root), s) for split in ("train", "test") for s in index["splits"][split]["shards"]]
    Xs = np.concatenate([p[0] for p in parts])
    ys = np.concatenate([p[1] for p in parts])
    assert Xs.dtype == np.float32 and Xs.shape == (3000, 16) and ys.dtype == np.int64
    # Every sample is stored once, with its label: same rows as the source, in another order.
    order, src = np.lexsort(Xs.T), np.lexsort(X.T)
    assert np.array_equal(Xs[order], X[src]) and np.array_equal(ys[order], y[src])
    with pytest.raises(StoreError, match="no split"):
        capacity(index, "validation")


def test_synthetic_data_is_learnable():
    X, y = make_synthetic(2000, 8, 3, seed=0)
    centres = np.stack([X[y == c].mean(axis=0) for c in range(3)])
    nearest = np.argmin(((X[:, None, :] - centres[None]) ** 2).sum(-1), axis=1)
    assert (nearest == y).mean() > 0.9


def test_index_errors():
    with pytest.raises(StoreError, match="not JSON"):
        parse_index("{", "x/index.json")
    with pytest.raises(StoreError, match="unsupported format 2"):
        parse_index(json.dumps({"format": 2}))
    with pytest.raises(StoreError, match="missing 'classes'"):
        parse_index(json.dumps({"format": 1, "dtype": "float32", "feature_shape": [2], "splits": {}}))


@pytest.mark.parametrize("kind", ["http", "file", "path"])
def test_fetch_every_shard(store, server, tmp_path, kind):
    root, index, _, _ = store
    location = {"http": server.url, "file": f"file://{root}", "path": str(root)}[kind]
    source = open_source(location)
    assert source.read_index() == index
    stats = FetchStats()
    for f in shard_files(index):
        path = fetch_verified(source, f, str(tmp_path), stats=stats)
        assert path.read_bytes() == (root / f["name"]).read_bytes()
    assert stats.files == len(shard_files(index)) and stats.cache_hits == 0


@pytest.mark.parametrize("faults", [["500", "500"], ["truncate"], ["corrupt", "truncate"], ["slow"]])
def test_faults_are_retried(store, server, tmp_path, faults):
    _, index, _, _ = store
    entry = shard_files(index)[0]
    server.faults[entry["name"]] = list(faults)
    stats = FetchStats()
    path = fetch_verified(open_source(server.url), entry, str(tmp_path), retries=3, timeout=0.5,
                          backoff=0.01, stats=stats)
    assert path.stat().st_size == entry["bytes"]
    assert stats.retries == len(faults) and len(stats.errors) == len(faults)
    assert server.requests[entry["name"]] == len(faults) + 1
    assert not list(tmp_path.glob(".*.part"))


def test_persistent_corruption_names_shard_and_url(store, server, tmp_path):
    _, index, _, _ = store
    entry = shard_files(index)[1]
    server.faults[entry["name"]] = ["corrupt"] * 3
    with pytest.raises(FetchError) as info:
        fetch_verified(open_source(server.url), entry, str(tmp_path), retries=2, backoff=0.01)
    assert entry["name"] in str(info.value) and server.url in str(info.value)
    assert "sha256 mismatch" in str(info.value) and "after 3 attempts" in str(info.value)
    assert not (tmp_path / entry["name"]).exists() and not list(tmp_path.glob(".*.part"))


def test_cached_file_is_reused_and_corrupt_cache_refetched(store, server, tmp_path):
    _, index, _, _ = store
    entry = shard_files(index)[2]
    source = open_source(server.url)
    fetch_verified(source, entry, str(tmp_path))
    stats = FetchStats()
    fetch_verified(source, entry, str(tmp_path), stats=stats)
    assert stats.cache_hits == 1 and server.requests[entry["name"]] == 1
    cached = tmp_path / entry["name"]
    cached.write_bytes(b"\0" + cached.read_bytes()[1:])  # damaged in the cache: fetched again
    fetch_verified(source, entry, str(tmp_path), stats=stats)
    assert server.requests[entry["name"]] == 2 and stats.files == 1


def test_cli_make_convert_info(tmp_path, server):
    run = lambda *a: subprocess.run([sys.executable, "-m", "hxmpi.data", *a], capture_output=True, text=True)
    out = run("make", "--out", str(tmp_path / "s"), "--samples", "500", "--features", "4", "--classes", "3",
              "--shard-mb", "0.01", "--seed", "2")
    assert out.returncode == 0 and "train: 400 samples" in out.stdout
    out = run("convert", "digits", "--out", str(tmp_path / "d"))
    assert out.returncode == 0 and "train: 1438 samples" in out.stdout
    out = run("info", server.url)
    assert out.returncode == 0 and "train: 2400 samples" in out.stdout
    bad = run("make", "--out", str(tmp_path / "b"), "--samples", "10", "--classes", "1")
    assert bad.returncode == 2 and "classes >= 2" in bad.stderr
