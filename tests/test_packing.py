"""The compiled copy kernel: real compiled code, exact copies, bounds errors instead of overruns."""
import numpy as np
import pytest
from hxmpi.comm._packing import copy_blocks



def test_kernel_releases_the_gil():
    """While one thread copies 1 GiB through copy_blocks, another keeps running Python: the kernel
    is compiled and copies with the GIL released. A kernel that held the GIL would stall the other
    thread for the whole copy; here its longest stall must stay under half the copy's time."""
    import threading
    import time
    src = np.ones(1 << 24, dtype=np.uint8)  # 16 MiB, copied 64 times
    lengths = np.full(64, src.size, dtype=np.int64)
    dst = np.empty(src.size * 64, dtype=np.uint8)
    dst_off = np.arange(64, dtype=np.int64) * src.size
    worker = threading.Thread(target=copy_blocks, args=(src, np.zeros(64, np.int64), dst, dst_off, lengths))
    t0 = last = time.perf_counter()
    worker.start()
    longest = 0.0
    while worker.is_alive():
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
    elapsed = time.perf_counter() - t0
    assert dst[::src.size].all() and dst[-1] == 1  # the copy happened
    assert longest < 0.5 * elapsed, f"the other thread stalled {longest:.3f} s of a {elapsed:.3f} s copy"


def test_gather_matches_numpy():
    rng = np.random.default_rng(0)
    src = rng.integers(0, 256, 10_000, dtype=np.uint8)
    lengths = rng.integers(0, 64, 100).astype(np.int64)
    src_off = rng.integers(0, src.size - 64, 100).astype(np.int64)
    dst_off = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    dst = np.zeros(int(lengths.sum()), dtype=np.uint8)
    assert copy_blocks(src, src_off, dst, dst_off, lengths) == lengths.sum()
    expect = np.concatenate([src[o:o + n] for o, n in zip(src_off, lengths)])
    assert np.array_equal(dst, expect)


def test_read_only_source():
    src = np.arange(16, dtype=np.uint8)
    src.flags.writeable = False
    dst = np.zeros(4, dtype=np.uint8)
    copy_blocks(src, np.array([4], np.int64), dst, np.array([0], np.int64), np.array([4], np.int64))
    assert dst.tolist() == [4, 5, 6, 7]


@pytest.mark.parametrize("src_off,dst_off,length", [(14, 0, 4), (0, 2, 4), (-1, 0, 1), (0, 0, -1)])
def test_out_of_bounds_raises(src_off, dst_off, length):
    src, dst = np.zeros(16, np.uint8), np.zeros(4, np.uint8)
    with pytest.raises(ValueError, match="copy_blocks"):
        copy_blocks(src, np.array([src_off], np.int64), dst, np.array([dst_off], np.int64),
                    np.array([length], np.int64))


def test_empty_and_zero_length_blocks():
    empty = np.zeros(0, np.uint8)
    z = np.zeros(3, np.int64)
    assert copy_blocks(empty, z, empty, z, z) == 0


def test_mismatched_offset_lengths():
    with pytest.raises(ValueError, match="same length"):
        copy_blocks(np.zeros(4, np.uint8), np.zeros(2, np.int64), np.zeros(4, np.uint8),
                    np.zeros(1, np.int64), np.zeros(2, np.int64))


def test_bad_arrays_are_refused():
    z, one = np.zeros(1, np.int64), np.ones(1, np.int64)
    ro = np.zeros(4, np.uint8)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="dst is read-only"):
        copy_blocks(np.zeros(4, np.uint8), z, ro, z, one)
    with pytest.raises(ValueError, match="src must be a contiguous 1-D uint8 array"):
        copy_blocks(np.zeros(4, np.float64), z, np.zeros(4, np.uint8), z, one)
    with pytest.raises(ValueError, match="length must be a contiguous 1-D int64 array"):
        copy_blocks(np.zeros(4, np.uint8), z, np.zeros(4, np.uint8), z, one.astype(np.int32))
