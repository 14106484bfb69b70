"""The virtual-time WAN emulator: an asyncio loop on a virtual clock, a flow-level
network model, bandwidth traces and the emulator's Transport.

See docs/architecture.md ("sim/ contract") for how the pieces fit together.
"""

from geomx.sim.loop import (
    EmulationDeadlock, EmulationLivelock, VirtualTimeLoop, new_virtual_loop, run_virtual,
)
from geomx.sim.network import Link, Network, NetworkError, NetworkStats, channel_class
from geomx.sim.trace import (
    BandwidthTrace, ConstantTrace, CsvTrace, StepTrace, TraceError, UniformRandomTrace,
)
from geomx.sim.transport import SimFabric, SimTransport, TransportClosed, fabric_of

__all__ = [
    "BandwidthTrace", "ConstantTrace", "CsvTrace", "EmulationDeadlock", "EmulationLivelock",
    "Link", "Network", "NetworkError", "NetworkStats", "SimFabric", "SimTransport",
    "StepTrace", "TraceError", "TransportClosed", "UniformRandomTrace", "VirtualTimeLoop",
    "channel_class", "fabric_of", "new_virtual_loop", "run_virtual",
]
