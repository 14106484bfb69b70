"""The optimizer family against independent float64 transcriptions of MXNet 1.x's formulas.

Each reference below is written straight from the formula in MXNet's
python/mxnet/optimizer/optimizer.py / src/operator/optimizer_op-inl.h (as quoted in the
optimizer's module docstring), in float64 numpy, sharing no code with geomx.optim. Both
the Numba kernel path and the numpy path of every optimizer must match it to 1e-6 over
several steps with weight decay, gradient rescaling and clipping all active.
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable

import numpy as np
import pytest

from geomx.optim import OPTIMIZER_NAMES, OptimizerConfig, create_optimizer, optimizer_from_config
from geomx.optim import kernels as optim_kernels

RESCALE, WD, CLIP = 0.7, 0.01, 1.0
STEPS = 4


def _clip(x: np.ndarray, bound: float | None) -> np.ndarray:
    return x if bound is None else np.clip(x, -bound, bound)


# -- float64 references: (options, init(w) -> state, step(w, grad, state, t) -> w) -----------


def ref_sgd(o: dict[str, Any]) -> tuple[Callable, Callable]:
    def step(w, grad, s, t):
        return w - o["lr"] * (_clip(o["rescale_grad"] * grad, o["clip_gradient"]) + o["wd"] * w)
    return (lambda w: {}), step


def ref_momentum(o):
    def step(w, grad, s, t):
        s["m"] = o["momentum"] * s["m"] - o["lr"] * (_clip(o["rescale_grad"] * grad, o["clip_gradient"]) + o["wd"] * w)
        return w + s["m"]
    return (lambda w: {"m": np.zeros_like(w)}), step


def ref_nesterov(o):
    def step(w, grad, s, t):
        g = _clip(o["rescale_grad"] * grad, o["clip_gradient"]) + o["wd"] * w
        s["m"] = o["momentum"] * s["m"] + g
        return w - o["lr"] * (g + o["momentum"] * s["m"])
    return (lambda w: {"m": np.zeros_like(w)}), step


def ref_adam(o):
    def step(w, grad, s, t):
        g = _clip(o["rescale_grad"] * grad + o["wd"] * w, o["clip_gradient"])
        s["m"] = o["beta1"] * s["m"] + (1 - o["beta1"]) * g
        s["v"] = o["beta2"] * s["v"] + (1 - o["beta2"]) * g * g
        lr_t = o["lr"] * math.sqrt(1 - o["beta2"] ** t) / (1 - o["beta1"] ** t)
        return w - lr_t * s["m"] / (np.sqrt(s["v"]) + o["epsilon"])
    return (lambda w: {"m": np.zeros_like(w), "v": np.zeros_like(w)}), step


def ref_adagrad(o):
    def step(w, grad, s, t):
        g = _clip(o["rescale_grad"] * grad, o["clip_gradient"])
        s["h"] = s["h"] + g * g
        return w + (g / np.sqrt(s["h"] + o["eps"]) + w * o["wd"]) * -o["lr"]
    return (lambda w: {"h": np.zeros_like(w)}), step


def ref_rmsprop(o):
    def step(w, grad, s, t):
        g = _clip(o["rescale_grad"] * grad + o["wd"] * w, o["clip_gradient"])
        s["n"] = (1 - o["gamma1"]) * g * g + o["gamma1"] * s["n"]
        return _clip(w - o["lr"] * g / np.sqrt(s["n"] + o["epsilon"]), o["clip_weights"])
    return (lambda w: {"n": np.zeros_like(w)}), step


def ref_rmsprop_centered(o):
    def step(w, grad, s, t):
        g = _clip(o["rescale_grad"] * grad + o["wd"] * w, o["clip_gradient"])
        s["n"] = (1 - o["gamma1"]) * g * g + o["gamma1"] * s["n"]
        s["g"] = (1 - o["gamma1"]) * g + o["gamma1"] * s["g"]
        s["d"] = o["gamma2"] * s["d"] - o["lr"] * g / np.sqrt(s["n"] - s["g"] * s["g"] + o["epsilon"])
        return _clip(w + s["d"], o["clip_weights"])
    return (lambda w: {k: np.zeros_like(w) for k in "ngd"}), step


def ref_adadelta(o):
    def step(w, grad, s, t):
        g = _clip(o["rescale_grad"] * grad, o["clip_gradient"])
        s["ag"] = o["rho"] * s["ag"] + (1 - o["rho"]) * g * g
        delta = np.sqrt(s["ad"] + o["epsilon"]) / np.sqrt(s["ag"] + o["epsilon"]) * g
        s["ad"] = o["rho"] * s["ad"] + (1 - o["rho"]) * delta * delta
        return w - (delta + o["wd"] * w)
    return (lambda w: {"ag": np.zeros_like(w), "ad": np.zeros_like(w)}), step


def ref_adamax(o):
    def step(w, grad, s, t):
        g = _clip(o["rescale_grad"] * grad + o["wd"] * w, o["clip_gradient"])
        s["m"] = o["beta1"] * s["m"] + (1 - o["beta1"]) * g
        s["u"] = np.maximum(o["beta2"] * s["u"], np.abs(g))
        return w - o["lr"] / (1 - o["beta1"] ** t) * s["m"] / s["u"]
    return (lambda w: {"m": np.zeros_like(w), "u": np.zeros_like(w)}), step


def ref_nadam(o):
    def step(w, grad, s, t):
        g = _clip(o["rescale_grad"] * grad + o["wd"] * w, o["clip_gradient"])
        mu_t = o["beta1"] * (1 - 0.5 * 0.96 ** (t * o["schedule_decay"]))
        mu_t1 = o["beta1"] * (1 - 0.5 * 0.96 ** ((t + 1) * o["schedule_decay"]))
        s["sched"] = s["sched"] * mu_t
        sched_next = s["sched"] * mu_t1
        s["m"] = o["beta1"] * s["m"] + (1 - o["beta1"]) * g
        s["v"] = o["beta2"] * s["v"] + (1 - o["beta2"]) * g * g
        g_prime = g / (1 - s["sched"])
        m_prime = s["m"] / (1 - sched_next)
        v_prime = s["v"] / (1 - o["beta2"] ** t)
        m_bar = (1 - mu_t) * g_prime + mu_t1 * m_prime
        return w - o["lr"] * m_bar / (np.sqrt(v_prime) + o["epsilon"])
    return (lambda w: {"m": np.zeros_like(w), "v": np.zeros_like(w), "sched": 1.0}), step


def ref_ftrl(o):
    def step(w, grad, s, t):
        g = _clip(o["rescale_grad"] * grad, o["clip_gradient"])
        s["z"] = s["z"] + g - (np.sqrt(s["n"] + g * g) - np.sqrt(s["n"])) * w / o["lr"]
        s["n"] = s["n"] + g * g
        return ((np.sign(s["z"]) * o["lamda1"] - s["z"]) / ((o["beta"] + np.sqrt(s["n"])) / o["lr"] + o["wd"])
                * (np.abs(s["z"]) > o["lamda1"]))
    return (lambda w: {"z": np.zeros_like(w), "n": np.zeros_like(w)}), step


def ref_signum(o):
    def step(w, grad, s, t):
        mu = o["momentum"]
        s["m"] = mu * s["m"] - (1 - mu) * o["wd"] * w - (1 - mu) * _clip(o["rescale_grad"] * grad, o["clip_gradient"])
        return (1 - o["lr"] * o["wd_lh"]) * w + o["lr"] * np.sign(s["m"])
    return (lambda w: {"m": np.zeros_like(w)}), step


def ref_lamb(o):
    def step(w, grad, s, t):
        g = _clip(o["rescale_grad"] * grad, o["clip_gradient"])
        s["m"] = o["beta1"] * s["m"] + (1 - o["beta1"]) * g
        s["v"] = o["beta2"] * s["v"] + (1 - o["beta2"]) * g * g
        m, v = s["m"], s["v"]
        if o["bias_correction"]:
            m, v = m / (1 - o["beta1"] ** t), v / (1 - o["beta2"] ** t)
        upd = m / (np.sqrt(v) + o["epsilon"]) + o["wd"] * w
        r1, r2 = np.linalg.norm(w), np.linalg.norm(upd)
        if o["lower_bound"] is not None:
            r1 = max(r1, o["lower_bound"])
        if o["upper_bound"] is not None:
            r1 = min(r1, o["upper_bound"])
        ratio = r1 / r2 if r1 > 0 and r2 > 0 else 1.0
        return w - o["lr"] * ratio * upd
    return (lambda w: {"m": np.zeros_like(w), "v": np.zeros_like(w)}), step


# name -> (reference, options beyond the shared ones; the defaults are MXNet's)
CASES: dict[str, tuple[Callable, dict[str, Any]]] = {
    "sgd": (ref_sgd, {"lr": 0.1}),
    "momentum": (ref_momentum, {"lr": 0.1, "momentum": 0.9}),
    "nesterov": (ref_nesterov, {"lr": 0.1, "momentum": 0.9}),
    "adam": (ref_adam, {"lr": 0.01, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8}),
    "adagrad": (ref_adagrad, {"lr": 0.1, "eps": 1e-7}),
    "rmsprop": (ref_rmsprop, {"lr": 0.01, "gamma1": 0.9, "epsilon": 1e-8, "clip_weights": 2.0}),
    "rmsprop_centered": (ref_rmsprop_centered,
                         {"lr": 0.01, "gamma1": 0.95, "gamma2": 0.8, "epsilon": 1e-8, "clip_weights": None}),
    "adadelta": (ref_adadelta, {"rho": 0.9, "epsilon": 1e-5}),
    "adamax": (ref_adamax, {"lr": 0.02, "beta1": 0.9, "beta2": 0.999}),
    "nadam": (ref_nadam, {"lr": 0.01, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8, "schedule_decay": 0.004}),
    "ftrl": (ref_ftrl, {"lr": 0.1, "lamda1": 0.01, "beta": 1.0}),
    "signum": (ref_signum, {"lr": 0.01, "momentum": 0.9, "wd_lh": 0.001}),
    "lamb": (ref_lamb, {"lr": 0.01, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-6, "lower_bound": 0.5,
                        "upper_bound": 10.0, "bias_correction": True}),
}


def test_every_elementwise_optimizer_has_a_reference() -> None:
    assert set(CASES) == {n for n in OPTIMIZER_NAMES if not n.startswith("dcasgd")}


def _build(name: str, use_kernels: bool, shared: dict[str, Any]):
    ref, own = CASES[name]
    options = {**own, **shared}
    opt = create_optimizer(name, **{k: v for k, v in options.items()})
    opt.use_kernels = use_kernels
    full = {"rescale_grad": 1.0, "wd": 0.0, "clip_gradient": None, **options}
    if name == "adadelta":
        full["lr"] = 1.0
    return opt, ref(full)


def _inputs(shape: tuple[int, ...], seed: int = 7) -> tuple[np.ndarray, list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    w = rng.normal(size=shape).astype(np.float32)
    grads = [(2.0 * rng.normal(size=shape)).astype(np.float32) for _ in range(STEPS)]  # some beyond CLIP
    return w, grads


def _run_reference(init, step, w: np.ndarray, grads: list[np.ndarray], *, round_to=None) -> np.ndarray:
    ref_w = w.astype(np.float64)
    state = init(ref_w)
    for t, g in enumerate(grads, start=1):
        ref_w = step(ref_w, g.astype(np.float64), state, t)
        if round_to is not None:
            ref_w = ref_w.astype(round_to).astype(np.float64)
    return ref_w


MAX_DIFF: dict[tuple[str, str], float] = {}


@pytest.mark.parametrize("path", ["kernel", "numpy"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_the_mxnet_formula(name: str, path: str) -> None:
    opt, (init, step) = _build(name, path == "kernel", {"wd": WD, "rescale_grad": RESCALE, "clip_gradient": CLIP})
    w, grads = _inputs((23, 9))
    expected = _run_reference(init, step, w, grads)
    state = opt.create_state(0, w)
    for g in grads:
        opt.update(0, w, g, state)
    diff = float(np.abs(w.astype(np.float64) - expected).max())
    MAX_DIFF[(name, path)] = diff
    assert diff <= 1e-6, f"{name} ({path}) differs from MXNet's formula by {diff:.3g}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_float16_weights_are_updated_in_float32_and_rounded_back(name: str) -> None:
    opt, (init, step) = _build(name, True, {"wd": WD, "rescale_grad": RESCALE, "clip_gradient": CLIP})
    w32, grads = _inputs((40,), seed=3)
    w = w32.astype(np.float16)
    expected = _run_reference(init, step, w.astype(np.float32), [g.astype(np.float16).astype(np.float32)
                                                                  for g in grads], round_to=np.float16)
    state = opt.create_state(0, w)
    for g in grads:
        opt.update(0, w, g.astype(np.float16), state)
    assert w.dtype == np.float16
    # a float32 result a rounding away from a float16 boundary may round the other way
    ulp = np.spacing(np.abs(expected).astype(np.float16)).astype(np.float64)
    assert np.all(np.abs(w.astype(np.float64) - expected) <= ulp * 1.001)


@pytest.mark.parametrize("name", ["adam", "lamb", "rmsprop_centered"])
def test_threaded_chunks_give_the_numpy_result(name: str) -> None:
    """Arrays above one chunk run on the thread pool; LAMB sums its norms over chunks."""
    n = optim_kernels.CHUNK + 4097
    rng = np.random.default_rng(11)
    w0 = rng.normal(size=n).astype(np.float32)
    results = []
    for use in (True, False):
        opt = create_optimizer(name, wd=WD, clip_gradient=CLIP)
        opt.use_kernels = use
        w = w0.copy()
        state = opt.create_state(0, w)
        for seed in range(2):
            opt.update(0, w, np.random.default_rng(seed).normal(size=n).astype(np.float32), state)
        results.append(w)
    np.testing.assert_allclose(results[0], results[1], rtol=0, atol=1e-6)


def test_non_contiguous_weights_and_states_fall_back_to_numpy() -> None:
    opt = create_optimizer("adam", lr=0.1)
    base = np.ones((4, 6), np.float32)
    w = base[:, ::2]  # a strided view: updated through a working copy, written back
    opt.update(0, w, np.full(w.shape, 0.5, np.float32), opt.create_state(0, w))
    np.testing.assert_allclose(base[:, ::2], 0.90000006, rtol=1e-6)
    np.testing.assert_array_equal(base[:, 1::2], 1.0)
    state = {"mean": np.zeros((6, 4), np.float32).T, "var": np.zeros((4, 6), np.float32), "t": 0}
    w2 = np.ones((4, 6), np.float32)
    opt.update(0, w2, np.full(w2.shape, 0.5, np.float32), state)  # state not C-contiguous: numpy path
    np.testing.assert_allclose(w2, 0.90000006, rtol=1e-6)
    assert state["t"] == 1


def test_adamax_leaves_never_touched_coordinates_alone() -> None:
    """MXNet writes 0/0 = NaN where u == 0; we leave the weight (docstring of adamax.py)."""
    for use in (True, False):
        opt = create_optimizer("adamax")
        opt.use_kernels = use
        w = np.array([1.0, 2.0], np.float32)
        opt.update(0, w, np.array([0.0, 0.5], np.float32), opt.create_state(0, w))
        assert w[0] == 1.0 and np.isfinite(w).all() and w[1] < 2.0


def test_signum_without_momentum_is_signsgd() -> None:
    for use in (True, False):
        opt = create_optimizer("signum", lr=0.1, momentum=0.0, wd=0.5, rescale_grad=3.0)
        opt.use_kernels = use
        w = np.array([1.0, 1.0, 1.0], np.float32)
        assert opt.create_state(0, w) is None
        opt.update(0, w, np.array([0.2, -7.0, 0.0], np.float32), None)
        np.testing.assert_allclose(w, [0.95 - 0.1, 0.95 + 0.1, 0.95], rtol=1e-6)


def test_adadelta_ignores_the_learning_rate_as_mxnet_1x_does() -> None:
    a, b = create_optimizer("adadelta", lr=1.0), create_optimizer("adadelta", lr=0.001)
    wa, wb = np.ones(5, np.float32), np.ones(5, np.float32)
    g = np.linspace(-1, 1, 5).astype(np.float32)
    a.update(0, wa, g, a.create_state(0, wa))
    b.update(0, wb, g, b.create_state(0, wb))
    np.testing.assert_array_equal(wa, wb)


# -- state contract -------------------------------------------------------------------------


def _is_contract_state(state: Any) -> bool:
    if state is None or isinstance(state, np.ndarray):
        return True
    if isinstance(state, tuple):
        return all(isinstance(v, np.ndarray) for v in state)
    if isinstance(state, dict):
        return all(isinstance(k, str) and (isinstance(v, (np.ndarray, float, int)) and not isinstance(v, bool))
                   for k, v in state.items())
    return False


@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
def test_states_follow_the_contract(name: str) -> None:
    for options in ({}, {"momentum": 0.5} if name.startswith("dcasgd") else {}):
        opt = create_optimizer(name, **options)
        w = np.ones((3, 2), np.float32)
        state = opt.create_state(0, w)
        opt.update(0, w, np.full((3, 2), 0.1, np.float32), state, sender="a")
        assert _is_contract_state(state), f"{name}: state {type(state).__name__} breaks the state contract"


# -- options and config -----------------------------------------------------------------------


@pytest.mark.parametrize("name, option, value", [
    ("adagrad", "eps", -1.0),
    ("rmsprop", "gamma1", 1.0),
    ("rmsprop_centered", "gamma2", -0.1),
    ("rmsprop", "centered", "yes"),
    ("rmsprop", "clip_weights", -2.0),
    ("adadelta", "rho", 1.5),
    ("adadelta", "epsilon", 0.0),
    ("adamax", "beta2", 1.0),
    ("nadam", "schedule_decay", float("inf")),
    ("ftrl", "lr", 0.0),
    ("ftrl", "lamda1", -0.1),
    ("signum", "wd_lh", -1.0),
    ("lamb", "lower_bound", -1.0),
    ("lamb", "bias_correction", 1),
    ("lamb", "epsilon", "small"),
])
def test_bad_options_name_the_option(name: str, option: str, value: Any) -> None:
    with pytest.raises(ValueError, match=f"option {option} must"):
        create_optimizer(name, **{option: value})


def test_unknown_options_list_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match="allowed: lr, gamma1, gamma2, epsilon, clip_weights"):
        create_optimizer("rmsprop_centered", centered=False)
    with pytest.raises(ValueError, match="beta1"):
        create_optimizer("nadam", gamma1=0.9)
    with pytest.raises(ValueError, match="lower_bound must be <= upper_bound"):
        create_optimizer("lamb", lower_bound=2.0, upper_bound=1.0)


@pytest.mark.parametrize("name", sorted(CASES))
def test_non_default_options_round_trip_through_json(name: str) -> None:
    _, own = CASES[name]
    opt = create_optimizer(name, **own, wd=0.003, rescale_grad=0.25, clip_gradient=5.0)
    text = OptimizerConfig.of(opt).to_json()
    rebuilt = optimizer_from_config(json.loads(text))
    assert rebuilt.to_config() == opt.to_config()
    assert {k: v for k, v in opt.to_config().items() if k in own} == {k: v for k, v in own.items()
                                                                     if k != "gamma2" or name.endswith("centered")}


def test_rmsprop_centered_option_and_name_are_the_same_optimizer() -> None:
    by_option = create_optimizer("rmsprop", centered=True, gamma2=0.7)
    assert by_option.to_config()["name"] == "rmsprop_centered"
    assert optimizer_from_config(by_option.to_config()).centered


def test_kernels_can_be_turned_off_for_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEOMX_OPTIM_KERNELS", "0")
    assert not create_optimizer("adam").use_kernels
    monkeypatch.setenv("GEOMX_OPTIM_KERNELS", "1")
    assert create_optimizer("adam").use_kernels


def test_by_default_only_large_arrays_go_through_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """A small model's server never pays Numba's start-up (geomx/optim/base.py)."""
    from geomx.optim import adam, base

    monkeypatch.delenv("GEOMX_OPTIM_KERNELS", raising=False)
    calls: list[int] = []
    real = adam.kernels

    def counting():  # type: ignore[no-untyped-def]
        calls.append(1)
        return real()

    monkeypatch.setattr(adam, "kernels", counting)
    opt = create_optimizer("adam")
    assert opt.use_kernels is None
    for n in (base.KERNEL_MIN_ELEMENTS - 1, base.KERNEL_MIN_ELEMENTS):
        w = np.ones(n, np.float32)
        opt.update(0, w, np.full(n, 0.5, np.float32), opt.create_state(0, w))
        np.testing.assert_allclose(w, 0.999, rtol=1e-6)
    assert len(calls) == 2  # only the second update, which looks the kernel up twice


# -- training through the emulated parameter server --------------------------------------------

# name -> (lr, extra scenario overrides); 30 iterations of the quickstart (digits, 2 parties x
# 2 workers, the global server runs the optimizer). Accuracies measured when written:
# adagrad .958, rmsprop .905, rmsprop_centered .944, adadelta .908, adamax .930, nadam .916,
# ftrl .922, signum .897, lamb .950 (adam, the quickstart's own, gets .96 in 60).
TRAINING: dict[str, tuple[float, list[str]]] = {
    "adagrad": (0.05, []),
    "rmsprop": (0.003, []),
    "rmsprop_centered": (0.002, []),
    "adadelta": (1.0, []),
    "adamax": (0.01, []),
    "nadam": (0.005, []),
    # FTRL is an online method for linear models: beta = 1 shrinks an MLP's random
    # initial weights towards 0 on the first step, so train the softmax model with it.
    "ftrl": (0.5, ["training.model=softmax", 'training.optimizer_options=["lamda1=0.001"]']),
    "signum": (0.003, []),
    "lamb": (0.03, []),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TRAINING))
def test_trains_the_quickstart_through_the_global_server(scenario_of, name: str) -> None:
    from geomx.cluster import plan_job
    from geomx.experiment import run_scenario

    lr, extra = TRAINING[name]
    s = scenario_of("quickstart.toml", f"training.optimizer={name}", f"training.lr={lr}", "run.iterations=30",
                    "run.target_accuracy=0", "metrics.trace=false", "metrics.plot=false", *extra)
    assert plan_job(s).train.global_optimizer["name"] == name
    summary = run_scenario(s).summary
    assert summary.final_accuracy >= 0.85, f"{name}: accuracy {summary.final_accuracy:.3f} after 30 iterations"


def test_mxnet_class_spellings_reach_the_new_optimizers() -> None:
    from geomx.node.kvstore import optimizer

    config = optimizer.RMSProp(learning_rate=0.01, centered=True)
    assert optimizer_from_config(config).to_config()["name"] == "rmsprop_centered"
    assert optimizer_from_config(optimizer.LAMB(learning_rate=0.002)).lr == 0.002


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_a_forked_child_gets_its_own_thread_pool() -> None:
    """A child forked after the parent used the pool must not wait on the parent's threads."""
    import multiprocessing

    n = optim_kernels.CHUNK + 10
    opt = create_optimizer("sgd", lr=0.5)
    w = np.ones(n, np.float32)
    opt.update(0, w, np.ones(n, np.float32), None)  # the parent's pool now exists
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply_async(_update_in_child, (n,)).get(timeout=60) == 0.5


def _update_in_child(n: int) -> float:
    opt = create_optimizer("sgd", lr=0.5)
    w = np.ones(n, np.float32)
    opt.update(0, w, np.ones(n, np.float32), None)
    return float(w[-1])
