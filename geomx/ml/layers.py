"""Numpy layers with hand-written forward and backward passes.

Why numpy and not a framework: the same maths has to run inside the virtual-time
emulator (one process, hundreds of nodes) and in a real per-node process, with no GPU
and no framework install. The layers are *stateless*: parameters are passed in and
whatever backward needs is returned from forward as an opaque ``cache``. A model can
therefore keep its parameters in the flat list that the kvstore addresses by index.

Layout follows MXNet/gluon, which GeoMX uses (docs/geomx-behaviour.md §2.2): images are
NCHW, convolution weights are ``(out_channels, in_channels, kh, kw)`` and dense weights
are ``(out_features, in_features)``.

Convolution uses im2col: a strided *view* of every receptive field
(``sliding_window_view``) is copied once into a ``(N*Ho*Wo, C*kh*kw)`` matrix, and the
layer becomes one matrix product, which is what keeps a batch of 32 MNIST images at a
few milliseconds on a laptop core.
"""

from __future__ import annotations

import math
from typing import Any, Protocol, runtime_checkable

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

Shape = tuple[int, ...]

__all__ = [
    "Layer",
    "Conv2D",
    "MaxPool2D",
    "Dense",
    "ReLU",
    "Flatten",
    "xavier_uniform",
]


def xavier_uniform(
    shape: Shape, rng: np.random.Generator, *, magnitude: float = 3.0, dtype: Any = np.float32
) -> np.ndarray:
    """Xavier/Glorot uniform init as MXNet's ``mx.init.Xavier("uniform", "avg", 3)``.

    MXNet computes ``fan_in = shape[1] * prod(shape[2:])`` and
    ``fan_out = shape[0] * prod(shape[2:])``, takes their average ("avg") and draws from
    ``U(-s, s)`` with ``s = sqrt(magnitude / avg)``. That is the demo model's
    initialiser (docs/geomx-behaviour.md §2.2).
    """
    if len(shape) < 2:
        raise ValueError(f"xavier_uniform needs a weight of rank >= 2, got shape {shape}")
    receptive = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    fan_in = shape[1] * receptive
    fan_out = shape[0] * receptive
    scale = math.sqrt(magnitude / ((fan_in + fan_out) / 2.0))
    return rng.uniform(-scale, scale, size=shape).astype(dtype, copy=False)


@runtime_checkable
class Layer(Protocol):
    """One stateless layer.

    ``name`` is the gluon-style prefix of its parameters (``conv0``, ``dense1``) or
    ``""`` for a layer without parameters; ``param_suffixes`` are appended with ``_``
    to build the kvstore-visible parameter names (``conv0_weight``).
    """

    name: str
    param_suffixes: tuple[str, ...]

    def output_shape(self, input_shape: Shape) -> Shape: ...

    def param_shapes(self, input_shape: Shape) -> list[Shape]: ...

    def init_params(self, input_shape: Shape, rng: np.random.Generator, dtype: Any) -> list[np.ndarray]: ...

    def forward(self, x: np.ndarray, params: list[np.ndarray]) -> tuple[np.ndarray, Any]: ...

    def backward(
        self, dy: np.ndarray, params: list[np.ndarray], cache: Any, need_input_grad: bool = True
    ) -> tuple[np.ndarray | None, list[np.ndarray]]: ...

    def forward_flops(self, input_shape: Shape) -> int: ...


class _NoParams:
    """Mixin for layers without parameters."""

    name = ""
    param_suffixes: tuple[str, ...] = ()

    def param_shapes(self, input_shape: Shape) -> list[Shape]:
        return []

    def init_params(self, input_shape: Shape, rng: np.random.Generator, dtype: Any) -> list[np.ndarray]:
        return []


def _resolve_padding(padding: int | str, kernel_size: int) -> int:
    if isinstance(padding, str):
        if padding == "valid":
            return 0
        if padding == "same":
            if kernel_size % 2 == 0:
                raise ValueError(f"padding='same' needs an odd kernel_size, got {kernel_size}")
            return (kernel_size - 1) // 2
        raise ValueError(f"padding must be 'valid', 'same' or an int >= 0, got {padding!r}")
    if int(padding) != padding or padding < 0:
        raise ValueError(f"padding must be 'valid', 'same' or an int >= 0, got {padding!r}")
    return int(padding)


class Conv2D:
    """2-D convolution, stride 1, square kernel, zero padding, NCHW (gluon ``Conv2D``).

    Forward: ``y = im2col(x) @ W^T + b``. Backward: ``dW = dy^T @ cols``, and the input
    gradient scatters ``dy @ W`` back over the ``kh*kw`` kernel offsets (one vectorised
    add per offset, so 25 adds for a 5x5 kernel).
    """

    param_suffixes = ("weight", "bias")

    def __init__(self, name: str, channels: int, kernel_size: int, padding: int | str = "valid") -> None:
        if channels <= 0 or kernel_size <= 0:
            raise ValueError(f"{name}: channels and kernel_size must be > 0")
        self.name = name
        self.channels = int(channels)
        self.kernel_size = int(kernel_size)
        self.pad = _resolve_padding(padding, self.kernel_size)

    def output_shape(self, input_shape: Shape) -> Shape:
        if len(input_shape) != 3:
            raise ValueError(f"{self.name}: Conv2D needs (C, H, W) inputs, got {input_shape}")
        c, h, w = input_shape
        ho = h + 2 * self.pad - self.kernel_size + 1
        wo = w + 2 * self.pad - self.kernel_size + 1
        if ho <= 0 or wo <= 0:
            raise ValueError(
                f"{self.name}: input {input_shape} is smaller than the {self.kernel_size}x"
                f"{self.kernel_size} kernel; use padding='same' for small images"
            )
        return (self.channels, ho, wo)

    def param_shapes(self, input_shape: Shape) -> list[Shape]:
        k = self.kernel_size
        return [(self.channels, input_shape[0], k, k), (self.channels,)]

    def init_params(self, input_shape: Shape, rng: np.random.Generator, dtype: Any) -> list[np.ndarray]:
        w_shape, b_shape = self.param_shapes(input_shape)
        return [xavier_uniform(w_shape, rng, dtype=dtype), np.zeros(b_shape, dtype=dtype)]

    def forward(self, x: np.ndarray, params: list[np.ndarray]) -> tuple[np.ndarray, Any]:
        weight, bias = params
        n, c, h, w = x.shape
        k, p, f = self.kernel_size, self.pad, self.channels
        xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p))) if p else x
        ho, wo = h + 2 * p - k + 1, w + 2 * p - k + 1
        windows = sliding_window_view(xp, (k, k), axis=(2, 3))  # (n, c, ho, wo, k, k), a view
        # Columns laid out (c*k*k, n*ho*wo): the copy then walks image rows contiguously,
        # which is several times faster than the (n*ho*wo, c*k*k) layout.
        cols = windows.transpose(1, 4, 5, 0, 2, 3).reshape(c * k * k, n * ho * wo)
        out = weight.reshape(f, -1) @ cols  # (f, n*ho*wo)
        out += bias[:, None]
        y = np.ascontiguousarray(out.reshape(f, n, ho, wo).transpose(1, 0, 2, 3))
        return y, (cols, x.shape)

    def backward(
        self, dy: np.ndarray, params: list[np.ndarray], cache: Any, need_input_grad: bool = True
    ) -> tuple[np.ndarray | None, list[np.ndarray]]:
        weight, _ = params
        cols, x_shape = cache
        n, c, h, w = x_shape
        k, p, f = self.kernel_size, self.pad, self.channels
        ho, wo = dy.shape[2], dy.shape[3]
        dy_f = np.ascontiguousarray(dy.transpose(1, 0, 2, 3)).reshape(f, n * ho * wo)
        d_weight = (dy_f @ cols.T).reshape(weight.shape)
        d_bias = dy_f.sum(axis=1)
        if not need_input_grad:
            return None, [d_weight, d_bias]
        # col2im: scatter-add every kernel offset's slice back onto the padded input.
        dcols = (weight.reshape(f, -1).T @ dy_f).reshape(c, k, k, n, ho, wo)
        dxp = np.zeros((c, n, h + 2 * p, w + 2 * p), dtype=dy.dtype)
        for i in range(k):
            for j in range(k):
                dxp[:, :, i : i + ho, j : j + wo] += dcols[:, i, j]
        dx = dxp[:, :, p : p + h, p : p + w].transpose(1, 0, 2, 3)
        return np.ascontiguousarray(dx), [d_weight, d_bias]

    def forward_flops(self, input_shape: Shape) -> int:
        f, ho, wo = self.output_shape(input_shape)
        return 2 * f * ho * wo * input_shape[0] * self.kernel_size**2


class MaxPool2D(_NoParams):
    """Max pooling with window = stride (gluon ``MaxPool2D(2, 2)``), "valid" convention.

    Trailing rows/columns that do not fill a window are dropped, as MXNet's default
    pooling convention does. The gradient goes to the first maximum of each window.
    """

    def __init__(self, pool_size: int = 2) -> None:
        if pool_size <= 0:
            raise ValueError(f"pool_size must be > 0, got {pool_size}")
        self.pool_size = int(pool_size)

    def output_shape(self, input_shape: Shape) -> Shape:
        c, h, w = input_shape
        s = self.pool_size
        if h < s or w < s:
            raise ValueError(f"MaxPool2D({s}) needs inputs of at least {s}x{s}, got {input_shape}")
        return (c, h // s, w // s)

    def forward(self, x: np.ndarray, params: list[np.ndarray]) -> tuple[np.ndarray, Any]:
        # One strided view per window offset and an elementwise maximum over them:
        # s*s cheap passes instead of an argmax over a non-contiguous axis.
        s = self.pool_size
        ho, wo = x.shape[2] // s, x.shape[3] // s
        offsets = [x[:, :, i : ho * s : s, j : wo * s : s] for i in range(s) for j in range(s)]
        y = offsets[0].copy()
        for view in offsets[1:]:
            np.maximum(y, view, out=y)
        return y, (x, y)

    def backward(
        self, dy: np.ndarray, params: list[np.ndarray], cache: Any, need_input_grad: bool = True
    ) -> tuple[np.ndarray | None, list[np.ndarray]]:
        if not need_input_grad:
            return None, []
        x, y = cache
        s = self.pool_size
        ho, wo = y.shape[2], y.shape[3]
        dx = np.zeros(x.shape, dtype=dy.dtype)
        unassigned = np.ones(y.shape, dtype=bool)  # the first maximum in a window wins
        for i in range(s):
            for j in range(s):
                hit = x[:, :, i : ho * s : s, j : wo * s : s] == y
                hit &= unassigned
                unassigned &= ~hit
                dx[:, :, i : ho * s : s, j : wo * s : s] = dy * hit
        return dx, []

    def forward_flops(self, input_shape: Shape) -> int:
        return int(np.prod(input_shape))


class Dense:
    """Fully connected layer, ``y = x @ W^T + b`` with ``W`` stored ``(out, in)`` as MXNet."""

    param_suffixes = ("weight", "bias")

    def __init__(self, name: str, units: int) -> None:
        if units <= 0:
            raise ValueError(f"{name}: units must be > 0, got {units}")
        self.name = name
        self.units = int(units)

    def output_shape(self, input_shape: Shape) -> Shape:
        if len(input_shape) != 1:
            raise ValueError(f"{self.name}: Dense needs flat inputs, got {input_shape}")
        return (self.units,)

    def param_shapes(self, input_shape: Shape) -> list[Shape]:
        return [(self.units, input_shape[0]), (self.units,)]

    def init_params(self, input_shape: Shape, rng: np.random.Generator, dtype: Any) -> list[np.ndarray]:
        w_shape, b_shape = self.param_shapes(input_shape)
        return [xavier_uniform(w_shape, rng, dtype=dtype), np.zeros(b_shape, dtype=dtype)]

    def forward(self, x: np.ndarray, params: list[np.ndarray]) -> tuple[np.ndarray, Any]:
        weight, bias = params
        y = x @ weight.T
        y += bias
        return y, x

    def backward(
        self, dy: np.ndarray, params: list[np.ndarray], cache: Any, need_input_grad: bool = True
    ) -> tuple[np.ndarray | None, list[np.ndarray]]:
        weight, _ = params
        x = cache
        d_weight = dy.T @ x
        d_bias = dy.sum(axis=0)
        dx = dy @ weight if need_input_grad else None
        return dx, [d_weight, d_bias]

    def forward_flops(self, input_shape: Shape) -> int:
        return 2 * self.units * input_shape[0]


class ReLU(_NoParams):
    """``max(x, 0)``; the gradient at exactly 0 is 0 (as MXNet's ``relu``)."""

    def output_shape(self, input_shape: Shape) -> Shape:
        return tuple(input_shape)

    def forward(self, x: np.ndarray, params: list[np.ndarray]) -> tuple[np.ndarray, Any]:
        mask = x > 0
        return x * mask, mask

    def backward(
        self, dy: np.ndarray, params: list[np.ndarray], cache: Any, need_input_grad: bool = True
    ) -> tuple[np.ndarray | None, list[np.ndarray]]:
        return (dy * cache if need_input_grad else None), []

    def forward_flops(self, input_shape: Shape) -> int:
        return int(np.prod(input_shape))


class Flatten(_NoParams):
    """``(N, ...) -> (N, prod(...))``; gluon's Dense flattens its input the same way."""

    def output_shape(self, input_shape: Shape) -> Shape:
        return (int(np.prod(input_shape)),)

    def forward(self, x: np.ndarray, params: list[np.ndarray]) -> tuple[np.ndarray, Any]:
        return x.reshape(x.shape[0], -1), x.shape

    def backward(
        self, dy: np.ndarray, params: list[np.ndarray], cache: Any, need_input_grad: bool = True
    ) -> tuple[np.ndarray | None, list[np.ndarray]]:
        return (dy.reshape(cache) if need_input_grad else None), []

    def forward_flops(self, input_shape: Shape) -> int:
        return 0
