"""Node services over real sockets: wall-clock job time, compute padding, send counting."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from geomx.transport import BaseServices
from geomx.wire import Message


class RealServices(BaseServices):
    """``now()`` is wall seconds since the job's start epoch (shared by all processes on a
    host, and across NTP-synchronised hosts); compute is padded up to the scenario's
    profile so emulated and real heterogeneity agree; every send is recorded as a
    ``send`` event, which is what the run's byte counters are built from."""

    def __init__(self, seed: int, recorder: Any, dc_of: dict[str, str], start_epoch: float):
        super().__init__(seed, recorder, None, dc_of)
        self.start_epoch = start_epoch

    def now(self) -> float:
        return time.time() - self.start_epoch

    async def compute(self, declared_s: float, measured_s: float) -> None:
        extra = declared_s - measured_s
        if extra > 0:
            await asyncio.sleep(extra)
        else:
            await asyncio.sleep(0)

    def count_bytes(self, msg: Message) -> None:
        if self._recorder is not None:
            self._recorder.record("send", msg.src, src=msg.src, dst=msg.dst, msg=msg.kind.name,
                                  key=msg.key, bytes=msg.nbytes, channel=msg.channel)
