"""Server-side optimizers: MXNet 1.x maths (docs/geomx-behaviour.md §2.2), shipped as JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest

from geomx.optim import (
    DCASGD,
    OPTIMIZER_NAMES,
    Adam,
    Momentum,
    Nesterov,
    Optimizer,
    OptimizerConfig,
    SGD,
    Updater,
    create_optimizer,
    optimizer_from_config,
)


def f32(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


# -- SGD family ---------------------------------------------------------------------------


def test_sgd_step_is_lr_times_grad_plus_weight_decay() -> None:
    opt = SGD(lr=0.1, wd=0.01)
    w = f32(1.0, -2.0)
    opt.update(0, w, f32(0.5, 0.25), opt.create_state(0, w))
    # w - lr * (g + wd * w)
    np.testing.assert_allclose(w, [1.0 - 0.1 * (0.5 + 0.01), -2.0 - 0.1 * (0.25 - 0.02)], rtol=1e-6)


def test_sgd_rescales_then_clips_the_gradient() -> None:
    opt = SGD(lr=1.0, rescale_grad=0.5, clip_gradient=0.3)
    w = f32(0.0, 0.0)
    opt.update(0, w, f32(2.0, 0.4), None)
    np.testing.assert_allclose(w, [-0.3, -0.2], rtol=1e-6)  # 2*0.5 clipped to 0.3; 0.4*0.5


def test_update_does_not_modify_the_received_gradient() -> None:
    for name in OPTIMIZER_NAMES:
        opt = create_optimizer(name, lr=0.1)
        w, g = f32(1.0, 2.0), f32(0.5, -0.5)
        opt.update(0, w, g, opt.create_state(0, w), sender="ls:a")
        np.testing.assert_array_equal(g, [0.5, -0.5])


def test_heavy_ball_momentum_two_steps() -> None:
    opt = Momentum(lr=0.1, momentum=0.9)
    w = f32(1.0)
    state = opt.create_state(0, w)
    opt.update(0, w, f32(1.0), state)  # m = -0.1, w = 0.9
    opt.update(0, w, f32(1.0), state)  # m = 0.9*-0.1 - 0.1 = -0.19, w = 0.71
    np.testing.assert_allclose(state, [-0.19], rtol=1e-6)
    np.testing.assert_allclose(w, [0.71], rtol=1e-6)


def test_nesterov_two_steps_match_mxnet_nag() -> None:
    opt = Nesterov(lr=0.1, momentum=0.9)
    w = f32(1.0)
    state = opt.create_state(0, w)
    opt.update(0, w, f32(1.0), state)  # m = 1; w -= 0.1 * (1 + 0.9*1) = 0.81
    np.testing.assert_allclose(w, [0.81], rtol=1e-6)
    opt.update(0, w, f32(1.0), state)  # m = 1.9; w -= 0.1 * (1 + 0.9*1.9) = 0.81 - 0.271
    np.testing.assert_allclose(w, [0.539], rtol=1e-6)


# -- Adam ---------------------------------------------------------------------------------


def test_adam_two_steps_match_hand_computation() -> None:
    """lr=0.1, grads 0.5 then -0.2, from w=1 (MXNet 1.x: bias correction folded into lr_t).

    t=1: m=0.05, v=0.00025, lr_t=0.1*sqrt(0.001)/0.1=0.0316228 -> w=0.90000006
    t=2: m=0.025, v=0.00028975, lr_t=0.1*sqrt(1-0.999^2)/(1-0.81)=0.0235317 -> w=0.8654395
    """
    opt = Adam(lr=0.1)
    w = f32(1.0)
    state = opt.create_state(0, w)
    opt.update(0, w, f32(0.5), state)
    assert state["t"] == 1
    np.testing.assert_allclose(state["mean"], [0.05], rtol=1e-6)
    np.testing.assert_allclose(state["var"], [0.00025], rtol=1e-5)
    np.testing.assert_allclose(w, [0.90000006], rtol=1e-6)
    opt.update(0, w, f32(-0.2), state)
    assert state["t"] == 2
    np.testing.assert_allclose(state["mean"], [0.025], rtol=1e-5)
    np.testing.assert_allclose(state["var"], [0.00028975], rtol=1e-5)
    np.testing.assert_allclose(w, [0.8654395], rtol=1e-6)


def test_adam_counts_updates_per_key() -> None:
    opt = Adam(lr=0.1)
    w0, w1 = f32(1.0), f32(1.0)
    s0, s1 = opt.create_state(0, w0), opt.create_state(1, w1)
    for _ in range(3):
        opt.update(0, w0, f32(0.5), s0)
    opt.update(1, w1, f32(0.5), s1)
    assert (s0["t"], s1["t"]) == (3, 1)
    np.testing.assert_allclose(w1, [0.90000006], rtol=1e-6)  # key 1's first step ignores key 0's


def test_adam_is_nearly_scale_invariant() -> None:
    """Why GeoMX's 4x-too-large summed gradient barely matters for Adam (§2.2)."""
    a, b = Adam(lr=0.01), Adam(lr=0.01)
    wa, wb = f32(1.0, -1.0), f32(1.0, -1.0)
    sa, sb = a.create_state(0, wa), b.create_state(0, wb)
    g = f32(0.3, -0.1)
    for _ in range(5):
        a.update(0, wa, g, sa)
        b.update(0, wb, 4 * g, sb)
    np.testing.assert_allclose(wa, wb, rtol=1e-5)


def test_float16_weights_are_updated_in_float32_and_rounded_back() -> None:
    opt = Adam(lr=0.1)
    w = np.array([1.0], dtype=np.float16)
    opt.update(0, w, np.array([0.5], dtype=np.float16), opt.create_state(0, w))
    assert w.dtype == np.float16
    assert w[0] == np.float16(0.9)


# -- DC-ASGD ------------------------------------------------------------------------------


def dc_step(w: float, g: float, w_bak: float, lr: float, lam: float, wd: float = 0.0) -> float:
    return w - lr * (g + wd * w + lam * g * g * (w - w_bak))


def test_dcasgd_shared_uses_the_weight_before_the_previous_update() -> None:
    opt = create_optimizer("dcasgd_shared", lr=0.5, lamda=0.5)
    w = f32(1.0)
    state = opt.create_state(0, w)
    opt.update(0, w, f32(0.4), state)  # w_prev = w: no correction -> 0.8
    np.testing.assert_allclose(w, [0.8], rtol=1e-6)
    np.testing.assert_allclose(state["backup"], [1.0])
    opt.update(0, w, f32(2.0), state)  # 0.8 - 0.5*(2 + 0.5*4*(0.8-1)) = 0.8 - 0.5*1.6 = 0.0
    np.testing.assert_allclose(w, [dc_step(0.8, 2.0, 1.0, 0.5, 0.5)], atol=1e-6)
    np.testing.assert_allclose(state["backup"], [0.8], rtol=1e-6)


def test_dcasgd_shared_weight_decay_and_momentum() -> None:
    opt = create_optimizer("dcasgd_shared", lr=0.1, lamda=1.0, wd=0.1, momentum=0.5)
    w = f32(2.0)
    state = opt.create_state(0, w)
    opt.update(0, w, f32(1.0), state)  # delta = -0.1*(1 + 0.2) = -0.12; m = -0.12
    np.testing.assert_allclose(w, [1.88], rtol=1e-6)
    opt.update(0, w, f32(1.0), state)  # delta = -0.1*(1 + 0.188 + 1*(1.88-2)) = -0.1068
    np.testing.assert_allclose(state["momentum"], [0.5 * -0.12 - 0.1068], rtol=1e-5)
    np.testing.assert_allclose(w, [1.88 - 0.06 - 0.1068], rtol=1e-5)


def test_dcasgd_per_sender_compensates_with_the_senders_pulled_model() -> None:
    lr, lam = 0.5, 0.5
    opt = create_optimizer("dcasgd", lr=lr, lamda=lam)
    assert opt.needs_pull_notes
    w = f32(1.0)
    state = opt.create_state(0, w)
    opt.note_pull(0, "ls:a", w)
    opt.note_pull(0, "ls:b", w)
    opt.update(0, w, f32(0.4), state, sender="ls:a")  # a pulled 1.0 = w: no correction
    np.testing.assert_allclose(w, [0.8], rtol=1e-6)
    opt.update(0, w, f32(2.0), state, sender="ls:b")  # b computed at 1.0, server is at 0.8
    expected = dc_step(0.8, 2.0, 1.0, lr, lam)
    np.testing.assert_allclose(w, [expected], atol=1e-6)
    opt.note_pull(0, "ls:a", w)  # a pulls the current model
    opt.update(0, w, f32(0.2), state, sender="ls:a")  # no staleness: no correction
    np.testing.assert_allclose(w, [expected - lr * 0.2], atol=1e-6)
    np.testing.assert_allclose(opt.pulled_weight(0, "ls:b"), [1.0])


def test_dcasgd_per_and_shared_rules_differ_on_the_same_history() -> None:
    """MXNet's single backup is 'the previous update's weight', not the sender's model."""
    per, shared = create_optimizer("dcasgd", lr=0.5, lamda=0.5), create_optimizer("dcasgd_shared", lr=0.5, lamda=0.5)
    wp, ws = f32(1.0), f32(1.0)
    sp, ss = per.create_state(0, wp), shared.create_state(0, ws)
    for sender, g in (("a", 0.4), ("b", 1.0), ("a", 1.0)):
        per.update(0, wp, f32(g), sp, sender=sender)  # nobody pulls again: backups stay 1.0
        shared.update(0, ws, f32(g), ss)
    assert abs(float(wp[0]) - float(ws[0])) > 1e-3


def test_dcasgd_per_sender_falls_back_to_the_initial_weight() -> None:
    opt = DCASGD(lr=0.5, lamda=0.5)
    w = f32(1.0)
    state = opt.create_state(0, w)
    opt.update(0, w, f32(0.4), state, sender="a")
    opt.update(0, w, f32(2.0), state, sender="b")  # never pulled: w_bak = initial 1.0
    np.testing.assert_allclose(w, [dc_step(0.8, 2.0, 1.0, 0.5, 0.5)], atol=1e-6)


def test_dcasgd_per_sender_requires_a_sender() -> None:
    opt = DCASGD()
    w = f32(1.0)
    with pytest.raises(ValueError, match="dcasgd_shared"):
        opt.update(0, w, f32(1.0), opt.create_state(0, w))


def test_dcasgd_adaptive_lambda_scales_by_root_mean_square() -> None:
    opt = DCASGD(lr=0.5, lamda=0.5, adaptive=True, ms_decay=0.5)
    w = f32(1.0)
    state = opt.create_state(0, w)
    opt.note_pull(0, "a", w)
    opt.update(0, w, f32(0.4), state, sender="b")  # b never pulled; w == initial: no correction
    opt.update(0, w, f32(2.0), state, sender="a")
    ms = 0.5 * (0.5 * 0.16) + 0.5 * 4.0
    np.testing.assert_allclose(w, [dc_step(0.8, 2.0, 1.0, 0.5, 0.5 / np.sqrt(ms))], atol=1e-5)


def test_updater_creates_state_on_first_update_and_forwards_pulls() -> None:
    up = Updater(create_optimizer("dcasgd", lr=0.5, lamda=0.5))
    w = f32(1.0)
    up.note_pull(3, "a", w)
    up(3, f32(0.4), w, sender="a")
    assert list(up.states) == [3]
    np.testing.assert_allclose(w, [0.8], rtol=1e-6)


# -- config -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
def test_config_round_trips_through_json(name: str) -> None:
    opt = create_optimizer(name, lr=0.05, wd=1e-4)
    assert isinstance(opt, Optimizer)
    text = OptimizerConfig.of(opt).to_json()
    rebuilt = optimizer_from_config(json.loads(text))
    assert rebuilt.to_config() == opt.to_config()
    assert type(rebuilt) is type(opt)
    assert rebuilt.to_config()["name"] == name


def test_config_keeps_non_default_options() -> None:
    opt = create_optimizer("dcasgd", lamda=2.0, momentum=0.9, adaptive=True)
    rebuilt = OptimizerConfig.from_json(OptimizerConfig.of(opt).to_json()).build()
    assert isinstance(rebuilt, DCASGD)
    assert (rebuilt.lamda, rebuilt.momentum, rebuilt.adaptive, rebuilt.per_sender) == (2.0, 0.9, True, True)


def test_unknown_names_and_options_are_rejected_with_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match="allowed: sgd, momentum"):
        create_optimizer("rmsprop_plain")
    with pytest.raises(ValueError, match="beta1"):
        create_optimizer("adam", momentum=0.9)
    with pytest.raises(ValueError, match="per_sender"):
        optimizer_from_config({"name": "dcasgd_shared", "per_sender": True})
    with pytest.raises(ValueError, match="name"):
        optimizer_from_config({"lr": 0.1})
    with pytest.raises(ValueError, match="JSON scalar"):
        OptimizerConfig("sgd", {"lr": [0.1]})
    with pytest.raises(ValueError, match="lr"):
        create_optimizer("sgd", lr=float("nan"))
    with pytest.raises(ValueError, match="not valid JSON"):
        OptimizerConfig.from_json("{'name': 'sgd'}")


def test_shape_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError, match="shape"):
        SGD().update(0, f32(1.0, 2.0), f32(1.0), None)
