"""Load-balanced sync under MPI: samples land where the new split says, and the trajectory is sync's."""
import numpy as np
import pytest

from hxmpi.comm.exchange import HierComm
from hxmpi.train.balance import proportional_counts, redistribute
from hxmpi.train.command import Trainer, parse_config

pytestmark = pytest.mark.mpi


def random_split(rng, batch, size):
    """A random split of ``batch`` samples over ``size`` ranks (zeros included)."""
    weights = rng.integers(0, 4, size)
    weights[rng.integers(size)] += 1
    return proportional_counts(weights, batch)


def test_redistribute_follows_the_batch_order(comm):
    size, me = comm.size, comm.rank
    rng = np.random.default_rng(7)  # the same counts on every rank
    batches = [13, 1, 0, 40, size, 7]
    current = np.array([random_split(rng, b, size) for b in batches])
    target = np.array([random_split(rng, b, size) for b in batches])
    starts = np.concatenate([[0], np.cumsum(batches)])
    steps = []
    for s, b in enumerate(batches):
        lo = starts[s] + current[s, :me].sum()
        ids = np.arange(lo, lo + current[s, me])
        steps.append((np.stack([ids, -ids], axis=1).astype(np.float64), ids, b))
    out = redistribute(HierComm(comm, ranks_per_node=2), steps, current, target)
    assert len(out) == len(batches)
    for s, (X, y, b) in enumerate(out):
        lo = starts[s] + target[s, :me].sum()
        expected = np.arange(lo, lo + target[s, me])
        assert b == batches[s] and np.array_equal(y, expected)
        assert np.array_equal(X, np.stack([expected, -expected], axis=1).astype(np.float64))


def test_redistribute_rejects_counts_of_other_batches(comm):
    with pytest.raises(ValueError, match="must cover the same batches"):
        redistribute(HierComm(comm), [], np.array([[2] * comm.size]), np.array([[1] * comm.size]))


def run(comm, *flags):
    t = Trainer(parse_config(["--quiet", "--ranks-per-node", "2", "--update", "sync", "--dtype", "float64",
                              "--epochs", "2", *flags]), comm)
    return t, t.run()


# Windows of 4 steps re-split inside an epoch; 23 (an epoch of digits at batch 64) decide at an
# epoch's last step, so the next epoch starts split.
@pytest.mark.parametrize("window", ["4", "23"])
def test_balanced_sync_keeps_the_sync_trajectory(comm, window):
    last = comm.size - 1
    straggle = ["--straggle", f"{last}:x3", "--policy-window", window]
    plain, s_plain = run(comm, *straggle)
    balanced, s_bal = run(comm, *straggle, "--balance", "on")
    # The same global mean gradient every step: only the order of additions differs.
    assert s_bal["test_loss"] == pytest.approx(s_plain["test_loss"], rel=1e-6)
    assert [e["train_loss"] for e in balanced.events if e["event"] == "epoch"] == pytest.approx(
        [e["train_loss"] for e in plain.events if e["event"] == "epoch"], rel=1e-6)
    rebalances = [e for e in balanced.events if e["event"] == "rebalance"]
    assert s_plain["rebalances"] == 0 and s_bal["rebalances"] == len(rebalances)
    if comm.size == 1:
        assert not rebalances  # one rank holds every batch whatever its speed
        return
    assert rebalances, "a rank three times slower must get a smaller share"
    for r in rebalances:
        assert sum(r["counts"]) == 64
    # Mid-window decisions move samples at once; end-of-window ones from the next window on.
    assert any(r["samples_moved"] > 0 for r in rebalances) == (window == "4")
    # A decision moves only the steps up to the next decision (at most a window of batches), not
    # the rest of the epoch: a one-window trial of balancing moves little.
    assert all(r["samples_moved"] <= int(window) * 64 for r in rebalances), rebalances
    # The straggler gets less than an even share (which rank is the fastest of the others is up to
    # the load of the host: ranks oversubscribed on a busy host are slowed too).
    assert rebalances[0]["counts"][last] < 64 / comm.size, rebalances[0]
    # Every sample of the epoch was still used once.
    assert {e["samples"] for e in balanced.events if e["event"] == "epoch"} == {len(balanced.data.y_train)}
