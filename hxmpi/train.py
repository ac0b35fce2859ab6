"""``mpirun -np N python -m hxmpi.train``: data-parallel SGD over MPI on numpy models.

Every epoch the training samples are reshuffled globally across ranks with ``HierComm.alltoallv``;
dense gradients are averaged with one Allreduce per step; MoE experts are sharded over ranks and
fed their tokens through the same hierarchical exchange. Rank 0 logs; every rank computes.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from typing import Optional

import numpy as np
from mpi4py import MPI

from . import __version__
from .data import DATASETS, load_dataset
from .data.shuffle import SHUFFLES, GlobalShuffle, ShardStream
from .data.staging import STAGING_MODES, StagingConfig, parse_bytes, stage
from .errors import HxmpiError, agree
from .exchange import HierComm
from .models import MODELS, build_model
from .models.base import softmax_xent
from .optim import SCHEDULES, SGD, learning_rate
from .policy import gradient_coefficient
from .updates import UpdateConfig, UpdateEngine, parse_straggle

CHECKPOINT_FORMAT = 1


class UsageError(HxmpiError):
    """A bad flag or value: reported once by rank 0, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # raise instead of printing on every rank
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    """The CLI; every flag is documented here and in the README."""
    p = _Parser(prog="python -m hxmpi.train", description=__doc__,
                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", choices=MODELS, default="mlp", help="numpy model to train")
    p.add_argument("--hidden", type=_int_list, default=[64],
                   help="hidden layer sizes, comma-separated (MLP; MoE uses the first)")
    p.add_argument("--experts", type=int, default=None,
                   help="MoE experts in total, a multiple of the rank count (default: the smallest "
                        "multiple of the rank count >= 4)")
    p.add_argument("--capacity-factor", type=float, default=1.25,
                   help="MoE expert capacity as a multiple of the even share of tokens")
    p.add_argument("--dataset", default="digits",
                   help=f"bundled dataset ({', '.join(DATASETS)}) or a store directory / URL (see python -m hxmpi.data)")
    p.add_argument("--staging", choices=STAGING_MODES, default="auto",
                   help="store staging: memory (one shared copy per node), distributed (shards spread over "
                        "nodes, staged ahead of training), or by capacity (auto)")
    p.add_argument("--capacity-threshold", type=_size, default=None,
                   help="train bytes (suffixes K, M, G) below which a store is staged in memory "
                        "(default: 1/4 of available memory)")
    p.add_argument("--cache-dir", default=None, help="node-local staging directory (default: $TMPDIR/hxmpi-cache-JOB)")
    p.add_argument("--cache-limit", type=_size, default=None,
                   help="distributed mode: bytes of local storage per node (suffixes K, M, G); evicts the "
                        "shard used furthest in the future (default: the node's shards, at most 90%% of "
                        "the free disk)")
    p.add_argument("--prefetch-shards", type=_non_negative_int, default=2,
                   help="distributed mode: shards staged ahead of the one being trained on")
    p.add_argument("--pretrain-time", type=float, default=None, metavar="SECONDS",
                   help="memory mode: after this much training, evaluate; below --target-accuracy switch "
                        "to distributed staging (re-reading the store's index) and keep training the "
                        "model, else stop")
    p.add_argument("--retries", type=int, default=3, help="download retries per file (exponential backoff)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per download request")
    p.add_argument("--fetch-workers", type=_positive_int, default=8, help="parallel downloads per node")
    p.add_argument("--epochs", type=_positive_int, default=20, help="training epochs")
    p.add_argument("--batch-size", type=_positive_int, default=64, help="global batch size (samples)")
    p.add_argument("--lr", type=float, default=0.1, help="base learning rate")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    p.add_argument("--weight-decay", type=float, default=1e-4, help="L2 weight decay")
    p.add_argument("--schedule", choices=SCHEDULES, default="cosine", help="learning-rate schedule")
    p.add_argument("--warmup-epochs", type=float, default=1.0, help="linear warm-up length in epochs")
    p.add_argument("--step-epochs", type=float, default=10.0,
                   help="'step' schedule: multiply the rate by --gamma every this many epochs")
    p.add_argument("--gamma", type=float, default=0.1, help="'step' schedule decay factor")
    p.add_argument("--clip-norm", type=float, default=0.0, help="clip the global gradient L2 norm (0: off)")
    p.add_argument("--seed", type=int, default=0, help="seed of the split, the model and every shuffle")
    p.add_argument("--shuffle", choices=SHUFFLES, default="hier",
                   help="per-epoch global shuffle exchange (none: each rank keeps its shard)")
    p.add_argument("--ranks-per-node", type=_positive_int, default=None,
                   help="virtual nodes of this many consecutive ranks (default: real nodes, or env "
                        "HXMPI_RANKS_PER_NODE)")
    p.add_argument("--log", default=None, help="JSONL file: one record per epoch and a final summary")
    p.add_argument("--checkpoint", default=None, help="directory for a checkpoint after every epoch")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in --checkpoint")
    p.add_argument("--stop-after", type=_positive_int, default=None,
                   help="stop after this many epochs of this run (for time-limited jobs; continue "
                        "later with --resume)")
    p.add_argument("--update", choices=("auto", "sync", "async"), default="auto",
                   help="update mode; auto applies the straggler rule every --policy-window steps")
    p.add_argument("--b1", type=float, default=0.3, help="straggler fraction up to which auto goes async")
    p.add_argument("--b2", type=float, default=0.7,
                   help="straggler fraction above which gradients are scaled by 1 - (B - b2)")
    p.add_argument("--straggler-threshold", default="auto",
                   help="step time (seconds) above which a rank straggles; auto = 2x the median")
    p.add_argument("--policy-window", type=_positive_int, default=20, help="steps between policy decisions")
    p.add_argument("--max-staleness", type=_positive_int, default=4,
                   help="async: local steps a rank may take per round before it waits for the average")
    p.add_argument("--target-accuracy", type=float, default=None,
                   help="adjust the step size after each epoch from the accuracy gap (claim 2)")
    p.add_argument("--straggle", default=None, metavar="RANKS:SECONDS",
                   help="testing aid: ranks (comma-separated) that sleep SECONDS per step")
    p.add_argument("--stall-timeout", type=float, default=0.0,
                   help="seconds after which rank 0 logs the ranks missing from a step's collective (0: off)")
    p.add_argument("--stall-abort", action="store_true", help="abort the job when a stall is detected")
    p.add_argument("--fail-at", default=None, metavar="RANK:STEP",
                   help="testing aid: raise an error on RANK at global step STEP")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--version", action="version", version=f"hxmpi {__version__}")
    return p


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _size(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive sizes, got {text!r}")
    return values


class Trainer:
    """Wires topology, data, model and optimizer together for one run."""

    def __init__(self, args, comm: MPI.Intracomm):
        self.args, self.comm = args, comm
        self.rank, self.size = comm.rank, comm.size
        self.t_start = time.perf_counter()
        self.hc = HierComm(comm, ranks_per_node=args.ranks_per_node)
        self.staging_info = None
        self.staging_cfg = StagingConfig(args.staging, args.capacity_threshold, args.cache_dir, args.cache_limit,
                                         args.prefetch_shards, args.retries, args.timeout, args.fetch_workers,
                                         progress=not args.quiet)
        if args.target_accuracy is not None and not 0.0 <= args.target_accuracy <= 1.0:
            raise UsageError(f"--target-accuracy must lie in [0, 1], got {args.target_accuracy}")
        if args.pretrain_time is not None and (args.target_accuracy is None or args.pretrain_time <= 0):
            raise UsageError("--pretrain-time needs a positive number of seconds and --target-accuracy")
        if args.pretrain_time is not None and args.resume:
            raise UsageError("--pretrain-time cannot be combined with --resume")
        if args.dataset in DATASETS:
            if args.pretrain_time is not None:
                raise UsageError(f"--pretrain-time needs a store (--dataset DIR|URL), not the bundled {args.dataset!r}")
            self.data = load_dataset(args.dataset, seed=args.seed)
        else:
            problem = None
            if "://" not in args.dataset and not os.path.isdir(args.dataset):
                problem = (f"unknown dataset {args.dataset!r}: not a bundled dataset ({', '.join(DATASETS)}) "
                           f"nor a store directory or URL")
            agree(comm, problem, UsageError)  # a path missing on one node must not hang the rest
            self._stage(self.staging_cfg, range(args.epochs))
        experts = args.experts or self.size * -(-4 // self.size)
        self.model = build_model(args.model, self.data.n_features, self.data.n_classes, args.hidden,
                                 args.seed, hc=self.hc, num_experts=experts,
                                 capacity_factor=args.capacity_factor)
        self.flat = self.model.flat
        self.shuffle = self._make_shuffle()
        self.opt = SGD(self.flat, comm, args.lr, args.momentum, args.weight_decay, args.clip_norm)
        steps = self.shuffle.steps(0)
        self.total_steps = sum(self.shuffle.steps(e) for e in range(args.epochs))
        self.warmup_steps = int(round(args.warmup_epochs * steps))
        self.step_every = max(1, int(round(args.step_epochs * steps)))
        self.start_epoch = 0
        self.first_batch_s = None  # seconds from start-up to the first batch in hand (rank's own)
        self.pretrain_deadline = None
        self.rounds = 0  # global steps so far: sync steps or async rounds (drives the schedule)
        self.fail_at = _parse_fail_at(args.fail_at)
        self.events: list[dict] = []
        self._log = None
        ranks, delay = parse_straggle(args.straggle)
        threshold = None if args.straggler_threshold == "auto" else _seconds(args.straggler_threshold)
        cfg = UpdateConfig(args.update, args.b1, args.b2, threshold, args.policy_window, args.max_staleness,
                           ranks, delay, args.stall_timeout, args.stall_abort)
        self.updates = UpdateEngine(cfg, comm, self.model, self.opt, dense_only=args.model != "moe",
                                    emit=self._emit)
        self.local_batch = max(1, args.batch_size // self.size)

    # ------------------------------------------------------------------ data
    def _stage(self, cfg: StagingConfig, epochs: range) -> None:
        """Stage the store at --dataset (collective): sets ``data`` and ``staging_info``."""
        a, topo = self.args, self.hc.topology
        self.data, self.staging_info = stage(a.dataset, self.comm, topo.intra, topo.node, topo.num_nodes, cfg,
                                             a.seed, epochs)

    def _make_shuffle(self):
        """The per-epoch global shuffle of the training data (in memory, or streamed by windows)."""
        d, a = self.data, self.args
        if d.train_stream is None:
            return GlobalShuffle(self.hc, d.X_train, d.y_train, a.batch_size, a.seed, a.shuffle)
        try:
            return ShardStream(self.hc, d.train_stream, a.batch_size, a.seed, a.shuffle)
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
        cfg = StagingConfig(**{**self.staging_cfg.__dict__, "staging": "distributed"})
        self._stage(cfg, range(epoch, self.args.epochs))
        self.shuffle = self._make_shuffle()
        # The remaining schedule covers the (possibly grown) store from where training stands.
        self.total_steps = self.rounds + sum(self.shuffle.steps(e) for e in range(epoch, self.args.epochs))
        self._emit({**decision, "decision": "switch to distributed", "train_samples_before": before,
                    "train_samples_after": self.data.train_samples})
        self._emit(self.staging_info)

    # ------------------------------------------------------------------ checkpoints
    def _meta(self) -> dict:
        a = self.args
        return {"format": CHECKPOINT_FORMAT, "world_size": self.size, "model": a.model,
                "hidden": a.hidden, "experts": getattr(self.model, "E", None), "dataset": a.dataset,
                "batch_size": a.batch_size, "seed": a.seed, "params": int(self.flat.params.size)}

    def save_checkpoint(self, epoch: int) -> None:
        """Every rank writes its shard atomically; rank 0 then commits meta.json (collective)."""
        d = self.args.checkpoint
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, f"rank{self.rank}.npz")
        tmp = path + ".tmp.npz"
        np.savez(tmp, params=self.flat.params, velocity=self.opt.velocity,
                 opt_steps=np.int64(self.opt.steps), rounds=np.int64(self.rounds), epoch=np.int64(epoch))
        os.replace(tmp, path)
        self.comm.Barrier()  # meta.json names a complete set of shards only
        if self.rank == 0:
            # RNG state: every random draw derives from (seed, epoch), so the next epoch is enough.
            meta = {**self._meta(), "epochs_done": epoch, "rng": {"seed": self.args.seed, "next_epoch": epoch}}
            with open(os.path.join(d, "meta.json.tmp"), "w") as fh:
                json.dump(meta, fh)
            os.replace(os.path.join(d, "meta.json.tmp"), os.path.join(d, "meta.json"))

    def load_checkpoint(self) -> None:
        """Restore parameters, momentum and progress; mismatches raise on every rank."""
        d = self.args.checkpoint
        problem = None
        try:
            with open(os.path.join(d, "meta.json")) as fh:
                meta = json.load(fh)
            want = self._meta()
            diff = [f"{k}={meta.get(k)!r} (now {v!r})" for k, v in want.items() if meta.get(k) != v]
            if diff:
                problem = "checkpoint does not match this run: " + ", ".join(diff)
            else:
                shard = np.load(os.path.join(d, f"rank{self.rank}.npz"))
                if int(shard["epoch"]) != meta["epochs_done"]:
                    problem = f"checkpoint shard of rank {self.rank} is from epoch {int(shard['epoch'])}"
        except (OSError, ValueError, KeyError) as exc:
            problem = f"cannot read checkpoint in {d}: {exc}"
        agree(self.comm, problem, UsageError)
        self.flat.params[:] = shard["params"]
        self.opt.velocity[:] = shard["velocity"]
        self.opt.steps = int(shard["opt_steps"])
        self.rounds = int(shard["rounds"])
        self.start_epoch = int(meta["epochs_done"])
        if self.data.train_stream is not None:
            self.data.train_stream.seek(self.start_epoch)

    # ------------------------------------------------------------------ training
    def evaluate(self) -> tuple[float, float]:
        """Test loss and accuracy over the whole test split (collective)."""
        X, y = self.data.X_test, self.data.y_test
        lo, hi = self.rank * len(y) // self.size, (self.rank + 1) * len(y) // self.size
        loss, correct, _ = softmax_xent(self.model.logits(X[lo:hi]), y[lo:hi], 1.0)
        sums = np.array([loss, correct], dtype=np.float64)
        self.comm.Allreduce(MPI.IN_PLACE, sums, op=MPI.SUM)
        return float(sums[0] / len(y)), float(sums[1] / len(y))

    def lr_at(self, step: int) -> float:
        """Learning rate of optimizer step ``step``."""
        a = self.args
        return learning_rate(step, a.lr, a.schedule, self.total_steps, self.warmup_steps, self.step_every, a.gamma)

    def _emit(self, record: dict) -> None:
        self.events.append(record)
        if self._log is not None:
            self._log.write(json.dumps(record) + "\n")
            self._log.flush()

    def _local_batches(self, parts):
        """Async rounds draw from this rank's samples of the epoch, cyclically, in local batches."""
        X = np.concatenate([p[0] for p in parts]) if parts else np.empty((0,))
        y = np.concatenate([p[1] for p in parts]) if parts else np.empty((0,), np.int64)
        b = self.local_batch
        while True:
            if len(y) == 0:
                yield X, y
                continue
            for lo in range(0, len(y), b):
                yield X[lo:lo + b], y[lo:lo + b]

    def train_epoch(self, epoch: int) -> dict:
        """One epoch over the globally shuffled data; returns its metrics (identical on all ranks)."""
        stats = np.zeros(3)  # loss sum, correct, samples
        t0 = time.perf_counter()
        expired = False
        # A window's exchange happens when it is drawn, for every rank alike: the whole epoch in
        # memory mode, one window of shards at a time when streaming.
        for parts in self.shuffle.epoch_windows(epoch):
            if self.first_batch_s is None:
                self.first_batch_s = time.perf_counter() - self.t_start
            batches = self._local_batches(parts)
            for X, y, global_batch in parts:
                if self.fail_at and self.fail_at == (self.rank, self.rounds):
                    raise RuntimeError(f"injected failure (--fail-at) at step {self.rounds}")
                lr = self.lr_at(self.rounds)
                if self.updates.mode == "sync":
                    # Local sums scaled by 1/global batch: summed over ranks, the exact global mean.
                    loss, correct = self.updates.sync_step(X, y, global_batch, lr, self.rounds)
                    stats += (loss, correct, len(y))
                else:
                    stats += self.updates.async_round(batches, lr)
                self.rounds += 1
                self.updates.end_of_round(self.rounds, epoch)
                if self.pretrain_deadline is not None:
                    # Rank 0's clock decides, so every rank leaves after the same step.
                    expired = self.comm.bcast(time.perf_counter() > self.pretrain_deadline if self.rank == 0
                                              else None, root=0)
                    if expired:
                        break
            if expired:
                break
        elapsed = time.perf_counter() - t0
        self.comm.Allreduce(MPI.IN_PLACE, stats, op=MPI.SUM)
        return {"train_loss": stats[0] / max(stats[2], 1), "train_accuracy": stats[1] / max(stats[2], 1),
                "train_time_s": elapsed, "samples": int(stats[2]), "update": self.updates.mode,
                **({"pretrain_expired": True} if expired else {})}

    def adjust_from_accuracy(self, accuracy: float) -> None:
        """Claim 2: scale the next epoch's steps from the accuracy gap and the slowest step time."""
        times = self.updates.last_step_times or [1.0]
        median = float(np.median(times))
        coeff = gradient_coefficient(accuracy, self.args.target_accuracy, max(times), median)
        self.updates.lr_factor = coeff
        self._emit({"event": "gradient_adjustment", "accuracy": accuracy, "target": self.args.target_accuracy,
                    "max_step_time_s": max(times), "median_step_time_s": median, "coefficient": coeff})

    def run(self) -> dict:
        """Train all epochs; returns the summary record."""
        a = self.args
        log = self._log = open(a.log, "a") if a.log and self.rank == 0 else None
        if self.staging_info:
            self._emit(self.staging_info)
        progress = _Progress(a, self.rank, self.start_epoch)
        train_time = samples = data_wait = first_batch = 0
        test_loss = test_acc = float("nan")
        stop_reason = None
        if a.pretrain_time is not None:
            if self.data.train_stream is None:
                self.pretrain_deadline = time.perf_counter() + a.pretrain_time
            else:
                self._emit({"event": "staging_decision", "decision": "no pre-training: the store is staged "
                            "in distributed mode already"})
        last = a.epochs if a.stop_after is None else min(a.epochs, self.start_epoch + a.stop_after)
        for epoch in range(self.start_epoch, last):
            m = self.train_epoch(epoch)
            train_time = train_time + self.comm.allreduce(m["train_time_s"], op=MPI.MAX)
            samples += m["samples"]
            test_loss, test_acc = self.evaluate()
            if a.target_accuracy is not None:
                self.adjust_from_accuracy(test_acc)
            first_batch = self.comm.allreduce(self.first_batch_s or 0.0, op=MPI.MAX)  # slowest rank
            staged = self.staging_progress()
            data_wait = staged.get("data_wait_s", 0.0)
            record = {"event": "epoch", "epoch": epoch + 1, **m, "test_loss": test_loss,
                      "test_accuracy": test_acc, "lr": self.lr_at(max(self.opt.steps - 1, 0)),
                      "shuffle_bytes_sent": self.shuffle.bytes_moved,
                      "time_to_first_batch_s": first_batch,
                      **({"staging": staged, "data_wait_fraction": data_wait / train_time if train_time else 0.0}
                         if staged else {})}
            if a.checkpoint:
                self.save_checkpoint(epoch + 1)
            self._emit(record)
            progress.update(record)
            if m.get("pretrain_expired"):
                self.pretrain_deadline = None
                decision = {"event": "staging_decision", "epoch": epoch + 1, "accuracy": test_acc,
                            "target": a.target_accuracy, "pretrain_time_s": a.pretrain_time}
                if test_acc >= a.target_accuracy:
                    stop_reason = "target accuracy reached in pre-training"
                    self._emit({**decision, "decision": "stop: target reached"})
                    last = epoch + 1
                    break
                self.switch_to_distributed(decision)
        progress.close()
        topo = self.hc.topology
        summary = {"event": "summary", "test_accuracy": test_acc, "test_loss": test_loss,
                   "epochs": last, "samples_per_s": samples / train_time if train_time else 0.0,
                   "world_size": self.size, "num_nodes": topo.num_nodes, "model": a.model,
                   "shuffle": a.shuffle, "batch_size": a.batch_size, "train_time_s": train_time,
                   "update": self.updates.mode, "policy_decisions": len(self.updates.decisions),
                   "samples_per_s_per_rank": self.comm.allgather(
                       self.updates.local_samples / train_time if train_time else 0.0),
                   "max_round_steps": self.comm.allreduce(self.updates.max_round_steps, op=MPI.MAX),
                   "time_to_first_batch_s": first_batch,
                   "data_wait_s": data_wait, "data_wait_fraction": data_wait / train_time if train_time else 0.0,
                   **({"stop_reason": stop_reason} if stop_reason else {})}
        self.data.close()
        if log:
            log.write(json.dumps(summary) + "\n")
            log.close()
        return summary


class _Progress:
    """tqdm on a terminal, otherwise one line per epoch; rank 0 only."""

    def __init__(self, args, rank: int, start_epoch: int):
        self.quiet = args.quiet or rank != 0
        self.bar = None
        if not self.quiet and sys.stdout.isatty():
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=args.epochs, initial=start_epoch, desc="train", unit="epoch")
            except ImportError:
                pass

    def update(self, r: dict) -> None:
        if self.quiet:
            return
        text = (f"epoch {r['epoch']:>3}  loss {r['train_loss']:.4f}  train_acc {r['train_accuracy']:.4f}  "
                f"test_acc {r['test_accuracy']:.4f}  lr {r['lr']:.4g}  "
                f"{r['samples'] / max(r['train_time_s'], 1e-9):.0f} samples/s")
        st = r.get("staging")
        if st:
            text += (f"  staged {st['shards_staged']} shards {st['bytes_staged'] / 2**20:.1f} MiB  "
                     f"hits {st['cache_hits']}  evicted {st['evictions']}  "
                     f"wait {st['data_wait_s']:.2f} s ({100 * r['data_wait_fraction']:.1f}%)")
        if self.bar is not None:
            self.bar.set_postfix_str(text.split("  ", 1)[1])
            self.bar.update(1)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"--straggler-threshold expects seconds or 'auto', got {text!r}") from None
    if value <= 0:
        raise UsageError(f"--straggler-threshold must be > 0 seconds, got {value}")
    return value


def _parse_fail_at(text: Optional[str]):
    if not text:
        return None
    try:
        rank, step = (int(v) for v in text.split(":"))
    except ValueError:
        raise UsageError(f"--fail-at expects RANK:STEP, got {text!r}") from None
    return rank, step


def main(argv=None) -> int:
    """Entry point: parse flags, train, print the summary; returns the exit code."""
    comm = MPI.COMM_WORLD
    try:
        args = build_parser().parse_args(argv)
        trainer = Trainer(args, comm)
        if args.resume:
            if not args.checkpoint:
                raise UsageError("--resume needs --checkpoint DIR")
            trainer.load_checkpoint()
    except SystemExit as exc:  # --help / --version
        return int(exc.code or 0)
    except (UsageError, ValueError, HxmpiError, OSError) as exc:
        # Set-up errors are the same on every rank (or agreed collectively): one line, from rank 0.
        if comm.rank == 0:
            print(f"python -m hxmpi.train: error: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        summary = trainer.run()
    except Exception as exc:  # noqa: BLE001 - any failure must end every rank, not hang them
        sys.stderr.write(f"hxmpi.train: rank {comm.rank} failed: {type(exc).__name__}: {exc}\n"
                         + traceback.format_exc())
        sys.stderr.flush()
        comm.Abort(1)
        return 1
    if comm.rank == 0 and not args.quiet:
        print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    from .cli import run_main  # an uncaught error on one rank ends the job
    run_main(main, "python -m hxmpi.train")
