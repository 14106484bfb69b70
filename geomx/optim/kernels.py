"""Numba kernels for the optimizers' elementwise updates, and the chunked runner.

Why kernels: a numpy update is a chain of whole-array operations (Adam: about twelve),
each one a pass over memory with a temporary; a kernel makes one pass and keeps every
intermediate in registers. On 25M parameters that is the difference between streaming
memory a dozen times and three or four (``bench/optim.py`` measures it).

Design (the codec kernels' conventions, ``geomx/codec/cpu_kernels.py``):

* Importing this module compiles nothing; every kernel is ``cache=True`` and compiles on
  its first call. Only :mod:`geomx.optim.base` imports it, lazily, so ``import
  geomx.optim`` does not import numba.
* Kernels are serial and ``nogil``; :func:`run` splits large arrays into fixed
  :data:`CHUNK`-element pieces and runs them on a thread pool. Serial kernels compile in
  a fraction of the time ``parallel=True`` ones take, and fixed chunk boundaries keep the
  LAMB norm sums independent of the thread count.
* Every float argument is a ``np.float32`` and every intermediate float32, as MXNet's
  float32 operators compute; the factors that depend only on the step count (bias
  corrections, Nadam's schedule) are computed once in Python, in float64, and passed in.
* A clip bound below zero means "no clipping" (MXNet's ``clip_gradient = -1``).
* Arrays are 1-D, C-contiguous float32 views; the optimizers check that before calling
  and take the numpy path otherwise.

The formulas are MXNet 1.x's (python/mxnet/optimizer/optimizer.py and
src/operator/optimizer_op-inl.h); each optimizer's module states its own.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numba import njit

#: Elements per chunk handed to one thread (4 MiB of float32 per array).
CHUNK = 1 << 20

_JIT = {"cache": True, "nogil": True, "error_model": "numpy"}
_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)


def _threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


_POOL: ThreadPoolExecutor | None = None
_POOL_PID = 0


def _pool() -> ThreadPoolExecutor:
    """The process's pool; a forked child makes its own (threads do not survive a fork,
    and an inherited executor would queue work for threads that no longer exist)."""
    global _POOL, _POOL_PID
    if _POOL is None or _POOL_PID != os.getpid():
        _POOL = ThreadPoolExecutor(max_workers=_threads(), thread_name_prefix="geomx-optim")
        _POOL_PID = os.getpid()
    return _POOL


def run(kernel: Callable[..., object], arrays: Sequence[np.ndarray], *scalars: object) -> list[object]:
    """Run ``kernel(*arrays, *scalars)`` over fixed chunks of the (equal-length) arrays.

    Small arrays (one chunk) run on the calling thread. Returns the kernel's results in
    chunk order (the partial sums of ``sum_squares``; None for the update kernels).
    """
    n = arrays[0].shape[0]
    if n <= CHUNK or _threads() == 1:
        return [kernel(*arrays, *scalars)]
    futures = [
        _pool().submit(kernel, *(a[start : start + CHUNK] for a in arrays), *scalars)
        for start in range(0, n, CHUNK)
    ]
    return [f.result() for f in futures]


@njit(inline="always")
def _clip(x, bound):  # type: ignore[no-untyped-def]
    if bound >= _ZERO:
        if x > bound:
            return bound
        if x < -bound:
            return -bound
    return x


@njit(inline="always")
def _sign(x):  # type: ignore[no-untyped-def]
    if x > _ZERO:
        return _ONE
    if x < _ZERO:
        return -_ONE
    return _ZERO


# -- SGD family (gradient: clip(rescale * grad), then + wd * w) ----------------------------


@njit(**_JIT)
def sgd(w, g, lr, rescale, wd, clip):  # type: ignore[no-untyped-def]
    for i in range(w.shape[0]):
        gi = _clip(rescale * g[i], clip) + wd * w[i]
        w[i] = w[i] - lr * gi


@njit(**_JIT)
def momentum(w, g, mom, lr, mu, rescale, wd, clip):  # type: ignore[no-untyped-def]
    for i in range(w.shape[0]):
        gi = _clip(rescale * g[i], clip) + wd * w[i]
        m = mu * mom[i] - lr * gi
        mom[i] = m
        w[i] = w[i] + m


@njit(**_JIT)
def nesterov(w, g, mom, lr, mu, rescale, wd, clip):  # type: ignore[no-untyped-def]
    for i in range(w.shape[0]):
        gi = _clip(rescale * g[i], clip) + wd * w[i]
        m = mu * mom[i] + gi
        mom[i] = m
        w[i] = w[i] - lr * (gi + mu * m)


@njit(**_JIT)
def adagrad(w, g, history, lr, eps, rescale, wd, clip):  # type: ignore[no-untyped-def]
    for i in range(w.shape[0]):
        gi = _clip(rescale * g[i], clip)
        h = history[i] + gi * gi
        history[i] = h
        w[i] = w[i] - lr * (gi / np.sqrt(h + eps) + wd * w[i])


@njit(**_JIT)
def adadelta(w, g, acc_g, acc_delta, rho, one_minus_rho, eps, rescale, wd, clip):  # type: ignore[no-untyped-def]
    for i in range(w.shape[0]):
        gi = _clip(rescale * g[i], clip)
        ag = rho * acc_g[i] + one_minus_rho * gi * gi
        acc_g[i] = ag
        ad = acc_delta[i]
        delta = np.sqrt(ad + eps) / np.sqrt(ag + eps) * gi
        acc_delta[i] = rho * ad + one_minus_rho * delta * delta
        w[i] = w[i] - (delta + wd * w[i])


@njit(**_JIT)
def ftrl(w, g, z, n, lr, lamda1, beta, rescale, wd, clip):  # type: ignore[no-untyped-def]
    for i in range(w.shape[0]):
        gi = _clip(rescale * g[i], clip)
        ni = n[i]
        g2 = gi * gi
        zi = z[i] + gi - (np.sqrt(ni + g2) - np.sqrt(ni)) * w[i] / lr
        ni = ni + g2
        z[i] = zi
        n[i] = ni
        if abs(zi) > lamda1:
            w[i] = (_sign(zi) * lamda1 - zi) / ((beta + np.sqrt(ni)) / lr + wd)
        else:
            w[i] = _ZERO


@njit(**_JIT)
def signum(w, g, mom, lr, mu, one_minus_mu, rescale, wd, wd_lh, clip):  # type: ignore[no-untyped-def]
    for i in range(w.shape[0]):
        m = mu * mom[i] - one_minus_mu * wd * w[i] - one_minus_mu * _clip(rescale * g[i], clip)
        mom[i] = m
        w[i] = (_ONE - lr * wd_lh) * w[i] + lr * _sign(m)


@njit(**_JIT)
def signsgd(w, g, lr, wd):  # type: ignore[no-untyped-def]
    for i in range(w.shape[0]):
        w[i] = (_ONE - lr * wd) * w[i] - lr * _sign(g[i])


# -- Adam family (gradient: clip(rescale * grad + wd * w)) ----------------------------------


@njit(**_JIT)
def adam(w, g, mean, var, lr_t, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, rescale, wd, clip):  # type: ignore[no-untyped-def]
    for i in range(w.shape[0]):
        gi = _clip(rescale * g[i] + wd * w[i], clip)
        m = beta1 * mean[i] + one_minus_beta1 * gi
        v = beta2 * var[i] + one_minus_beta2 * (gi * gi)
        mean[i] = m
        var[i] = v
        w[i] = w[i] - lr_t * m / (np.sqrt(v) + eps)


@njit(**_JIT)
def rmsprop(w, g, n, lr, gamma1, one_minus_gamma1, eps, rescale, wd, clip, clip_weights):  # type: ignore[no-untyped-def]
    for i in range(w.shape[0]):
        gi = _clip(rescale * g[i] + wd * w[i], clip)
        ni = one_minus_gamma1 * (gi * gi) + gamma1 * n[i]
        n[i] = ni
        w[i] = _clip(w[i] - lr * (gi / np.sqrt(ni + eps)), clip_weights)


@njit(**_JIT)
def rmsprop_centered(w, g, n, gbar, delta, lr, gamma1, one_minus_gamma1, gamma2, eps, rescale, wd, clip,  # type: ignore[no-untyped-def]
                     clip_weights):
    for i in range(w.shape[0]):
        gi = _clip(rescale * g[i] + wd * w[i], clip)
        ni = one_minus_gamma1 * (gi * gi) + gamma1 * n[i]
        gb = one_minus_gamma1 * gi + gamma1 * gbar[i]
        d = gamma2 * delta[i] - lr * gi / np.sqrt(ni - gb * gb + eps)
        n[i] = ni
        gbar[i] = gb
        delta[i] = d
        w[i] = _clip(w[i] + d, clip_weights)


@njit(**_JIT)
def adamax(w, g, mean, u, lr_t, beta1, one_minus_beta1, beta2, rescale, wd, clip):  # type: ignore[no-untyped-def]
    for i in range(w.shape[0]):
        gi = _clip(rescale * g[i] + wd * w[i], clip)
        m = beta1 * mean[i] + one_minus_beta1 * gi
        ui = max(beta2 * u[i], abs(gi))
        mean[i] = m
        u[i] = ui
        if ui > _ZERO:
            w[i] = w[i] - lr_t * m / ui


@njit(**_JIT)
def nadam(w, g, mean, var, lr, beta1, one_minus_beta1, beta2, one_minus_beta2, coef_g, coef_m, coef_v, eps,  # type: ignore[no-untyped-def]
          rescale, wd, clip):
    for i in range(w.shape[0]):
        gi = _clip(rescale * g[i] + wd * w[i], clip)
        m = beta1 * mean[i] + one_minus_beta1 * gi
        v = beta2 * var[i] + one_minus_beta2 * gi * gi
        mean[i] = m
        var[i] = v
        m_bar = coef_g * gi + coef_m * m
        w[i] = w[i] - lr * m_bar / (np.sqrt(v * coef_v) + eps)


# -- LAMB (two phases around the layer's norms) ---------------------------------------------


@njit(**_JIT)
def lamb_phase1(w, g, mean, var, upd, beta1, one_minus_beta1, beta2, one_minus_beta2, coef1, coef2, eps,  # type: ignore[no-untyped-def]
                rescale, wd, clip):
    """Moments and the Adam-like direction ``upd`` (MXNet's lamb_update_phase1)."""
    for i in range(w.shape[0]):
        gi = _clip(rescale * g[i], clip)
        m = beta1 * mean[i] + one_minus_beta1 * gi
        v = beta2 * var[i] + one_minus_beta2 * gi * gi
        mean[i] = m
        var[i] = v
        upd[i] = (m * coef1) / (np.sqrt(v * coef2) + eps) + wd * w[i]


@njit(cache=True, nogil=True, fastmath={"reassoc"})
def sum_squares(x):  # type: ignore[no-untyped-def]
    """Sum of x^2 in float64. ``reassoc`` lets LLVM vectorise the reduction: the order of
    additions is fixed by the compiled code and the chunk, so a run is reproducible on a
    machine; it may differ from a plain left-to-right sum in the last bits."""
    total = 0.0
    for i in range(x.shape[0]):
        xi = np.float64(x[i])
        total += xi * xi
    return total


@njit(**_JIT)
def lamb_phase2(w, upd, lr_ratio):  # type: ignore[no-untyped-def]
    for i in range(w.shape[0]):
        w[i] = w[i] - lr_ratio * upd[i]
