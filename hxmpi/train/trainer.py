"""``Trainer``: data-parallel SGD over MPI on numpy models, for one ``TrainConfig``.

Every epoch the training samples are reshuffled globally across ranks with ``HierComm.alltoallv``;
dense gradients are averaged with one Allreduce per step; MoE experts are sharded over ranks and
fed their tokens through the same hierarchical exchange. Rank 0 logs; every rank computes.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Optional

import numpy as np
from mpi4py import MPI

from ..comm.exchange import HierComm
from ..data import DATASETS, load_dataset
from ..data.shuffle import GlobalShuffle, ShardStream
from ..data.staging import StagingConfig, stage
from ..errors import HxmpiError, NonFiniteLoss, SettingError, agree, agreed_error
from ..models import build_model
from ..models.base import softmax_xent
from ..runlog import RunLog, time_to_target
from ..schema import SETTINGS
from . import checkpoint
from .balance import moved_samples, redistribute
from .optim import SGD, learning_rate
from .run_config import TrainConfig
from .stall import NoWatch, StallWatch, WatchedComm
from .threads import default_threads, limit_threads
from .update_engine import LocalPool, UpdateEngine

__all__ = ["Trainer"]

DTYPES = SETTINGS["dtype"].choices
# Where a step's time goes (seconds per step, mean over ranks): forward/backward and optimizer,
# waiting for the gradient sums after the backward pass (or an async round's average), the
# shuffle and rebalance exchanges, waiting for shards (streaming).
BREAKDOWN = ("compute", "gradient_wait", "exchange", "data")


class Trainer:
    """Wires topology, data, model and optimizer together for one run (collective: build and run
    it on every rank of ``comm``)."""

    def __init__(self, cfg: TrainConfig, comm: MPI.Intracomm):
        cfg.check()
        self.cfg = cfg
        # Every collective of the run goes through this proxy, and so runs inside the run's stall
        # watch (--stall-timeout): the shuffle and rebalance exchanges (its HierComm), gradient
        # buckets, the policy, evaluation, checkpoints and the summary. Only staging, which builds
        # node windows on communicators of its own, gets the raw one.
        self.comm = WatchedComm(comm)
        self.rank, self.size = comm.rank, comm.size
        if cfg.batch_size < self.size:
            raise SettingError("batch_size", f"{cfg.batch_size} is smaller than the {self.size} ranks: "
                                             f"every rank needs at least one sample per step")
        self.t_start = time.perf_counter()
        self.threads = cfg.threads or default_threads(comm)
        self.thread_pools = limit_threads(self.threads)
        self.dtype = np.dtype(cfg.dtype)
        self.hc = WatchedComm(HierComm(comm, ranks_per_node=cfg.ranks_per_node), owner=self.comm)
        self.log = RunLog(cfg.log, self.rank, cfg.quiet)
        self.staging_info = None
        if cfg.dataset in DATASETS:
            if cfg.pretrain_time is not None:
                raise SettingError("pretrain_time", f"needs a store (a dataset directory or URL), "
                                                    f"not the bundled {cfg.dataset!r}")
            self.data = load_dataset(cfg.dataset, seed=cfg.seed)
        else:
            problem = None
            if "://" not in cfg.dataset and not os.path.isdir(cfg.dataset):
                problem = (f"unknown dataset {cfg.dataset!r}: not a bundled dataset ({', '.join(DATASETS)}) "
                           f"nor a store directory or URL")
            agree(comm, problem, HxmpiError)  # a path missing on one node must not hang the rest
            self._stage(cfg.staging_config(), range(cfg.epochs))
        experts = cfg.experts or self.size * -(-4 // self.size)
        self.model = build_model(cfg.model, self.data.n_features, self.data.n_classes, cfg.hidden,
                                 cfg.seed, hc=self.hc, num_experts=experts,
                                 capacity_factor=cfg.capacity_factor, dtype=self.dtype)
        self.flat = self.model.flat
        self.shuffle = self._make_shuffle()
        self.opt = SGD(self.flat, self.comm, cfg.lr, cfg.momentum, cfg.weight_decay, cfg.clip_norm)
        steps = self.shuffle.steps(0)
        self.total_steps = sum(self.shuffle.steps(e) for e in range(cfg.epochs))
        self.warmup_steps = int(round(cfg.warmup_epochs * steps))
        self.step_every = max(1, int(round(cfg.step_epochs * steps)))
        self.start_epoch = 0
        self.first_batch_s = None  # seconds from start-up to the first batch in hand (rank's own)
        self.pretrain_deadline = None
        self.rounds = 0  # schedule steps so far: sync steps, or the local batches the furthest rank read in async
        self.updates = UpdateEngine(cfg.update_config(), self.comm, self.model, self.opt, emit=self._emit)
        self.updates.total_steps = self.total_steps
        self.watch = NoWatch()  # run() sets the stall watch of --stall-timeout (stall.StallWatch)
        self.checkpoint_lock = None  # one live run per checkpoint directory, held until run() ends
        if cfg.checkpoint:  # found now, not after the first epoch
            self.checkpoint_lock = checkpoint.hold(cfg.checkpoint, comm)
        self.local_batch = max(1, cfg.batch_size // self.size)
        self.exchange_s = 0.0  # this rank's seconds in shuffle and rebalance exchanges, this epoch

    @property
    def events(self) -> list[dict]:
        """Every record this run logged so far (on every rank)."""
        return self.log.events

    def _emit(self, record: dict) -> None:
        self.log.emit(record)

    def _accuracy_records(self) -> list[dict]:
        """This run's epoch and evaluation records, in order (``runlog.accuracy_points``)."""
        return [e for e in self.events if e["event"] in ("epoch", "evaluation")]

    # ------------------------------------------------------------------ data
    def _stage(self, staging: StagingConfig, epochs: range) -> None:
        """Stage the store at ``cfg.dataset`` (collective): sets ``data`` and ``staging_info``."""
        topo = self.hc.topology
        self.data, self.staging_info = stage(self.cfg.dataset, self.comm.raw, topo.intra, topo.node, topo.num_nodes,
                                             staging, self.cfg.seed, epochs)

    def _make_shuffle(self):
        """The per-epoch global shuffle of the training data (in memory, or streamed by windows)."""
        d, c = self.data, self.cfg
        # Features in the model's dtype (a no-op when they are already): a float64 model on a
        # float32 stream upcasts exactly in its matrix products.
        d.X_test = d.X_test.astype(self.dtype, copy=False)
        if d.train_stream is None:
            return GlobalShuffle(self.hc, d.X_train.astype(self.dtype, copy=False), d.y_train, c.batch_size,
                                 c.seed, c.shuffle)
        try:
            return ShardStream(self.hc, d.train_stream, c.batch_size, c.seed, c.shuffle)
        except ValueError:
            d.close()
            raise

    def staging_progress(self) -> dict:
        """Distributed-mode counters for the log (collective; empty in memory mode)."""
        stream = self.data.train_stream
        return stream.stats() if stream is not None else {}

    def switch_to_distributed(self, decision: dict) -> None:
        """Pre-train decision (logged as ``decision`` plus the sample counts): restage the re-read
        store in distributed mode from ``decision["epoch"]`` on, keep the model (collective)."""
        epoch, before = decision["epoch"], self.data.train_samples
        self.data.close()
        self._stage(self.cfg.staging_config(staging="distributed"), range(epoch, self.cfg.epochs))
        self.shuffle = self._make_shuffle()
        # The remaining schedule covers the (possibly grown) store from where training stands.
        self.total_steps = self.rounds + sum(self.shuffle.steps(e) for e in range(epoch, self.cfg.epochs))
        self.updates.total_steps = self.total_steps
        self._emit({**decision, "decision": "switch to distributed", "train_samples_before": before,
                    "train_samples_after": self.data.train_samples})
        self._emit(self.staging_info)

    # ------------------------------------------------------------------ checkpoints
    def _meta(self) -> dict:
        return checkpoint.run_meta(self.cfg, self.model)

    def save_checkpoint(self, epoch: int) -> None:
        """Checkpoint after ``epoch`` epochs into ``cfg.checkpoint`` (collective)."""
        checkpoint.save(self.cfg.checkpoint, self.comm,
                        {"params": self.flat.params, "velocity": self.opt.velocity,
                         "opt_steps": np.int64(self.opt.steps), "rounds": np.int64(self.rounds)},
                        {**self._meta(), "policy": self.updates.state()}, epoch, keep=self.cfg.keep_checkpoints)

    def load_checkpoint(self) -> None:
        """Restore parameters, momentum, progress and the policy's state from ``cfg.checkpoint``,
        written at this or any other world size (MoE experts are re-sharded); a checkpoint of
        another run raises CheckpointError on every rank (collective)."""
        shards, meta = checkpoint.load(self.cfg.checkpoint, self.comm, self._meta())
        saved = int(meta["world_size"])
        if saved == self.size:
            mine = shards[self.rank]
            self.flat.params[:], self.opt.velocity[:] = mine["params"], mine["velocity"]
        else:
            experts = getattr(self.model, "E", None)
            for key, target in (("params", self.flat.params), ("velocity", self.opt.velocity)):
                target[:] = checkpoint.reshard(shards, self.flat, experts, saved, self.rank, self.size, key)
            mine = shards[0]
        self.opt.steps = int(mine["opt_steps"])
        self.rounds = int(mine["rounds"])
        if "policy" in meta:
            self.updates.restore(meta["policy"])
        self.start_epoch = int(meta["epochs_done"])
        moved = f", written by {saved} ranks" if saved != self.size else ""
        if self.rank == 0 and not self.cfg.quiet:
            print(f"resuming from {meta['checkpoint_dir']} ({meta['chosen_because']}), after epoch "
                  f"{self.start_epoch}{moved}", file=sys.stderr, flush=True)
        self._emit({"event": "resume", "checkpoint": meta["checkpoint_dir"], "epochs_done": self.start_epoch,
                    "chosen_because": meta["chosen_because"], "saved_world_size": saved})
        if self.data.train_stream is not None:
            self.data.train_stream.seek(self.start_epoch)

    # ------------------------------------------------------------------ training
    def evaluate(self) -> tuple[float, float]:
        """Test loss and accuracy over the whole test split (collective). While async rounds hold
        the ranks' parameters apart (within a window) it evaluates their mean, the model a
        ``settle`` would give, and keeps each rank's own parameters (``UpdateEngine.mean_model``)."""
        X, y = self.data.X_test, self.data.y_test
        lo, hi = self.rank * len(y) // self.size, (self.rank + 1) * len(y) // self.size
        with self.updates.mean_model():
            loss, correct, _ = softmax_xent(self.model.logits(X[lo:hi]), y[lo:hi], 1.0)
        sums = np.array([loss, correct], dtype=np.float64)
        self.comm.Allreduce(MPI.IN_PLACE, sums, op=MPI.SUM)
        return float(sums[0] / len(y)), float(sums[1] / len(y))

    def _evaluate_within(self, epoch: int, trained: float) -> float:
        """``--eval-every``: evaluate now, within ``epoch`` (0-based), after ``trained`` seconds of
        its training on this rank, and log an ``"evaluation"`` record with the slowest rank's
        seconds (collective); returns the seconds the evaluation took here, which are not
        training time."""
        t0 = time.perf_counter()
        trained = self.comm.allreduce(trained, op=MPI.MAX)
        test_loss, test_acc = self.evaluate()
        self._emit({"event": "evaluation", "epoch": epoch + 1, "round": self.rounds, "epoch_train_s": trained,
                    "test_loss": test_loss, "test_accuracy": test_acc})
        return time.perf_counter() - t0

    def lr_at(self, step: int) -> float:
        """Learning rate of optimizer step ``step``."""
        c = self.cfg
        return learning_rate(step, c.lr, c.schedule, self.total_steps, self.warmup_steps, self.step_every, c.gamma)

    def train_epoch(self, epoch: int) -> dict:
        """One epoch over the globally shuffled data; returns its metrics (identical on all ranks).

        ``samples`` counts each sample of the epoch once (unique); ``processed_samples`` counts
        every forward pass (the same: async rounds read each sample at most once, and skip the
        samples a straggler had not reached when the fastest rank had read its share).
        ``train_time_s`` is the slowest rank's.
        """
        stats = np.zeros(4)  # loss sum, correct, processed samples, unique samples
        t0 = time.perf_counter()
        expired = False
        fail_at = self.cfg.fail_at
        # A window's exchange happens when it is drawn, for every rank alike: the whole epoch in
        # memory mode, one window of shards at a time when streaming.
        bad_step = None  # the first step whose loss was not finite on this rank
        busy = np.array([*self.updates.busy(), 0.0])  # subtracted below
        rounds_before = self.updates.rounds_run
        every, epoch_end = self.cfg.eval_every, self.rounds + self.shuffle.steps(epoch)
        evaluating = 0.0  # this rank's seconds in evaluations within the epoch (not training time)
        windows = self._timed(self.watch.iterate(self.shuffle.epoch_windows(epoch), "shuffle exchange",
                                                 lambda: self.rounds))
        for parts in windows:
            if self.first_batch_s is None:
                self.first_batch_s = time.perf_counter() - self.t_start
            parts = list(parts)
            processed_before = stats[2]
            pool = None  # async: this rank's samples of the steps left, each read once
            if self.updates.balance_weights is not None:  # dealt evenly: split up to the next decision
                t_re = time.perf_counter()
                self._rebalance(parts, 0, self.updates.rounds_to_decision())
                self.exchange_s += time.perf_counter() - t_re
            s = 0
            while s < len(parts):
                if fail_at and tuple(fail_at) == (self.rank, self.rounds):
                    raise RuntimeError(f"injected failure (fail_at) at step {self.rounds}")
                if self.updates.mode == "async":
                    if pool is None:
                        base = s
                        # A rank with a larger share than b/P per step has more local batches than steps left.
                        pool = LocalPool(parts[s:], self.local_batch,
                                         lambda k, r=self.rounds, n=len(parts) - s: self.lr_at(r + min(k, n - 1)))
                    step_stats = self.updates.step(None, pool, 0.0)
                    # The schedule follows the rank that read furthest; the window ends when one has read all.
                    ahead = len(parts) if self.updates.pool_done else min(len(parts), base + self.updates.pool_read)
                    advance = max(0, ahead - s)
                else:
                    pool = None
                    # Sync: local sums scaled by 1/global batch, summed over ranks: the exact global mean.
                    step_stats = self.updates.step(parts[s], None, self.lr_at(self.rounds))
                    advance = 1
                loss = step_stats[0]
                stats[:3] += step_stats
                if bad_step is None and not np.isfinite(loss):
                    bad_step = self.rounds
                self.rounds += advance
                self.watch.step = self.rounds
                s += advance
                decision = self.updates.end_of_round(self.rounds, epoch)
                # The same on every rank. Steps past the next decision stay as dealt (even): a
                # window that ends balancing, or a one-window trial of it, has nothing to move back.
                moved = 0
                if decision is not None and decision.balance_weights is not None:
                    t_re = time.perf_counter()
                    moved = self._rebalance(parts, s, self.updates.rounds_to_decision())
                    self.exchange_s += time.perf_counter() - t_re
                if decision is not None and (decision.rebalance or moved):
                    self._emit({"event": "rebalance", "epoch": epoch, "round": self.rounds,
                                "counts": [int(c) for c in self.updates.shares(self.cfg.batch_size)],
                                "weights": decision.balance_weights, "samples_moved": moved})
                if every and self.rounds // every > (self.rounds - advance) // every and self.rounds < epoch_end:
                    # The same rounds on every rank; the epoch's own evaluation follows its last step.
                    evaluating += self._evaluate_within(epoch, time.perf_counter() - t0 - evaluating)
                if self.pretrain_deadline is not None:
                    # Rank 0's clock decides, so every rank leaves after the same step.
                    expired = self.comm.bcast(time.perf_counter() > self.pretrain_deadline if self.rank == 0
                                              else None, root=0)
                    if expired:
                        break
            self.updates.settle()  # async rounds leave the ranks apart: one model again for what follows
            stats[3] += min(stats[2] - processed_before, sum(len(p[1]) for p in parts))
            if expired:
                break
        busy = np.array([*self.updates.busy(), self.exchange_s]) - busy
        self.exchange_s = 0.0
        elapsed = self.comm.allreduce(time.perf_counter() - t0 - evaluating, op=MPI.MAX)
        self.comm.Allreduce(MPI.IN_PLACE, stats, op=MPI.SUM)
        self.comm.Allreduce(MPI.IN_PLACE, busy, op=MPI.SUM)
        bad_step = self.comm.allreduce(np.inf if bad_step is None else bad_step, op=MPI.MIN)
        if np.isfinite(bad_step):  # the same on every rank: raised everywhere, the run ends with exit 1
            raise agreed_error(NonFiniteLoss(f"training loss is not finite in epoch {epoch + 1} at step {int(bad_step)} "
                                f"(steps counted from the start of the run); lower lr or check the data"))
        return {"train_loss": stats[0] / max(stats[2], 1), "train_accuracy": stats[1] / max(stats[2], 1),
                "train_time_s": elapsed, "samples": int(stats[3]), "processed_samples": int(stats[2]),
                "step_breakdown_s": dict(zip(("compute", "gradient_wait", "exchange"),
                                             (busy / self.size / max(self.updates.rounds_run - rounds_before, 1)).tolist())),
                "update": self.updates.mode, **({"pretrain_expired": True} if expired else {})}

    def _timed(self, windows):
        """``windows`` with the time each takes to produce (its shuffle exchange, and in streaming
        mode the wait for its shards) added to ``exchange_s``."""
        it = iter(windows)
        while True:
            t0 = time.perf_counter()
            parts = next(it, None)
            self.exchange_s += time.perf_counter() - t0
            if parts is None:
                return
            yield parts

    def _rebalance(self, parts: list, start: int, count: int) -> int:
        """Re-split steps ``parts[start:start + count]`` (those up to the next policy decision)
        over the ranks by the current balance (collective); returns the samples that changed rank
        (0 when no step is left: the next window is split by the shares from its start).

        Only the steps up to the next decision move, so that a one-window trial of balancing
        does not move the rest of the epoch there and back (docs/update-policy.md)."""
        rest = parts[start:start + count]
        if not rest:  # the decision came with the window's last step: the next window is split anew
            return 0
        current = np.array(self.comm.allgather([len(p[1]) for p in rest]), dtype=np.int64).T.reshape(len(rest), -1)
        target = np.array([self.updates.shares(p[2]) for p in rest], dtype=np.int64).reshape(len(rest), -1)
        if np.array_equal(current, target):
            return 0
        parts[start:start + count] = redistribute(self.hc, rest, current, target)
        return moved_samples(current, target)

    def adjust_from_accuracy(self, accuracy: float) -> None:
        """Scale the next epoch's steps by the policy's gradient coefficient (docs/method.md)."""
        self._emit(self.updates.adjust(accuracy, self.cfg.target_accuracy))

    def run(self, stop_at_accuracy: Optional[float] = None) -> dict:
        """Train all epochs, or until the first epoch whose test accuracy is at least
        ``stop_at_accuracy`` (benchmarks: time to target); returns the summary record (collective)."""
        self.comm.watch = self.watch = StallWatch.for_run(self.comm.raw, self.cfg.stall_timeout,
                                                          self.cfg.stall_abort, self._emit)
        try:
            return self._run(stop_at_accuracy)
        finally:
            self.watch.close()
            self.comm.watch = self.watch = NoWatch()
            self.release()

    def release(self) -> None:
        """Let another run use this run's checkpoint directory (run() does it when it ends)."""
        if self.checkpoint_lock is not None:
            self.checkpoint_lock.release()
            self.checkpoint_lock = None

    def _run(self, stop_at_accuracy: Optional[float]) -> dict:
        c = self.cfg
        if self.staging_info:
            self._emit(self.staging_info)
        self.log.start_epochs(c.epochs, self.start_epoch)
        train_time = samples = processed = data_wait = first_batch = 0
        epochs_run = []
        test_loss = test_acc = float("nan")
        stop_reason = None
        if c.pretrain_time is not None:
            if self.data.train_stream is None:
                self.pretrain_deadline = time.perf_counter() + c.pretrain_time
            else:
                self._emit({"event": "staging_decision", "decision": "no pre-training: the store is staged "
                            "in distributed mode already"})
        last = c.epochs if c.stop_after is None else min(c.epochs, self.start_epoch + c.stop_after)
        for epoch in range(self.start_epoch, last):
            m = self.train_epoch(epoch)
            train_time += m["train_time_s"]
            samples += m["samples"]
            processed += m["processed_samples"]
            test_loss, test_acc = self.evaluate()
            first_batch = self.comm.allreduce(self.first_batch_s or 0.0, op=MPI.MAX)  # slowest rank
            with self.watch.waiting("staging progress", self.rounds):  # the staging's own communicators
                staged = self.staging_progress()
            if c.target_accuracy is not None:
                self.adjust_from_accuracy(test_acc)
            steps = max(self.shuffle.steps(epoch), 1)
            # The exchange time includes waiting for shards (streaming): the breakdown shows it apart.
            waited = (staged.get("data_wait_s", 0.0) - data_wait) / steps
            m["step_breakdown_s"]["exchange"] = max(0.0, m["step_breakdown_s"]["exchange"] - waited)
            m["step_breakdown_s"]["data"] = waited
            data_wait = staged.get("data_wait_s", 0.0)
            record = {"event": "epoch", "epoch": epoch + 1, **m, "test_loss": test_loss,
                      "test_accuracy": test_acc, "lr": self.updates.last_lr,
                      "shuffle_bytes_sent": self.shuffle.bytes_moved,
                      "time_to_first_batch_s": first_batch,
                      **({"staging": staged, "data_wait_fraction": data_wait / train_time if train_time else 0.0}
                         if staged else {})}
            if c.checkpoint:
                self.save_checkpoint(epoch + 1)
            self.log.epoch(record)
            epochs_run.append(record)
            if stop_at_accuracy is not None and test_acc >= stop_at_accuracy:
                stop_reason, last = f"test accuracy {test_acc:.4g} reached {stop_at_accuracy}", epoch + 1
                break
            if m.get("pretrain_expired"):
                self.pretrain_deadline = None
                decision = {"event": "staging_decision", "epoch": epoch + 1, "accuracy": test_acc,
                            "target": c.target_accuracy, "pretrain_time_s": c.pretrain_time}
                if test_acc >= c.target_accuracy:
                    stop_reason = "target accuracy reached in pre-training"
                    self._emit({**decision, "decision": "stop: target reached"})
                    last = epoch + 1
                    break
                self.switch_to_distributed(decision)
        topo = self.hc.topology
        per_s = (lambda n: n / train_time) if train_time else (lambda n: 0.0)
        figures = self.updates.figures(train_time)
        summary = {"event": "summary", "test_accuracy": test_acc, "test_loss": test_loss,
                   "epochs": last, "samples_per_s": per_s(samples), "processed_samples_per_s": per_s(processed),
                   "world_size": self.size, "num_nodes": topo.num_nodes, "model": c.model, "dtype": c.dtype,
                   "threads": self.threads, "thread_pools": self.thread_pools,
                   "shuffle": c.shuffle, "batch_size": c.batch_size, "train_time_s": train_time,
                   **({"target_accuracy": c.target_accuracy,
                       **dict(zip(("time_to_target_s", "epoch_at_target"),
                                  time_to_target(self._accuracy_records(), c.target_accuracy)))}
                      if c.target_accuracy is not None else {}),
                   **figures, "rebalances": sum(e["event"] == "rebalance" for e in self.events),
                   "time_to_first_batch_s": first_batch,
                   "step_breakdown_s": {k: float(np.mean([e["step_breakdown_s"][k] for e in epochs_run]))
                                        for k in BREAKDOWN} if epochs_run else {},
                   "data_wait_s": data_wait, "data_wait_fraction": data_wait / train_time if train_time else 0.0,
                   **({"stop_reason": stop_reason} if stop_reason else {})}
        self.data.close()
        self.log.close(summary)
        return summary
