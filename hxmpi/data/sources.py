"""Where a store lives: a local path, ``file://``, ``http(s)://``, or ``s3://`` (with fsspec + s3fs).

``fetch_verified`` is the one way a shard file reaches node-local storage: it downloads to a temp
file beside the target, checks size and sha256, and only then renames, so a partial or corrupt
file is never used. Every failure of the transport (HTTP errors, timeouts, resets, a body cut off
mid-chunk, whatever a filesystem library raises) and every truncated or wrong file is retried with
exponential backoff; after the last try it raises ``FetchError`` naming the file and its URL. The
temp file is removed on every path out. A target already present with the right checksum is
reused without any request.
"""
from __future__ import annotations

import hashlib
import os
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..errors import HxmpiError
from ..schema import check
from .store import INDEX, parse_index, sha256_file

__all__ = ["FetchError", "FetchStats", "Source", "LocalSource", "HttpSource", "FsspecSource", "open_source",
           "part_name", "fetch_verified"]


class FetchError(HxmpiError, OSError):
    """A file could not be fetched intact after every retry."""


@dataclass
class FetchStats:
    """What fetching did: files and bytes downloaded, cache hits, retries."""
    files: int = 0
    bytes: int = 0
    cache_hits: int = 0
    retries: int = 0
    errors: list = field(default_factory=list)

    def add(self, other: "FetchStats") -> None:
        """Add ``other``'s counters (one thread's downloads) to these."""
        self.files += other.files
        self.bytes += other.bytes
        self.cache_hits += other.cache_hits
        self.retries += other.retries
        self.errors += other.errors


class Source:
    """A store location; ``url(name)`` names a file, ``open(name, timeout)`` streams it."""

    def __init__(self, location: str):
        self.location = location.rstrip("/")

    def url(self, name: str) -> str:
        """Where ``name`` lives, for messages."""
        return f"{self.location}/{name}"

    def open(self, name: str, timeout: float):
        """A binary file object for ``name``."""
        raise NotImplementedError

    def read_index(self, timeout: float = 30.0, retries: int = 3) -> dict:
        """Fetch and parse ``index.json`` (retried like any file; StoreError if it is malformed)."""
        _check_retries(retries)
        last = None
        for attempt in range(retries + 1):
            try:
                with self.open(INDEX, timeout) as fh:
                    text = fh.read().decode()
            except Exception as exc:  # noqa: BLE001 - any transport failure is retried (see module doc)
                last = f"{type(exc).__name__}: {exc}"
                time.sleep(min(2.0, 0.05 * 2 ** attempt))
                continue
            return parse_index(text, self.url(INDEX))
        raise FetchError(f"cannot read {self.url(INDEX)}: {last} (after {retries + 1} attempts)")


class LocalSource(Source):
    """A directory on this machine (plain path or ``file://``)."""

    def __init__(self, location: str):
        path = urllib.parse.urlparse(location).path if location.startswith("file://") else location
        super().__init__(str(Path(path).resolve()))

    def open(self, name: str, timeout: float):
        return open(Path(self.location) / name, "rb")


class HttpSource(Source):
    """An HTTP(S) server holding the store tree."""

    def open(self, name: str, timeout: float):
        return urllib.request.urlopen(self.url(urllib.parse.quote(name)), timeout=timeout)


class FsspecSource(Source):
    """Anything fsspec opens (``s3://`` needs s3fs)."""

    def __init__(self, location: str):
        try:
            import fsspec
        except ImportError:
            raise FetchError(f"{location}: install fsspec (and s3fs for s3://) to read this store") from None
        super().__init__(location)
        self._fsspec = fsspec

    def open(self, name: str, timeout: float):
        return self._fsspec.open(self.url(name), "rb").open()


def open_source(location: str) -> Source:
    """The Source for a path or URL."""
    scheme = urllib.parse.urlparse(location).scheme
    if scheme in ("", "file"):
        return LocalSource(location)
    if scheme in ("http", "https"):
        return HttpSource(location)
    return FsspecSource(location)


def _check_retries(retries: int) -> None:
    check("retries", retries)


def part_name(name: str) -> str:
    """The temp file a download of ``name`` writes (``.NAME.PID.part``), beside the target."""
    return f".{name}.{os.getpid()}.part"


def fetch_verified(source: Source, entry: dict, directory: str, retries: int = 3, timeout: float = 30.0,
                   backoff: float = 0.1, stats: Optional[FetchStats] = None) -> Path:
    """Put the file described by ``entry`` ({name, bytes, sha256}) into ``directory``, verified."""
    _check_retries(retries)
    stats = stats if stats is not None else FetchStats()
    target = Path(directory) / entry["name"]
    if target.exists() and target.stat().st_size == entry["bytes"] and sha256_file(target) == entry["sha256"]:
        stats.cache_hits += 1
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(part_name(target.name))
    try:
        return _download(source, entry, target, tmp, retries, timeout, backoff, stats)
    finally:
        tmp.unlink(missing_ok=True)


def _download(source: Source, entry: dict, target: Path, tmp: Path, retries: int, timeout: float,
              backoff: float, stats: FetchStats) -> Path:
    problem = None
    for attempt in range(retries + 1):
        if attempt:
            stats.retries += 1
            time.sleep(backoff * 2 ** (attempt - 1))
        try:
            h, size = hashlib.sha256(), 0
            with source.open(entry["name"], timeout) as src, open(tmp, "wb") as dst:
                for block in iter(lambda: src.read(1 << 20), b""):
                    h.update(block)
                    size += len(block)
                    if size > entry["bytes"]:
                        break
                    dst.write(block)
            if size != entry["bytes"]:
                problem = f"got {size} bytes, expected {entry['bytes']}"
            elif h.hexdigest() != entry["sha256"]:
                problem = "sha256 mismatch"
            else:
                os.replace(tmp, target)
                stats.files += 1
                stats.bytes += size
                return target
        except Exception as exc:  # noqa: BLE001 - HTTP errors, timeouts, resets, IncompleteRead, fsspec's own
            problem = f"{type(exc).__name__}: {exc}"
        stats.errors.append(problem)
        tmp.unlink(missing_ok=True)
    raise FetchError(f"{entry['name']} from {source.url(entry['name'])}: {problem} "
                     f"(after {retries + 1} attempts)")

