"""How parameters are updated across ranks: synchronous steps, asynchronous rounds, the policy loop.

Synchronous: every step, the dense gradients are summed over the ranks (the global mean) in
buckets posted during the backward pass (``BucketReducer``), then the optimizer steps.
Asynchronous (after the policy picks it, or ``--update async``): local SGD in rounds.
At the start of a round a rank posts a nonblocking ``Iallreduce`` of its parameters and keeps
taking local steps on its own data (``LocalPool``: each sample at most once per epoch), testing
the request after each step; when the average arrives it keeps its own progress since the
snapshot on top of it (``params = mean(snapshots) + (params - snapshot)``). A fast rank never
waits for a straggler at every step: only when it has taken ``max_staleness`` steps in one round
does it block. Every rank posts exactly one ``Iallreduce`` per round, and the window's rounds end
for every rank at once (when the reduction shows that some rank has read its share), so no rank
waits for a collective another rank never starts. The end of a window averages parameters and
momentum (``settle``); after ``--local-steps-until`` of the schedule the rounds give way to sync.

Every ``policy_window`` rounds the ranks gather their compute time per step (forward/backward and
the optimizer, not communication), samples and training loss; ``--update auto`` hands them to
``update_policy.PolicyController``, forced modes log the rule's view. Every rank gets the same
numbers, so every rank takes the same decision, which is logged with its inputs.

The engine gets the run's ``stall.WatchedComm``, so every collective here (buckets, async
averages, the policy gather) is a wait of the run's stall watch without wrapping it here.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
from mpi4py import MPI

from ..errors import SettingError
from ..schema import SETTINGS, Straggle, check, check_fields, default
from .balance import balanced_counts, fit_costs, proportional_counts
from .stall import WatchedComm
from .update_policy import PolicyController, RoundDecision, Window, decide, gradient_coefficient, lower_median

__all__ = ["BucketReducer", "UpdateConfig", "UpdateEngine", "LocalPool"]


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
    policy_hysteresis: int = default("policy_hysteresis")  # windows in a row a change needs
    policy_gain: float = default("policy_gain")        # relative samples/s gain a tried mode must bring
    policy_explore: str = default("policy_explore")    # all | rule
    local_steps_until: float = default("local_steps_until")  # fraction of the schedule with async allowed
    straggle: Straggle = field(default_factory=Straggle)
    balance: str = default("balance")                  # on | off | auto: split sync batches by rank speed
    batch_size: int = default("batch_size")            # global batch (samples): the reference for rebalancing
    bucket_cap_mb: float = default("bucket_cap_mb")    # MiB per gradient bucket (DDP's default cap)

    def __post_init__(self):
        check_fields(self)


BALANCE_MODES = SETTINGS["balance"].choices
# Re-split only when the slowest rank's step takes this much longer than the (lower) median one: the
# step times of ranks on a busy host jitter by tens of percent, and re-splitting on that noise
# would move samples for nothing ...
REBALANCE_IMBALANCE = 0.5
# ... except in the window right after a split, the first with two points per rank: there the
# cost model's line corrects the first split's guess (no fixed cost) down to this imbalance.
REFINE_IMBALANCE = 0.1
# ... and only when that moves some rank's share of a batch by more than this fraction of an even
# share (a straggler whose fixed cost alone exceeds the others' steps keeps the imbalance even
# with one sample; re-splitting the others then only chases their noise).
REBALANCE_SHIFT = 0.05
class LocalPool:
    """This rank's samples of the steps left in a window, for async rounds: read in local batches
    of ``batch`` samples, each sample once (a rank that has read them all takes no more steps
    until the window ends). ``lr_of(k)`` is the rate of the k-th local batch (schedule steps
    counted from the pool's first step)."""

    def __init__(self, parts: list, batch: int, lr_of: Callable[[int], float]):
        self.X = np.concatenate([p[0] for p in parts]) if parts else None
        self.y = np.concatenate([p[1] for p in parts]) if parts else np.empty(0, np.int64)
        self.batch, self.lr_of = max(1, batch), lr_of
        self.taken = 0  # local batches read so far

    @property
    def exhausted(self) -> bool:
        return self.taken * self.batch >= len(self.y)

    def take(self):
        """The next (X, y, lr), or None when every sample was read."""
        if self.exhausted:
            return None
        lo = self.taken * self.batch
        self.taken += 1
        return self.X[lo:lo + self.batch], self.y[lo:lo + self.batch], self.lr_of(self.taken - 1)


class UpdateEngine:
    """Runs the rounds of an epoch in the mode the policy chose; collects timings and events."""

    def __init__(self, cfg: UpdateConfig, comm: MPI.Intracomm, model, opt, emit: Callable[[dict], None]):
        if cfg.update == "async" and model.collective_steps:
            raise SettingError("update", f"async needs a model whose steps are local; "
                                         f"{type(model).__name__} steps are collective")
        comm = comm if isinstance(comm, WatchedComm) else WatchedComm(comm)  # waits go through the watch
        self.cfg, self.comm, self.model, self.opt, self.emit = cfg, comm, model, opt, emit
        self.mode = "async" if cfg.update == "async" and cfg.local_steps_until > 0 else "sync"
        self.controller = None
        if cfg.update == "auto":
            self.controller = PolicyController(cfg.b1, cfg.b2, cfg.straggler_threshold, cfg.policy_hysteresis,
                                               cfg.policy_gain, cfg.policy_explore,
                                               async_allowed=not model.collective_steps and cfg.local_steps_until > 0)
        self.grad_scale = 1.0
        self.lr_factor = 1.0              # the gradient coefficient, set by the trainer after evaluation
        self.total_steps = 0              # the schedule's steps (the trainer sets them): --local-steps-until, UNTIL
        self.straggling = cfg.straggle.slows(comm.rank)
        self._new_window()
        self.last_step_times: list[float] = []
        self.local_steps = 0              # steps this rank took (sync and async)
        self.local_samples = 0            # samples this rank processed
        self.max_round_steps = 0          # largest number of local steps in one async round
        self.async_rounds = 0             # async rounds this rank took part in, and its steps in them
        self.async_steps = 0
        self.round_budget = cfg.max_staleness  # async: local steps before this rank waits for the average
        self.balance_weights = None       # sync: per-rank share weights of a batch; None: even
        self._costs = None                # per rank (samples per step, step seconds) of the window before
        self.last_lr = 0.0                # the rate of this rank's last optimizer step
        self.decisions: list[dict] = []
        self.round = 0                    # schedule steps done (the trainer's count)
        self.rounds_run = 0               # rounds run (sync steps and async rounds)
        self.pool_read = 0                # async: local batches read by the furthest rank, as of the last round
        self.pool_done = False            # async: some rank has read all of its pool
        self.diverged = False             # async rounds left the ranks' parameters apart (settle() averages)
        self.reducer = BucketReducer(opt.flat.dense_grads, comm, model.grad_segments(), cfg.bucket_cap_mb * 2**20)
        self.compute_s = 0.0              # this rank's seconds in forward/backward and the optimizer
        self.grad_wait_s = 0.0            # ... waiting for the gradient sums (sync) or the average (async)

    def _new_window(self) -> None:
        self._window_time = 0.0
        self._window_steps = 0
        self._window_samples = 0
        self._window_rounds = 0
        self._window_loss = 0.0
        self._window_busy = 0.0  # seconds inside step(): compute and waits, not evaluation or shuffles

    # ------------------------------------------------------------------ steps
    @property
    def slow(self) -> bool:
        """Whether this rank is slowed now (``--straggle``, until its fraction of the schedule)."""
        return self.straggling and self.round < self.cfg.straggle.until * max(self.total_steps, 1)

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

    def step(self, part: tuple, pool: Optional[LocalPool], lr: float) -> tuple[float, int, int]:
        """The next global step in the mode in effect: a sync step on ``part`` (this rank's
        (X, y, global batch) of the step) at rate ``lr``, or an async round drawing local batches
        from ``pool``; returns (summed loss, correct, samples processed) on this rank."""
        self.rounds_run += 1
        t0 = time.perf_counter()
        if self.mode == "sync":
            X, y, global_batch = part
            out = (*self.sync_step(X, y, global_batch, lr), len(y))
        else:
            out = self.async_round(pool)
        self._window_busy += time.perf_counter() - t0
        return out

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
        self._account(compute, len(y), 1, loss)
        return loss, correct

    def async_round(self, pool: LocalPool) -> tuple[float, int, int]:
        """One asynchronous round: local steps until the parameter average arrives, or until this
        rank's step budget is spent, or its pool is read; then it waits for the average. The
        budget (``round_budget``) is how many of this rank's steps fit into one step of the
        slowest rank (at most ``max_staleness``), so the slowest rank waits right after its own
        step and never holds a round for longer than that step plus the reduction.

        Local SGD: each local step uses the schedule's rate for its local batch (the mean of P
        ranks' steps on batches of b/P is a step on a batch of b); after the average a rank keeps
        its own progress since the snapshot (``params = mean(snapshots) + (params - snapshot)``).
        The reduction also carries how many local batches each rank had read and whether one
        had read all: the window ends for everyone when one has, so no sample is read twice in
        an epoch (re-reading a fast rank's share biased the model towards it)."""
        size = self.comm.size
        dense = self.opt.flat.params[:self.opt.flat.dense_size]
        snapshot = np.zeros(dense.size + size + 1, dtype=dense.dtype)
        snapshot[:dense.size] = dense
        snapshot[dense.size + self.comm.rank] = pool.taken
        snapshot[-1] = pool.exhausted
        total = np.empty_like(snapshot)
        request = self.comm.Iallreduce(snapshot, total, op=MPI.SUM)
        loss_sum = correct_sum = samples = steps = 0
        compute = 0.0
        while True:
            batch = None if steps >= self.round_budget else pool.take()
            if batch is None:  # budget spent or nothing left to read: wait for the average
                t0 = time.perf_counter()
                request.Wait(counted=False)  # only the ranks that ran ahead wait here
                self.grad_wait_s += time.perf_counter() - t0
                break
            X, y, lr = batch
            loss, correct, c = self._compute(X, y, 1.0 / max(len(y), 1))
            steps += 1
            compute += c + self._timed_step(lr * self.lr_factor)
            loss_sum += loss
            correct_sum += correct
            samples += len(y)
            if request.Test():
                break
        dense += total[:dense.size] / size - snapshot[:dense.size]
        self.pool_read = int(round(total[dense.size:dense.size + size].max()))
        self.pool_done = bool(total[-1] > 0)
        self.diverged = size > 1
        self.max_round_steps = max(self.max_round_steps, steps)
        self.async_rounds += 1
        self.async_steps += steps
        self._account(compute, samples, max(steps, 1), loss_sum)
        return loss_sum, correct_sum, samples

    def _mean_over_ranks(self, values: np.ndarray) -> None:
        """Replace ``values`` by their mean over the ranks, in place (collective)."""
        self.comm.Allreduce(MPI.IN_PLACE, values, op=MPI.SUM)
        values /= self.comm.size

    def settle(self) -> None:
        """After async rounds: average the parameters and momentum over the ranks, so that every
        rank holds the same model again (collective; a no-op after sync steps). The trainer calls
        it at the end of every window; a switch to sync calls it too."""
        if not self.diverged:
            return
        n = self.opt.flat.dense_size
        both = np.concatenate([self.opt.flat.params[:n], self.opt.velocity[:n]])
        self._mean_over_ranks(both)
        self.opt.flat.params[:n], self.opt.velocity[:n] = both[:n], both[n:]
        self.diverged = False

    @contextmanager
    def mean_model(self):
        """Within the block every rank holds the mean of the ranks' dense parameters, the model
        ``settle`` would give, and after it its own again (collective; nothing to do after sync
        steps). Evaluation amid async rounds scores this model without ending the window."""
        if not self.diverged:
            yield
            return
        dense = self.opt.flat.params[:self.opt.flat.dense_size]
        own = dense.copy()
        self._mean_over_ranks(dense)
        try:
            yield
        finally:
            dense[:] = own

    def _account(self, compute: float, samples: int, steps: int, loss: float) -> None:
        self.compute_s += compute
        self._window_time += compute
        self._window_steps += steps
        self._window_samples += samples
        self._window_loss += loss
        self._window_rounds += 1
        self.local_steps += steps
        self.local_samples += samples

    # ------------------------------------------------------------------ policy
    def end_of_round(self, round_index: int, epoch: int) -> Optional[RoundDecision]:
        """Every ``policy_window`` rounds: gather compute times, decide, log, and return the decision,
        now in effect (collective at those rounds); None between decisions.

        ``auto`` hands the window to the ``PolicyController`` (hysteresis, trials, returns);
        forced modes log the rule's view. Balancing (sync) splits a batch by a cost model per
        rank, a fixed cost per step plus a cost per sample, fitted to the last two windows'
        (samples per step, step time), so that the step times meet within two windows.
        """
        self.round = round_index
        if self._window_rounds < self.cfg.policy_window:
            return None
        mine = (self._window_time, self._window_steps, self._window_samples, self._window_loss, self._window_busy)
        gathered = np.array(self.comm.allgather(mine), dtype=np.float64)
        self._new_window()
        seconds, steps, samples, losses, walls = gathered.T
        times = [float(t / max(k, 1.0)) for t, k in zip(seconds, steps)]
        per_step = samples / np.maximum(steps, 1.0)
        even = max(self.cfg.batch_size / self.comm.size, 1.0)
        # The rule compares ranks at an even share: a balanced split must not hide a straggler.
        normalised = [t * even / max(n, 1.0) for t, n in zip(times, per_step)]
        self.last_step_times = normalised
        was_async = self.mode == "async"
        async_over = self.cfg.local_steps_until < 1 and round_index >= self.cfg.local_steps_until * self.total_steps
        window = Window(tuple(normalised), float(samples.sum() / max(walls.max(), 1e-12)),
                        float(losses.sum() / max(samples.sum(), 1.0)))
        note = None
        if self.controller is not None:
            if async_over and self.controller.async_allowed:
                left = self.controller.forbid_async()
                if left:
                    note = "post-local: async rounds end at --local-steps-until"
            record = self.controller.observe(window)
            chosen, scale = self.controller.mode, self.controller.grad_scale
            ratio = record["ratio"]
        else:
            decision = decide(normalised, self.cfg.b1, self.cfg.b2, self.cfg.straggler_threshold, self.cfg.update)
            record = {**decision.as_record(), "rate_samples_per_s": window.rate, "train_loss": window.loss,
                      "step_times_s": normalised}
            chosen, scale, ratio = decision.mode, decision.grad_scale, decision.ratio
            if chosen == "async" and async_over:
                chosen, note = "sync", "post-local: async rounds end at --local-steps-until"
        mode = "async" if chosen == "async" else "sync"
        self.mode, self.grad_scale = mode, scale if chosen == "damped" or self.controller is None else 1.0
        if was_async and mode == "sync":
            self.settle()
        slowest = max(times)
        budgets = [max(1, min(self.cfg.max_staleness, int(slowest / t))) if t > 0 else self.cfg.max_staleness
                   for t in times]
        self.round_budget = budgets[self.comm.rank]
        record = {**record, "mode": chosen, "round": round_index, "epoch": epoch}
        if mode == "async":
            record["round_budgets"] = budgets
        # auto: on once the rule finds stragglers and stays sync; it stays on while sync.
        was_on = self.balance_weights is not None
        balanced = mode == "sync" and (chosen == "balanced" or self.cfg.balance == "on"
                                       or (self.cfg.balance == "auto" and (ratio > 0 or was_on)))
        moved = self._set_balance(balanced, np.asarray(times), per_step)
        record["balance"] = "on" if self.balance_weights is not None else "off"
        if note:
            record["note"] = note
        self.decisions.append(record)
        self.emit(record)
        weights = None if self.balance_weights is None else tuple(self.balance_weights)
        return RoundDecision(mode, self.grad_scale, weights, moved, record)

    def rounds_to_decision(self) -> int:
        """Rounds left before the next policy decision (``end_of_round`` decides after the last)."""
        return max(self.cfg.policy_window - self._window_rounds, 0)

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
        return {"update": self.mode, "modes_used": sorted({d["mode"] for d in self.decisions} | {self.mode}),
                "policy_decisions": len(self.decisions),
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
        if self.controller is not None:
            self.controller.mode = "async" if self.mode == "async" else "damped" if self.grad_scale < 1 else "sync"
            self.controller.grad_scale = self.grad_scale
        if state.get("world_size") == self.comm.size:
            self.balance_weights = state.get("balance_weights")

    def shares(self, batch: int) -> np.ndarray:
        """Samples per rank of a synchronous global batch of ``batch`` samples under the current
        balance (even when balancing is off)."""
        weights = self.balance_weights if self.balance_weights is not None else [1.0] * self.comm.size
        return proportional_counts(weights, batch)

    def _cost_model(self, times: np.ndarray, per_step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per rank (fixed seconds per step, seconds per sample), ``balance.fit_costs`` over this
        window and the window before (forgotten when balancing stops)."""
        fixed, per_sample = fit_costs(per_step, times, self._costs)
        self._costs = (per_step.copy(), times.copy(), fixed)
        return fixed, per_sample

    def _set_balance(self, on: bool, times: np.ndarray, per_step: np.ndarray) -> bool:
        """Balancing ``on``: when the step times are out of balance, split a batch by the cost
        model (``balance.balanced_counts``); off: back to even. Returns whether any rank's
        share of a batch moved."""
        if not on:
            self._costs = None
            if self.balance_weights is None:
                return False
            self.balance_weights = None
            return True
        refine = self._costs is not None and bool(np.any(np.abs(per_step - self._costs[0]) >= 1))
        fixed, per_sample = self._cost_model(times, per_step)
        allowed = REFINE_IMBALANCE if refine else REBALANCE_IMBALANCE
        # The lower median: of two ranks, the faster one (the mean of two would put a rank x3
        # exactly at 1 + REBALANCE_IMBALANCE times it, and noise would decide).
        if times.min() <= 0 or times.max() <= (1 + allowed) * lower_median(times):
            return False  # balanced enough: keep the pieces where they are
        reference = max(self.cfg.batch_size, self.comm.size)
        target = balanced_counts(fixed, np.maximum(per_sample, 1e-12), reference)
        before = self.shares(reference)
        if np.abs(target - before).max() <= REBALANCE_SHIFT * reference / self.comm.size:
            return False
        self.balance_weights = [float(c) for c in target]
        return True
