"""Node services over real sockets: wall-clock job time, compute padding, send counting."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from geomx.transport import BaseServices
from geomx.wire import Message

#: Bounds on the timer error carried from one compute pad to the next (seconds): an
#: early wake-up is made up next time, a late one (the loop was busy, the machine
#: loaded) is taken off the next pad, but never more than this.
MAX_CARRY_EARLY_S = 0.005
MAX_CARRY_LATE_S = 0.05


class RealServices(BaseServices):
    """``now()`` is wall seconds since the job's start epoch (shared by all processes on a
    host, and across NTP-synchronised hosts); compute is padded up to the scenario's
    profile so emulated and real heterogeneity agree; every send is recorded as a
    ``send`` event, which is what the run's byte counters are built from.

    Padding and the emulator: the emulator charges exactly ``declared_s`` per step. A
    real ``asyncio.sleep`` wakes on the event loop's 1 ms timer grid, late when the
    machine is busy, so padding each step independently runs ~1-2 ms long per step (a
    measured 1.7 ms of a 133 ms quickstart iteration). The error of each pad is carried
    into the next one instead, so the *average* compute time matches the profile the
    way the shaper keeps the average link rate exact.
    """

    def __init__(self, seed: int, recorder: Any, dc_of: dict[str, str], start_epoch: float):
        super().__init__(seed, recorder, None, dc_of)
        self.start_epoch = start_epoch
        self._carry_s = 0.0  # > 0: the last pads overshot; < 0: they woke early

    def now(self) -> float:
        return time.time() - self.start_epoch

    async def compute(self, declared_s: float, measured_s: float) -> None:
        pad = declared_s - measured_s
        if pad <= 0:  # the maths alone took the profile's time (or more): nothing to add
            await asyncio.sleep(0)
            return
        sleep_s = pad - self._carry_s
        if sleep_s <= 0:  # earlier overshoot covers this whole pad
            self._carry_s -= pad
            await asyncio.sleep(0)
            return
        t0 = time.perf_counter()
        await asyncio.sleep(sleep_s)
        error = (time.perf_counter() - t0) - sleep_s
        self._carry_s = min(max(error, -MAX_CARRY_EARLY_S), MAX_CARRY_LATE_S)

    def count_bytes(self, msg: Message) -> None:
        rec = self._recorder
        if rec is None:
            return
        if rec.keeps_only_aggregates("send"):  # events off: the counters, cheaply
            rec.count_transfer("send", msg.src, msg.src, msg.dst, msg.nbytes)
        else:
            rec.record("send", msg.src, src=msg.src, dst=msg.dst, msg=msg.kind.name,
                       key=msg.key, bytes=msg.nbytes, channel=msg.channel)
