"""Event loop selection for the real runtime: uvloop where installed, asyncio otherwise.

Every real-socket process (a node, the benchmark, the tests) gets its loop from here so
that one switch decides it. uvloop (libuv) moves bytes two to four times faster than
the stock selector loop for the large zero-copy writes a parameter server makes; the
stock loop stays as a fallback for platforms without uvloop (Windows) and for debugging.

The choice can be forced with the environment variable ``GEOMX_EVENT_LOOP`` set to
``uvloop`` or ``asyncio`` (anything else, or unset, means "uvloop if installed").
Node code never imports this module: it only sees ``asyncio`` (docs/architecture.md).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

try:  # pragma: no cover - depends on the platform
    import uvloop as _uvloop
except ImportError:  # pragma: no cover
    _uvloop = None

T = TypeVar("T")

#: Environment variable that forces the loop kind ("uvloop" or "asyncio").
ENV_VAR = "GEOMX_EVENT_LOOP"


def uvloop_available() -> bool:
    """True when the ``uvloop`` package can be imported."""
    return _uvloop is not None


def _want_uvloop(use_uvloop: bool | None) -> bool:
    if use_uvloop is None:
        forced = os.environ.get(ENV_VAR, "").strip().lower()
        if forced == "asyncio":
            return False
        if forced == "uvloop" and _uvloop is None:
            raise RuntimeError(f"{ENV_VAR}=uvloop but uvloop is not installed "
                               "(pip install uvloop, or unset the variable)")
        use_uvloop = True
    if use_uvloop and _uvloop is None:
        return False
    return bool(use_uvloop)


def new_event_loop(use_uvloop: bool | None = None) -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop when wanted and installed, the stock asyncio loop otherwise.

    ``use_uvloop=None`` follows ``GEOMX_EVENT_LOOP`` (default: uvloop if installed);
    ``False`` forces asyncio; ``True`` asks for uvloop and quietly falls back when it is
    not installed.
    """
    if _want_uvloop(use_uvloop):
        return _uvloop.new_event_loop()  # type: ignore[union-attr]
    return asyncio.new_event_loop()


def install_event_loop(use_uvloop: bool | None = None) -> str:
    """Make ``asyncio.new_event_loop()``/``asyncio.run`` use the chosen loop in this process.

    Returns the kind installed: ``"uvloop"`` or ``"asyncio"``.
    """
    if _want_uvloop(use_uvloop):
        asyncio.set_event_loop_policy(_uvloop.EventLoopPolicy())  # type: ignore[union-attr]
        return "uvloop"
    asyncio.set_event_loop_policy(None)
    return "asyncio"


def loop_kind(loop: asyncio.AbstractEventLoop | None = None) -> str:
    """``"uvloop"`` or ``"asyncio"`` for ``loop`` (default: the running loop)."""
    loop = loop or asyncio.get_running_loop()
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def run(coro: Coroutine[Any, Any, T], *, use_uvloop: bool | None = None,
        debug: bool | None = None) -> T:
    """Run ``coro`` to completion on a fresh loop from :func:`new_event_loop`; close it after.

    Like :func:`asyncio.run` (pending tasks are cancelled, async generators and the
    default executor are shut down) but with the loop chosen here.
    """
    with asyncio.Runner(debug=debug, loop_factory=lambda: new_event_loop(use_uvloop)) as runner:
        return runner.run(coro)
