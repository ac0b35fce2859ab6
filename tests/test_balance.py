"""Serial checks of the balancer's arithmetic: proportional shares and the samples they move."""
import numpy as np
import pytest

from hxmpi.train.balance import moved_samples, proportional_counts


@pytest.mark.parametrize("weights,total,expected", [
    ([1, 1, 1, 1], 64, [16, 16, 16, 16]),
    ([1, 1, 1, 1], 10, [3, 3, 2, 2]),          # remainders tie: the lower ranks get them
    ([3, 3, 3, 1], 64, [19, 19, 19, 7]),       # a straggler at a third of the speed
    ([1, 0, 1], 5, [3, 0, 2]),
    ([2.0], 7, [7]),
])
def test_proportional_counts(weights, total, expected):
    counts = proportional_counts(weights, total)
    assert counts.tolist() == expected and counts.sum() == total


def test_proportional_counts_is_exact_for_any_weights():
    rng = np.random.default_rng(0)
    for _ in range(200):
        w = rng.random(rng.integers(1, 9)) + 1e-3
        total = int(rng.integers(0, 1000))
        counts = proportional_counts(w, total)
        assert counts.sum() == total and counts.min() >= 0
        assert np.all(np.abs(counts - total * w / w.sum()) < 1.0)


@pytest.mark.parametrize("weights", [[], [0, 0], [1, -1], [1, float("nan")]])
def test_proportional_counts_rejects_bad_weights(weights):
    with pytest.raises(ValueError, match="weights must be finite, non-negative and not all zero"):
        proportional_counts(weights, 10)


def test_moved_samples_counts_boundary_crossings():
    current = np.array([[4, 4], [3, 3]])
    assert moved_samples(current, current) == 0
    # Step 0: boundary 4 -> 6 moves two samples; step 1: 3 -> 1 moves two.
    assert moved_samples(current, np.array([[6, 2], [1, 5]])) == 4


def test_balanced_counts_equalise_modelled_step_times():
    from hxmpi.train.balance import balanced_counts
    fixed, per = [0.001, 0.003], [1e-5, 3e-5]
    n = balanced_counts(fixed, per, 256)
    assert n.sum() == 256 and list(n) == [242, 14]  # 1 + 2.42 ms = 3 + 0.42 ms
    # A rank whose fixed cost alone exceeds the others' steps keeps one sample.
    assert list(balanced_counts([0.001, 0.01], per, 256)) == [255, 1]
    assert list(balanced_counts([0.0] * 3, [1.0] * 3, 64)) == [22, 21, 21]
    with pytest.raises(ValueError, match="cannot give each"):
        balanced_counts([0, 0, 0], [1, 1, 1], 2)


def test_balance_converges_within_two_windows():
    """The cost model on a simulated host: rank 1 three times slower, with a fixed cost per step
    (its own 3x too); window 1 runs the even split, window 2 the first split, window 3 is balanced."""
    import numpy as np

    from hxmpi.train.balance import balanced_counts, fit_costs
    fixed, per = np.array([0.002, 0.006]), np.array([2e-5, 6e-5])
    counts, before, ratios = np.array([128, 128]), None, []
    for _ in range(2):
        t = fixed + per * counts
        ratios.append(t.max() / t.min())
        f, p = fit_costs(counts, t, before)
        before = (counts, t, f)
        counts = balanced_counts(f, p, 256)
    t = fixed + per * counts
    assert ratios[0] == pytest.approx(3.0) and ratios[1] > 1.2  # the proportional guess misses the fixed cost
    assert t.max() / t.min() < 1.05, (counts, t)
    assert t.max() < 0.6 * (fixed[1] + per[1] * 128)  # the balanced step against the even split's
