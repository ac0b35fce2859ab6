"""Fault matrix, data side (issue 13): dying HTTP bodies, dead staging threads, stale partial files,
shards that disagree with their index, shared cache directories and bad fetch settings.

Serial tests, against a real HTTP server on 127.0.0.1 (tests/test_store.py's FaultServer).
"""
import re
import subprocess
import sys
import threading

import numpy as np
import pytest
from support import rewrite_shard

from hxmpi.data.cache import ShardCache
from hxmpi.data.sources import FetchError, FetchStats, fetch_verified, open_source
from hxmpi.data.staging import StagingConfig
from hxmpi.data.store import load_shard, make_synthetic, write_store


@pytest.fixture(scope="module")
def store(shop):
    """conftest's shop store behind a real HTTP server: (root, train shards, server)."""
    return shop


@pytest.mark.watchdog(60)
def test_dying_chunked_body_is_retried(store, tmp_path):
    root, shards, server = store
    entry = shards[0]["files"]["x"]
    server.faults[entry["name"]] = ["die", "die"]
    stats = FetchStats()
    path = fetch_verified(open_source(server.url), entry, str(tmp_path), retries=3, timeout=5, backoff=0.01,
                          stats=stats)
    assert path.read_bytes() == (root / entry["name"]).read_bytes()
    assert stats.retries == 2 and all("IncompleteRead" in e for e in stats.errors)
    assert not list(tmp_path.glob(".*.part"))


@pytest.mark.watchdog(60)
def test_dying_body_every_time_names_file_and_url(store, tmp_path):
    _, shards, server = store
    entry = shards[1]["files"]["y"]
    server.faults[entry["name"]] = ["die"] * 3
    with pytest.raises(FetchError, match=rf"{entry['name']} from {server.url}/{entry['name']}: IncompleteRead"):
        fetch_verified(open_source(server.url), entry, str(tmp_path), retries=2, timeout=5, backoff=0.01)
    assert not list(tmp_path.iterdir())


def _acquire_in_thread(cache, q, seconds=20):
    """cache.acquire(q) with a deadline: returns the exception it raised (None if it returned)."""
    box = {}

    def run():
        try:
            cache.acquire(q)
            box["error"] = None
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            box["error"] = exc
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "acquire() still blocked: a dead download thread hung the consumer"
    return box["error"]


@pytest.mark.watchdog(60)
def test_dead_download_thread_fails_the_consumer(store, tmp_path):
    _, shards, server = store
    shards = [dict(s) for s in shards[:2]]
    # An entry the download code cannot handle (no size): the worker thread meets a KeyError.
    shards[1] = {**shards[1], "files": {k: {"name": f["name"], "sha256": f["sha256"]}
                                        for k, f in shards[1]["files"].items()}}
    cache = ShardCache(open_source(server.url), shards, [0, 1], str(tmp_path), limit=10**9, prefetch=0, workers=1)
    try:
        assert _acquire_in_thread(cache, 0) is None
        cache.release(0)
        error = _acquire_in_thread(cache, 1)
        assert isinstance(error, FetchError) and "KeyError" in str(error) and shards[1]["name"] in str(error)
    finally:
        cache.close()


@pytest.mark.watchdog(60)
def test_stale_part_files_are_removed_and_counted(store, tmp_path):
    _, shards, server = store
    # Partial downloads of a killed run: they hold disk that the limit must see until they go.
    stale = [tmp_path / f".{shards[0]['files']['x']['name']}.4242.part", tmp_path / f".{shards[1]['files']['y']['name']}.7.part"]
    for p in stale:
        p.write_bytes(b"\0" * 100)
    other = tmp_path / "notes.txt"  # not ours: left alone
    other.write_text("keep")
    cache = ShardCache(open_source(server.url), shards, [0, 1], str(tmp_path), limit=10**9, prefetch=0, workers=1)
    cache.close()
    assert not any(p.exists() for p in stale) and other.read_text() == "keep"


@pytest.mark.parametrize("fault,message", [
    ("rows", r"holds 5 rows, the index says \d+"),
    ("features", r"features \(5,\), the index says \(6,\)"),
    ("dtype", r"features are float64, the index says float32"),
    ("labels", r"label 7 outside \[0, 3\)"),
    ("label_dtype", r"labels are int32, the index says int64"),
])
def test_check_shard_names_shard_and_url(tmp_path, fault, message):
    from hxmpi.data.store import check_shard
    X, y = make_synthetic(800, 6, 3, seed=1)
    index = write_store(str(tmp_path), {"train": (X, y)}, 3, shard_mb=0.01)
    shard = index["splits"]["train"]["shards"][1]
    Xs, ys = (np.array(a) for a in load_shard(str(tmp_path), shard))
    Xs, ys = {"rows": (Xs[:5], ys[:5]), "features": (Xs[:, :5], ys), "dtype": (Xs.astype(np.float64), ys),
              "labels": (Xs, np.where(np.arange(len(ys)) == 3, 7, ys)), "label_dtype": (Xs, ys.astype(np.int32))}[fault]
    rewrite_shard(tmp_path, index, shard, Xs, ys)
    assert check_shard(*load_shard(str(tmp_path), index["splits"]["train"]["shards"][0]), index,
                       index["splits"]["train"]["shards"][0], "URL") is None
    url = f"http://store/{shard['files']['x']['name']}"
    problem = check_shard(*load_shard(str(tmp_path), shard), index, shard, url)
    assert re.fullmatch(rf"shard {shard['name']} \({url}\): {message}", problem or ""), problem


@pytest.mark.watchdog(60)
def test_cache_dir_held_by_a_live_run_is_refused(tmp_path):
    from hxmpi.data.lock import CacheDirBusy, hold_cache_dir
    held = hold_cache_dir(tmp_path / "node0")
    try:
        with pytest.raises(CacheDirBusy, match=rf"{tmp_path / 'node0'} is in use by a live run \(pid \d+\)"):
            hold_cache_dir(tmp_path / "node0")
        # Another process too (flock is per open file, so this is what a second job sees).
        code = ("import sys; from hxmpi.data.lock import hold_cache_dir, CacheDirBusy\n"
                f"try: hold_cache_dir({str(tmp_path / 'node0')!r})\n"
                "except CacheDirBusy as e: print(e); sys.exit(3)")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 3 and "in use by a live run" in proc.stdout
        other = hold_cache_dir(tmp_path / "node1")  # another node's directory is free
        other.release()
    finally:
        held.release()
    hold_cache_dir(tmp_path / "node0").release()  # released: free again


def test_bad_fetch_settings_are_refused():
    with pytest.raises(ValueError, match="retries must be >= 0"):
        StagingConfig(retries=-1)
    with pytest.raises(ValueError, match="timeout must be > 0"):
        StagingConfig(timeout=0)
    with pytest.raises(ValueError, match="retries must be >= 0"):
        fetch_verified(open_source("/nonexistent"), {"name": "a", "bytes": 1, "sha256": "0"}, "/tmp", retries=-1)


def test_data_cli_info_shows_features_classes_dtype(tmp_path):
    run = lambda *a: subprocess.run([sys.executable, "-m", "hxmpi.data", *a], capture_output=True, text=True,
                                    timeout=120)
    out = run("make", "--out", str(tmp_path / "s"), "--samples", "600", "--features", "5", "--classes", "3",
              "--shard-mb", "0.01")
    assert out.returncode == 0, out.stderr
    info = run("info", str(tmp_path / "s"))
    assert info.returncode == 0
    assert "features (5,), 3 classes, float32 features, int64 labels" in info.stdout, info.stdout


@pytest.mark.watchdog(240)
def test_default_synthetic_store_shows_learning_over_epochs(tmp_path):
    """issue 15: `make`'s defaults are not learnt in one epoch (they were: test accuracy 1.0 at epoch 1)."""
    import json
    out = subprocess.run([sys.executable, "-m", "hxmpi.data", "make", "--out", str(tmp_path / "s")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    log = tmp_path / "log.jsonl"
    run = subprocess.run([sys.executable, "-m", "hxmpi.train", "--dataset", str(tmp_path / "s"), "--epochs", "6",
                          "--quiet", "--log", str(log), "--cache-dir", str(tmp_path / "cache")],
                         capture_output=True, text=True, timeout=200)
    assert run.returncode == 0, run.stderr
    acc = [r["test_accuracy"] for r in map(json.loads, log.read_text().splitlines()) if r.get("event") == "epoch"]
    assert acc[0] < 0.85 and acc[-1] > acc[0] + 0.05, acc
