"""Checkpoints of a training run: a new directory per epoch, committed by one atomic pointer.

Layout of a checkpoint directory ``D``::

    D/epoch-000003/rank0.npz ... rank{N-1}.npz meta.json    one complete checkpoint
    D/epoch-000004/...                                        the next one
    D/LATEST                                                   "epoch-000004": the newest committed

Saving epoch ``e``: every rank writes its shard into ``epoch-e`` (temp file, fsync, rename, fsync
of the directory); after an agreement that every shard is down, rank 0 writes ``meta.json`` the
same way and then commits by renaming a new ``LATEST`` over the old one. A kill at any moment
leaves ``LATEST`` naming a complete checkpoint, the previous one until the rename, the new one
after it. Then all but the newest ``keep`` complete checkpoints are deleted.

Resuming takes the checkpoint ``LATEST`` names if it is complete (a shard of every rank of the
run that wrote it, as its meta.json says), otherwise the newest complete one found (and says
why), at any world size: the same size reads its own shard; another reads every shard and
rebuilds its part (``reshard``: dense parameters are replicated, experts re-sharded). One live
run holds a checkpoint directory (``hold``: an ``flock`` by rank 0, as ``data.lock`` does for
cache directories); a second one is refused at start, naming the holder's pid. Any error on any rank (a missing, truncated or corrupt shard, a run
that does not match, a full disk while saving) is agreed on and raised as ``CheckpointError`` on
every rank, naming the file; a failed save leaves no temp file behind.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from typing import Optional

import numpy as np
from mpi4py import MPI

from ..data.lock import hold_directory
from ..errors import HxmpiError, agree

__all__ = ["CheckpointError", "run_meta", "epoch_dir", "hold", "check_writable", "save", "saved_world_size",
           "is_complete", "newest_complete", "load", "reshard"]

CHECKPOINT_FORMAT = 2
POINTER = "LATEST"
META = "meta.json"
_EPOCH_DIR = re.compile(r"epoch-(\d{6,})$")


class CheckpointError(HxmpiError):
    """A checkpoint that cannot be written, read or does not belong to this run (raised on every rank)."""


def run_meta(cfg, model) -> dict:
    """What a checkpoint must match to be resumed by this run (``cfg`` a TrainConfig), at any
    world size: the model (``dense_params`` replicated on every rank, experts in total), the
    data, batch, seed and dtype."""
    return {"format": CHECKPOINT_FORMAT, "model": cfg.model, "hidden": cfg.hidden,
            "experts": getattr(model, "E", None), "dataset": cfg.dataset, "batch_size": cfg.batch_size,
            "seed": cfg.seed, "dense_params": int(model.flat.dense_size), "dtype": cfg.dtype}


def epoch_dir(directory: str, epoch: int) -> str:
    """The directory of the checkpoint after ``epoch`` epochs."""
    return os.path.join(directory, f"epoch-{epoch:06d}")


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: str, write) -> None:
    """``write(fh)`` into a temp file beside ``path``, fsync, rename; the temp file never stays."""
    tmp = path + ".tmp" + (".npz" if path.endswith(".npz") else "")
    try:
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(os.path.dirname(path) or ".")


def _failure(what: str, exc: BaseException) -> str:
    return f"cannot {what}: {type(exc).__name__}: {exc}"


def hold(directory: str, comm: MPI.Intracomm):
    """Before training: every rank can write into ``directory``, and no other live run uses it;
    returns the lock rank 0 holds for this run (None on the other ranks; ``release()`` it, or
    process exit does). CheckpointError on every rank otherwise, naming the directory (and the
    other run's pid) (collective)."""
    check_writable(directory, comm)
    lock = problem = None
    if comm.rank == 0:  # rank 0 commits every checkpoint: its hold covers the run
        try:
            lock = hold_directory(directory, "checkpoint directory", "checkpoint", CheckpointError)
        except (CheckpointError, OSError) as exc:
            problem = str(exc)
    agree(comm, problem, CheckpointError)
    return lock


def check_writable(directory: str, comm: MPI.Intracomm) -> None:
    """Before training: every rank can create ``directory`` and write a file in it (collective;
    CheckpointError naming the directory on every rank otherwise)."""
    problem = None
    probe = os.path.join(directory, f".probe-rank{comm.rank}-{os.getpid()}")
    try:
        os.makedirs(directory, exist_ok=True)
        with open(probe, "wb") as fh:
            fh.write(b"hxmpi")
        os.unlink(probe)
    except Exception as exc:  # noqa: BLE001 - agreed below
        problem = _failure(f"write checkpoints to {directory}", exc)
    agree(comm, problem, CheckpointError)


def save(directory: str, comm: MPI.Intracomm, arrays: dict, meta: dict, epoch: int, keep: int = 2) -> str:
    """Write and commit the checkpoint after ``epoch`` epochs (collective); returns its directory.

    ``arrays`` are this rank's; ``meta`` (from ``run_meta``, plus any state to carry such as the
    policy's) is rank 0's; the world size is added. Keeps the newest ``keep``."""
    where = epoch_dir(directory, epoch)
    path = os.path.join(where, f"rank{comm.rank}.npz")
    problem = None
    try:
        os.makedirs(where, exist_ok=True)
        _write_atomic(path, lambda fh: np.savez(fh, **arrays, epoch=np.int64(epoch)))
    except Exception as exc:  # noqa: BLE001 - a full disk on one rank is every rank's error
        problem = _failure(f"write {path}", exc)
    agree(comm, problem, CheckpointError)  # every shard is down before meta.json names them
    if comm.rank == 0:
        try:
            # RNG state: every random draw derives from (seed, epoch), so the next epoch is enough.
            full = {**meta, "world_size": comm.size, "epochs_done": epoch,
                    "rng": {"seed": meta.get("seed"), "next_epoch": epoch}}
            _write_atomic(os.path.join(where, META), lambda fh: fh.write(json.dumps(full).encode()))
            _write_atomic(os.path.join(directory, POINTER), lambda fh: fh.write(os.path.basename(where).encode()))
        except Exception as exc:  # noqa: BLE001
            problem = _failure(f"commit {where}", exc)
    agree(comm, problem, CheckpointError)
    if comm.rank == 0:
        _prune(directory, keep, epoch)
    return where


def _epochs(directory: str) -> list[tuple[int, str]]:
    """(epoch, path) of every epoch directory, newest first."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = [(int(m.group(1)), os.path.join(directory, n)) for n in names if (m := _EPOCH_DIR.match(n))]
    return sorted(found, reverse=True)


def saved_world_size(path: str) -> Optional[int]:
    """The world size of the run that wrote checkpoint ``path`` (from its meta.json; None if unreadable)."""
    try:
        with open(os.path.join(path, META)) as fh:
            return int(json.load(fh)["world_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def is_complete(path: str, world_size: Optional[int] = None) -> bool:
    """Whether ``path`` holds meta.json and a shard of every rank of the run that wrote it
    (``world_size``: that run's size, default: read from meta.json)."""
    n = world_size if world_size is not None else saved_world_size(path)
    return n is not None and os.path.isfile(os.path.join(path, META)) and all(
        os.path.isfile(os.path.join(path, f"rank{r}.npz")) for r in range(n))


def _prune(directory: str, keep: int, committed: int) -> None:
    """Delete every epoch directory but the newest ``keep`` complete ones up to ``committed``
    (incomplete ones are leftovers of a killed run; later ones, of an older run in this directory)."""
    kept = [p for e, p in _epochs(directory) if e <= committed and is_complete(p)][:max(1, keep)]
    for _, path in _epochs(directory):
        if path not in kept:
            shutil.rmtree(path, ignore_errors=True)


def newest_complete(directory: str, world_size: Optional[int] = None) -> tuple[Optional[str], str]:
    """(the checkpoint to resume from or None, a note on how it was chosen); no MPI. A checkpoint
    is complete when every rank of the run that wrote it left its shard (``world_size``: expect
    that many, default: as its meta.json says)."""
    try:
        with open(os.path.join(directory, POINTER)) as fh:
            named = os.path.join(directory, fh.read().strip())
        if _EPOCH_DIR.match(os.path.basename(named)) and is_complete(named, world_size):
            return named, f"{POINTER} names it"
        note = f"{POINTER} names {os.path.basename(named)!r}, which is incomplete"
    except OSError as exc:
        note = f"no readable {POINTER} ({exc.strerror or exc})"
    for _, path in _epochs(directory):
        if is_complete(path, world_size):
            return path, f"{note}; the newest complete one"
    return None, note


def load(directory: str, comm: MPI.Intracomm, want: dict) -> tuple[dict, dict]:
    """({saved rank: its arrays}, meta) of the newest complete checkpoint in ``directory``: this
    rank's own shard if the checkpoint was written at this world size, else every saved rank's
    (to re-shard from). meta gains ``checkpoint_dir`` and ``chosen_because``. Raises
    CheckpointError on every rank if any rank cannot read a shard or the checkpoint is of another
    run (collective)."""
    chosen = note = problem = None
    if comm.rank == 0:
        chosen, note = newest_complete(directory)
        if chosen is None:
            problem = f"no complete checkpoint in {directory} ({note})"
    agree(comm, problem, CheckpointError)
    chosen, note = comm.bcast((chosen, note), root=0)
    shards, meta, path = {}, None, os.path.join(chosen, META)
    try:
        with open(path) as fh:
            meta = json.load(fh)
        diff = [f"{k}={meta.get(k)!r} (now {v!r})" for k, v in want.items() if meta.get(k) != v]
        if diff:
            problem = f"checkpoint {chosen} does not match this run: " + ", ".join(diff)
        else:
            saved = int(meta["world_size"])
            for r in ([comm.rank] if saved == comm.size else range(saved)):
                path = os.path.join(chosen, f"rank{r}.npz")
                with np.load(path) as npz:  # read every array now: a corrupt member fails here, on this rank
                    shards[r] = {k: np.array(npz[k]) for k in npz.files}
                if int(shards[r]["epoch"]) != meta["epochs_done"]:
                    problem = f"{path} is from epoch {int(shards[r]['epoch'])}, {META} says {meta['epochs_done']}"
                    break
    except Exception as exc:  # noqa: BLE001 - BadZipFile, EOFError, a truncated file: agreed below
        problem = _failure(f"read {path}", exc)
    agree(comm, problem, CheckpointError)
    meta.update(checkpoint_dir=chosen, chosen_because=note)
    return shards, meta


def reshard(shards: dict, flat, experts: Optional[int], saved_size: int, rank: int, size: int,
            key: str) -> np.ndarray:
    """This rank's flat array ``key`` ("params", "velocity") of a run of ``size`` ranks, rebuilt
    from the ``shards`` ({rank: arrays}) of a run of ``saved_size`` ranks: the dense part
    (replicated) from saved rank 0; each rank-local parameter (MoE: ``experts`` in total, first
    axis the expert, ``experts / ranks`` per rank) concatenated over the saved ranks in rank order,
    then this rank's experts taken."""
    dense = flat.dense_size
    out = np.empty_like(flat.params)
    out[:dense] = shards[0][key][:dense]
    names = [n for n in flat.names if flat.offsets[n][0] >= dense]
    if not names:
        return out
    per_expert = {n: (flat.offsets[n][1] - flat.offsets[n][0]) // (experts // size) for n in names}
    saved_local = experts // saved_size
    pieces = {n: [] for n in names}
    for r in range(saved_size):
        offset = dense
        for n in names:
            length = saved_local * per_expert[n]
            pieces[n].append(shards[r][key][offset:offset + length])
            offset += length
    for n in names:
        lo, hi = flat.offsets[n]
        out[lo:hi] = np.concatenate(pieces[n])[rank * (hi - lo):(rank + 1) * (hi - lo)]
    return out
