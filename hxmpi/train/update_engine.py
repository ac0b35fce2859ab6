"""How parameters are updated across ranks: synchronous steps, asynchronous rounds, the policy loop.

Synchronous: every step, the dense gradients are summed over the ranks (the global mean) in
buckets posted during the backward pass (``BucketReducer``), then the optimizer steps.
Asynchronous (after the policy picks it, or ``--update async``): local SGD in rounds.
At the start of a round a rank posts a nonblocking ``Iallreduce`` of its parameters and keeps
taking local steps on its own data, testing the request after each step; when the average
arrives it keeps its own progress since the snapshot on top of it
(``params = mean(snapshots) + (params - snapshot)``). A fast rank never waits for a straggler at
every step: only when it has taken ``max_staleness`` steps in one round does it block. The j-th
step of a round uses ``lr / j`` (staleness damping after Zhang et al., 2016). Every rank posts
exactly one ``Iallreduce`` per round and an epoch has a fixed number of rounds, so no rank waits
for a collective another rank never starts.

Every ``policy_window`` rounds the ranks gather their mean compute time per step (the time in
forward/backward and the optimizer, not in communication) and apply ``update_policy.decide``; every
rank gets the same numbers, so every rank takes the same decision, which is logged with its inputs.

The engine gets the run's ``stall.WatchedComm``, so every collective here (buckets, async
averages, the policy gather) is a wait of the run's stall watch without wrapping it here.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

import numpy as np
from mpi4py import MPI

from ..errors import SettingError
from ..schema import SETTINGS, Straggle, check, check_fields, default
from .balance import proportional_counts
from .stall import WatchedComm
from .update_policy import RoundDecision, decide, gradient_coefficient

__all__ = ["BucketReducer", "UpdateConfig", "UpdateEngine"]


class BucketReducer:
    """Sums the dense gradient over the ranks in buckets, each posted as soon as it is complete.

    The model's ``grad_segments()`` (one per layer, in backward order) are grouped, in that order,
    into buckets of at most ``cap_bytes`` (a segment larger than the cap is a bucket of its own),
    as DDP groups parameters in reverse order into 25 MiB buckets. During the backward pass
    ``segment_done(k)`` posts a bucket's ``Iallreduce`` once its last segment is done and tests
    every bucket in flight, so MPI progresses them while the remaining layers compute; ``finish()``
    waits for them. Every rank posts the same buckets in the same order, and the sums are the
    same element for element as one Allreduce over the whole buffer.
    """

    def __init__(self, grads: np.ndarray, comm: MPI.Intracomm, segments: list, cap_bytes: float):
        check("bucket_cap_mb", cap_bytes / 2**20)  # the library's own callers: the one range check
        self.grads, self.comm = grads, comm
        self.buckets: list[tuple[int, int]] = []  # [lo, hi) of grads, in posting order
        self.closing: dict[int, int] = {}  # segment index -> the bucket it completes
        lo = hi = None
        for k, (s_lo, s_hi) in enumerate(segments):
            if lo is not None and (max(hi, s_hi) - min(lo, s_lo)) * grads.itemsize > cap_bytes:
                self.buckets.append((lo, hi))
                self.closing[k - 1] = len(self.buckets) - 1
                lo = hi = None
            lo, hi = (s_lo, s_hi) if lo is None else (min(lo, s_lo), max(hi, s_hi))
        if lo is not None:
            self.buckets.append((lo, hi))
            self.closing[len(segments) - 1] = len(self.buckets) - 1
        self._requests: list = []

    def segment_done(self, k: int) -> None:
        """Segment ``k`` of the backward pass is complete: post its bucket if it closes one, and
        let MPI progress the buckets in flight."""
        b = self.closing.get(k)
        if b is not None:
            lo, hi = self.buckets[b]
            self._requests.append(self.comm.Iallreduce(MPI.IN_PLACE, self.grads[lo:hi], op=MPI.SUM))
        for request in self._requests:
            request.Test()

    def finish(self) -> None:
        """Post the buckets not posted yet (a model that never called ``segment_done``), then wait
        for all of them."""
        for b in range(len(self._requests), len(self.buckets)):
            lo, hi = self.buckets[b]
            self._requests.append(self.comm.Iallreduce(MPI.IN_PLACE, self.grads[lo:hi], op=MPI.SUM))
        for request in self._requests:
            request.Wait()
        self._requests = []


@dataclass
class UpdateConfig:
    """Policy and update settings (``hxmpi.schema.SETTINGS`` names them and gives their defaults and
    ranges, checked when this is built); seconds for times."""
    update: str = default("update")                    # auto | sync | async
    b1: float = default("b1")
    b2: float = default("b2")
    straggler_threshold: Optional[float] = default("straggler_threshold")  # seconds; None = auto
    policy_window: int = default("policy_window")      # rounds between policy decisions
    max_staleness: int = default("max_staleness")      # local steps per async round before a rank blocks
    straggle: Straggle = field(default_factory=Straggle)
    balance: str = default("balance")                  # on | off | auto: split sync batches by rank speed
    batch_size: int = default("batch_size")            # global batch (samples): the reference for rebalancing
    bucket_cap_mb: float = default("bucket_cap_mb")    # MiB per gradient bucket (DDP's default cap)

    def __post_init__(self):
        check_fields(self)


BALANCE_MODES = SETTINGS["balance"].choices
# Rebalance only when the slowest rank's step (smoothed over windows) takes this much longer than
# the median one. Step times of oversubscribed ranks jitter by tens of percent, and below a step's
# fixed cost time hardly depends on the share, so re-splitting on noise would random-walk the shares.
REBALANCE_IMBALANCE = 0.5
# ... and only when that moves some rank's share of a batch by more than this fraction of an even
# share (a straggler whose fixed cost alone exceeds the others' steps keeps the imbalance even
# with no samples; re-splitting the others then only chases their noise).
REBALANCE_SHIFT = 0.25


class UpdateEngine:
    """Runs the rounds of an epoch in the mode the policy chose; collects timings and events."""

    def __init__(self, cfg: UpdateConfig, comm: MPI.Intracomm, model, opt, emit: Callable[[dict], None]):
        if cfg.update == "async" and model.collective_steps:
            raise SettingError("update", f"async needs a model whose steps are local; "
                                         f"{type(model).__name__} steps are collective")
        comm = comm if isinstance(comm, WatchedComm) else WatchedComm(comm)  # waits go through the watch
        self.cfg, self.comm, self.model, self.opt, self.emit = cfg, comm, model, opt, emit
        self.mode = "async" if cfg.update == "async" else "sync"
        self.grad_scale = 1.0
        self.lr_factor = 1.0              # the gradient coefficient, set by the trainer after evaluation
        self.slow = cfg.straggle.slows(comm.rank)
        self._window_time = 0.0
        self._window_steps = 0
        self._window_samples = 0
        self._window_rounds = 0
        self.last_step_times: list[float] = []
        self.local_steps = 0              # steps this rank took (sync and async)
        self.local_samples = 0            # samples this rank processed (async: re-reads included)
        self.max_round_steps = 0          # largest number of local steps in one async round
        self.async_rounds = 0             # async rounds this rank took part in, and its steps in them
        self.async_steps = 0
        self.round_budget = cfg.max_staleness  # async: local steps before this rank waits for the average
        self.balance_weights = None       # sync: per-rank share weights of a batch; None: even
        self._times_ema = None            # step times per rank, smoothed over the windows since the last split
        self.last_lr = 0.0                # the rate of this rank's last optimizer step
        self.decisions: list[dict] = []
        self.round = 0                    # rounds completed
        self.reducer = BucketReducer(opt.flat.dense_grads, comm, model.grad_segments(), cfg.bucket_cap_mb * 2**20)
        self.compute_s = 0.0              # this rank's seconds in forward/backward and the optimizer
        self.grad_wait_s = 0.0            # ... waiting for the gradient sums (sync) or the average (async)

    # ------------------------------------------------------------------ steps
    def _compute(self, X, y, scale: float, segment_done=None):
        """Forward/backward (+ injected straggling), timed as compute."""
        t0 = time.perf_counter()
        self.opt.flat.grads[:] = 0.0
        loss, correct = self.model.loss_and_grad(X, y, scale, segment_done)
        if self.slow:
            time.sleep(self.cfg.straggle.delay_s)
            self._stretch(t0)
        return loss, correct, time.perf_counter() - t0

    def _timed_step(self, lr: float) -> float:
        t0 = time.perf_counter()
        self.opt.step(lr)
        self.last_lr = lr
        if self.slow:
            self._stretch(t0)
        return time.perf_counter() - t0

    def _stretch(self, t0: float) -> None:
        """A straggler's compute since ``t0`` takes ``factor`` times as long (it sleeps the rest)."""
        if self.cfg.straggle.factor != 1.0:
            time.sleep((self.cfg.straggle.factor - 1.0) * (time.perf_counter() - t0))

    def step(self, part: tuple, batches: Iterator, lr: float) -> tuple[float, int, int]:
        """The next global step in the mode in effect: a sync step on ``part`` (this rank's
        (X, y, global batch) of the step), or an async round drawing local batches from
        ``batches``; returns (summed loss, correct, samples processed) on this rank."""
        if self.mode == "sync":
            X, y, global_batch = part
            return (*self.sync_step(X, y, global_batch, lr), len(y))
        return self.async_round(batches, lr)

    def sync_step(self, X, y, global_batch: int, lr: float) -> tuple[float, int]:
        """One synchronous step on this rank's share of a global batch."""
        # A slowed rank (testing aid) posts its buckets after its injected delay, as a backward pass
        # that is really that slow would: its gradients must not reach the others early.
        done = None if self.slow else self.reducer.segment_done
        loss, correct, compute = self._compute(X, y, 1.0 / max(global_batch, 1), done)
        t0 = time.perf_counter()
        self.reducer.finish()
        self.grad_wait_s += time.perf_counter() - t0
        if self.grad_scale != 1.0:
            self.opt.flat.grads *= self.grad_scale
        compute += self._timed_step(lr * self.lr_factor)
        self._account(compute, len(y), steps=1)
        return loss, correct

    def async_round(self, batches: Iterator, lr: float) -> tuple[float, int, int]:
        """One asynchronous round: local steps until the parameter average arrives, or until this
        rank's step budget is spent; then it waits for the average. The budget (``round_budget``)
        is how many of this rank's steps fit into one step of the slowest rank (at most
        ``max_staleness``), so the slowest rank waits right after its own step and never holds
        a round for longer than that step plus the reduction."""
        dense = self.opt.flat.params[:self.opt.flat.dense_size]
        snapshot = dense.copy()
        total = np.empty_like(snapshot)
        request = self.comm.Iallreduce(snapshot, total, op=MPI.SUM)
        loss_sum = correct_sum = samples = steps = 0
        compute = 0.0
        while True:
            X, y = next(batches)
            loss, correct, c = self._compute(X, y, 1.0 / max(len(y), 1))
            steps += 1
            c += self._timed_step(lr * self.lr_factor / steps)
            compute += c
            loss_sum += loss
            correct_sum += correct
            samples += len(y)
            if steps >= self.round_budget:
                t0 = time.perf_counter()
                request.Wait(counted=False)  # only the ranks that ran ahead wait here
                self.grad_wait_s += time.perf_counter() - t0
                break
            if request.Test():
                break
        dense += total / self.comm.size - snapshot
        self.max_round_steps = max(self.max_round_steps, steps)
        self.async_rounds += 1
        self.async_steps += steps
        self._account(compute, samples, steps)
        return loss_sum, correct_sum, samples

    def _account(self, compute: float, samples: int, steps: int) -> None:
        self.compute_s += compute
        self._window_time += compute
        self._window_steps += steps
        self._window_samples += samples
        self._window_rounds += 1
        self.local_steps += steps
        self.local_samples += samples

    # ------------------------------------------------------------------ policy
    def end_of_round(self, round_index: int, epoch: int) -> Optional[RoundDecision]:
        """Every ``policy_window`` rounds: gather compute times, decide, log, and return the decision,
        now in effect (collective at those rounds); None between decisions.

        Balancing (sync) gives each rank a share of a batch in proportion to its speed in the
        window, samples per second of compute. Step time is not proportional to samples (every
        step has a fixed cost), so the shares approach equal step times over a few windows
        rather than in one; a rank whose fixed cost alone exceeds the others' steps ends with
        (almost) no samples, which is then the fastest split.
        """
        self.round = round_index
        if self._window_rounds < self.cfg.policy_window:
            return None
        mine = (self._window_time, self._window_steps, self._window_samples)
        gathered = np.array(self.comm.allgather(mine), dtype=np.float64)
        self._window_time, self._window_steps, self._window_samples, self._window_rounds = 0.0, 0, 0, 0
        seconds, steps, samples = gathered.T
        times = [float(t / max(k, 1.0)) for t, k in zip(seconds, steps)]
        self.last_step_times = times
        decision = decide(times, self.cfg.b1, self.cfg.b2, self.cfg.straggler_threshold, self.cfg.update)
        mode, scale, note = decision.mode, decision.grad_scale, None
        if mode == "async" and self.model.collective_steps:
            mode, note = "sync", "the model's steps are collective: async not possible, staying sync"
        self.mode, self.grad_scale = mode, scale
        slowest = max(times)
        budgets = [max(1, min(self.cfg.max_staleness, int(slowest / t))) if t > 0 else self.cfg.max_staleness
                   for t in times]
        self.round_budget = budgets[self.comm.rank]
        record = {**decision.as_record(), "mode": mode, "round": round_index, "epoch": epoch,
                  "step_times_s": times}
        if mode == "async":
            record["round_budgets"] = budgets
        # auto: on once the rule finds stragglers and stays sync; it stays on while sync, because
        # balanced step times no longer show the straggler.
        was_on = self.balance_weights is not None
        balanced = mode == "sync" and (self.cfg.balance == "on" or (self.cfg.balance == "auto"
                                                                     and (decision.ratio > 0 or was_on)))
        moved = self._set_balance(balanced, times, samples / np.maximum(steps, 1.0))
        record["balance"] = "on" if self.balance_weights is not None else "off"
        if note:
            record["note"] = note
        self.decisions.append(record)
        self.emit(record)
        weights = None if self.balance_weights is None else tuple(self.balance_weights)
        return RoundDecision(mode, scale, weights, moved, record)

    def busy(self) -> tuple[float, float]:
        """This rank's seconds so far in compute and in waiting for gradient sums or averages."""
        return self.compute_s, self.grad_wait_s

    def adjust(self, accuracy: float, target: float) -> dict:
        """Take the policy's gradient coefficient for the accuracy gap and the last window's
        slowest step as the factor of every later step size; returns the record to log."""
        times = self.last_step_times or [1.0]
        median = float(np.median(times))
        self.lr_factor = gradient_coefficient(accuracy, target, max(times), median)
        return {"event": "gradient_adjustment", "accuracy": accuracy, "target": target,
                "max_step_time_s": max(times), "median_step_time_s": median, "coefficient": self.lr_factor}

    def figures(self, train_time: float) -> dict:
        """The run's update figures for the summary (collective): mode, decisions, processed
        samples/s per rank over ``train_time`` seconds, async round sizes."""
        rate = self.local_samples / train_time if train_time else 0.0
        return {"update": self.mode, "policy_decisions": len(self.decisions),
                "processed_samples_per_s_per_rank": self.comm.allgather(rate),
                "max_round_steps": self.comm.allreduce(self.max_round_steps, op=MPI.MAX),
                "steps_per_async_round_per_rank": self.comm.allgather(self.async_steps / max(self.async_rounds, 1))}

    def state(self) -> dict:
        """The policy state a checkpoint carries (the same on every rank; JSON-ready)."""
        return {"mode": self.mode, "grad_scale": self.grad_scale, "lr_factor": self.lr_factor,
                "balance_weights": self.balance_weights, "world_size": self.comm.size}

    def restore(self, state: dict) -> None:
        """Continue from a checkpoint's ``state()``. Balance weights are per rank: at another world
        size the split starts even again and the next decisions re-balance."""
        self.mode, self.grad_scale, self.lr_factor = state["mode"], state["grad_scale"], state["lr_factor"]
        if state.get("world_size") == self.comm.size:
            self.balance_weights = state.get("balance_weights")

    def shares(self, batch: int) -> np.ndarray:
        """Samples per rank of a synchronous global batch of ``batch`` samples under the current
        balance (even when balancing is off)."""
        weights = self.balance_weights if self.balance_weights is not None else [1.0] * self.comm.size
        return proportional_counts(weights, batch)

    def _set_balance(self, on: bool, times: list[float], share: np.ndarray) -> bool:
        """Balancing ``on``: when the step times (smoothed over windows) are out of balance, give
        each rank ``share`` (its samples per step) times the median step time over its own, i.e.
        its speed; off: back to even. Returns whether any rank's share of a batch moved."""
        weights = None
        if on:
            t = np.asarray(times) if self._times_ema is None else 0.5 * self._times_ema + 0.5 * np.asarray(times)
            self._times_ema = t
            median = float(np.median(t))
            if t.min() <= 0 or t.max() <= (1 + REBALANCE_IMBALANCE) * median:
                return False  # balanced enough: keep the pieces where they are
            # A rank with no samples keeps the weight of one, so it can win some back.
            weights = [float(max(n, 1.0) * median / s) for n, s in zip(share, t)]
        reference = max(self.cfg.batch_size, self.comm.size)
        before = self.shares(reference)
        old, self.balance_weights = self.balance_weights, weights
        moved = np.abs(self.shares(reference) - before).max()
        if weights is not None and moved <= REBALANCE_SHIFT * reference / self.comm.size:
            self.balance_weights = old
            return False
        self._times_ema = None  # times measured under the old split say nothing about the new one
        return bool(moved > 0)
