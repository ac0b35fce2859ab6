"""Memory-mode staging from a real HTTP store: one verified download per node, one shared copy per node."""
import tempfile
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

from hxmpi.data.sources import FetchError
from hxmpi.data.store import make_synthetic, split_train_test, write_store
from hxmpi.train import Trainer, build_parser
from test_store import FaultServer

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def http_store():
    """Rank 0 writes a store and serves it over HTTP on 127.0.0.1; every rank gets the URL."""
    comm = MPI.COMM_WORLD
    server, root = None, None
    if comm.rank == 0:
        root = Path(tempfile.mkdtemp(prefix="hxmpi-store-"))
        X, y = make_synthetic(3000, 12, 4, seed=3, separation=2.0)
        write_store(str(root), split_train_test(X, y, 0.2, 3), 4, shard_mb=0.02)
        server = FaultServer(root)
    url, root = comm.bcast((server.url if server else None, str(root) if root else None), root=0)
    yield server, url, Path(root)
    comm.Barrier()
    if server:
        server.close()


def trainer(comm, url, cache, *extra):
    return Trainer(build_parser().parse_args(["--quiet", "--dataset", url, "--staging", "memory",
                                              "--ranks-per-node", "2", "--cache-dir", cache, "--epochs", "3",
                                              "--update", "sync", *extra]), comm)


def test_memory_mode_one_download_and_one_copy_per_node(comm, http_store):
    server, url, root = http_store
    cache = comm.bcast(tempfile.mkdtemp(prefix="hxmpi-cache-") if comm.rank == 0 else None)
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
    assert t.data._shared.local_bytes == (0 if t.hc.topology.local_rank else pytest.approx(expected, abs=256))
    X = np.concatenate([np.load(p) for p in sorted(root.glob("train-*-x.npy"))])
    assert np.array_equal(t.data.X_train, X)
    summary = t.run()
    assert summary["test_accuracy"] >= 0.9
    # A second job with the same cache reuses every verified file.
    again = trainer(comm, url, cache)
    assert again.staging_info["files_downloaded"] == 0 and again.staging_info["cache_hits"] == nodes * n_files


def test_corrupt_store_file_fails_on_every_rank(comm, http_store):
    server, url, root = http_store
    name = "train-00001-x.npy"
    if server:
        server.faults[name] = ["corrupt"] * 100
    comm.Barrier()
    cache = comm.bcast(tempfile.mkdtemp(prefix="hxmpi-cache-") if comm.rank == 0 else None)
    with pytest.raises(FetchError, match=f"{name} from {url}/{name}: sha256 mismatch"):
        trainer(comm, url, cache, "--retries", "1", "--timeout", "5")
    comm.Barrier()
    if server:
        server.faults[name] = []


def test_capacity_above_threshold_needs_distributed_mode(comm, http_store):
    _, url, _ = http_store
    with pytest.raises(ValueError, match="distributed staging is not available yet"):
        Trainer(build_parser().parse_args(["--quiet", "--dataset", url, "--capacity-threshold", "1000"]), comm)
