"""Numpy models: the demo CNN's exact parameter layout and correct gradients."""

from __future__ import annotations

import math

import numpy as np
import pytest

from geomx.ml import MODEL_NAMES, Model, build_model, load_dataset
from geomx.ml.layers import MaxPool2D
from geomx.ml.models import softmax_cross_entropy

DEMO_NAMES = [
    "conv0_weight",
    "conv0_bias",
    "conv1_weight",
    "conv1_bias",
    "dense0_weight",
    "dense0_bias",
    "dense1_weight",
    "dense1_bias",
    "dense2_weight",
    "dense2_bias",
]
DEMO_SIZES = [400, 16, 12800, 32, 131072, 256, 32768, 128, 1280, 10]


def test_demo_cnn_has_geomx_keys_sizes_and_total() -> None:
    model = build_model("cnn", (1, 28, 28), 10, np.random.default_rng(0))
    assert isinstance(model, Model)
    assert model.param_names == DEMO_NAMES
    assert [p.size for p in model.params] == DEMO_SIZES
    assert model.num_params == 178_762
    assert model.params[4].shape == (256, 512)  # dense weights stored (out, in) like MXNet
    assert all(p.dtype == np.float32 and p.flags.c_contiguous for p in model.params)


def test_init_is_xavier_uniform_with_zero_biases_and_deterministic() -> None:
    a = build_model("cnn", (1, 28, 28), 10, np.random.default_rng(7))
    b = build_model("cnn", (1, 28, 28), 10, np.random.default_rng(7))
    c = build_model("cnn", (1, 28, 28), 10, np.random.default_rng(8))
    for pa, pb in zip(a.params, b.params):
        np.testing.assert_array_equal(pa, pb)
    assert not np.array_equal(a.params[0], c.params[0])
    for name, p in zip(a.param_names, a.params):
        if name.endswith("bias"):
            assert not p.any()
    # conv0: fan_in = 1*25, fan_out = 16*25 -> bound sqrt(3 / 212.5)
    bound = math.sqrt(3.0 / ((25 + 400) / 2))
    assert np.abs(a.params[0]).max() <= bound
    assert np.abs(a.params[0]).max() > 0.8 * bound
    # dense0 (256, 512): bound sqrt(3 / 384)
    assert np.abs(a.params[4]).max() <= math.sqrt(3.0 / 384)


def _gradient_check(model, x: np.ndarray, y: np.ndarray, rng: np.random.Generator, per_param: int = 6) -> float:
    """Largest relative error between central differences and the analytic gradient."""
    _, grads = model.loss_and_grads(x, y)
    worst = 0.0
    eps = 1e-6
    for p, g in zip(model.params, grads):
        assert g.shape == p.shape and g.dtype == p.dtype
        flat, gflat = p.reshape(-1), g.reshape(-1)
        for i in rng.choice(flat.size, size=min(flat.size, per_param), replace=False):
            original = flat[i]
            flat[i] = original + eps
            up, _ = model.loss_and_grads(x, y)
            flat[i] = original - eps
            down, _ = model.loss_and_grads(x, y)
            flat[i] = original
            numeric = (up - down) / (2 * eps)
            worst = max(worst, abs(numeric - gflat[i]) / max(1e-7, abs(numeric) + abs(gflat[i])))
    return worst


@pytest.mark.parametrize(
    ("name", "shape", "kwargs"),
    [
        ("softmax", (6,), {}),
        ("mlp", (2, 3, 3), {"hidden": [5, 4]}),
        ("cnn", (1, 9, 9), {"conv_channels": [3], "kernel_size": 3, "dense_units": [5]}),
        ("cnn", (2, 8, 8), {"conv_channels": [3, 4], "kernel_size": 3, "dense_units": [6], "padding": "same"}),
    ],
)
def test_analytic_gradients_match_finite_differences(name: str, shape: tuple, kwargs: dict) -> None:
    rng = np.random.default_rng(3)
    model = build_model(name, shape, 3, rng, dtype=np.float64, **kwargs)
    for p in model.params:  # non-zero biases so their gradients are exercised too
        p[...] = rng.normal(scale=0.5, size=p.shape)
    x = rng.normal(size=(4, *shape))
    y = rng.integers(0, 3, size=4)
    assert _gradient_check(model, x, y, rng) < 1e-5


def test_loss_is_the_batch_mean_and_gradients_are_of_the_mean() -> None:
    rng = np.random.default_rng(0)
    model = build_model("mlp", (5,), 3, rng, hidden=[4], dtype=np.float64)
    x, y = rng.normal(size=(6, 5)), rng.integers(0, 3, size=6)
    loss, grads = model.loss_and_grads(x, y)
    per_sample = [model.loss_and_grads(x[i : i + 1], y[i : i + 1]) for i in range(6)]
    assert loss == pytest.approx(np.mean([l for l, _ in per_sample]))
    for k, g in enumerate(grads):
        np.testing.assert_allclose(g, np.mean([gs[k] for _, gs in per_sample], axis=0), atol=1e-12)


def test_cross_entropy_is_stable_for_large_logits() -> None:
    loss, grad = softmax_cross_entropy(np.array([[1000.0, 0.0], [0.0, 1000.0]]), np.array([0, 0]))
    assert loss == pytest.approx(500.0)
    assert np.isfinite(grad).all()


def test_max_pool_sends_the_gradient_to_the_first_maximum_only() -> None:
    pool = MaxPool2D(2)
    x = np.array([[[[1.0, 3.0], [3.0, 2.0]]]])
    y, cache = pool.forward(x, [])
    dx, _ = pool.backward(np.ones_like(y), [], cache)
    assert y[0, 0, 0, 0] == 3.0
    np.testing.assert_array_equal(dx[0, 0], [[0.0, 1.0], [0.0, 0.0]])


def test_same_padding_makes_the_cnn_fit_8x8_digits() -> None:
    with pytest.raises(ValueError, match="same"):
        build_model("cnn", (1, 8, 8), 10, np.random.default_rng(0))
    model = build_model("cnn", (1, 8, 8), 10, np.random.default_rng(0), padding="same")
    assert model.predict(np.zeros((3, 1, 8, 8), np.float32)).shape == (3, 10)


def test_accuracy_counts_samples_not_batch_means() -> None:
    model = build_model("softmax", (2,), 2, np.random.default_rng(0))
    model.params[0][...] = [[1.0, 0.0], [0.0, 1.0]]  # predicts argmax of the input
    x = np.array([[1, 0]] * 5 + [[0, 1]], dtype=np.float32)
    y = np.array([0, 0, 0, 0, 0, 0])
    assert model.accuracy(x, y, batch_size=4) == pytest.approx(5 / 6)  # batch means would give 0.75


def test_predict_in_chunks_equals_one_pass() -> None:
    rng = np.random.default_rng(1)
    model = build_model("cnn", (1, 8, 8), 10, rng, padding="same")
    x = rng.random((70, 1, 8, 8), dtype=np.float32)
    np.testing.assert_allclose(model.predict(x, batch_size=16), model.predict(x, batch_size=100), rtol=1e-5, atol=1e-6)


def test_set_params_copies_in_place() -> None:
    model = build_model("mlp", (4,), 3, np.random.default_rng(0), hidden=[5])
    before = model.params[0]
    model.set_params([np.ones_like(p) for p in model.params])
    assert model.params[0] is before and (before == 1).all()
    with pytest.raises(ValueError, match="expected"):
        model.set_params(model.params[:1])


def test_unknown_model_and_bad_inputs_are_rejected() -> None:
    with pytest.raises(ValueError, match="allowed: softmax, mlp, cnn"):
        build_model("resnet", (4,), 3)
    assert MODEL_NAMES == ("softmax", "mlp", "cnn")
    with pytest.raises(ValueError, match=r"\(C, H, W\)"):
        build_model("cnn", (64,), 10)
    with pytest.raises(ValueError, match="options"):
        build_model("softmax", (4,), 3, hidden=[3])
    model = build_model("mlp", (4,), 3)
    with pytest.raises(ValueError, match="inputs must be"):
        model.predict(np.zeros((2, 5), np.float32))


def test_mlp_learns_digits_with_plain_sgd() -> None:
    data = load_dataset("digits", seed=0)
    model = build_model("mlp", data.input_shape, data.num_classes, np.random.default_rng(0), hidden=[64])
    rng = np.random.default_rng(0)
    for _ in range(4):
        order = rng.permutation(data.num_train)
        for start in range(0, data.num_train, 32):
            batch = order[start : start + 32]
            _, grads = model.loss_and_grads(data.x_train[batch], data.y_train[batch])
            for p, g in zip(model.params, grads):
                p -= 0.5 * g
    assert model.accuracy(data.x_test, data.y_test) > 0.9


def test_cnn_forward_backward_runs_on_a_demo_batch() -> None:
    model = build_model("cnn", (1, 28, 28), 10, np.random.default_rng(0))
    rng = np.random.default_rng(1)
    loss, grads = model.loss_and_grads(rng.random((32, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, 32))
    assert loss == pytest.approx(math.log(10), rel=0.2)
    assert [g.size for g in grads] == DEMO_SIZES
    assert model.forward_flops_per_sample > 2_000_000
