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
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import numpy as np
from mpi4py import MPI

from .errors import SettingError
from .policy import MODES, decide
from .stall import NoWatch


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
    """Policy and update settings (seconds for times)."""
    update: str = "sync"                  # auto | sync | async
    b1: float = 0.3
    b2: float = 0.7
    threshold: Optional[float] = None     # straggler threshold in seconds; None = auto
    window: int = 10                      # rounds between policy decisions
    max_staleness: int = 4                # local steps per async round before a rank blocks
    straggle: Straggle = Straggle()
    stall_timeout: float = 0.0            # 0: off
    stall_abort: bool = False


class UpdateEngine:
    """Runs the rounds of an epoch in the mode the policy chose; collects timings and events."""

    def __init__(self, cfg: UpdateConfig, comm: MPI.Intracomm, model, opt, emit: Callable[[dict], None]):
        if cfg.update not in MODES:
            raise SettingError("update", f"must be one of {', '.join(MODES)}, got {cfg.update!r}")
        for name, value in (("max_staleness", cfg.max_staleness), ("policy_window", cfg.window)):
            if value < 1:
                raise SettingError(name, f"must be >= 1, got {value}")
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
        self._window_rounds = 0
        self.last_step_times: list[float] = []
        self.local_steps = 0              # steps this rank took (sync and async)
        self.local_samples = 0
        self.max_round_steps = 0          # largest number of local steps in one async round
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
            st = self.cfg.straggle
            time.sleep(st.delay_s + (st.factor - 1.0) * (time.perf_counter() - t0))
        return loss, correct, time.perf_counter() - t0

    def _timed_step(self, lr: float) -> float:
        t0 = time.perf_counter()
        self.opt.step(lr)
        return time.perf_counter() - t0

    def sync_step(self, X, y, global_batch: int, lr: float, round_index: int) -> tuple[float, int]:
        """One synchronous step on this rank's share of a global batch."""
        if self.model.collective_steps:  # the forward/backward exchanges tokens: a collective too
            with self.watch.waiting("expert exchange", round_index):
                loss, correct, compute = self._compute(X, y, 1.0 / max(global_batch, 1))
        else:
            loss, correct, compute = self._compute(X, y, 1.0 / max(global_batch, 1))
        with self.watch.waiting("gradient allreduce", round_index):
            self.comm.Allreduce(MPI.IN_PLACE, self.opt.flat.dense_grads, op=MPI.SUM)
        if self.grad_scale != 1.0:
            self.opt.flat.grads *= self.grad_scale
        compute += self._timed_step(lr * self.lr_factor)
        self._account(compute, len(y), steps=1)
        return loss, correct

    def async_round(self, batches: Iterator, lr: float) -> tuple[float, int, int]:
        """One asynchronous round: local steps until the parameter average arrives (or the bound)."""
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
            if request.Test():
                break
            if steps >= self.cfg.max_staleness:
                with self.watch.waiting("async average", self.round, counted=False):
                    request.Wait()
                break
        dense += total / self.comm.size - snapshot
        self.max_round_steps = max(self.max_round_steps, steps)
        self._account(compute, samples, steps)
        return loss_sum, correct_sum, samples

    def _account(self, compute: float, samples: int, steps: int) -> None:
        self._window_time += compute
        self._window_steps += steps
        self._window_rounds += 1
        self.local_steps += steps
        self.local_samples += samples

    # ------------------------------------------------------------------ policy
    def end_of_round(self, round_index: int, epoch: int) -> None:
        """Every ``window`` rounds: gather step times, decide, log (collective at those rounds)."""
        self.round = round_index
        if self._window_rounds < self.cfg.window:
            return
        mean = self._window_time / max(self._window_steps, 1)
        with self.watch.waiting("policy gather", round_index):
            times = self.comm.allgather(mean)
        self._window_time, self._window_steps, self._window_rounds = 0.0, 0, 0
        self.last_step_times = times
        forced = self.cfg.update if self.cfg.update != "auto" else "auto"
        decision = decide(times, self.cfg.b1, self.cfg.b2, self.cfg.threshold, forced)
        mode, scale, note = decision.mode, decision.grad_scale, None
        if mode == "async" and self.model.collective_steps:
            mode, note = "sync", "the model's steps are collective: async not possible, staying sync"
        self.mode, self.grad_scale = mode, scale
        record = {**decision.as_record(), "mode": mode, "round": round_index, "epoch": epoch,
                  "step_times_s": times}
        if note:
            record["note"] = note
        self.decisions.append(record)
        self.emit(record)
