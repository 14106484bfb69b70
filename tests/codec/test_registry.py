"""Choosing codecs by name and from GeoMX-style config dicts, with clear errors."""
from __future__ import annotations

import math

import pytest

from geomx.codec import (
    CODEC_NAMES,
    MPQ,
    BF16Codec,
    BiSparseCodec,
    DenseCodec,
    FP16Codec,
    OneBitCodec,
    codec_from_config,
    create_codec,
)


def test_names():
    assert set(CODEC_NAMES) == {"none", "fp16", "bf16", "bsc", "mpq", "onebit"}
    kinds = {"none": DenseCodec, "fp16": FP16Codec, "bf16": BF16Codec, "bsc": BiSparseCodec,
             "mpq": MPQ, "onebit": OneBitCodec}
    for name, cls in kinds.items():
        assert type(create_codec(name)) is cls
        assert create_codec(name).name == name
    assert type(create_codec("BSC")) is BiSparseCodec


def test_unknown_name_lists_the_allowed_ones():
    with pytest.raises(ValueError) as e:
        create_codec("2bit")
    for name in CODEC_NAMES:
        assert name in str(e.value)
    with pytest.raises(ValueError, match="allowed"):
        codec_from_config({"type": "topk"})


def test_geomx_dict():
    c = codec_from_config({"type": "bsc", "threshold": 0.01})
    assert isinstance(c, BiSparseCodec) and c.threshold == 0.01 and c.momentum == 0.9
    c = codec_from_config({"type": "bsc", "threshold": 0.001, "size_lower_bound": 1000, "seed": 3,
                           "resample": False, "momentum": 0.5, "sample_ratio": 0.01})
    assert (c.size_lower_bound, c.seed, c.resample, c.momentum, c.sample_ratio) == (1000, 3, False, 0.5, 0.01)
    assert codec_from_config({"type": "onebit", "size_lower_bound": 2e5}).size_lower_bound == 200_000
    assert isinstance(codec_from_config(None), DenseCodec)
    assert isinstance(codec_from_config({}), DenseCodec)
    assert isinstance(codec_from_config("fp16"), FP16Codec)


@pytest.mark.parametrize("value", [0, 1, -0.1, 1.5, math.nan, "0.01", True, None])
def test_threshold_must_be_in_open_unit_interval(value):
    with pytest.raises(ValueError, match=r"codec 'bsc': threshold must be"):
        codec_from_config({"type": "bsc", "threshold": value})


@pytest.mark.parametrize("cfg,match", [
    ({"type": "bsc", "size_lower_bound": -1}, "size_lower_bound"),
    ({"type": "bsc", "size_lower_bound": 1.5}, "size_lower_bound"),
    ({"type": "bsc", "size_lower_bound": True}, "size_lower_bound"),
    ({"type": "bsc", "momentum": 1.0}, "momentum"),
    ({"type": "bsc", "resample": "yes"}, "resample"),
    ({"type": "bsc", "seed": -3}, "seed"),
    ({"type": "bsc", "sample_ratio": 0}, "sample_ratio"),
    ({"type": "bsc", "ratio": 0.01}, r"unknown parameter\(s\) ratio; allowed: threshold"),
    ({"type": "fp16", "threshold": 0.01}, "allowed: none"),
    ({"threshold": 0.01}, "needs a 'type'"),
    ({"type": 3}, "name must be a string"),
    ([("type", "bsc")], "must be a dict"),
])
def test_invalid_configs(cfg, match):
    with pytest.raises(ValueError, match=match):
        codec_from_config(cfg)


def test_config_round_trips():
    for c in (DenseCodec(), FP16Codec(), BF16Codec(), BiSparseCodec(0.05, size_lower_bound=7, seed=9),
              OneBitCodec(size_lower_bound=3), MPQ(0.02, size_lower_bound=11)):
        again = codec_from_config(c.config())
        assert again == c and again.config() == c.config()
        assert repr(c).startswith(type(c).__name__)
