"""The optimizer a master worker installs on the global servers, as a JSON config.

``set_optimizer`` takes a geomx optimizer, a config dict, or MXNet's spellings
(``geomx.kv.optimizer.Adam(learning_rate=0.01)``); all become one checked config that
travels as JSON and is acknowledged, never pickled.
"""

from __future__ import annotations

from typing import Any

from geomx.node.kv_state import KVStoreError

#: MXNet's optimizer option names -> geomx's.
_OPTION_ALIASES = {"learning_rate": "lr", "lamda": "lamda", "lambda": "lamda",
                   "clip_gradient": "clip_gradient", "weight_decay": "wd"}


def optimizer_config(optimizer: Any) -> dict[str, Any]:
    """A JSON optimizer config from a geomx optimizer, a dict, or MXNet spellings
    (``learning_rate`` for ``lr``, ``weight_decay`` for ``wd``, names in any case)."""
    if isinstance(optimizer, dict):
        raw = dict(optimizer)
    elif hasattr(optimizer, "to_config"):
        raw = dict(optimizer.to_config())
        if raw.get("rescale_grad") == 1.0:
            raw.pop("rescale_grad")  # the default: let the servers scale
    else:
        raise KVStoreError(f"set_optimizer takes a geomx optimizer or a config dict, got "
                           f"{type(optimizer).__name__}")
    name = raw.pop("name", None) or raw.pop("optimizer", None)
    if not isinstance(name, str):
        raise KVStoreError(f"an optimizer config needs a 'name', got {optimizer!r}")
    config: dict[str, Any] = {"name": name.lower()}
    for k, v in raw.items():
        config[_OPTION_ALIASES.get(k, k)] = v
    from geomx.optim import optimizer_from_config

    try:
        optimizer_from_config(config)  # a bad name or option fails here, naming what is allowed
    except ValueError as e:
        raise KVStoreError(f"set_optimizer: {e}") from None
    return config


class _OptimizerSpelling:
    """``geomx.kv.optimizer.Adam(learning_rate=0.01)``: MXNet's ``mx.optimizer`` style."""

    def __init__(self, name: str):
        self._name = name

    def __call__(self, **options: Any) -> dict[str, Any]:
        return optimizer_config({"name": self._name, **options})


class _OptimizerNamespace:
    Adam = _OptimizerSpelling("adam")
    SGD = _OptimizerSpelling("sgd")
    DCASGD = _OptimizerSpelling("dcasgd")
    NAG = _OptimizerSpelling("nesterov")
    AdaGrad = _OptimizerSpelling("adagrad")
    RMSProp = _OptimizerSpelling("rmsprop")
    AdaDelta = _OptimizerSpelling("adadelta")
    Adamax = _OptimizerSpelling("adamax")
    Nadam = _OptimizerSpelling("nadam")
    Ftrl = _OptimizerSpelling("ftrl")
    Signum = _OptimizerSpelling("signum")
    LAMB = _OptimizerSpelling("lamb")


optimizer = _OptimizerNamespace()
