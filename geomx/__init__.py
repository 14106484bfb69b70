"""geomx: geo-distributed training on a two-tier parameter server (HiPS), emulated or real."""
from __future__ import annotations

import importlib
from types import ModuleType

#: The release (semantic versioning; CHANGELOG.md says what each one changed). pyproject.toml
#: reads it from here, so this is the one place it is written.
__version__ = "0.6.1"


def __getattr__(name: str) -> ModuleType:
    """``import geomx; geomx.kv.create(...)`` works without importing every subpackage
    up front (start-up time matters: a real run starts a process per node). PEP 562."""
    if not name.startswith("_"):
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise  # the submodule exists but something it imports does not
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
