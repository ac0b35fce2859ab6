"""Update policy rule: every branch, forced modes, thresholds, and the gradient coefficient."""
import pytest

from hxmpi.train.update_policy import (
    auto_threshold,
    decide,
    gradient_coefficient,
    straggler_ratio,
)

FAST, SLOW = 1.0, 3.0


@pytest.mark.parametrize("n_slow,mode,scale,rule", [
    (0, "sync", 1.0, "B = 0"),
    (1, "async", 1.0, "0 < B <= B1"),      # B = 0.1
    (4, "sync", 1.0, "B1 < B <= B2"),      # B = 0.4
    (7, "sync", 0.9, "B > B2"),            # B = 0.7, dB = 0.1
])
def test_rule_branches(n_slow, mode, scale, rule):
    times = [SLOW] * n_slow + [FAST] * (10 - n_slow)
    d = decide(times, b1=0.2, b2=0.6, threshold=2.0)
    assert (d.mode, d.rule) == (mode, rule)
    assert d.grad_scale == pytest.approx(scale)
    assert d.ratio == pytest.approx(n_slow / 10)


def test_auto_threshold_follows_the_median():
    assert decide([SLOW] + [FAST] * 9, b1=0.2, b2=0.6).mode == "async"
    # Everyone equally slow: the median moves with them, and nobody straggles.
    assert decide([SLOW] * 10, b1=0.2, b2=0.6).rule == "B = 0"


def test_fixed_threshold_and_forced_modes():
    times = [1.0, 1.0, 2.0, 2.0]
    assert decide(times, 0.2, 0.6, threshold=1.5).ratio == 0.5
    d = decide(times, 0.2, 0.6, threshold=1.5, forced="async")
    assert (d.mode, d.rule, d.forced) == ("async", "forced", "async")
    assert d.as_record()["event"] == "policy" and d.as_record()["ratio"] == 0.5


@pytest.mark.parametrize("b1,b2", [(-0.1, 0.5), (0.6, 0.5), (0.2, 1.1)])
def test_bad_thresholds(b1, b2):
    with pytest.raises(ValueError, match="b1 <= b2"):
        decide([1.0], b1, b2)


def test_bad_mode_and_empty_times():
    with pytest.raises(ValueError, match="update mode"):
        decide([1.0], 0.1, 0.5, forced="lazy")
    with pytest.raises(ValueError, match="no step times"):
        straggler_ratio([], 1.0)


def test_auto_threshold_is_a_multiple_of_the_median():
    assert auto_threshold([1.0, 2.0, 3.0]) == pytest.approx(4.0)
    assert auto_threshold([1.0, 2.0, 3.0, 4.0], factor=2.0) == pytest.approx(4.0)  # lower median
    assert decide([1.0, 3.0], b1=0.5, b2=0.8).mode == "async"  # two ranks: the slow one is seen


def test_gradient_coefficient():
    assert gradient_coefficient(0.9, 0.9, 1.0, 1.0) == pytest.approx(1.0)
    assert gradient_coefficient(0.5, 0.9, 1.0, 1.0) == pytest.approx(1.4)      # below target: boost
    assert gradient_coefficient(0.9, 0.9, 4.0, 1.0) == pytest.approx(0.5)      # 4x straggler: damp
    assert gradient_coefficient(0.95, 0.9, 1.0, 1.0) == pytest.approx(1.0)     # above target: no boost
    assert gradient_coefficient(0.0, 1.0, 1.0, 1.0, gain=5.0) == 2.0           # clipped high
    assert gradient_coefficient(0.9, 0.9, 1e6, 1.0) == 0.1                     # clipped low
    with pytest.raises(ValueError, match="accuracies"):
        gradient_coefficient(1.5, 0.9, 1.0, 1.0)
    with pytest.raises(ValueError, match="positive"):
        gradient_coefficient(0.5, 0.9, 0.0, 1.0)
