"""Phantom models: the tensor sizes of a real network, without the tensors.

Network studies (NETSTORM on ResNet-50, P3 on VGG, 1000-node emulations) only need to
know how many bytes each key carries; allocating 25.6 M or 138 M float32 parameters per
node would make those runs impossible in one process. A phantom model pairs with the
phantom payloads of ``geomx/wire.py`` (shape and dtype, no data).

Shapes are *derived from the architecture*, not typed in, so the totals below are a
check on the derivation (they equal the torchvision counts of the same models):

* ResNet-50 v1 (He et al. 2016, ImageNet, 1000 classes): 161 trainable tensors,
  25,557,032 parameters. GeoMX/MXNet's ``resnet50_v1`` puts the stride on the first
  1x1 convolution and torchvision on the 3x3 one; the parameter shapes are identical.
  Convolutions have no bias; every batch norm contributes gamma and beta (its running
  statistics are not trained and never pushed).
* VGG-16 (Simonyan & Zisserman 2015, no batch norm): 32 tensors, 138,357,544 parameters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable

import numpy as np

__all__ = [
    "PhantomModel",
    "PHANTOM_PRESETS",
    "DEFAULT_PHANTOM_TENSOR_PARAMS",
    "resnet_param_shapes",
    "resnet50_param_shapes",
    "resnet50_layer_sizes",
    "vgg_param_shapes",
    "alexnet_param_shapes",
    "demo_cnn_param_shapes",
    "preset_param_shapes",
    "phantom_layer_sizes",
    "phantom_model",
]

Shape = tuple[int, ...]
NamedShapes = list[tuple[str, Shape]]

# When only a total is given and no tensor count, tensors of about this many parameters
# (1 M float32 = 4 MB, the order of a large conv layer) are made.
DEFAULT_PHANTOM_TENSOR_PARAMS = 1_000_000

IMAGENET_CLASSES = 1000


# -- ResNet -------------------------------------------------------------------------------

# depth -> (bottleneck?, blocks per stage)
RESNET_SPECS: dict[int, tuple[bool, tuple[int, int, int, int]]] = {
    18: (False, (2, 2, 2, 2)),
    34: (False, (3, 4, 6, 3)),
    50: (True, (3, 4, 6, 3)),
    101: (True, (3, 4, 23, 3)),
    152: (True, (3, 8, 36, 3)),
}


def _bn(prefix: str, channels: int) -> NamedShapes:
    return [(f"{prefix}_gamma", (channels,)), (f"{prefix}_beta", (channels,))]


def _conv(prefix: str, out_ch: int, in_ch: int, k: int) -> NamedShapes:
    return [(f"{prefix}_weight", (out_ch, in_ch, k, k))]


def resnet_param_shapes(depth: int = 50, num_classes: int = IMAGENET_CLASSES) -> NamedShapes:
    """Trainable tensors of ResNet-``depth`` v1 in parameter (kvstore key) order.

    Stem: 7x7/64 conv + BN. Four stages of 64, 128, 256, 512 base channels; a bottleneck
    block is 1x1 (base) -> 3x3 (base) -> 1x1 (4*base), a basic block is 3x3 -> 3x3; the
    first block of a stage gets a 1x1 projection + BN when its input width differs from
    its output width (or it strides). Then global pooling and a dense layer with bias.
    """
    if depth not in RESNET_SPECS:
        raise ValueError(f"unknown ResNet depth {depth}; allowed: {sorted(RESNET_SPECS)}")
    bottleneck, blocks = RESNET_SPECS[depth]
    shapes: NamedShapes = _conv("conv0", 64, 3, 7) + _bn("bn0", 64)
    in_ch = 64
    for stage, (num_blocks, base) in enumerate(zip(blocks, (64, 128, 256, 512)), start=1):
        out_ch = base * 4 if bottleneck else base
        for unit in range(1, num_blocks + 1):
            p = f"stage{stage}_unit{unit}"
            strides = unit == 1 and stage > 1
            if bottleneck:
                shapes += _conv(f"{p}_conv1", base, in_ch, 1) + _bn(f"{p}_bn1", base)
                shapes += _conv(f"{p}_conv2", base, base, 3) + _bn(f"{p}_bn2", base)
                shapes += _conv(f"{p}_conv3", out_ch, base, 1) + _bn(f"{p}_bn3", out_ch)
            else:
                shapes += _conv(f"{p}_conv1", base, in_ch, 3) + _bn(f"{p}_bn1", base)
                shapes += _conv(f"{p}_conv2", base, base, 3) + _bn(f"{p}_bn2", base)
            if unit == 1 and (strides or in_ch != out_ch):
                shapes += _conv(f"{p}_downsample_conv", out_ch, in_ch, 1) + _bn(f"{p}_downsample_bn", out_ch)
            in_ch = out_ch
    shapes += [("fc_weight", (num_classes, in_ch)), ("fc_bias", (num_classes,))]
    return shapes


def resnet50_param_shapes(num_classes: int = IMAGENET_CLASSES) -> NamedShapes:
    """ResNet-50 v1: 161 tensors, 25,557,032 parameters for 1000 classes."""
    return resnet_param_shapes(50, num_classes)


def resnet50_layer_sizes(num_classes: int = IMAGENET_CLASSES) -> list[int]:
    """Per-tensor parameter counts of ResNet-50 v1, in parameter order."""
    return [math.prod(shape) for _, shape in resnet50_param_shapes(num_classes)]


# -- VGG, AlexNet -------------------------------------------------------------------------

# Channel plans ("M" = 2x2 max pool), Simonyan & Zisserman 2015, table 1.
VGG_PLANS: dict[int, tuple[int | str, ...]] = {
    11: (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    13: (64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    16: (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"),
    19: (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M"),
}


def _dense(prefix: str, out_f: int, in_f: int) -> NamedShapes:
    return [(f"{prefix}_weight", (out_f, in_f)), (f"{prefix}_bias", (out_f,))]


def vgg_param_shapes(depth: int = 16, num_classes: int = IMAGENET_CLASSES) -> NamedShapes:
    """VGG-``depth`` (no batch norm) for 224x224 inputs: 3x3 convs with bias, then
    dense 512*7*7 -> 4096 -> 4096 -> classes."""
    if depth not in VGG_PLANS:
        raise ValueError(f"unknown VGG depth {depth}; allowed: {sorted(VGG_PLANS)}")
    shapes: NamedShapes = []
    in_ch, i = 3, 0
    for item in VGG_PLANS[depth]:
        if item == "M":
            continue
        out_ch = int(item)
        shapes += [(f"conv{i}_weight", (out_ch, in_ch, 3, 3)), (f"conv{i}_bias", (out_ch,))]
        in_ch, i = out_ch, i + 1
    shapes += _dense("dense0", 4096, in_ch * 7 * 7) + _dense("dense1", 4096, 4096)
    return shapes + _dense("dense2", num_classes, 4096)


def alexnet_param_shapes(num_classes: int = IMAGENET_CLASSES) -> NamedShapes:
    """AlexNet, single-tower variant (Krizhevsky 2014, as torchvision): 61,100,840 params."""
    shapes: NamedShapes = []
    in_ch = 3
    for i, (out_ch, k) in enumerate([(64, 11), (192, 5), (384, 3), (256, 3), (256, 3)]):
        shapes += [(f"conv{i}_weight", (out_ch, in_ch, k, k)), (f"conv{i}_bias", (out_ch,))]
        in_ch = out_ch
    shapes += _dense("dense0", 4096, 256 * 6 * 6) + _dense("dense1", 4096, 4096)
    return shapes + _dense("dense2", num_classes, 4096)


def demo_cnn_param_shapes() -> NamedShapes:
    """The GeoMX demo CNN on 1x28x28 MNIST (178,762 params), without allocating it."""
    from geomx.ml.models import cnn_layers  # local import: phantom must stay cheap to import

    shape: Shape = (1, 28, 28)
    out: NamedShapes = []
    for layer in cnn_layers(shape, 10):
        out += [(f"{layer.name}_{s}", p) for s, p in zip(layer.param_suffixes, layer.param_shapes(shape))]
        shape = layer.output_shape(shape)
    return out


PHANTOM_PRESETS: dict[str, Callable[[], NamedShapes]] = {
    "cnn": demo_cnn_param_shapes,
    "alexnet": alexnet_param_shapes,
    "resnet18": lambda: resnet_param_shapes(18),
    "resnet34": lambda: resnet_param_shapes(34),
    "resnet50": lambda: resnet_param_shapes(50),
    "resnet101": lambda: resnet_param_shapes(101),
    "resnet152": lambda: resnet_param_shapes(152),
    "vgg11": lambda: vgg_param_shapes(11),
    "vgg13": lambda: vgg_param_shapes(13),
    "vgg16": lambda: vgg_param_shapes(16),
    "vgg19": lambda: vgg_param_shapes(19),
}


def preset_param_shapes(preset: str) -> NamedShapes:
    """(name, shape) of every trainable tensor of a preset architecture."""
    key = preset.lower().replace("-", "").replace("_", "")
    key = key.removesuffix("v1") if key.startswith("resnet") else key
    if key not in PHANTOM_PRESETS:
        raise ValueError(f"unknown phantom preset {preset!r}; allowed: {', '.join(PHANTOM_PRESETS)}")
    return PHANTOM_PRESETS[key]()


# -- sizes and the phantom model ----------------------------------------------------------


def _even_split(total_params: int, num_layers: int | None) -> list[int]:
    if int(total_params) != total_params or total_params < 1:
        raise ValueError(f"total_params must be an int >= 1, got {total_params!r}")
    total = int(total_params)
    if num_layers is None:
        num_layers = max(1, math.ceil(total / DEFAULT_PHANTOM_TENSOR_PARAMS))
    if int(num_layers) != num_layers or not 1 <= num_layers <= total:
        raise ValueError(f"num_layers must be an int in [1, total_params={total}], got {num_layers!r}")
    base, extra = divmod(total, int(num_layers))
    return [base + 1 if i < extra else base for i in range(int(num_layers))]


def phantom_layer_sizes(
    total_params: int | None = None,
    layers: Sequence[int] | None = None,
    preset: str | None = None,
    *,
    num_layers: int | None = None,
) -> list[int]:
    """Per-tensor parameter counts from exactly one of three descriptions.

    * ``total_params``: split into ``num_layers`` tensors whose sizes differ by at most
      one (default: tensors of about ``DEFAULT_PHANTOM_TENSOR_PARAMS``);
    * ``layers``: an explicit list of sizes (each >= 1);
    * ``preset``: a named architecture (see ``PHANTOM_PRESETS``), e.g. ``"resnet50"``.
    """
    given = [n for n, v in (("total_params", total_params), ("layers", layers), ("preset", preset)) if v is not None]
    if len(given) != 1:
        raise ValueError(f"give exactly one of total_params, layers, preset; got {given or 'none'}")
    if num_layers is not None and total_params is None:
        raise ValueError("num_layers only applies together with total_params")
    if preset is not None:
        return [math.prod(shape) for _, shape in preset_param_shapes(preset)]
    if layers is not None:
        sizes = [int(s) for s in layers]
        if not sizes or any(s < 1 or s != v for s, v in zip(sizes, layers)):
            raise ValueError(f"layers must be a non-empty list of ints >= 1, got {list(layers)!r}")
        return sizes
    return _even_split(total_params, num_layers)  # type: ignore[arg-type]


@dataclass(frozen=True)
class PhantomModel:
    """Parameter shapes of a model whose arrays are never allocated.

    Key ``k`` has shape ``param_shapes[k]``, as with a real model's ``params[k]``.
    """

    param_names: tuple[str, ...]
    param_shapes: tuple[Shape, ...]
    dtype: str = "float32"
    name: str = "phantom"

    @property
    def layer_sizes(self) -> list[int]:
        return [math.prod(s) for s in self.param_shapes]

    @property
    def num_params(self) -> int:
        return sum(self.layer_sizes)

    @property
    def nbytes(self) -> int:
        """Bytes of one full copy of the parameters in ``dtype``."""
        return self.num_params * np.dtype(self.dtype).itemsize

    @property
    def num_keys(self) -> int:
        return len(self.param_shapes)

    @classmethod
    def from_preset(cls, preset: str, *, dtype: str = "float32") -> PhantomModel:
        named = preset_param_shapes(preset)
        return cls(tuple(n for n, _ in named), tuple(s for _, s in named), dtype, preset)

    @classmethod
    def from_sizes(cls, sizes: Sequence[int], *, dtype: str = "float32", name: str = "phantom") -> PhantomModel:
        sizes = phantom_layer_sizes(layers=sizes)
        return cls(tuple(f"param{i}" for i in range(len(sizes))), tuple((s,) for s in sizes), dtype, name)


def phantom_model(
    total_params: int | None = None,
    layers: Sequence[int] | None = None,
    preset: str | None = None,
    *,
    num_layers: int | None = None,
    dtype: str = "float32",
) -> PhantomModel:
    """A :class:`PhantomModel` from the same descriptions as :func:`phantom_layer_sizes`;
    presets keep their real (multi-dimensional) shapes and names."""
    if preset is not None and total_params is None and layers is None:
        return PhantomModel.from_preset(preset, dtype=dtype)
    sizes = phantom_layer_sizes(total_params, layers, preset, num_layers=num_layers)
    return PhantomModel.from_sizes(sizes, dtype=dtype)
