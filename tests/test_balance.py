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
