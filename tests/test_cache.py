"""Distributed staging's node cache and shard assignment, against a real HTTP store on 127.0.0.1."""
import threading

import numpy as np
import pytest

from hxmpi.data.cache import READY, ShardCache
from hxmpi.data.sources import FetchError, open_source
from hxmpi.data.staging import assign_shards, parse_bytes
from hxmpi.data.store import sha256_file


def belady_misses(uses, sizes, limit):
    """Reference: downloads needed by the optimal offline cache (evict the furthest next use)."""
    cached, misses = set(), 0
    for q, s in enumerate(uses):
        if s in cached:
            continue
        misses += 1
        later = {v: next((i for i in range(q + 1, len(uses)) if uses[i] == v), float("inf")) for v in cached}
        while sum(sizes[v] for v in cached) + sizes[s] > limit:
            victim = max(cached, key=later.get)
            cached.remove(victim)
        cached.add(s)
    return misses


def consume(cache, uses, check=None, start=0):
    for q in range(start, len(uses)):
        paths = cache.acquire(q)
        if check:
            check(q, paths)
        cache.release(q)


@pytest.mark.parametrize("slots", [1, 2, 3])
def test_eviction_is_beladys_optimum_and_respects_the_limit(shop, tmp_path, slots):
    root, shards, server = shop
    uses = [0, 1, 2, 0, 3, 1, 0, 4, 2, 1, 0, 3] * 2
    limit = slots * max(s["bytes"] for s in shards)

    def check(q, paths):  # the bytes handed out are the store's, and the disk stays under the limit
        for p, f in zip(paths, shards[uses[q]]["files"].values(), strict=True):
            assert sha256_file(p) == f["sha256"]
        assert sum(p.stat().st_size for p in tmp_path.glob("train-*.npy")) <= limit

    cache = ShardCache(open_source(server.url), shards, uses, str(tmp_path), limit, prefetch=0, workers=1)
    consume(cache, uses, check)
    cache.close()
    assert cache.stats["shards_staged"] == belady_misses(uses, [s["bytes"] for s in shards], limit)
    assert cache.stats["cache_hits"] == len(uses) - cache.stats["shards_staged"]
    assert cache.stats["max_used_bytes"] <= limit


def test_prefetch_stages_ahead_without_being_asked(shop, tmp_path):
    root, shards, server = shop
    uses = list(range(6))
    cache = ShardCache(open_source(server.url), shards, uses, str(tmp_path), 10**9, prefetch=2, workers=2)
    cache.acquire(0)
    with cache.cond:  # while a window loads, only its shard is fetched
        assert [s for s in uses if cache.state[s] != 0] == [0]
    cache.release(0)
    with cache.cond:  # then the next two uses arrive unasked; use 3 is beyond the horizon
        assert cache.cond.wait_for(lambda: all(cache.state[s] == READY for s in uses[1:3]), timeout=30)
        assert cache.state[3] == 0
    consume(cache, uses, start=1)
    cache.close()
    assert cache.stats["shards_staged"] == 6


def test_cache_below_largest_shard_is_rejected(shop, tmp_path):
    _, shards, server = shop
    largest = max(s["bytes"] for s in shards)
    with pytest.raises(ValueError, match=f"cache limit {largest - 1} B is below the largest shard \\({largest} B\\)"):
        ShardCache(open_source(server.url), shards, [0], str(tmp_path), largest - 1)


def test_earlier_cache_reused_corrupt_and_foreign_files_handled(shop, tmp_path):
    root, shards, server = shop
    src = open_source(server.url)
    cache = ShardCache(src, shards, [0, 1, 2], str(tmp_path), 10**9, workers=2)
    consume(cache, [0, 1, 2])
    cache.close()
    (tmp_path / shards[1]["files"]["x"]["name"]).write_bytes(b"garbage")  # damaged since
    (tmp_path / "notes.txt").write_text("not ours")
    store_before = {p.name: sha256_file(p) for p in root.iterdir()}
    # Shard 2 is not used by this run: it is dropped to make room; a damaged shard 1 is re-fetched.
    limit = 2 * max(s["bytes"] for s in shards)
    again = ShardCache(src, shards, [0, 1, 3], str(tmp_path), limit, prefetch=0, workers=1)
    consume(again, [0, 1, 3])
    again.close()
    assert again.stats["cache_hits"] == 1 and again.stats["shards_staged"] == 2
    assert (tmp_path / "notes.txt").read_text() == "not ours"
    assert not (tmp_path / shards[2]["files"]["x"]["name"]).exists()
    assert {p.name: sha256_file(p) for p in root.iterdir()} == store_before


def test_failed_shard_raises_with_name_and_url(shop, tmp_path):
    root, shards, server = shop
    name = shards[1]["files"]["y"]["name"]
    server.faults[name] = ["500"] * 10
    cache = ShardCache(open_source(server.url), shards, [0, 1], str(tmp_path), 10**9, retries=1, workers=1)
    try:
        cache.acquire(0)
        cache.release(0)
        with pytest.raises(FetchError, match=f"{name} from {server.url}/{name}: HTTPError.*after 2 attempts"):
            cache.acquire(1)
    finally:
        cache.close()
        server.faults[name] = []


def test_parallel_consumers_never_see_a_partial_file(shop, tmp_path):
    """Workers download while the consumer reads: every handed-out file is complete."""
    root, shards, server = shop
    uses = list(range(len(shards))) * 3
    server.faults.update({shards[3]["files"]["x"]["name"]: ["slow", "truncate"]})
    cache = ShardCache(open_source(server.url), shards, uses, str(tmp_path),
                       3 * max(s["bytes"] for s in shards), prefetch=2, workers=3)
    seen = []
    t = threading.Thread(target=consume, args=(cache, uses, lambda q, p: seen.append(np.load(p[1]).shape)))
    t.start()
    t.join(120)
    cache.close()
    assert not t.is_alive() and seen == [(s["samples"],) for s in (shards[u] for u in uses)]


def test_assignment_is_disjoint_and_balanced_by_bytes():
    rng = np.random.default_rng(0)
    for nodes in (1, 2, 3, 5, 8):
        sizes = list(rng.integers(1, 1000, 23))
        parts = assign_shards(sizes, nodes)
        assert sorted(s for p in parts for s in p) == list(range(23))
        loads = [sum(sizes[s] for s in p) for p in parts]
        assert max(loads) - min(loads) <= max(sizes)
    assert assign_shards([5, 5], 3) == [[0], [1], []]  # more nodes than shards: some hold none


def test_parse_bytes():
    assert parse_bytes("1000") == 1000
    assert parse_bytes("64M") == 64 << 20
    assert parse_bytes("1.5GiB") == 3 << 29
    assert parse_bytes("2k") == 2048
    with pytest.raises(ValueError, match="expected a size like"):
        parse_bytes("lots")


def test_cache_limit_defaults_and_refusals(tmp_path):
    from hxmpi.data.staging import cache_limit
    assert cache_limit(None, [30, 50], 80, tmp_path) == (80, None)  # all of this node's shards
    assert cache_limit(None, [], 80, tmp_path) == (0, None)  # a node without shards needs no room
    assert cache_limit(100, [30], 80, tmp_path) == (100, None)
    limit, problem = cache_limit(79, [30], 80, tmp_path)
    assert problem == "cache_limit 79 B is below the largest shard (80 B) of the store"
    limit, problem = cache_limit(None, [1 << 62], 1 << 62, tmp_path)  # more than any disk holds
    assert problem.startswith(f"{tmp_path} has room for ") and "free space or set cache_dir" in problem
