"""Node services inside the emulator: virtual-time compute and the virtual clock.

The emulated counterpart of :class:`geomx.runtime.services.RealServices`; both extend
:class:`geomx.transport.BaseServices`, which gives every node its seeded RNGs and its
event recording (docs/architecture.md, "The two runtimes").
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from geomx.transport import BaseServices


class EmuServices(BaseServices):
    """Compute is charged as virtual time; bytes are counted by the network model (per
    physical link, when a message's last byte leaves), not here."""

    def __init__(self, *args: Any, clock: Callable[[], float] | None = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        if clock is not None:
            # the virtual clock itself, not asyncio.get_running_loop().time(): that makes a
            # getpid() system call per read
            self.now = clock  # type: ignore[method-assign]

    async def compute(self, declared_s: float, measured_s: float) -> None:
        if declared_s > 0:
            await asyncio.sleep(declared_s)

    def count_bytes(self, msg: Any) -> None:  # the network's transfer hook counts
        return None
