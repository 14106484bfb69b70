"""Server-side optimizers: how a store is updated from a received gradient.

Chosen by name (``create_optimizer``) and shipped as JSON (``OptimizerConfig``).
MXNet 1.x semantics, geomx-behaviour.md §2.2.
"""

from geomx.optim.adam import Adam, AdamState
from geomx.optim.base import JSONScalar, Optimizer, OptimizerBase
from geomx.optim.dcasgd import DCASGD, DCASGDState
from geomx.optim.registry import OPTIMIZER_NAMES, OptimizerConfig, create_optimizer, optimizer_from_config
from geomx.optim.sgd import SGD, Momentum, Nesterov
from geomx.optim.updater import Updater

__all__ = [
    "Adam",
    "AdamState",
    "DCASGD",
    "DCASGDState",
    "JSONScalar",
    "Momentum",
    "Nesterov",
    "OPTIMIZER_NAMES",
    "Optimizer",
    "OptimizerBase",
    "OptimizerConfig",
    "SGD",
    "Updater",
    "create_optimizer",
    "optimizer_from_config",
]
