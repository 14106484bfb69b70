"""Phantom models carry the real per-tensor sizes of well-known networks, without arrays."""

from __future__ import annotations

import numpy as np
import pytest

from geomx.ml import PhantomModel, build_model, phantom_layer_sizes, phantom_model, resnet50_layer_sizes
from geomx.ml.phantom import resnet50_param_shapes


def test_resnet50_has_161_tensors_and_25_557_032_parameters() -> None:
    sizes = resnet50_layer_sizes()
    assert len(sizes) == 161
    assert sum(sizes) == 25_557_032
    assert sizes[:3] == [64 * 3 * 7 * 7, 64, 64]  # stem conv, its BN gamma and beta
    assert sizes[-2:] == [1000 * 2048, 1000]  # classifier weight and bias
    assert max(sizes) == 512 * 512 * 3 * 3  # the 3x3 convs of stage 4


def test_resnet50_order_is_body_then_projection_per_block() -> None:
    names = [n for n, _ in resnet50_param_shapes()]
    first_block = [n for n in names if n.startswith("stage1_unit1_")]
    assert first_block[0] == "stage1_unit1_conv1_weight"
    assert first_block[-3:] == [
        "stage1_unit1_downsample_conv_weight",
        "stage1_unit1_downsample_bn_gamma",
        "stage1_unit1_downsample_bn_beta",
    ]
    assert sum(n.endswith("downsample_conv_weight") for n in names) == 4


@pytest.mark.parametrize(
    ("preset", "total", "tensors"),
    [
        ("vgg16", 138_357_544, 32),
        ("vgg19", 143_667_240, 38),
        ("vgg11", 132_863_336, 22),
        ("resnet18", 11_689_512, 62),
        ("resnet101", 44_549_160, 314),
        ("alexnet", 61_100_840, 16),
        ("resnet50_v1", 25_557_032, 161),
    ],
)
def test_presets_match_published_parameter_counts(preset: str, total: int, tensors: int) -> None:
    sizes = phantom_layer_sizes(preset=preset)
    assert (sum(sizes), len(sizes)) == (total, tensors)


def test_demo_cnn_preset_equals_the_real_model_layout() -> None:
    real = build_model("cnn", (1, 28, 28), 10, np.random.default_rng(0))
    phantom = PhantomModel.from_preset("cnn")
    assert list(phantom.param_names) == real.param_names
    assert list(phantom.param_shapes) == real.param_shapes
    assert phantom.num_params == 178_762 and phantom.nbytes == 4 * 178_762


def test_total_is_split_into_near_equal_tensors() -> None:
    sizes = phantom_layer_sizes(total_params=25_600_001, num_layers=10)
    assert sum(sizes) == 25_600_001 and len(sizes) == 10 and max(sizes) - min(sizes) <= 1
    default = phantom_layer_sizes(total_params=25_600_000)
    assert len(default) == 26 and max(default) <= 1_000_000


def test_phantom_model_from_each_description() -> None:
    assert phantom_model(layers=[3, 5]).param_shapes == ((3,), (5,))
    model = phantom_model(total_params=1000, num_layers=3, dtype="float16")
    assert model.num_params == 1000 and model.nbytes == 2000 and model.num_keys == 3
    assert not hasattr(model, "params")  # no arrays, ever
    vgg = phantom_model(preset="vgg16")
    assert vgg.param_shapes[0] == (64, 3, 3, 3) and vgg.num_params == 138_357_544


def test_ambiguous_or_invalid_descriptions_are_rejected() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        phantom_layer_sizes()
    with pytest.raises(ValueError, match="exactly one"):
        phantom_layer_sizes(total_params=10, preset="vgg16")
    with pytest.raises(ValueError, match="allowed: cnn"):
        phantom_layer_sizes(preset="inception")
    with pytest.raises(ValueError, match="ints >= 1"):
        phantom_layer_sizes(layers=[4, 0])
    with pytest.raises(ValueError, match="num_layers"):
        phantom_layer_sizes(total_params=3, num_layers=4)
    with pytest.raises(ValueError, match="num_layers only"):
        phantom_layer_sizes(layers=[1], num_layers=1)
