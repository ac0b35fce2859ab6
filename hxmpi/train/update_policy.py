"""Update policy and gradient coefficient (docs/method.md): pure functions, no MPI.

The straggler ratio B is the fraction of ranks whose step time exceeds a threshold. With
thresholds 0 <= B1 <= B2 <= 1::

  B = 0         -> sync        no stragglers, no reason to accept staleness
  0 < B <= B1   -> async       a few stragglers must not hold everyone back
  B1 < B <= B2  -> sync        most ranks are equally slow, waiting costs little
  B > B2        -> sync, gradients scaled by 1 - dB with dB = B - B2

The gradient adjustment coefficient combines the accuracy gap and the slowest step::

  c = clip((1 + gain * max(0, target - accuracy)) * sqrt(min(1, reference_time / max_time)), lo, hi)

A model below its target accuracy takes larger steps; a slow straggler damps them (its gradients
are the stalest), by the square root of the speed ratio so that one slow rank cannot stall
training. The result is clipped to [lo, hi] (default [0.1, 2]).

``PolicyController`` runs the rule for ``--update auto`` across windows: hysteresis, one-window
trials of the other modes beside a straggler, kept only when they measure better, and returns
(docs/method.md: *The policy controller*).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

from ..schema import SETTINGS

__all__ = ["PolicyController", "Window", "Decision", "RoundDecision", "auto_threshold", "lower_median", "straggler_ratio",
           "check_thresholds", "decide", "gradient_coefficient"]

MODES = SETTINGS["update"].choices
AUTO_THRESHOLD_FACTOR = 2.0  # "auto" straggler threshold: this multiple of the lower median step time


@dataclass(frozen=True)
class Decision:
    """One policy decision with its inputs, for the log."""
    mode: str                 # "sync" or "async"
    grad_scale: float         # multiply gradients by this (1 - dB above B2, else 1)
    ratio: float              # B, the straggler fraction
    b1: float
    b2: float
    threshold_s: float        # straggler threshold, seconds
    forced: Optional[str]     # the mode the user forced, if any
    rule: str                 # which branch of the rule fired

    def as_record(self) -> dict:
        """A JSON-ready dict."""
        return {"event": "policy", **asdict(self)}


@dataclass(frozen=True)
class RoundDecision:
    """What the update engine does from the next round on, returned to the trainer (the same on
    every rank): the mode, the gradient scale, the balance weights (per-rank share weights of a
    sync batch; None: even) and whether they changed (``rebalance``). While weights are set the
    trainer re-splits the steps up to the next decision. ``record`` is the logged decision with
    its inputs."""
    mode: str
    grad_scale: float
    balance_weights: Optional[tuple]
    rebalance: bool
    record: dict


def lower_median(step_times: Sequence[float]) -> float:
    """The lower median step time (seconds): the smaller middle value for an even count.

    It lets two ranks tell a straggler from its partner; the plain median of two would sit
    between them (a rank x3 would then be exactly 1.5 times it, on the edge of every threshold).
    """
    if len(step_times) == 0:
        raise ValueError("no step times")
    return float(sorted(step_times)[(len(step_times) - 1) // 2])


def auto_threshold(step_times: Sequence[float], factor: float = AUTO_THRESHOLD_FACTOR) -> float:
    """``factor`` times the lower median step time (seconds; ``lower_median``)."""
    return factor * lower_median(step_times)


def straggler_ratio(step_times: Sequence[float], threshold: float) -> float:
    """B: the fraction of ranks whose step time (seconds) exceeds ``threshold``."""
    if not step_times:
        raise ValueError("no step times")
    return sum(t > threshold for t in step_times) / len(step_times)


def check_thresholds(b1: float, b2: float) -> None:
    """Raise ValueError unless 0 <= b1 <= b2 <= 1."""
    if not (0.0 <= b1 <= b2 <= 1.0):
        raise ValueError(f"need 0 <= b1 <= b2 <= 1, got b1={b1}, b2={b2}")


def decide(step_times: Sequence[float], b1: float, b2: float, threshold: Optional[float] = None,
           forced: str = "auto") -> Decision:
    """Apply the rule to every rank's step time (seconds); ``threshold`` None means auto."""
    check_thresholds(b1, b2)
    if forced not in MODES:
        raise ValueError(f"update mode must be one of {MODES}, got {forced!r}")
    thr = auto_threshold(step_times) if threshold is None else float(threshold)
    ratio = straggler_ratio(step_times, thr)
    common = dict(ratio=ratio, b1=b1, b2=b2, threshold_s=thr)
    if forced != "auto":
        return Decision(forced, 1.0, forced=forced, rule="forced", **common)
    if ratio == 0.0:
        return Decision("sync", 1.0, forced=None, rule="B = 0", **common)
    if ratio <= b1:
        return Decision("async", 1.0, forced=None, rule="0 < B <= B1", **common)
    if ratio <= b2:
        return Decision("sync", 1.0, forced=None, rule="B1 < B <= B2", **common)
    return Decision("sync", 1.0 - (ratio - b2), forced=None, rule="B > B2", **common)


def gradient_coefficient(accuracy: float, target: float, max_step_time: float, reference_step_time: float,
                         gain: float = 1.0, lo: float = 0.1, hi: float = 2.0) -> float:
    """The gradient adjustment coefficient (see the module docstring); times in seconds."""
    if not (0.0 <= accuracy <= 1.0 and 0.0 <= target <= 1.0):
        raise ValueError(f"accuracies must lie in [0, 1], got {accuracy} and {target}")
    if max_step_time <= 0 or reference_step_time <= 0:
        raise ValueError("step times must be positive")
    if not 0 < lo <= hi:
        raise ValueError(f"need 0 < lo <= hi, got {lo}, {hi}")
    boost = 1.0 + gain * max(0.0, target - accuracy)
    damp = math.sqrt(min(1.0, reference_step_time / max_step_time))
    return min(hi, max(lo, boost * damp))


# ----------------------------------------------------------------------------- the policy controller
# The modes ``auto`` moves between. "balanced" is sync with each batch split by rank speed
# (balance.py); "damped" is sync with the rule's gradient scale 1 - (B - b2).
CONTROLLER_MODES = ("sync", "async", "balanced", "damped")
EXPLORE = SETTINGS["policy_explore"].choices
# A window whose mean training loss is this much above the window before, in a mode just
# entered, says the mode hurts the model whatever its speed (async's dips).
LOSS_RISE = 0.05


@dataclass(frozen=True)
class Window:
    """What one policy window measured, the same on every rank: per-rank compute seconds per step
    scaled to an even share of a batch (``step_times``), samples per second of the time the
    slowest rank spent in steps (``rate``; evaluation and shuffles excluded) and the window's mean
    training loss per sample (``loss``)."""
    step_times: tuple
    rate: float
    loss: float


class PolicyController:
    """``--update auto`` across windows: the seed's rule proposes, hysteresis confirms, the
    measured progress decides (pure: no MPI, so every rank given the same windows decides alike).

    - The rule (``decide``) maps each window to a mode: "async" (0 < B <= b1), "damped" (B > b2),
      "sync" otherwise; with stragglers (B > 0) and ``explore == "all"`` the candidates are the
      rule's mode, "async", "balanced" and "damped" (when its scale is below 1).
    - A change needs the same proposal in ``hysteresis`` windows in a row: one noisy window
      changes nothing.
    - With stragglers, a change is a trial (with ``explore == "all"``, plain sync beside a
      straggler starts one even where the rule says sync: one slow rank of two is B = 0.5 > b1):
      each candidate runs one window and is scored by
      ``rate`` (samples/s); the best is kept if it beats the mode before by more than ``gain``
      (relative), else the mode before returns. A candidate whose window's loss rose by more
      than ``LOSS_RISE`` against the window before scores nothing.
    - A kept mode stays while the straggler does (the rule alone would pull a kept async back
      to sync wherever B > b1, undoing what the trial measured).
    - Back to plain sync when the straggler is gone (B = 0 in ``hysteresis`` windows) needs no
      trial: sync is the safe mode.
    - A trial that ended in a return is not retried for ``hysteresis * 2**k`` windows after the
      k-th return in a row (so a straggler that async cannot beat costs few windows).

    Each ``observe`` returns a record of what was decided and why, with the numbers.
    """

    def __init__(self, b1: float, b2: float, threshold: Optional[float] = None, hysteresis: int = 2,
                 gain: float = 0.1, explore: str = "all", async_allowed: bool = True):
        check_thresholds(b1, b2)
        if hysteresis < 1:
            raise ValueError(f"hysteresis must be >= 1 window, got {hysteresis}")
        if explore not in EXPLORE:
            raise ValueError(f"explore must be one of {EXPLORE}, got {explore!r}")
        self.b1, self.b2, self.threshold = b1, b2, threshold
        self.hysteresis, self.gain, self.explore = hysteresis, gain, explore
        self.async_allowed = async_allowed
        self.mode = "sync"
        self.grad_scale = 1.0
        self._proposal, self._streak = None, 0
        self._trial: list = []              # candidates still to run, one window each
        self._scores: dict = {}             # mode -> rate measured in its trial window
        self._base: Optional[tuple] = None  # (mode, rate, loss) the trial is measured against
        self._last: Optional[Window] = None
        self._returns = 0                   # trials in a row that ended in a return
        self._hold = 0                      # windows left before another trial may start
        self._trial_running = False

    def _rule(self, w: Window) -> tuple[str, float, Decision]:
        d = decide(w.step_times, self.b1, self.b2, self.threshold)
        if d.mode == "async":
            mode = "async" if self.async_allowed else "sync"
        else:
            mode = "damped" if d.grad_scale < 1.0 else "sync"
        return mode, d.grad_scale, d

    def _candidates(self, proposed: str, scale: float, ratio: float) -> list:
        if self.explore == "rule" or ratio == 0:
            return [proposed]
        ordered = [proposed, "async", "balanced"] + (["damped"] if scale < 1.0 else [])
        out = []
        for m in ordered:
            if m not in out and m != self.mode and (m != "async" or self.async_allowed) \
                    and (m != "damped" or scale < 1.0):
                out.append(m)
        return out

    def _enter(self, mode: str, scale: float) -> None:
        self.mode = mode
        self.grad_scale = scale if mode == "damped" else 1.0

    def forbid_async(self) -> Optional[dict]:
        """From now on no async (``--local-steps-until`` reached): leave it for the best other
        mode measured (plain sync if none was); returns the record when the mode changed."""
        self.async_allowed = False
        self._trial = [m for m in self._trial if m != "async"]
        if self.mode != "async":
            return None
        others = {m: r for m, r in self._scores.items() if m != "async"}
        self._enter(max(others, key=others.get) if others else "sync", self.grad_scale)
        return {"event": "policy", "mode_before": "async", "mode": self.mode, "action": "post-local",
                "scores": others}

    def observe(self, w: Window) -> dict:
        """Take one window's measurements (made in ``self.mode``); return the decision record.
        ``self.mode`` and ``self.grad_scale`` then hold the mode of the next window."""
        proposed, scale, d = self._rule(w)
        before = self.mode
        rec = {"event": "policy", **asdict(d), "proposed": proposed, "mode_before": before,
               "rate_samples_per_s": w.rate, "train_loss": w.loss, "step_times_s": list(w.step_times)}
        loss_rose = self._last is not None and w.loss > (1 + LOSS_RISE) * self._last.loss
        self._last = w
        if self._trial_running:
            return self._continue_trial(w, scale, loss_rose, rec)
        self._hold = max(0, self._hold - 1)
        straggling = d.ratio > 0
        # Plain sync beside a straggler: the other modes are worth a trial whatever the rule says.
        explore = self.explore == "all" and straggling and self.mode == "sync"
        # A mode kept after a trial stays while the straggler does (the rule cannot see that a
        # balanced split or async rounds are what hide it); the rule alone moves by its proposals.
        settled = proposed == self.mode or (straggling and self.mode != "sync" and proposed == "sync"
                                            and (self.explore == "all" or self.mode == "balanced"))
        if settled and not explore:
            self._proposal, self._streak = None, 0
            if self.mode == "damped":
                self.grad_scale = scale  # the damping follows B
            return {**rec, "mode": self.mode, "action": "stay"}
        key = "explore" if proposed == self.mode else proposed
        self._streak = self._streak + 1 if key == self._proposal else 1
        self._proposal = key
        if self._streak < self.hysteresis:
            return {**rec, "mode": self.mode, "action": "wait", "streak": self._streak}
        self._proposal, self._streak = None, 0
        if not straggling:
            self._enter("sync", 1.0)  # no straggler: back to the safe mode, no trial needed
            self._returns = 0
            return {**rec, "mode": self.mode, "action": "change", "streak": self.hysteresis}
        if self._hold > 0:
            return {**rec, "mode": self.mode, "action": "hold", "hold_windows": self._hold}
        self._trial = self._candidates(proposed, scale, d.ratio)
        if not self._trial:
            return {**rec, "mode": self.mode, "action": "stay"}
        self._scores = {}
        self._base = (self.mode, w.rate)
        self._trial_running = True
        self._enter(self._trial.pop(0), scale)
        return {**rec, "mode": self.mode, "action": "trial",
                "baseline": {"mode": before, "rate_samples_per_s": w.rate}}

    def _continue_trial(self, w: Window, scale: float, loss_rose: bool, rec: dict) -> dict:
        self._scores[self.mode] = 0.0 if loss_rose else w.rate
        if self._trial:
            self._enter(self._trial.pop(0), scale)
            return {**rec, "mode": self.mode, "action": "trial", "scores": dict(self._scores),
                    **({"loss_rose": True} if loss_rose else {})}
        base_mode, base_rate = self._base
        best = max(self._scores, key=lambda m: (self._scores[m], -CONTROLLER_MODES.index(m)))
        gains = {m: (r / base_rate - 1.0) if base_rate > 0 else float("inf") for m, r in self._scores.items()}
        self._base, self._trial_running = None, False
        if gains[best] > self.gain:
            self._enter(best, scale)
            self._returns = 0
            action = "keep"
        else:
            self._enter(base_mode, scale)
            self._returns += 1
            self._hold = self.hysteresis * 2 ** self._returns
            action = "return"
        return {**rec, "mode": self.mode, "action": action, "scores": dict(self._scores), "gains": gains,
                "baseline": {"mode": base_mode, "rate_samples_per_s": base_rate}, "gain_needed": self.gain,
                **({"loss_rose": True} if loss_rose else {})}
