"""Serial model checks: analytic gradients against finite differences, schedules, data."""
import numpy as np
import pytest
from mpi4py import MPI

from hxmpi.comm.exchange import HierComm
from hxmpi.data import load_dataset, load_digits
from hxmpi.data.shuffle import epoch_order
from hxmpi.models import MLP, MoE, build_model
from hxmpi.train._sgd import sgd_update
from hxmpi.train.optim import SGD, learning_rate


def numeric_check(model, X, y, n_checks=25, eps=1e-6):
    model.flat.grads[:] = 0
    model.loss_and_grad(X, y, 1.0)
    analytic = model.flat.grads.copy()
    rng = np.random.default_rng(0)
    idx = rng.choice(model.flat.params.size, n_checks, replace=False)
    for i in idx:
        old = model.flat.params[i]
        losses = []
        for delta in (eps, -eps):
            model.flat.params[i] = old + delta
            model.flat.grads[:] = 0
            losses.append(model.loss_and_grad(X, y, 1.0)[0])
        model.flat.params[i] = old
        assert (losses[0] - losses[1]) / (2 * eps) == pytest.approx(analytic[i], rel=1e-4, abs=1e-6), i


def test_mlp_gradients():
    rng = np.random.default_rng(1)
    X, y = rng.standard_normal((20, 6)), rng.integers(0, 4, 20)
    numeric_check(MLP(6, 4, (7, 5), seed=0), X, y)


def test_moe_gradients():
    rng = np.random.default_rng(2)
    X, y = rng.standard_normal((30, 6)), rng.integers(0, 3, 30)
    model = MoE(6, 3, 8, 4, 1.0, HierComm(MPI.COMM_SELF), seed=0)  # capacity 1.0: some drops
    numeric_check(model, X, y, n_checks=40)


def test_bad_model_and_experts():
    with pytest.raises(ValueError, match="unknown model"):
        build_model("cnn", 4, 2, [4], 0)
    with pytest.raises(ValueError, match="multiple"):
        MoE(4, 2, 4, 0, 1.0, HierComm(MPI.COMM_SELF), seed=0)


def test_schedules():
    assert learning_rate(0, 1.0, "cosine", 100, warmup_steps=10) == pytest.approx(0.1)
    assert learning_rate(10, 1.0, "cosine", 100, warmup_steps=10) == pytest.approx(1.0)
    assert learning_rate(100, 1.0, "cosine", 100, warmup_steps=10) == pytest.approx(0.0)
    assert learning_rate(25, 1.0, "step", 100, step_every=10, gamma=0.5) == pytest.approx(0.25)
    assert learning_rate(5, 0.3, "constant", 100) == 0.3
    with pytest.raises(ValueError, match="schedule"):
        learning_rate(0, 1.0, "linear", 10)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("weight_decay", [0.0, 1e-4])
def test_sgd_step_is_the_numpy_form_bit_for_bit(dtype, weight_decay):
    """The fused compiled update gives what g += wd * p; v = m * v + g; p -= lr * v gives in
    numpy, to the last bit, over several steps; the gradient is left as it was."""
    rng = np.random.default_rng(7)
    model = MLP(40, 10, [33], seed=0, dtype=dtype)
    opt = SGD(model.flat, MPI.COMM_SELF, 0.1, momentum=0.9, weight_decay=weight_decay)
    p, v = model.flat.params.copy(), np.zeros_like(model.flat.params)
    for lr in (0.1, 0.05, 0.0123):
        model.flat.grads[:] = rng.standard_normal(model.flat.grads.size)
        g = model.flat.grads.copy()
        opt.step(lr)
        if weight_decay:
            g += weight_decay * p
        v *= 0.9
        v += g
        p -= lr * v
        assert np.array_equal(model.flat.params, p) and np.array_equal(opt.velocity, v)
        assert not weight_decay or not np.array_equal(model.flat.grads, g)  # grads not written


def test_sgd_update_refuses_mismatched_buffers():
    a = np.zeros(5)
    with pytest.raises(ValueError, match="one length, got params 5, grads 4, velocity 5"):
        sgd_update(a, np.zeros(4), np.zeros(5), 0.1, 0.9, 0.0)
    with pytest.raises(ValueError, match="contiguous"):
        sgd_update(np.zeros(10)[::2], np.zeros(5), np.zeros(5), 0.1, 0.9, 0.0)
    with pytest.raises(ValueError, match="dtype mismatch"):
        sgd_update(a, np.zeros(5, np.float32), np.zeros(5), 0.1, 0.9, 0.0)


def test_digits_bundled_and_split():
    X, y = load_digits()
    assert X.shape == (1797, 64) and y.shape == (1797,) and set(y.tolist()) == set(range(10))
    assert 0.0 <= X.min() and X.max() == 1.0
    d = load_dataset("digits", seed=0)
    assert len(d.y_train) == 1438 and len(d.y_test) == 359
    assert np.array_equal(load_dataset("digits", seed=0).y_test, d.y_test)
    with pytest.raises(ValueError, match="unknown dataset"):
        load_dataset("mnist")


def test_epoch_order_depends_on_seed_and_epoch_only():
    a = epoch_order(100, 1, 0)
    assert np.array_equal(a, epoch_order(100, 1, 0))
    assert not np.array_equal(a, epoch_order(100, 1, 1))
    assert sorted(a.tolist()) == list(range(100))
