"""The virtual-time WAN emulator: an asyncio loop on a virtual clock, a flow-level
network model and the emulator's Transport (the bandwidth traces its links follow live
in :mod:`geomx.traces`, below both runtimes).

See docs/architecture.md ("sim/ contract") for how the pieces fit together.
"""

from geomx.sim.loop import (
    EmulationDeadlock, EmulationLivelock, VirtualTimeLoop, new_virtual_loop, run_virtual,
)
from geomx.sim.network import Link, Network, NetworkError, NetworkStats, channel_class
from geomx.sim.transport import SimFabric, SimTransport, TransportClosed, fabric_of

__all__ = [
    "EmulationDeadlock", "EmulationLivelock", "Link", "Network", "NetworkError",
    "NetworkStats", "SimFabric", "SimTransport", "TransportClosed", "VirtualTimeLoop",
    "channel_class", "fabric_of", "new_virtual_loop", "run_virtual",
]
