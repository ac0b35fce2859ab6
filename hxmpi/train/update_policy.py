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
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

from ..schema import SETTINGS

__all__ = ["Decision", "RoundDecision", "auto_threshold", "straggler_ratio", "check_thresholds", "decide",
           "gradient_coefficient"]

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
    sync batch; None: even) and whether they changed, so that the steps left in the window must
    be re-split (``rebalance``). ``record`` is the logged decision with its inputs."""
    mode: str
    grad_scale: float
    balance_weights: Optional[tuple]
    rebalance: bool
    record: dict


def auto_threshold(step_times: Sequence[float], factor: float = AUTO_THRESHOLD_FACTOR) -> float:
    """``factor`` times the lower median step time (seconds).

    The lower median (the smaller middle value for an even count) lets two ranks tell a straggler
    from its partner; the plain median of two would sit between them.
    """
    if not step_times:
        raise ValueError("no step times")
    return factor * sorted(step_times)[(len(step_times) - 1) // 2]


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
