"""Node-local shard cache of distributed staging: prefetch ahead of training, bounded in bytes.

One ``ShardCache`` per node (owned by the node leader; no MPI in here). Training consumes shards
in an order known in advance from the seed (the *use sequence*), which lets the cache

- download the shards of the next ``prefetch`` uses in parallel threads while the current shard is
  being trained on, each file verified by ``fetch_verified`` (temp file, size + sha256, rename);
  while a window is being loaded, only its shard is fetched;
- stay under ``limit`` bytes of local storage: to make room it evicts the cached shard whose next
  use is furthest away (Belady's rule, optimal when the future order is known), and only if that
  use comes after the one being fetched. A shard in use is pinned and never evicted.

Deletes touch only shard files of this store (and their ``.part`` temp files) inside the cache's
own directory, which one live run holds at a time (``data.lock``). A download's bytes count
against ``limit`` from the moment it starts, so its ``.part`` file is inside the bound; ``.part``
files a killed run left behind are removed when the cache starts.

A download thread never dies silently: any error fails its shard, and an error outside a
download marks the whole cache failed; ``acquire`` raises ``FetchError`` either way.
"""
from __future__ import annotations

import bisect
import threading
from pathlib import Path
from typing import Optional, Sequence

from ..schema import check
from .sources import FetchError, FetchStats, Source, fetch_verified
from .store import sha256_file

__all__ = ["ShardCache"]

ABSENT, FETCHING, READY, FAILED = range(4)
NEVER = float("inf")


class ShardCache:
    """Stages ``shards`` (index entries) into ``directory`` ahead of the use sequence ``uses``."""

    def __init__(self, source: Source, shards: Sequence[dict], uses: Sequence[int], directory: str,
                 limit: int, prefetch: int = 2, workers: int = 4, retries: int = 3, timeout: float = 30.0):
        largest = max((shards[s]["bytes"] for s in set(uses)), default=0)
        if limit < largest:
            raise ValueError(f"cache limit {limit} B is below the largest shard ({largest} B); "
                             f"raise cache_limit")
        check("prefetch_shards", prefetch)
        self.source, self.shards, self.uses = source, list(shards), list(uses)
        self.dir, self.limit, self.prefetch = Path(directory), int(limit), int(prefetch)
        self.retries, self.timeout = retries, timeout
        self._positions: dict[int, list[int]] = {}
        for q, s in enumerate(self.uses):
            self._positions.setdefault(s, []).append(q)
        self.state = [ABSENT] * len(self.shards)
        self.error: dict[int, str] = {}
        self.fresh = [False] * len(self.shards)  # downloaded since its last use
        self.pinned: set[int] = set()
        self.pos = 0
        self.loading = True  # between acquire() and release(): a window is being loaded (and first)
        self.used = 0  # bytes on disk or being downloaded
        self.fetch_stats = FetchStats()
        self.stats = {"shards_staged": 0, "bytes_staged": 0, "cache_hits": 0, "evictions": 0,
                      "max_used_bytes": 0}
        self.cond = threading.Condition()
        self.closed = False
        self.crashed: Optional[str] = None  # a download thread failed outside any download
        self.dir.mkdir(parents=True, exist_ok=True)
        self._adopt_existing()
        self.threads = [threading.Thread(target=self._worker, name=f"hxmpi-stage-{i}", daemon=True)
                        for i in range(max(1, workers))]
        for t in self.threads:
            t.start()

    # ------------------------------------------------------------------ bookkeeping (lock held)
    def _files(self, s: int) -> list[Path]:
        return [self.dir / f["name"] for f in self.shards[s]["files"].values()]

    def _next_use(self, s: int, after: int) -> float:
        """Position of the first use of shard ``s`` at or after ``after`` (inf: never)."""
        pos = self._positions.get(s, [])
        i = bisect.bisect_left(pos, after)
        return pos[i] if i < len(pos) else NEVER

    def _adopt_existing(self) -> None:
        """Shards left by an earlier run: verified ones of this node count as cached, the rest go,
        and so do partial downloads (``.NAME.PID.part``) of a run that was killed."""
        for s, shard in enumerate(self.shards):
            for p in self._files(s):
                for part in self.dir.glob(f".{p.name}.*.part"):
                    part.unlink(missing_ok=True)
            files = self._files(s)
            if not any(p.exists() for p in files):
                continue
            ok = s in self._positions and all(
                p.exists() and p.stat().st_size == f["bytes"] and sha256_file(p) == f["sha256"]
                for p, f in zip(files, shard["files"].values(), strict=True))
            if ok:
                self.state[s] = READY
                self.used += shard["bytes"]
            else:  # not needed on this node, or not intact: never used, so not kept
                for p in files:
                    p.unlink(missing_ok=True)
        self._make_room(0, -1)  # an earlier, larger cache shrinks to this run's limit
        self.stats["max_used_bytes"] = self.used

    def _evict(self, s: int) -> None:
        for p in self._files(s):
            p.unlink(missing_ok=True)
        self.state[s] = ABSENT
        self.used -= self.shards[s]["bytes"]
        self.stats["evictions"] += 1

    def _make_room(self, need: int, use: int) -> bool:
        """Evict (Belady) until ``need`` more bytes fit; only shards next used after position ``use``."""
        while self.used + need > self.limit:
            victims = [(self._next_use(v, self.pos), v) for v in range(len(self.shards))
                       if self.state[v] == READY and v not in self.pinned]
            victims = [(nxt, v) for nxt, v in victims if nxt > use]
            if not victims:
                return False
            self._evict(max(victims)[1])
        return True

    def _pick(self) -> Optional[int]:
        """The next shard to download, in use order within the prefetch horizon, if it fits."""
        # While training waits for a window, only its shard is fetched: the store's bandwidth goes
        # to what is needed now, on this node and on the others (which makes the first batch
        # arrive after one shard per node, not after K + 1).
        horizon = 1 if self.loading else self.prefetch  # pos is the next window once released
        for q in range(self.pos, min(self.pos + horizon, len(self.uses))):
            s = self.uses[q]
            if self.state[s] != ABSENT:
                continue
            if not self._make_room(self.shards[s]["bytes"], q):
                return None  # later shards must not overtake one that is needed sooner
            self.state[s] = FETCHING
            self.used += self.shards[s]["bytes"]
            self.stats["max_used_bytes"] = max(self.stats["max_used_bytes"], self.used)
            return s
        return None

    # ------------------------------------------------------------------ threads
    def _worker(self) -> None:
        try:
            self._work()
        except BaseException as exc:  # noqa: BLE001 - a dead thread must fail the consumer, not hang it
            with self.cond:
                self.crashed = f"download thread {threading.current_thread().name} failed: {type(exc).__name__}: {exc}"
                self.cond.notify_all()

    def _work(self) -> None:
        while True:
            with self.cond:
                job = None
                while not self.closed and (job := self._pick()) is None:
                    self.cond.wait()
                if self.closed:
                    return
            problem, job_stats = None, FetchStats()  # per job: workers run concurrently
            try:
                for f in self.shards[job]["files"].values():
                    fetch_verified(self.source, f, str(self.dir), self.retries, self.timeout, stats=job_stats)
            except (FetchError, OSError) as exc:  # disk full, permissions: reported like fetch errors
                problem = str(exc)
            except Exception as exc:  # noqa: BLE001 - anything else fails this shard, named
                problem = f"shard {self.shards[job].get('name')}: {type(exc).__name__}: {exc}"
            with self.cond:
                self.fetch_stats.add(job_stats)
                if problem:
                    self.state[job] = FAILED
                    self.error[job] = problem
                    self.used -= self.shards[job]["bytes"]
                else:
                    self.state[job] = READY
                    self.fresh[job] = True
                    self.stats["shards_staged"] += 1
                    self.stats["bytes_staged"] += job_stats.bytes
                self.cond.notify_all()

    # ------------------------------------------------------------------ consumer
    def acquire(self, q: int) -> list[Path]:
        """Block until the shard of use ``q`` is staged; pin it and return its file paths."""
        s = self.uses[q]
        with self.cond:
            self.pos = q
            self.loading = True
            self.cond.notify_all()  # with --prefetch-shards 0 nothing is fetched until this wakes a worker
            while self.state[s] not in (READY, FAILED) and self.crashed is None:
                self.cond.wait()
            if self.state[s] != READY and self.crashed is not None:
                raise FetchError(f"{self.dir}: {self.crashed}")
            if self.state[s] == FAILED:
                raise FetchError(self.error[s])
            self.pinned.add(s)
            if not self.fresh[s]:
                self.stats["cache_hits"] += 1
            self.fresh[s] = False
        return self._files(s)

    def seek(self, q: int) -> None:
        """The next use will be ``q`` (a resumed run): prefetch from there."""
        with self.cond:
            self.pos = q
            self.cond.notify_all()

    def release(self, q: int) -> None:
        """The shard of use ``q`` is in memory now: unpin it and let prefetching move past it."""
        with self.cond:
            self.pinned.discard(self.uses[q])
            self.pos = q + 1
            self.loading = False
            self.cond.notify_all()

    def close(self) -> None:
        """Stop the download threads (files stay for a later run)."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        for t in self.threads:
            t.join()
