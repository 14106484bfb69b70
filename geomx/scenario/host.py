"""``[host]``: the machine the job's processes share, as the emulator charges it.

A host profile (``geomx calibrate``, docs/calibration.md) makes the emulator charge the
CPU time the real runtime's processes spend per message, codec byte, kvstore call and
server push; ``cores`` makes the nodes share that many cores, as the processes of a
``--runtime real`` job on one host do. Both change emulated times only; the real runtime
ignores them (its CPU cost is real).
"""

from __future__ import annotations

from dataclasses import dataclass

from geomx.scenario.kinds import Integer, Section, Text, setting

#: The most cores a host may declare.
MAX_CORES = 4096


@dataclass(frozen=True)
class HostConfig(Section):
    """The host's CPU as the emulator charges it: a calibration profile and its cores
    (docs/calibration.md). Without a profile nothing is charged and `cores` has no effect."""

    profile: str = setting(Text(), "",
                           "Host profile written by `geomx calibrate --out FILE` (relative to "
                           "the scenario file): the emulator charges its per-message, codec, "
                           "kvstore and server costs as CPU time on the node that pays them. "
                           "\"\" = charge nothing (the emulator's default).")
    cores: int = setting(Integer(min=0, max=MAX_CORES), 0,
                         "Cores the job's nodes share when a profile is charged (one FIFO "
                         "thread per node, work waits for a free core); 0 = a core per node.")
