"""The agreement record without MPI: every rank's record summed as MPI_SUM would, for whole count matrices."""
import numpy as np
import pytest
from hxmpi.comm._agree import Word, fill_record, pattern_key, same_arrays

from hxmpi.comm import agreement

KEY = (0x1234_5678_9ABC_DEF1, 0x0FED_CBA9_8765_4321)


def world_sum(counts: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Sum (mod 2**64) of every rank's record: rank a sends counts[a] and expects expected[a]."""
    total = np.zeros(agreement.WORDS, dtype=np.uint64)
    rec = np.zeros(agreement.WORDS, dtype=np.uint64)
    for me in range(counts.shape[0]):
        fill_record(rec, False, False, 1, True, 0, 0, False, False, 1 << 20,
                    np.ascontiguousarray(counts[me]), np.ascontiguousarray(expected[me]), True, me, *KEY)
        total += rec  # numpy's uint64 addition wraps, as MPI_SUM on uint64 does
    return total


def fingerprint_of(counts, expected) -> tuple[int, int]:
    t = world_sum(counts, expected)
    return int(t[Word.FP_A]), int(t[Word.FP_B])


@pytest.mark.parametrize("p", [1, 2, 5, 16])
def test_consistent_counts_sum_to_zero(p):
    rng = np.random.default_rng(p)
    counts = rng.integers(0, 1 << 40, (p, p)).astype(np.int64)
    assert fingerprint_of(counts, np.ascontiguousarray(counts.T)) == (0, 0)


def _mismatches(p):
    rng = np.random.default_rng(7)
    counts = rng.integers(0, 100, (p, p)).astype(np.int64)
    good = np.ascontiguousarray(counts.T)
    one = good.copy()
    one[1, 0] += 1                      # rank 1 expects one byte more from rank 0
    cancel = good.copy()
    cancel[1, 0] += 5                   # two pairs whose errors cancel in a plain sum
    cancel[2, 0] -= 5
    zeros = good.copy()
    zeros[3] = 0                        # rank 3 expects nothing at all
    swapped = good.copy()
    swapped[1, 0], swapped[1, 2] = good[1, 2] + 1, good[1, 0] - 1  # same total, other pairs
    return counts, {"one byte": one, "cancelling pairs": cancel, "all zeros": zeros, "swapped": swapped}


@pytest.mark.parametrize("case", ["one byte", "cancelling pairs", "all zeros", "swapped"])
def test_every_kind_of_mismatch_is_seen(case):
    counts, cases = _mismatches(5)
    assert fingerprint_of(counts, cases[case]) != (0, 0)
    # A plain sum of the counts would not see the cancelling pairs: the fingerprint must.
    if case == "cancelling pairs":
        assert cases[case].sum() == counts.sum()


def test_settings_words_are_sums_and_squares():
    rec = np.zeros(agreement.WORDS, dtype=np.uint64)
    sent, expected = np.array([5 << 10, 0, 7], np.int64), np.array([1, 2, 3 << 10], np.int64)
    fill_record(rec, False, True, 2, True, 77, 3, True, False, 1 << 20, sent, expected, False, 0, *KEY)
    assert rec[Word.FLAGS] == 1 << 32  # large-count path, no problem
    assert rec[Word.VALIDATE] == 1
    assert (rec[Word.ALGO], rec[Word.ALGO_SQ]) == (2, 4)
    assert (rec[Word.KIND], rec[Word.KIND_SQ]) == (77, 77 * 77)
    assert (rec[Word.SLOT], rec[Word.SLOT_SQ]) == (3, 9)
    assert (rec[Word.SAME_BUFFERS], rec[Word.OVER_BUDGET]) == (1, 0)
    assert rec[Word.BYTES] == (5 << 10) + 7
    assert rec[Word.RECV_KIB_SQ] == 3 ** 2  # 3 KiB + 3 B received: whole KiB
    assert rec[Word.MESSAGES] == 1  # rank 0 sends to rank 2 only (not to itself, not 0 B)
    # Pairwise rounds of rank 0: k=1 sends 0 to 1, receives 3 KiB from 2; k=2 sends 7 to 2, receives 2 from 1.
    assert rec[Word.PAIRWISE] == (3 << 10) + 7
    assert rec[Word.FP_A] == rec[Word.FP_B] == 0  # no fingerprint asked for
    fill_record(rec, True, True, 2, True, 77, 3, True, False, 1 << 20, None, None, True, 0, *KEY)
    assert rec.tolist() == [1] + [0] * (agreement.WORDS - 1)  # a problem rank says only that


def test_record_refuses_bad_arrays():
    with pytest.raises(ValueError, match="16 contiguous uint64"):
        fill_record(np.zeros(8, np.uint64), False, False, 0, True, 0, 0, False, False, 1,
                    np.zeros(3, np.int64), np.zeros(3, np.int64), True, 0, 1, 2)
    with pytest.raises(ValueError, match="differ in length"):
        fill_record(np.zeros(16, np.uint64), False, False, 0, True, 0, 0, False, False, 1,
                    np.zeros(3, np.int64), np.zeros(4, np.int64), True, 0, 1, 2)
    with pytest.raises(ValueError, match="int64"):
        fill_record(np.zeros(16, np.uint64), False, False, 0, True, 0, 0, False, False, 1,
                    np.zeros(3, np.int32), np.zeros(3, np.int32), True, 0, 1, 2)
    with pytest.raises(ValueError, match="rank 3 outside"):
        fill_record(np.zeros(16, np.uint64), False, False, 0, True, 0, 0, False, False, 1,
                    np.zeros(3, np.int64), np.zeros(3, np.int64), True, 3, 1, 2)


@pytest.mark.parametrize("p", [1, 3, 8])
def test_pattern_words_are_the_cost_models_sums(p):
    """Summed over ranks, the pattern words are ``Pattern.from_counts(..., whole_kib=True)`` (uniform
    is the call's kind, an Alltoallv here)."""
    from dataclasses import replace

    from hxmpi.comm.costmodel import Pattern
    rng = np.random.default_rng(p)
    counts = rng.integers(0, 5000, (p, p)).astype(np.int64)
    counts[rng.random((p, p)) < 0.3] = 0  # empty blocks are not messages
    t = world_sum(counts, np.ascontiguousarray(counts.T))
    agreed = agreement.Agreed(0, 0, t)
    assert agreed.pattern(p, False) == replace(Pattern.from_counts(counts, whole_kib=True), uniform=False)


def test_pattern_keys_tell_patterns_apart():
    a = np.arange(6, dtype=np.int64)
    b = a.copy()
    b[5] += 1
    assert pattern_key((a, a)) == pattern_key((a.copy(), a.copy()))
    assert pattern_key((a, a)) != pattern_key((a, b))
    assert pattern_key((a[:3], a[3:])) != pattern_key((a, np.zeros(0, np.int64)))  # lengths count
    assert same_arrays((a, a), (a.copy(), a.copy()))
    assert not same_arrays((a, a), (a, b))
    assert not same_arrays((a,), (a, a))


def test_verdict_bits():
    from hxmpi.comm import _agree as v
    p = 4
    rec = np.zeros(agreement.WORDS, dtype=np.uint64)
    rec[Word.VALIDATE] = p
    rec[Word.ALGO], rec[Word.ALGO_SQ] = 2 * p, 4 * p  # code 2 everywhere
    rec[Word.SLOT], rec[Word.SLOT_SQ] = 3 * p, 9 * p  # slot 3 everywhere
    rec[Word.SAME_BUFFERS] = p
    assert v.verdict(rec, p) == v.Verdict.HIT | v.Verdict.ALL_SAME_BUFFERS
    one = rec.copy()
    one[Word.ALGO], one[Word.ALGO_SQ] = 2 * 3 + 1, 4 * 3 + 1  # one rank passed code 1
    assert v.verdict(one, p) & v.Verdict.SETTINGS
    one = rec.copy()
    one[Word.VALIDATE] = p - 1
    assert v.verdict(one, p) & v.Verdict.SETTINGS
    one = rec.copy()
    one[Word.SLOT], one[Word.SLOT_SQ] = 3 * 3 + 2, 9 * 3 + 4  # one rank at slot 2: a miss
    assert not v.verdict(one, p) & v.Verdict.HIT
    one = rec.copy()
    one[Word.FLAGS] = (1 << 32) * 2 + 1
    one[Word.FP_B] = 5
    assert v.verdict(one, p) == v.Verdict.PROBLEM | v.Verdict.BIG | v.Verdict.PAIRS | v.Verdict.HIT | v.Verdict.ALL_SAME_BUFFERS
    # Squares of 20-bit kinds summed over 2**22 ranks pass 2**64 when multiplied by P: compared exactly.
    big_p, kind = 1 << 22, (1 << 20) - 1
    huge = np.zeros(agreement.WORDS, dtype=np.uint64)
    huge[Word.KIND], huge[Word.KIND_SQ] = kind * big_p, kind * kind * big_p
    assert not v.verdict(huge, big_p) & v.Verdict.SETTINGS
    huge[Word.KIND_SQ] += 1
    assert v.verdict(huge, big_p) & v.Verdict.SETTINGS
