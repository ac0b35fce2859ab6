"""Trainer under MPI: rank-count invariance, exact resume, MoE gradients against one process."""
import os

import numpy as np
import pytest
from mpi4py import MPI

from hxmpi.comm.exchange import HierComm
from hxmpi.errors import SettingError
from hxmpi.models import MoE
from hxmpi.train.command import Trainer, parse_config

pytestmark = pytest.mark.mpi


def args_for(*extra):
    return parse_config(["--quiet", "--epochs", "3", "--update", "sync", *extra])


@pytest.mark.parametrize("model", ["mlp", "softmax", "moe"])
def test_same_loss_at_any_rank_count(comm, model):
    """Same seed and global batch: the world run ends at the single-process loss (1e-6 relative)."""
    extra = ["--model", model, "--ranks-per-node", "2", "--dtype", "float64"]
    if model == "moe":
        # Experts and capacity chosen so no token is dropped: capacity is per rank, so drops
        # would differ between rank counts by design.
        extra += ["--experts", str(comm.size * 2), "--capacity-factor", str(comm.size * 2 * 64)]
    # The world run reduces in buckets of a few KiB (one per layer, posted during the backward
    # pass), the single one in one bucket: the sums must not depend on it.
    world = Trainer(args_for(*extra, "--bucket-cap-mb", "0.001"), comm).run()
    single = Trainer(args_for(*extra), MPI.COMM_SELF).run()
    assert world["test_loss"] == pytest.approx(single["test_loss"], rel=1e-6)
    assert world["test_accuracy"] == pytest.approx(single["test_accuracy"], abs=1e-12)


@pytest.mark.parametrize("cap_mb", [1e-4, 0.02, 25.0])
def test_bucketed_reduction_equals_one_allreduce(comm, cap_mb):
    """Buckets cover the dense gradient once, in backward order, within the cap (or one layer);
    each is posted during the backward pass as soon as its last layer is done; the sums equal one
    Allreduce over the whole buffer."""
    from hxmpi.models import MLP
    from hxmpi.train.update_engine import BucketReducer
    model = MLP(64, 10, [48, 24], seed=0, dtype=np.float64)
    segments = model.grad_segments()
    reducer = BucketReducer(model.flat.dense_grads, comm, segments, cap_mb * 2**20)
    covered = sorted(reducer.buckets)
    assert covered[0][0] == 0 and covered[-1][1] == model.flat.dense_size
    assert all(a[1] == b[0] for a, b in zip(covered, covered[1:]))
    assert [lo for lo, _ in reducer.buckets] == sorted((lo for lo, _ in reducer.buckets), reverse=True)
    layer_bytes = [(hi - lo) * 8 for lo, hi in segments]
    for lo, hi in reducer.buckets:
        assert (hi - lo) * 8 <= cap_mb * 2**20 or (hi - lo) * 8 in layer_bytes
    assert len(reducer.buckets) == {1e-4: 3, 0.02: 2, 25.0: 1}[cap_mb]
    rng = np.random.default_rng(comm.rank)
    X, y = rng.standard_normal((20, 64)), rng.integers(0, 10, 20)
    posted = []
    model.loss_and_grad(X, y, 0.5, lambda k: (reducer.segment_done(k), posted.append(len(reducer._requests))))
    assert posted[0] == (1 if cap_mb == 1e-4 else 0)  # the last layer's bucket goes out at once
    reducer.finish()
    bucketed = model.flat.dense_grads.copy()
    model.flat.grads[:] = 0
    model.loss_and_grad(X, y, 0.5)
    comm.Allreduce(MPI.IN_PLACE, model.flat.dense_grads, op=MPI.SUM)
    np.testing.assert_allclose(bucketed, model.flat.dense_grads, rtol=1e-12, atol=1e-15)


def test_bad_bucket_cap_is_refused(comm):
    with pytest.raises(SettingError, match="bucket_cap_mb"):
        Trainer(args_for("--bucket-cap-mb", "0"), comm)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_dtype_of_parameters_and_data(comm, dtype):
    t = Trainer(args_for("--dtype", dtype, "--epochs", "2"), comm)
    assert t.flat.params.dtype == t.flat.grads.dtype == t.opt.velocity.dtype == np.dtype(dtype)
    assert t.shuffle.held["x"].dtype == t.data.X_test.dtype == np.dtype(dtype)
    summary = t.run()
    assert summary["dtype"] == dtype and summary["test_accuracy"] >= 0.85


def test_default_threads_split_the_cores_and_are_applied(comm):
    from threadpoolctl import threadpool_info

    from hxmpi.train.threads import host_ranks, usable_cores
    t = Trainer(args_for("--epochs", "1"), comm)
    expected = max(1, usable_cores() // host_ranks(comm))
    assert t.threads == expected
    assert all(p["num_threads"] == expected for p in threadpool_info())
    summary = Trainer(args_for("--epochs", "1", "--threads", "1"), comm).run()
    assert summary["threads"] == 1 and all(p["threads"] == 1 for p in summary["thread_pools"])
    assert all(p["num_threads"] == 1 for p in threadpool_info())


def test_time_to_target(comm):
    reached = Trainer(args_for("--target-accuracy", "0.5"), comm).run()
    never = Trainer(args_for("--target-accuracy", "1.0", "--epochs", "1"), comm).run()
    assert reached["epoch_at_target"] == 1 and 0 < reached["time_to_target_s"] < reached["train_time_s"]
    assert never["time_to_target_s"] is None and never["epoch_at_target"] is None
    assert "time_to_target_s" not in Trainer(args_for("--epochs", "1"), comm).run()


def test_evaluations_within_epochs_leave_training_alone(comm):
    """``--eval-every``: evaluation records at every multiple of N steps within an epoch, the same
    on every rank; the run's parameters are those of a run without them (sync: bit for bit), and
    the time to target is read from the first evaluation at it."""
    extra = ("--dtype", "float64", "--batch-size", "32", "--epochs", "2")
    plain, every = Trainer(args_for(*extra), comm), Trainer(args_for(*extra, "--eval-every", "7"), comm)
    every.run()
    plain.run()
    steps = every.shuffle.steps(0)
    evaluations = [e for e in every.events if e["event"] == "evaluation"]
    assert [e["round"] for e in evaluations] == [r for r in range(7, 2 * steps, 7) if r != steps]
    assert [e["epoch"] for e in evaluations] == [1 + (r > steps) for r in range(7, 2 * steps, 7) if r != steps]
    epochs = [e for e in every.events if e["event"] == "epoch"]
    assert all(0 < e["epoch_train_s"] <= epochs[e["epoch"] - 1]["train_time_s"] for e in evaluations)
    assert comm.allgather([e["test_accuracy"] for e in evaluations]) == [[e["test_accuracy"] for e in evaluations]] * comm.size
    assert np.array_equal(every.flat.params, plain.flat.params)
    # A target (it scales steps by a coefficient of timed steps: no longer bit-reproducible).
    targeted = Trainer(args_for(*extra, "--eval-every", "7", "--target-accuracy", "0.5"), comm)
    summary = targeted.run()
    done, hit = 0.0, None
    for e in targeted.events:
        if e["event"] == "epoch":
            done += e["train_time_s"]
        if e["event"] in ("epoch", "evaluation") and e["test_accuracy"] >= 0.5:
            hit = e, done + e.get("epoch_train_s", 0.0)
            break
    assert hit[0]["event"] == "evaluation"  # digits passes 0.5 well within its first epoch
    assert (summary["time_to_target_s"], summary["epoch_at_target"]) == (hit[1], hit[0]["epoch"])


def test_evaluation_amid_async_rounds_scores_the_mean_model(comm):
    """While async rounds hold the ranks apart, evaluate() scores the mean of their parameters
    and gives every rank its own back."""
    t = Trainer(args_for("--dtype", "float64", "--epochs", "1"), comm)
    dense = t.flat.params[:t.opt.flat.dense_size]
    # Parameters that are multiples of 2**-9 below 2**-3: a sum of up to 7 of them is exact in
    # float64 whatever the order, so the mean is the same bits whichever reduction computes it
    # (MPI's Allreduce inside the trainer, the pickle-based allreduce here). Random floats summed
    # in two orders differ in the last bits, and so would the two evaluations (seen at -n 3).
    dense[:] = np.random.default_rng(comm.rank).integers(-64, 65, dense.size) / 512
    own = t.flat.params.copy()
    t.updates.diverged = True
    apart = t.evaluate()
    assert np.array_equal(t.flat.params, own)
    mean = comm.allreduce(dense.copy()) / comm.size
    dense[:] = mean
    t.updates.diverged = False
    assert apart == t.evaluate()  # the same model, evaluated by the same code: bit for bit


@pytest.mark.parametrize("shuffle", ["hier", "flat"])
def test_shuffle_modes_agree(comm, shuffle):
    """hier and flat exchanges produce the same training trajectory."""
    a = Trainer(args_for("--shuffle", shuffle, "--ranks-per-node", "2"), comm).run()
    b = Trainer(args_for("--shuffle", "hier", "--ranks-per-node", "3"), comm).run()
    assert a["test_loss"] == pytest.approx(b["test_loss"], rel=1e-9)


def test_resume_is_bit_identical(comm, shared_tmp):
    tmp = str(shared_tmp)
    ckpt = os.path.join(tmp, "ckpt")
    common = ["--epochs", "4", "--model", "moe", "--experts", str(comm.size * 2), "--checkpoint", ckpt,
              "--update", "sync"]
    full = Trainer(parse_config(["--quiet", "--epochs", "4", "--model", "moe", "--update", "sync",
                                              "--experts", str(comm.size * 2)]), comm)
    full.run()
    first = Trainer(parse_config(["--quiet", *common, "--stop-after", "2"]), comm)
    first.run()
    assert not np.array_equal(first.flat.params, full.flat.params)
    second = Trainer(parse_config(["--quiet", *common, "--resume"]), comm)
    second.load_checkpoint()
    assert second.start_epoch == 2
    second.run()
    assert np.array_equal(second.flat.params, full.flat.params)
    assert np.array_equal(second.opt.velocity, full.opt.velocity)


@pytest.mark.parametrize("other,name", [(["--hidden", "32"], "hidden"), (["--dtype", "float64"], "dtype")])
def test_resume_rejects_other_model(comm, shared_tmp, other, name):
    from hxmpi.train.checkpoint import CheckpointError
    tmp = str(shared_tmp)
    Trainer(parse_config(["--quiet", "--epochs", "1", "--checkpoint", tmp]), comm).run()
    t = Trainer(parse_config(["--quiet", *other, "--checkpoint", tmp, "--resume"]), comm)
    with pytest.raises(CheckpointError, match=name):
        t.load_checkpoint()


def test_moe_gradients_match_single_process_reference(comm):
    """Expert-parallel MoE gradients equal those of one process holding every expert."""
    size, rank = comm.size, comm.rank
    E, H, D, C = 2 * size, 8, 5, 3
    rng = np.random.default_rng(42)
    X = rng.standard_normal((6 * size + 1, D))
    y = rng.integers(0, C, X.shape[0])
    lo, hi = rank * len(y) // size, (rank + 1) * len(y) // size
    scale = 1.0 / len(y)
    cf = float(E * len(y))  # no drops
    hc = HierComm(comm, ranks_per_node=2)
    dist = MoE(D, C, H, E, cf, hc, seed=3)
    ref = MoE(D, C, H, E, cf, HierComm(MPI.COMM_SELF), seed=3)
    # The reference sees each rank's tokens as that rank's batch (routing is per token).
    for r in range(size):
        a, b = r * len(y) // size, (r + 1) * len(y) // size
        ref.loss_and_grad(X[a:b], y[a:b], scale)
    dist.loss_and_grad(X[lo:hi], y[lo:hi], scale)
    comm.Allreduce(MPI.IN_PLACE, dist.flat.dense_grads, op=MPI.SUM)
    np.testing.assert_allclose(dist.flat.dense_grads, ref.flat.dense_grads, rtol=1e-10, atol=1e-13)
    mine = slice(dist.first, dist.first + dist.local)
    np.testing.assert_allclose(dist.flat.g["W_exp"], ref.flat.g["W_exp"][mine], rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(dist.flat.g["b_exp"], ref.flat.g["b_exp"][mine], rtol=1e-10, atol=1e-13)
    # Some expert somewhere received tokens, so the comparison above is not vacuous.
    assert comm.allreduce(float(np.abs(dist.flat.g["W_exp"]).sum())) > 0
