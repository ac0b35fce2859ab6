"""Staging from a real HTTP store: memory mode (one verified download and one shared copy per node),
distributed mode (disjoint shards per node, bounded cache) and the pre-train switch between them."""
import json
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI
from support import fresh_dir, injected, serve_store

from hxmpi.data.sources import FetchError
from hxmpi.train.command import Trainer, parse_config

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def http_store():
    """A well separated store served over HTTP; every rank gets (server or None, url, root)."""
    yield from serve_store(3, 2.0)


def trainer(comm, url, cache, *extra):
    return Trainer(parse_config(["--quiet", "--dataset", url, "--staging", "memory",
                                              "--ranks-per-node", "2", "--cache-dir", cache, "--epochs", "3",
                                              "--update", "sync", *extra]), comm)


def test_memory_mode_one_download_and_one_copy_per_node(comm, http_store, shared_tmp):
    server, url, root = http_store
    cache = str(shared_tmp)
    t = trainer(comm, url, cache)
    nodes = t.hc.topology.num_nodes
    info = t.staging_info
    n_files = len(list(root.glob("*.npy")))
    assert info["mode"] == "memory" and info["files_downloaded"] == nodes * n_files
    shard_requests = comm.bcast({k: v for k, v in server.requests.items() if k.endswith(".npy")}
                                if server else None)
    assert len(shard_requests) == n_files and set(shard_requests.values()) == {nodes}
    # Only node leaders allocate the shared window; the others map the leader's memory.
    expected = t.data.X_train.nbytes + t.data.y_train.nbytes + t.data.X_test.nbytes + t.data.y_test.nbytes
    assert t.data.shared.local_bytes == (0 if t.hc.topology.local_rank else pytest.approx(expected, abs=256))
    X = np.concatenate([np.load(p) for p in sorted(root.glob("train-*-x.npy"))])
    assert np.array_equal(t.data.X_train, X)
    summary = t.run()
    assert summary["test_accuracy"] >= 0.9
    # A second job with the same cache reuses every verified file.
    again = trainer(comm, url, cache)
    assert again.staging_info["files_downloaded"] == 0 and again.staging_info["cache_hits"] == nodes * n_files


def test_corrupt_store_file_fails_on_every_rank(comm, http_store, shared_tmp):
    server, url, root = http_store
    name = "train-00001-x.npy"
    with injected(comm, server, name, ["corrupt"] * 100):
        with pytest.raises(FetchError, match=f"{name} from {url}/{name}: sha256 mismatch"):
            trainer(comm, url, str(shared_tmp), "--retries", "1", "--timeout", "5")


def run_args(url, cache, *extra):
    return parse_config(["--quiet", "--dataset", url, "--ranks-per-node", "2", "--cache-dir", cache,
                                      "--epochs", "3", "--update", "sync", *extra])


def train_requests(server, comm):
    return comm.bcast({k: v for k, v in server.requests.items() if k.startswith("train-")} if server else None)


def test_distributed_mode_disjoint_bounded_and_as_accurate_as_memory(comm, http_store):
    server, url, root = http_store
    index = json.loads((root / "index.json").read_text())
    shards = index["splits"]["train"]["shards"]
    memory = Trainer(run_args(url, fresh_dir(comm), "--staging", "memory"), comm).run()

    # Unbounded: above the threshold auto picks distributed; every train file is fetched exactly
    # once in the whole job, so the nodes hold disjoint parts.
    if server:
        server.requests.clear()
    t = Trainer(run_args(url, fresh_dir(comm), "--capacity-threshold", "1000", "--epochs", "1"), comm)
    assert t.staging_info["mode"] == "distributed"
    nodes = t.hc.topology.num_nodes
    assert sum(t.staging_info["shards_per_node"]) == len(shards)
    sizes = t.staging_info["bytes_per_node"]
    assert max(sizes) - min(sizes) <= max(s["bytes"] for s in shards)
    t.run()
    requests = train_requests(server, comm)
    assert set(requests.values()) == {1} and len(requests) == 2 * len(shards)
    assert nodes == len(t.staging_info["shards_per_node"])

    # Above the threshold and bounded to two shards per node: the limit holds, and the accuracy is
    # memory mode's within 2 points.
    limit = 2 * max(s["bytes"] for s in shards)
    t = Trainer(run_args(url, fresh_dir(comm), "--capacity-threshold", "1000", "--cache-limit", str(limit),
                         "--prefetch-shards", "1"), comm)
    summary = t.run()
    last = [e for e in t.events if e.get("event") == "staging"][-1]
    assert last["mode"] == "distributed" and last["cache_limit_bytes"] == limit
    assert [e for e in t.events if e.get("event") == "epoch"][-1]["staging"]["max_used_bytes"] <= limit
    assert abs(summary["test_accuracy"] - memory["test_accuracy"]) <= 0.02
    assert summary["test_accuracy"] >= 0.9


def test_distributed_mode_progress_is_logged(comm, http_store, tmp_path_factory):
    _, url, root = http_store
    log = comm.bcast(str(tmp_path_factory.mktemp("log") / "run.jsonl") if comm.rank == 0 else None)
    # One shard of room per node: every node with two or more shards must evict.
    limit = max(s["bytes"] for s in json.loads((root / "index.json").read_text())["splits"]["train"]["shards"])
    Trainer(run_args(url, fresh_dir(comm), "--staging", "distributed", "--cache-limit", str(limit),
                     "--log", log), comm).run()
    if comm.rank == 0:
        records = [json.loads(line) for line in open(log)]
        epochs = [r for r in records if r["event"] == "epoch"]
        staged = epochs[-1]["staging"]
        assert staged["max_used_bytes"] <= limit and staged["evictions"] > 0
        shards = json.loads((root / "index.json").read_text())["splits"]["train"]["shards"]
        assert staged["shards_staged"] >= len(shards)
        assert staged["bytes_staged"] > 0 and 0 <= epochs[-1]["data_wait_fraction"] < 1
        assert 0 < records[-1]["time_to_first_batch_s"] and records[-1]["data_wait_s"] == staged["data_wait_s"]


def test_cache_limit_below_largest_shard_is_rejected_on_every_rank(comm, http_store):
    _, url, root = http_store
    largest = max(s["bytes"] for s in json.loads((root / "index.json").read_text())["splits"]["train"]["shards"])
    with pytest.raises(ValueError, match=f"cache_limit {largest - 1} B is below the largest shard \\({largest} B\\)"):
        Trainer(run_args(url, fresh_dir(comm), "--staging", "distributed", "--cache-limit", str(largest - 1)), comm)


def test_corrupt_shard_in_distributed_mode_fails_on_every_rank(comm, http_store):
    server, url, _ = http_store
    name = "train-00002-y.npy"
    with injected(comm, server, name, ["corrupt"] * 100):
        t = Trainer(run_args(url, fresh_dir(comm), "--staging", "distributed", "--retries", "1"), comm)
        with pytest.raises(FetchError, match=f"{name} from {url}/{name}: sha256 mismatch"):
            t.run()


def test_shuffle_none_is_refused_for_distributed_staging(comm, http_store):
    _, url, _ = http_store
    with pytest.raises(ValueError, match="distributed staging needs a global shuffle"):
        Trainer(run_args(url, fresh_dir(comm), "--staging", "distributed", "--shuffle", "none"), comm)


def _small_index(root, index):
    """index-small.json: the same store listing only its first two train shards."""
    train = index["splits"]["train"]
    train["shards"] = train["shards"][:2]
    train["samples"] = sum(s["samples"] for s in train["shards"])
    train["bytes"] = sum(s["bytes"] for s in train["shards"])
    (root / "index-small.json").write_text(json.dumps(index))


@pytest.fixture(scope="module")
def growing_store():
    """A store with overlapping classes (best accuracy ~0.88) whose index, after
    ``first_read_small``, first lists only two train shards, and the full store on later reads."""
    yield from serve_store(4, 1.0, _small_index)


def first_read_small(comm, server):
    if server:
        server.faults["index.json"] = ["as:index-small.json"]
    comm.Barrier()


def test_pretrain_below_target_switches_to_distributed_and_keeps_the_model(comm, growing_store):
    server, url, root = growing_store
    first_read_small(comm, server)
    full = json.loads((root / "index.json").read_text())["splits"]["train"]["samples"]
    # A sleeping rank makes a step last >= 5 ms, so 0.1 s of pre-training ends within the 2nd epoch.
    t = Trainer(run_args(url, fresh_dir(comm), "--pretrain-time", "0.1", "--target-accuracy", "0.99",
                         "--epochs", "4", "--straggle", "0:0.005"), comm)
    params = t.flat.params
    summary = t.run()
    switch = next(e for e in t.events if e["event"] == "staging_decision")
    assert switch["decision"] == "switch to distributed"
    assert switch["train_samples_before"] < switch["train_samples_after"] == full  # the index was re-read
    staging = [e for e in t.events if e["event"] == "staging"]
    assert [s["mode"] for s in staging] == ["memory", "distributed"]
    assert t.events.index(switch) < t.events.index(staging[1])
    epochs = [e for e in t.events if e["event"] == "epoch"]
    expired = [e["epoch"] for e in epochs if e.get("pretrain_expired")]
    assert len(expired) == 1 and expired[0] <= 2 and len(epochs) == 4
    assert t.flat.params is params and summary["test_accuracy"] >= 0.8  # the same model trained on


def test_pretrain_reaching_target_stops(comm, growing_store):
    server, url, _ = growing_store
    first_read_small(comm, server)
    # A target every model meets (accuracy >= 0): the deadline is wall-clock time, so on a busy
    # host it can pass after any number of steps, and a target that needs training (0.3 here
    # before) was missed when it passed early (seen under load). The stop branch is what this
    # tests; the other test takes the switch branch.
    t = Trainer(run_args(url, fresh_dir(comm), "--pretrain-time", "0.5", "--target-accuracy", "0",
                         "--epochs", "50", "--straggle", "0:0.005"), comm)
    summary = t.run()
    decision = next(e for e in t.events if e["event"] == "staging_decision")
    assert decision["decision"] == "stop: target reached" and decision["target"] == 0
    assert summary["stop_reason"] == "target accuracy reached in pre-training" and summary["epochs"] < 50


def test_distributed_resume_is_bit_identical(comm, http_store, tmp_path_factory):
    _, url, _ = http_store
    ckpt = comm.bcast(str(tmp_path_factory.mktemp("ckpt")) if comm.rank == 0 else None)
    common = ["--staging", "distributed", "--epochs", "3", "--cache-limit", "60K"]
    full = Trainer(run_args(url, fresh_dir(comm), *common), comm)
    full.run()
    Trainer(run_args(url, fresh_dir(comm), *common, "--checkpoint", ckpt, "--stop-after", "1"), comm).run()
    second = Trainer(run_args(url, fresh_dir(comm), *common, "--checkpoint", ckpt, "--resume"), comm)
    second.load_checkpoint()
    assert second.start_epoch == 1
    second.run()
    assert np.array_equal(second.flat.params, full.flat.params)


def test_default_cache_directory_is_removed_after_the_run(comm, http_store):
    from hxmpi.data.staging import default_cache_dir
    _, url, _ = http_store
    cfg = parse_config(["--quiet", "--dataset", url, "--ranks-per-node", "2", "--epochs", "1",
                        "--staging", "distributed", "--update", "sync"])
    t = Trainer(cfg, comm)
    where = Path(default_cache_dir()) / f"node{t.hc.topology.node}"
    assert comm.allreduce(where.is_dir(), op=MPI.LAND)
    t.run()
    comm.Barrier()
    assert not where.exists() and not Path(default_cache_dir()).exists()
