"""Server-side optimizers: how a store is updated from a received gradient.

Chosen by name (``create_optimizer``) and shipped as JSON (``OptimizerConfig``).
MXNet 1.x semantics, docs/geomx-behaviour.md §2.2; the family and its formulas are listed in
docs/optimizers.md. Elementwise updates run as Numba kernels (``kernels.py``) with a
numpy reference path.
"""

from geomx.optim.adadelta import AdaDelta
from geomx.optim.adagrad import AdaGrad
from geomx.optim.adam import Adam, AdamState
from geomx.optim.adamax import Adamax
from geomx.optim.base import JSONScalar, Optimizer, OptimizerBase
from geomx.optim.dcasgd import DCASGD, DCASGDState
from geomx.optim.ftrl import Ftrl
from geomx.optim.lamb import LAMB
from geomx.optim.nadam import Nadam
from geomx.optim.registry import (
    OPTIMIZER_NAMES,
    SERVER_ONLY,
    OptimizerConfig,
    create_optimizer,
    optimizer_from_config,
)
from geomx.optim.rmsprop import RMSProp
from geomx.optim.sgd import SGD, Momentum, Nesterov
from geomx.optim.signum import Signum
from geomx.optim.updater import Updater

__all__ = [
    "AdaDelta",
    "AdaGrad",
    "Adam",
    "AdamState",
    "Adamax",
    "DCASGD",
    "DCASGDState",
    "Ftrl",
    "JSONScalar",
    "LAMB",
    "Momentum",
    "Nadam",
    "Nesterov",
    "OPTIMIZER_NAMES",
    "Optimizer",
    "OptimizerBase",
    "OptimizerConfig",
    "RMSProp",
    "SERVER_ONLY",
    "SGD",
    "Signum",
    "Updater",
    "create_optimizer",
    "optimizer_from_config",
]
