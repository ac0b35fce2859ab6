"""Checkpoints of a training run: one ``rank{R}.npz`` shard per rank, then ``meta.json``.

Every rank writes its shard to a temporary file and renames it; after a barrier rank 0 commits
``meta.json`` the same way, so a ``meta.json`` always names a complete set of shards. Loading
checks the run's description against ``meta.json`` and every shard's epoch; a mismatch or an
unreadable file is raised on every rank.
"""
from __future__ import annotations

import json
import os

import numpy as np
from mpi4py import MPI

from .errors import HxmpiError, agree

CHECKPOINT_FORMAT = 1


class CheckpointError(HxmpiError):
    """A checkpoint that cannot be read or does not belong to this run (raised on every rank)."""


def run_meta(cfg, world_size: int, model, params: int) -> dict:
    """What a checkpoint must match to be resumed by this run (``cfg`` a TrainConfig)."""
    return {"format": CHECKPOINT_FORMAT, "world_size": world_size, "model": cfg.model,
            "hidden": cfg.hidden, "experts": getattr(model, "E", None), "dataset": cfg.dataset,
            "batch_size": cfg.batch_size, "seed": cfg.seed, "params": int(params), "dtype": cfg.dtype}


def save(directory: str, comm: MPI.Intracomm, arrays: dict, meta: dict, epoch: int) -> None:
    """Write this rank's ``arrays`` (plus ``epoch``) atomically; rank 0 then commits ``meta``
    with ``epochs_done`` (collective)."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"rank{comm.rank}.npz")
    tmp = path + ".tmp.npz"
    np.savez(tmp, **arrays, epoch=np.int64(epoch))
    os.replace(tmp, path)
    comm.Barrier()  # meta.json names a complete set of shards only
    if comm.rank == 0:
        # RNG state: every random draw derives from (seed, epoch), so the next epoch is enough.
        full = {**meta, "epochs_done": epoch, "rng": {"seed": meta.get("seed"), "next_epoch": epoch}}
        with open(os.path.join(directory, "meta.json.tmp"), "w") as fh:
            json.dump(full, fh)
        os.replace(os.path.join(directory, "meta.json.tmp"), os.path.join(directory, "meta.json"))


def load(directory: str, comm: MPI.Intracomm, want: dict):
    """(this rank's shard, meta) of the checkpoint in ``directory``; raises CheckpointError on every
    rank if any rank cannot read it or ``meta.json`` differs from ``want`` (collective)."""
    problem = shard = meta = None
    try:
        with open(os.path.join(directory, "meta.json")) as fh:
            meta = json.load(fh)
        diff = [f"{k}={meta.get(k)!r} (now {v!r})" for k, v in want.items() if meta.get(k) != v]
        if diff:
            problem = "checkpoint does not match this run: " + ", ".join(diff)
        else:
            shard = np.load(os.path.join(directory, f"rank{comm.rank}.npz"))
            if int(shard["epoch"]) != meta["epochs_done"]:
                problem = f"checkpoint shard of rank {comm.rank} is from epoch {int(shard['epoch'])}"
    except (OSError, ValueError, KeyError) as exc:
        problem = f"cannot read checkpoint in {directory}: {exc}"
    agree(comm, problem, CheckpointError)
    return shard, meta
