"""Fault matrix, staging under MPI (issue 13): a store whose shards disagree with its index, a
server dying mid-body, and a cache directory that a live run holds. Each must end in the same
clear error on every rank, never in silent zeros, dropped samples or a hang."""
import numpy as np
import pytest
from support import fresh_dir, injected, rewrite_shard, serve_store

from hxmpi.data.lock import CacheDirBusy
from hxmpi.data.sources import FetchError
from hxmpi.data.store import StoreError, load_shard
from hxmpi.train.command import Trainer, parse_config

pytestmark = pytest.mark.mpi
BAD = 1  # the train shard each faulty store damages


def _damage(kind):
    def prepare(root, index):
        import json
        shard = index["splits"]["train"]["shards"][BAD]
        X, y = (np.array(a) for a in load_shard(str(root), shard))
        X, y = {"rows": (X[:-7], y[:-7]), "features": (X[:, :-1], y)}[kind]
        rewrite_shard(root, index, shard, X, y)
        (root / "index.json").write_text(json.dumps(index))
    return prepare


@pytest.fixture(scope="module")
def short_store():
    """Shard 1 holds 7 rows fewer than the index says (sizes and checksums fit the short file)."""
    yield from serve_store(6, 2.0, _damage("rows"))


@pytest.fixture(scope="module")
def narrow_store():
    """Shard 1 holds 11 features where the index says 12."""
    yield from serve_store(7, 2.0, _damage("features"))


@pytest.fixture(scope="module")
def good_store():
    yield from serve_store(8, 2.0)


def args(url, cache, *extra):
    return parse_config(["--quiet", "--dataset", url, "--ranks-per-node", "2", "--cache-dir", cache,
                         "--epochs", "1", "--update", "sync", *extra])


def shard_url(url, n=BAD):
    return rf"shard train-{n:05d} \({url}/train-{n:05d}-x.npy\)"


DAMAGE = {"short": r"holds \d+ rows, the index says \d+", "narrow": r"features \(11,\), the index says \(12,\)"}


@pytest.mark.watchdog(90)
@pytest.mark.parametrize("store", DAMAGE)
def test_bad_shard_in_memory_mode_fails_naming_it(comm, request, store):
    """Before: a short shard left rows of zeros labelled 0 in the node window; a narrow one made the
    node leader's copy into the window raise alone (after the ranks had agreed on the window), and
    every other rank waited in the node barrier forever."""
    _, url, _ = request.getfixturevalue(f"{store}_store")
    with pytest.raises(StoreError, match=rf"{shard_url(url)}: {DAMAGE[store]}"):
        Trainer(args(url, fresh_dir(comm), "--staging", "memory"), comm)


@pytest.mark.watchdog(90)
@pytest.mark.parametrize("store", DAMAGE)
def test_bad_shard_in_distributed_mode_fails_naming_it(comm, request, store):
    """Before: a short shard's rows were silently dropped from every epoch; a narrow one gave a
    "row bytes" mismatch from the shuffle that named no shard."""
    _, url, _ = request.getfixturevalue(f"{store}_store")
    t = Trainer(args(url, fresh_dir(comm), "--staging", "distributed"), comm)
    with pytest.raises(FetchError, match=rf"{shard_url(url)}: {DAMAGE[store]}"):
        t.run()


@pytest.mark.watchdog(90)
def test_server_dying_mid_body_fails_distributed_staging_on_every_rank(comm, good_store):
    server, url, _ = good_store
    name = "train-00002-x.npy"
    with injected(comm, server, name, ["die"] * 50):
        t = Trainer(args(url, fresh_dir(comm), "--staging", "distributed", "--retries", "1", "--timeout", "5"),
                    comm)
        # Before: IncompleteRead killed the download thread and the job hung.
        with pytest.raises(FetchError, match=rf"{name} from {url}/{name}: IncompleteRead"):
            t.run()


@pytest.mark.watchdog(90)
def test_server_dying_mid_body_is_retried_in_memory_mode(comm, good_store):
    server, url, _ = good_store
    with injected(comm, server, "train-00003-y.npy", ["die"]):
        t = Trainer(args(url, fresh_dir(comm), "--staging", "memory"), comm)
    assert t.staging_info["retries"] >= 1
    assert t.run()["test_accuracy"] > 0.5


@pytest.mark.watchdog(90)
def test_cache_dir_of_a_live_run_is_refused_on_every_rank(comm, good_store):
    _, url, _ = good_store
    cache = fresh_dir(comm)
    first = Trainer(args(url, cache, "--staging", "distributed"), comm)
    # Before: the second run adopted or deleted the first one's shards (and a memory-mode run
    # beside distributed ones hung).
    for mode in ("distributed", "memory"):
        with pytest.raises(CacheDirBusy, match=rf"cache directory {cache}/node\d+ is in use by a live run "
                                               rf"\(pid \d+\)"):
            Trainer(args(url, cache, "--staging", mode), comm)
    first.run()  # releases the directory when its data is closed
    assert Trainer(args(url, cache, "--staging", "memory"), comm).run()["test_accuracy"] > 0.5
