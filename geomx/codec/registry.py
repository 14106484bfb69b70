"""Choosing a codec by name or by a GeoMX-style config dict.

``kv.set_gradient_compression({"type": "bsc", "threshold": 0.01})`` is how GeoMX turns
Bi-Sparse on (docs/geomx-behaviour.md §2.1, §4.1); :func:`codec_from_config` accepts the
same dicts (and the scenario's ``[codec]`` table), validating every key and value with an
error that names the codec, the field and what is allowed.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Mapping, Union

from geomx.policy.codec import Codec
from geomx.policy.registry import entry_point_names, policy_class

if TYPE_CHECKING:
    from .mpq import MPQ

#: What ``create_codec`` returns: a codec, or the MPQ policy. Both have
#: ``codec_for(num_elements, tier)``, ``applies_to``, ``config`` and ``name``.
Policy = Union[Codec, "MPQ"]

#: name -> (module of this package, class). A codec's module is imported when the codec
#: is first asked for: the compressing ones import Numba (~0.3 s per process, more with
#: its first kernel), which a job without compression never needs.
_CLASSES: dict[str, tuple[str, str]] = {
    "none": ("identity", "DenseCodec"),
    "fp16": ("fp16", "FP16Codec"),
    "bf16": ("bf16", "BF16Codec"),
    "bsc": ("bsc", "BiSparseCodec"),
    "mpq": ("mpq", "MPQ"),
    "onebit": ("onebit", "OneBitCodec"),
}
#: Accepted names, in the order the docs list them.
CODEC_NAMES: tuple[str, ...] = tuple(_CLASSES)

#: Decoder name (a payload's ``meta["codec"]``) -> module of this package whose import
#: registers that decoder. ``mpq`` is a policy, not a decoder: its payloads name the
#: codec it picked.
_DECODER_MODULES: dict[str, str] = {
    "none": "identity",
    "fp16": "fp16",
    "bf16": "bf16",
    "bsc": "bsc",
    "onebit": "onebit",
}
#: The built-in decoders' names.
DECODER_NAMES: tuple[str, ...] = tuple(_DECODER_MODULES)


def load_decoder(name: str) -> None:
    """Import the module that registers built-in decoder ``name`` (one of
    :data:`DECODER_NAMES`): the loader geomx.policy.codec's ``decode`` calls for a payload
    of a codec this process has not imported (``set_decoder_loader``)."""
    importlib.import_module(f".{_DECODER_MODULES[name]}", __package__)


def codec_class(name: str) -> type:
    """The class behind codec name ``name`` (one of :data:`CODEC_NAMES`), imported now."""
    module, cls = _CLASSES[name]
    return getattr(importlib.import_module(f".{module}", __package__), cls)


def create_codec(name: str, **params: Any) -> Policy:
    """Build a codec (or the ``mpq`` policy) by name: a built-in name, or a user codec's
    spec (``"/abs/lab/topk.py:TopK"``, ``"lab.codec:TopK"``, a ``geomx.policies`` plug-in
    name) found by :func:`geomx.policy.registry.policy_class`.

    Raises ``ValueError`` for an unknown name (listing the allowed ones), an unknown
    parameter (listing the codec's parameters) or an invalid value.
    """
    if not isinstance(name, str):
        raise ValueError(f"codec name must be a string, one of {list(CODEC_NAMES)}; got {name!r}")
    key = name.strip().lower()
    if key in _CLASSES:
        cls = codec_class(key)
    elif ":" in name or name.strip() in entry_point_names():
        key = name.strip()
        cls = policy_class("codec", key)  # PolicyError is a ValueError of one line
    else:
        raise ValueError(f"unknown codec {name!r}; allowed: {', '.join(CODEC_NAMES)}, "
                         "'file.py:Class', 'package.module:Class'")
    allowed: tuple[str, ...] = cls.params
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        what = ", ".join(allowed) if allowed else "none"
        raise ValueError(f"codec {key!r}: unknown parameter(s) {', '.join(unknown)}; allowed: {what}")
    if key in _CLASSES:
        return cls(**params)
    try:
        return cls(**params)
    except Exception as e:  # a user constructor: its failure names the codec and stays one line
        raise ValueError(f"codec {key!r}: {type(e).__name__}: {e}") from None


def codec_from_config(config: Mapping[str, Any] | str | None) -> Policy:
    """Build a codec from ``{"type": name, **params}`` (GeoMX's
    ``set_gradient_compression`` dict). ``None`` or ``{}`` mean ``none``; a bare string
    is a name with default parameters."""
    if config is None:
        return codec_class("none")()
    if isinstance(config, str):
        return create_codec(config)
    if not isinstance(config, Mapping):
        raise ValueError(f"codec config must be a dict like {{'type': 'bsc', 'threshold': 0.01}}, got {config!r}")
    if not config:
        return codec_class("none")()
    cfg = dict(config)
    if "type" not in cfg:
        raise ValueError(f"codec config needs a 'type' (one of {', '.join(CODEC_NAMES)}); got keys {sorted(cfg)}")
    name = cfg.pop("type")
    if name is None:
        name = "none"
    return create_codec(name, **cfg)
