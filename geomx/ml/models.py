"""Numpy classification models addressed by the kvstore as a flat list of tensors.

Every model exposes its parameters as ``params``: a list of C-contiguous arrays whose
*indices are the kvstore keys* (0..n-1), in gluon's ``collect_params()`` order, so a
worker can push ``grads[k]`` and pull into ``params[k]`` exactly as the GeoMX demo does
(docs/geomx-behaviour.md §2.1, §2.2).

``loss_and_grads`` returns the *mean* softmax cross-entropy and the gradients of that
mean: the demo pushes ``grad / num_samples`` (the mean gradient) to its servers.

The ``cnn`` model is the demo model of docs/geomx-behaviour.md §2.2 (178,762 parameters for
1x28x28 inputs). ``padding="same"`` keeps it usable on 8x8 ``digits`` images, where two
unpadded 5x5 convolutions would not fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from geomx.ml.layers import Conv2D, Dense, Flatten, Layer, MaxPool2D, ReLU, Shape

__all__ = [
    "Model",
    "SequentialModel",
    "build_model",
    "MODEL_NAMES",
    "softmax_cross_entropy",
    "cnn_layers",
    "mlp_layers",
    "softmax_layers",
]

MODEL_NAMES: tuple[str, ...] = ("softmax", "mlp", "cnn")

# The seed's CNN (docs/geomx-behaviour.md §2.2).
CNN_DEFAULT_CONV_CHANNELS: tuple[int, ...] = (16, 32)
CNN_DEFAULT_DENSE_UNITS: tuple[int, ...] = (256, 128)
MLP_DEFAULT_HIDDEN: tuple[int, ...] = (128,)


@runtime_checkable
class Model(Protocol):
    """What workers, evaluators and the kvstore rely on."""

    params: list[np.ndarray]
    param_names: list[str]

    @property
    def num_params(self) -> int: ...

    def loss_and_grads(self, x: np.ndarray, y: np.ndarray) -> tuple[float, list[np.ndarray]]: ...

    def predict(self, x: np.ndarray) -> np.ndarray: ...

    def accuracy(self, x: np.ndarray, y: np.ndarray) -> float: ...


def softmax_cross_entropy(logits: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean softmax cross-entropy over the batch and its gradient w.r.t. the logits.

    Computed from the log-sum-exp with the row maximum subtracted, so large logits do
    not overflow. The gradient is ``(softmax - onehot) / N``: the gradient of the mean.
    """
    n = logits.shape[0]
    if labels.shape != (n,):
        raise ValueError(f"labels must have shape ({n},), got {labels.shape}")
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    sum_exp = exp.sum(axis=1, keepdims=True)
    rows = np.arange(n)
    log_prob_true = shifted[rows, labels] - np.log(sum_exp[:, 0])
    loss = float(-log_prob_true.mean())
    d_logits = exp / sum_exp
    d_logits[rows, labels] -= 1.0
    d_logits /= n
    return loss, d_logits


class SequentialModel:
    """A chain of stateless layers plus the flat parameter list they read.

    ``dtype`` defaults to float32 (what goes on the wire); float64 exists for gradient
    checks. Inputs are cast to ``dtype``.
    """

    def __init__(
        self,
        name: str,
        layers: Sequence[Layer],
        input_shape: Shape,
        num_classes: int,
        rng: np.random.Generator,
        *,
        dtype: Any = np.float32,
    ) -> None:
        self.name = name
        self.layers: list[Layer] = list(layers)
        self.input_shape: Shape = tuple(int(d) for d in input_shape)
        self.num_classes = int(num_classes)
        self.dtype = np.dtype(dtype)
        self.params: list[np.ndarray] = []
        self.param_names: list[str] = []
        # For each layer, the slice of self.params it owns.
        self._param_slices: list[slice] = []
        self._forward_flops = 0
        shape = self.input_shape
        for layer in self.layers:
            start = len(self.params)
            for suffix, array in zip(layer.param_suffixes, layer.init_params(shape, rng, self.dtype)):
                self.params.append(np.ascontiguousarray(array, dtype=self.dtype))
                self.param_names.append(f"{layer.name}_{suffix}")
            self._param_slices.append(slice(start, len(self.params)))
            self._forward_flops += layer.forward_flops(shape)
            shape = layer.output_shape(shape)
        if shape != (self.num_classes,):
            raise ValueError(f"{name}: the last layer gives {shape}, expected ({self.num_classes},)")

    # -- introspection ------------------------------------------------------------------
    @property
    def num_params(self) -> int:
        return int(sum(p.size for p in self.params))

    @property
    def param_shapes(self) -> list[Shape]:
        return [tuple(p.shape) for p in self.params]

    @property
    def forward_flops_per_sample(self) -> int:
        """Multiply-adds x2 of one forward pass; training costs about 3x this."""
        return self._forward_flops

    def __repr__(self) -> str:
        return f"SequentialModel({self.name!r}, input_shape={self.input_shape}, num_params={self.num_params})"

    # -- parameters ---------------------------------------------------------------------
    def set_params(self, values: Sequence[np.ndarray]) -> None:
        """Copy ``values`` into ``params`` in place (what a worker does after a pull)."""
        if len(values) != len(self.params):
            raise ValueError(f"expected {len(self.params)} tensors, got {len(values)}")
        for k, (dst, src) in enumerate(zip(self.params, values)):
            if np.size(src) != dst.size:
                raise ValueError(f"key {k} ({self.param_names[k]}): shape {np.shape(src)} != {dst.shape}")
            dst[...] = np.reshape(src, dst.shape)

    def copy_params(self) -> list[np.ndarray]:
        return [p.copy() for p in self.params]

    # -- maths --------------------------------------------------------------------------
    def _check_input(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x)
        if tuple(x.shape[1:]) != self.input_shape:
            raise ValueError(f"{self.name}: inputs must be (N, *{self.input_shape}), got {x.shape}")
        return x.astype(self.dtype, copy=False)

    def _forward(self, x: np.ndarray, keep_caches: bool) -> tuple[np.ndarray, list[Any]]:
        caches: list[Any] = []
        for layer, sl in zip(self.layers, self._param_slices):
            x, cache = layer.forward(x, self.params[sl])
            if keep_caches:
                caches.append(cache)
        return x, caches

    def loss_and_grads(self, x: np.ndarray, y: np.ndarray) -> tuple[float, list[np.ndarray]]:
        """Mean cross-entropy of the batch and the gradient of that mean per parameter."""
        x = self._check_input(x)
        labels = np.asarray(y, dtype=np.int64)
        logits, caches = self._forward(x, keep_caches=True)
        loss, grad = softmax_cross_entropy(logits, labels)
        grads: list[np.ndarray | None] = [None] * len(self.params)
        for i in range(len(self.layers) - 1, -1, -1):
            layer, sl = self.layers[i], self._param_slices[i]
            grad, layer_grads = layer.backward(grad, self.params[sl], caches[i], need_input_grad=i > 0)
            for k, g in zip(range(sl.start, sl.stop), layer_grads):
                grads[k] = np.ascontiguousarray(g, dtype=self.dtype)
        return loss, grads  # type: ignore[return-value]

    def predict(self, x: np.ndarray, batch_size: int = 500) -> np.ndarray:
        """Logits, computed in chunks of ``batch_size`` to bound im2col memory."""
        x = self._check_input(x)
        if x.shape[0] <= batch_size:
            return self._forward(x, keep_caches=False)[0]
        chunks = [self._forward(x[i : i + batch_size], keep_caches=False)[0] for i in range(0, x.shape[0], batch_size)]
        return np.concatenate(chunks, axis=0)

    def loss(self, x: np.ndarray, y: np.ndarray, batch_size: int = 500) -> float:
        """Mean cross-entropy over all samples (no gradients)."""
        logits = self.predict(x, batch_size)
        return softmax_cross_entropy(logits, np.asarray(y, dtype=np.int64))[0]

    def accuracy(self, x: np.ndarray, y: np.ndarray, batch_size: int = 500) -> float:
        """Fraction of correct predictions over *all* samples.

        GeoMX's demo averages per-batch accuracies (docs/geomx-behaviour.md §2.2), which
        over-weights a short last batch; we count samples instead.
        """
        labels = np.asarray(y, dtype=np.int64)
        if labels.shape[0] == 0:
            raise ValueError("accuracy of an empty set is undefined")
        pred = self.predict(x, batch_size).argmax(axis=1)
        return float(np.count_nonzero(pred == labels) / labels.shape[0])


# -- layer recipes ------------------------------------------------------------------------


def softmax_layers(input_shape: Shape, num_classes: int) -> list[Layer]:
    """Multinomial logistic regression: flatten then one dense layer."""
    layers: list[Layer] = [] if len(input_shape) == 1 else [Flatten()]
    return layers + [Dense("dense0", num_classes)]


def mlp_layers(input_shape: Shape, num_classes: int, hidden: Sequence[int] = MLP_DEFAULT_HIDDEN) -> list[Layer]:
    """Dense layers with ReLU between them, then a dense output layer."""
    layers: list[Layer] = [] if len(input_shape) == 1 else [Flatten()]
    for i, units in enumerate(hidden):
        layers += [Dense(f"dense{i}", int(units)), ReLU()]
    return layers + [Dense(f"dense{len(hidden)}", num_classes)]


def cnn_layers(
    input_shape: Shape,
    num_classes: int,
    *,
    conv_channels: Sequence[int] = CNN_DEFAULT_CONV_CHANNELS,
    kernel_size: int = 5,
    dense_units: Sequence[int] = CNN_DEFAULT_DENSE_UNITS,
    padding: int | str = "valid",
    pool_size: int = 2,
) -> list[Layer]:
    """The demo CNN: [conv k x k (ReLU) -> maxpool] per channel count -> dense (ReLU)... -> dense.

    Defaults give the seed's model (docs/geomx-behaviour.md §2.2).
    """
    if len(input_shape) != 3:
        raise ValueError(f"cnn needs image inputs (C, H, W), got input_shape={input_shape}")
    layers: list[Layer] = []
    for i, channels in enumerate(conv_channels):
        layers += [Conv2D(f"conv{i}", int(channels), kernel_size, padding), ReLU(), MaxPool2D(pool_size)]
    layers.append(Flatten())
    for i, units in enumerate(dense_units):
        layers += [Dense(f"dense{i}", int(units)), ReLU()]
    return layers + [Dense(f"dense{len(dense_units)}", num_classes)]


def build_model(
    name: str,
    input_shape: Sequence[int],
    num_classes: int,
    rng: np.random.Generator | int | None = None,
    *,
    dtype: Any = np.float32,
    **kwargs: Any,
) -> SequentialModel:
    """Build a model by name: ``softmax``, ``mlp`` (``hidden=[...]``) or ``cnn``.

    ``cnn`` accepts ``conv_channels``, ``kernel_size``, ``dense_units``, ``padding``
    ("valid" | "same" | int) and ``pool_size``. ``rng`` seeds the Xavier init (a
    Generator, or an int seed; ``None`` means seed 0, like MXNet's default global seed
    that makes every demo process build the same initial weights).
    """
    if not isinstance(rng, np.random.Generator):
        rng = np.random.default_rng(0 if rng is None else rng)
    shape = tuple(int(d) for d in input_shape)
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    try:
        if name == "softmax":
            _no_kwargs(name, kwargs)
            layers = softmax_layers(shape, num_classes)
        elif name == "mlp":
            hidden = kwargs.pop("hidden", MLP_DEFAULT_HIDDEN)
            _no_kwargs(name, kwargs)
            layers = mlp_layers(shape, num_classes, hidden)
        elif name == "cnn":
            layers = cnn_layers(shape, num_classes, **kwargs)
        else:
            raise ValueError(f"unknown model {name!r}; allowed: {', '.join(MODEL_NAMES)}")
    except TypeError as exc:  # unexpected keyword for cnn_layers
        raise ValueError(f"model {name!r}: {exc}") from None
    return SequentialModel(name, layers, shape, num_classes, rng, dtype=dtype)


def _no_kwargs(name: str, kwargs: dict[str, Any]) -> None:
    if kwargs:
        raise ValueError(f"model {name!r} does not take options {sorted(kwargs)}")
