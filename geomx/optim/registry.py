"""Optimizers by name, and their JSON form for shipping to servers.

GeoMX pickles the optimizer object and sends it to the global servers
(docs/geomx-behaviour.md §2.1); unpickling network input runs arbitrary code, so geomx ships
``{"name": ..., "lr": ..., ...}`` as JSON instead and rebuilds the optimizer with
:func:`optimizer_from_config`, which accepts only known names and known options.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from geomx.optim.adadelta import AdaDelta
from geomx.optim.adagrad import AdaGrad
from geomx.optim.adam import Adam
from geomx.optim.adamax import Adamax
from geomx.optim.base import JSONScalar, OptimizerBase
from geomx.optim.dcasgd import DCASGD
from geomx.optim.ftrl import Ftrl
from geomx.optim.lamb import LAMB
from geomx.optim.nadam import Nadam
from geomx.optim.rmsprop import RMSProp
from geomx.optim.sgd import SGD, Momentum, Nesterov
from geomx.optim.signum import Signum

__all__ = [
    "OPTIMIZER_NAMES",
    "OptimizerConfig",
    "SERVER_ONLY",
    "create_optimizer",
    "optimizer_from_config",
]

_SHARED_OPTIONS = ("lr", "wd", "rescale_grad", "clip_gradient")

# name -> (class, options fixed by the name)
_REGISTRY: dict[str, tuple[type[OptimizerBase], dict[str, Any]]] = {
    "sgd": (SGD, {}),
    "momentum": (Momentum, {}),
    "nesterov": (Nesterov, {}),
    "adam": (Adam, {}),
    "dcasgd": (DCASGD, {}),
    "dcasgd_shared": (DCASGD, {"per_sender": False}),
    "adagrad": (AdaGrad, {}),
    "rmsprop": (RMSProp, {}),
    "rmsprop_centered": (RMSProp, {"centered": True}),
    "adadelta": (AdaDelta, {}),
    "adamax": (Adamax, {}),
    "nadam": (Nadam, {}),
    "ftrl": (Ftrl, {}),
    "signum": (Signum, {}),
    "lamb": (LAMB, {}),
}

#: Optimizers that need to know who pushed and what they pulled: server-side only.
SERVER_ONLY: tuple[str, ...] = ("dcasgd", "dcasgd_shared")

OPTIMIZER_NAMES: tuple[str, ...] = tuple(_REGISTRY)


def _allowed_options(cls: type[OptimizerBase], fixed: Mapping[str, Any]) -> list[str]:
    own = [
        p.name
        for p in inspect.signature(cls.__init__).parameters.values()
        if p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    ]
    return [name for name in dict.fromkeys(own + list(_SHARED_OPTIONS)) if name not in fixed]


def create_optimizer(name: str, **options: Any) -> OptimizerBase:
    """Build an optimizer by name: ``sgd``, ``momentum``, ``nesterov``, ``adam``,
    ``dcasgd`` (per-sender backups), ``dcasgd_shared`` (MXNet's single backup),
    ``adagrad``, ``rmsprop``, ``rmsprop_centered`` (Graves), ``adadelta``, ``adamax``,
    ``nadam``, ``ftrl``, ``signum`` or ``lamb`` (docs/optimizers.md).

    Unknown names or options raise ValueError naming what is allowed.
    """
    if name not in _REGISTRY:
        raise ValueError(f"unknown optimizer {name!r}; allowed: {', '.join(OPTIMIZER_NAMES)}")
    cls, fixed = _REGISTRY[name]
    allowed = _allowed_options(cls, fixed)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"optimizer {name!r} has no option(s) {unknown}; allowed: {', '.join(allowed)}")
    return cls(**fixed, **options)


@dataclass(frozen=True)
class OptimizerConfig:
    """An optimizer as data: a name plus JSON scalars. What travels to servers."""

    name: str
    options: dict[str, JSONScalar] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or self.name not in _REGISTRY:
            raise ValueError(f"unknown optimizer {self.name!r}; allowed: {', '.join(OPTIMIZER_NAMES)}")
        for key, value in self.options.items():
            if value is not None and not isinstance(value, (bool, int, float, str)):
                raise ValueError(f"optimizer option {key} must be a JSON scalar, got {type(value).__name__}")
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"optimizer option {key} must be finite, got {value!r}")

    def to_dict(self) -> dict[str, JSONScalar]:
        return {"name": self.name, **self.options}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OptimizerConfig:
        if not isinstance(data, Mapping) or "name" not in data:
            raise ValueError(f"an optimizer config needs a 'name' field; got {data!r}")
        options = {k: v for k, v in data.items() if k != "name"}
        return cls(str(data["name"]), options)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, allow_nan=False)

    @classmethod
    def from_json(cls, text: str | bytes) -> OptimizerConfig:
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"optimizer config is not valid JSON: {exc}") from None
        return cls.from_dict(data)

    @classmethod
    def of(cls, optimizer: OptimizerBase) -> OptimizerConfig:
        return cls.from_dict(optimizer.to_config())

    def build(self) -> OptimizerBase:
        return create_optimizer(self.name, **self.options)


def optimizer_from_config(config: Mapping[str, Any] | OptimizerConfig) -> OptimizerBase:
    """Rebuild an optimizer from ``to_config()`` output (a dict or an OptimizerConfig)."""
    if not isinstance(config, OptimizerConfig):
        config = OptimizerConfig.from_dict(config)
    return config.build()


