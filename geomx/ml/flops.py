"""Forward FLOPs per parameter tensor (kvstore key), for the per-layer compute model.

P3's gain depends on *where* an iteration's compute sits: backward produces the last
layer's gradient first, the next forward needs the first layer first, and the overlap
between the two and the network is set by how compute is spread over the layers
(docs/papers.md §4). So the emulator splits an iteration's compute over the keys by their
forward FLOPs (``geomx/node/layered.py``).

A layer's FLOPs are attributed to its parameter tensors:

* convolution weight ``2 * C_out * C_in * k * k * H_out * W_out`` (one multiply-add per
  weight per output pixel), its bias ``C_out * H_out * W_out``;
* dense weight ``2 * in * out``, bias ``out``;
* batch norm gamma and beta ``C * H * W`` each (a multiply, an add per element);
* parameter-free layers (ReLU, pooling) go to the tensors of the layer before them.

The phantom presets are re-derived with their spatial sizes at 224x224 (ImageNet), in the
exact key order of ``geomx/ml/phantom.py`` (checked): ResNet-50 v1 with the stride on the
first 1x1 convolution as MXNet's ``resnet50_v1`` does (3.9 G multiply-adds), VGG-19
(19.6 G multiply-adds; Simonyan & Zisserman 2015).
"""

from __future__ import annotations

import math
from typing import Any

from geomx.ml.phantom import RESNET_SPECS, VGG_PLANS, IMAGENET_CLASSES, preset_param_shapes

__all__ = ["resnet_key_flops", "vgg_key_flops", "preset_key_flops", "model_key_flops"]

IMAGE_SIZE = 224


def _conv_out(size: int, k: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - k) // stride + 1


def resnet_key_flops(depth: int = 50, num_classes: int = IMAGENET_CLASSES,
                     image: int = IMAGE_SIZE) -> list[int]:
    """Forward FLOPs of every ResNet-``depth`` v1 tensor, in key order."""
    bottleneck, blocks = RESNET_SPECS[depth]
    out: list[int] = []

    def conv(c_out: int, c_in: int, k: int, hw: int) -> None:
        out.append(2 * c_out * c_in * k * k * hw * hw)

    def bn(c: int, hw: int) -> None:
        out.extend([c * hw * hw, c * hw * hw])

    hw = _conv_out(image, 7, 2, 3)              # 112
    conv(64, 3, 7, hw)
    bn(64, hw)
    hw = _conv_out(hw, 3, 2, 1)                 # 56 after the 3x3/2 max pool
    in_ch = 64
    for stage, (num_blocks, base) in enumerate(zip(blocks, (64, 128, 256, 512)), start=1):
        out_ch = base * 4 if bottleneck else base
        for unit in range(1, num_blocks + 1):
            strides = unit == 1 and stage > 1
            hw_out = (hw + 1) // 2 if strides else hw
            if bottleneck:  # MXNet v1: the stride is on conv1
                conv(base, in_ch, 1, hw_out)
                bn(base, hw_out)
                conv(base, base, 3, hw_out)
                bn(base, hw_out)
                conv(out_ch, base, 1, hw_out)
                bn(out_ch, hw_out)
            else:
                conv(base, in_ch, 3, hw_out)
                bn(base, hw_out)
                conv(base, base, 3, hw_out)
                bn(base, hw_out)
            if unit == 1 and (strides or in_ch != out_ch):
                conv(out_ch, in_ch, 1, hw_out)
                bn(out_ch, hw_out)
            in_ch, hw = out_ch, hw_out
    out.extend([2 * num_classes * in_ch, num_classes])
    return out


def vgg_key_flops(depth: int = 19, num_classes: int = IMAGENET_CLASSES,
                  image: int = IMAGE_SIZE) -> list[int]:
    """Forward FLOPs of every VGG-``depth`` tensor (3x3 same convolutions, 2x2 pools)."""
    out: list[int] = []
    in_ch, hw = 3, image
    for item in VGG_PLANS[depth]:
        if item == "M":
            hw //= 2
            continue
        c = int(item)
        out.extend([2 * c * in_ch * 9 * hw * hw, c * hw * hw])
        in_ch = c
    for f_in, f_out in ((in_ch * 7 * 7, 4096), (4096, 4096), (4096, num_classes)):
        out.extend([2 * f_in * f_out, f_out])
    return out


def preset_key_flops(preset: str) -> list[int]:
    """Per-key forward FLOPs of a phantom preset (ResNet and VGG families)."""
    key = preset.lower().replace("-", "").replace("_", "").removesuffix("v1")
    if key.startswith("resnet") and key[6:].isdigit() and int(key[6:]) in RESNET_SPECS:
        flops = resnet_key_flops(int(key[6:]))
    elif key.startswith("vgg") and key[3:].isdigit() and int(key[3:]) in VGG_PLANS:
        flops = vgg_key_flops(int(key[3:]))
    else:
        raise ValueError(f"no per-layer FLOPs for phantom preset {preset!r}; allowed: "
                         "resnet18..resnet152, vgg11..vgg19 (or give per-key shares)")
    shapes = preset_param_shapes(preset)
    if len(shapes) != len(flops):  # the two derivations must walk the same architecture
        raise AssertionError(f"{preset}: {len(flops)} FLOP entries for {len(shapes)} tensors")
    return flops


def model_key_flops(model: Any) -> list[int]:
    """Per-key forward FLOPs (per sample) of a numpy ``SequentialModel``: each layer's
    FLOPs, plus those of the parameter-free layers after it, split over its tensors in
    proportion to their sizes."""
    flops = [0] * len(model.params)
    shape = model.input_shape
    owner: list[int] = []          # keys of the last layer that had parameters
    k = 0
    for layer in model.layers:
        n = len(layer.param_suffixes)
        if n:
            owner = list(range(k, k + n))
            k += n
        f = layer.forward_flops(shape)
        shape = layer.output_shape(shape)
        targets = owner or [0]
        sizes = [max(1, math.prod(model.params[i].shape)) for i in targets]
        total = sum(sizes)
        for i, s in zip(targets, sizes):
            flops[i] += f * s // total
    return flops
