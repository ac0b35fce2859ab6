"""Update policy rule: every branch, forced modes, thresholds, and the gradient coefficient."""
import pytest

from hxmpi.train.update_policy import (
    auto_threshold,
    decide,
    gradient_coefficient,
    lower_median,
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


def test_balancing_sees_a_straggler_of_two_clear_of_its_threshold():
    """Balancing re-splits when the slowest step exceeds 1 + REBALANCE_IMBALANCE times the lower
    median: of two ranks, the fast one, so a rank x3 is twice the margin past it, where the plain
    median (the pair's mean) would put it exactly on it and noise would decide."""
    from hxmpi.train.update_engine import REBALANCE_IMBALANCE
    times = [FAST, SLOW]
    assert lower_median(times) == FAST and lower_median([SLOW, FAST, 2.0]) == 2.0
    assert SLOW / ((1 + REBALANCE_IMBALANCE) * lower_median(times)) >= 2.0
    assert SLOW == pytest.approx((1 + REBALANCE_IMBALANCE) * (FAST + SLOW) / 2)  # the edge it had
    with pytest.raises(ValueError, match="no step times"):
        lower_median([])


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


# ----------------------------------------------------------------------------- the controller
from hxmpi.train.update_policy import PolicyController, Window  # noqa: E402

QUIET = (1.0, 1.0, 1.0, 1.0)
ONE_SLOW = (1.0, 1.0, 1.0, 3.0)  # B = 0.25 <= b1: the rule says async


def win(times, rate, loss=1.0):
    return Window(tuple(times), rate, loss)


def test_one_noisy_window_changes_nothing():
    c = PolicyController(0.3, 0.7, hysteresis=2, explore="rule")
    records = [c.observe(win(t, 100.0)) for t in (QUIET, ONE_SLOW, QUIET, ONE_SLOW, QUIET)]
    assert [r["action"] for r in records] == ["stay", "wait", "stay", "wait", "stay"]
    assert {r["mode"] for r in records} == {"sync"} and c.mode == "sync"


def test_a_persistent_straggler_switches_after_the_hysteresis_and_the_mode_is_kept_when_it_pays():
    c = PolicyController(0.3, 0.7, hysteresis=3, explore="rule")
    r = [c.observe(win(ONE_SLOW, 100.0)) for _ in range(3)]
    assert [x["action"] for x in r] == ["wait", "wait", "trial"] and c.mode == "async"
    assert r[-1]["baseline"] == {"mode": "sync", "rate_samples_per_s": 100.0}
    kept = c.observe(win(ONE_SLOW, 150.0))  # +50% > gain 0.1
    assert kept["action"] == "keep" and c.mode == "async"
    assert kept["gains"]["async"] == pytest.approx(0.5) and kept["gain_needed"] == 0.1


def test_a_mode_that_does_not_pay_is_reverted_and_not_retried_at_once():
    c = PolicyController(0.3, 0.7, hysteresis=2, gain=0.1, explore="rule")
    c.observe(win(ONE_SLOW, 100.0))
    assert c.observe(win(ONE_SLOW, 100.0))["action"] == "trial"
    back = c.observe(win(ONE_SLOW, 105.0))  # +5%: not worth the staleness
    assert back["action"] == "return" and c.mode == "sync" and back["scores"] == {"async": 105.0}
    later = [c.observe(win(ONE_SLOW, 100.0))["action"] for _ in range(3)]
    assert "trial" not in later and "hold" in later  # backed off


def test_a_loss_rise_voids_a_faster_mode():
    c = PolicyController(0.3, 0.7, hysteresis=1, explore="rule")
    c.observe(win(ONE_SLOW, 100.0, loss=1.0))
    r = c.observe(win(ONE_SLOW, 300.0, loss=1.2))  # 3x the samples/s, but the loss jumped
    assert r["action"] == "return" and r["loss_rose"] and c.mode == "sync"


def test_explore_all_tries_each_mode_for_a_window_and_keeps_the_best():
    # Two ranks, one slow: B = 0.5 > b1, so the rule alone would stay in plain sync.
    c = PolicyController(0.3, 0.7, hysteresis=2, explore="all")
    slow2 = (1.0, 3.0)
    acts = [c.observe(win(slow2, 100.0)) for _ in range(2)]
    assert acts[0]["action"] == "wait" and acts[1]["action"] == "trial" and c.mode == "async"
    assert c.observe(win(slow2, 130.0))["mode"] == "balanced"  # async measured, balanced next
    done = c.observe(win(slow2, 170.0))
    assert done["action"] == "keep" and c.mode == "balanced" and done["scores"] == {"async": 130.0, "balanced": 170.0}
    # The balanced split hides the straggler from the rule's times no more than the normalised
    # times do; while B > 0 the kept mode stays.
    assert c.observe(win(slow2, 170.0))["action"] == "stay" and c.mode == "balanced"
    # Straggler gone for the hysteresis: back to sync without a trial.
    c.observe(win((1.0, 1.0), 170.0))
    assert c.observe(win((1.0, 1.0), 170.0))["action"] == "change" and c.mode == "sync"


def test_post_local_leaves_async_for_the_best_other_mode():
    c = PolicyController(0.3, 0.7, hysteresis=1, explore="all")
    c.observe(win((1.0, 3.0), 100.0))
    c.observe(win((1.0, 3.0), 200.0))   # async scored
    c.observe(win((1.0, 3.0), 150.0))   # balanced scored: async kept
    assert c.mode == "async"
    r = c.forbid_async()
    assert r["action"] == "post-local" and c.mode == "balanced"
    assert c.observe(win((1.0, 3.0), 150.0))["mode"] == "balanced"


def test_every_rank_decides_the_same():
    windows = [win(t, r) for t, r in [(QUIET, 100), (ONE_SLOW, 90), (ONE_SLOW, 91), (ONE_SLOW, 140),
                                      (ONE_SLOW, 95), (QUIET, 100), (QUIET, 100), (ONE_SLOW, 90)]]
    runs = []
    for _ in range(3):  # three "ranks" given the same gathered numbers
        c = PolicyController(0.3, 0.7)
        runs.append([c.observe(w) for w in windows])
    assert runs[0] == runs[1] == runs[2]


def test_controller_rejects_bad_settings():
    with pytest.raises(ValueError, match="hysteresis"):
        PolicyController(0.3, 0.7, hysteresis=0)
    with pytest.raises(ValueError, match="explore"):
        PolicyController(0.3, 0.7, explore="some")
