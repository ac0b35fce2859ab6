"""How parameters are updated across ranks: synchronous steps, asynchronous rounds, the policy loop.

Synchronous: every step, one Allreduce of the dense gradients (the global mean), then the
optimizer. Asynchronous (after the policy picks it, or ``--update async``): local SGD in rounds.
At the start of a round a rank posts a nonblocking ``Iallreduce`` of its parameters and keeps
taking local steps on its own data, testing the request after each step; when the average
arrives it keeps its own progress since the snapshot on top of it
(``params = mean(snapshots) + (params - snapshot)``). A fast rank never waits for a straggler at
every step: only when it has taken ``max_staleness`` steps in one round does it block. The j-th
step of a round uses ``lr / j`` (staleness damping after Zhang et al., 2016). Every rank posts
exactly one ``Iallreduce`` per round and an epoch has a fixed number of rounds, so no rank waits
for a collective another rank never starts.

Every ``window`` rounds the ranks gather their mean compute time per step (the time in
forward/backward and the optimizer, not in communication) and apply ``policy.decide``; every
rank gets the same numbers, so every rank takes the same decision, which is logged with its inputs.

Stall detection (``stall_timeout`` > 0): every blocking collective here runs inside
``watch.waiting`` of the run's ``stall.StallWatch`` (set by the trainer), which names the ranks
missing from it after the timeout on every rank, and aborts the job if asked to.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

import numpy as np
from mpi4py import MPI

from .errors import SettingError
from .balance import proportional_counts
from .policy import decide
from .settings import check_fields, default
from .stall import NoWatch

SPIN_S = 200e-6   # a wait polls MPI this long before it starts sleeping between polls
NAP_S = 50e-6     # sleep between polls after that


def wait_politely(request: MPI.Request) -> None:
    """Wait for ``request`` without keeping a core busy for long.

    Open MPI's own waits poll in a loop. Where ranks share cores (more ranks than cores, other
    jobs, or two virtual CPUs on one physical core) a polling rank takes cycles from the ranks
    still computing: on the 2-vCPU development VM a matmul ran 1.7x slower while the other
    rank polled than while it slept. So poll for ``SPIN_S`` (short waits stay fast), then sleep
    ``NAP_S`` between polls.
    """
    t0 = time.perf_counter()
    while not request.Test():
        if time.perf_counter() - t0 > SPIN_S:
            time.sleep(NAP_S)


@dataclass(frozen=True)
class Straggle:
    """Injected straggling (testing, benchmarks): ``ranks`` sleep ``delay_s`` seconds per step and
    stretch their compute time by ``factor`` (1: as measured)."""
    ranks: tuple = ()
    delay_s: float = 0.0
    factor: float = 1.0

    def slows(self, rank: int) -> bool:
        """Whether ``rank`` is slowed at all."""
        return rank in self.ranks and (self.delay_s > 0 or self.factor != 1.0)


@dataclass
class UpdateConfig:
    """Policy and update settings (``settings.SETTINGS`` names them and gives their defaults and
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

    def __post_init__(self):
        check_fields(self)


BALANCE_MODES = ("on", "off", "auto")
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
        self.balance_changed = False      # set by a decision that changed the weights; the trainer clears it
        self._times_ema = None            # step times per rank, smoothed over the windows since the last split
        self.last_lr = 0.0                # the rate of this rank's last optimizer step
        self.decisions: list[dict] = []
        self.watch = NoWatch()            # the run's stall watch (stall.StallWatch), set by the trainer
        self.round = 0                    # rounds completed (for stall messages)

    # ------------------------------------------------------------------ steps
    def _compute(self, X, y, scale: float):
        """Forward/backward (+ injected straggling), timed as compute."""
        t0 = time.perf_counter()
        self.opt.flat.grads[:] = 0.0
        loss, correct = self.model.loss_and_grad(X, y, scale)
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

    def sync_step(self, X, y, global_batch: int, lr: float, round_index: int) -> tuple[float, int]:
        """One synchronous step on this rank's share of a global batch."""
        if self.model.collective_steps:  # the forward/backward exchanges tokens: a collective too
            with self.watch.waiting("expert exchange", round_index):
                loss, correct, compute = self._compute(X, y, 1.0 / max(global_batch, 1))
        else:
            loss, correct, compute = self._compute(X, y, 1.0 / max(global_batch, 1))
        with self.watch.waiting("gradient allreduce", round_index):
            wait_politely(self.comm.Iallreduce(MPI.IN_PLACE, self.opt.flat.dense_grads, op=MPI.SUM))
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
                with self.watch.waiting("async average", self.round, counted=False):
                    wait_politely(request)
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
        self._window_time += compute
        self._window_steps += steps
        self._window_samples += samples
        self._window_rounds += 1
        self.local_steps += steps
        self.local_samples += samples

    # ------------------------------------------------------------------ policy
    def end_of_round(self, round_index: int, epoch: int) -> None:
        """Every ``window`` rounds: gather compute times, decide, log (collective at those rounds).

        Balancing (sync) gives each rank a share of a batch in proportion to its speed in the
        window, samples per second of compute. Step time is not proportional to samples (every
        step has a fixed cost), so the shares approach equal step times over a few windows
        rather than in one; a rank whose fixed cost alone exceeds the others' steps ends with
        (almost) no samples, which is then the fastest split.
        """
        self.round = round_index
        if self._window_rounds < self.cfg.policy_window:
            return
        mine = (self._window_time, self._window_steps, self._window_samples)
        with self.watch.waiting("policy gather", round_index):
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
        self._set_balance(balanced, times, samples / np.maximum(steps, 1.0))
        record["balance"] = "on" if self.balance_weights is not None else "off"
        if note:
            record["note"] = note
        self.decisions.append(record)
        self.emit(record)

    def shares(self, batch: int) -> np.ndarray:
        """Samples per rank of a synchronous global batch of ``batch`` samples under the current
        balance (even when balancing is off)."""
        weights = self.balance_weights if self.balance_weights is not None else [1.0] * self.comm.size
        return proportional_counts(weights, batch)

    def _set_balance(self, on: bool, times: list[float], share: np.ndarray) -> None:
        """Balancing ``on``: when the step times (smoothed over windows) are out of balance, give
        each rank ``share`` (its samples per step) times the median step time over its own, i.e.
        its speed; off: back to even. Sets ``balance_changed`` if any rank's share of a batch moves."""
        weights = None
        if on:
            t = np.asarray(times) if self._times_ema is None else 0.5 * self._times_ema + 0.5 * np.asarray(times)
            self._times_ema = t
            median = float(np.median(t))
            if t.min() <= 0 or t.max() <= (1 + REBALANCE_IMBALANCE) * median:
                return  # balanced enough: keep the pieces where they are
            # A rank with no samples keeps the weight of one, so it can win some back.
            weights = [float(max(n, 1.0) * median / s) for n, s in zip(share, t)]
        reference = max(self.cfg.batch_size, self.comm.size)
        before = self.shares(reference)
        old, self.balance_weights = self.balance_weights, weights
        moved = np.abs(self.shares(reference) - before).max()
        if weights is not None and moved <= REBALANCE_SHIFT * reference / self.comm.size:
            self.balance_weights = old
            return
        self._times_ema = None  # times measured under the old split say nothing about the new one
        self.balance_changed = moved > 0
