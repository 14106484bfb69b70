"""The nodes' CPUs in the emulator: a host profile's costs charged as virtual CPU time.

Over sockets each node is a process whose one thread does everything: it frames and
writes what it sends, reads and decodes what it receives, runs the kvstore's and the
server's bookkeeping; a message that arrives while the thread is busy waits. A
:class:`HostProfile` (geomx/host_profile.py, measured by ``geomx calibrate``) says what
each of those costs on a host; :class:`ChargedFabric` charges them here, on the node that
pays them (docs/calibration.md):

* a message a node sends leaves for the network once the sender's CPU has spent the
  profile's send cost on it (plus the codec's encode cost; plus the kvstore's per-call
  cost for a worker's push or pull request; plus a server's per-byte cost of answering
  a pull);
* a message that arrives is handed to the receiving node once its CPU has spent the
  receive cost (plus the codec's decode cost; plus a server's per-push or per-pull
  cost; plus the kvstore's per-byte cost of a pull reply a worker takes in);
* a message between DCs goes through the real runtime's shaper: its sender pays the
  shaper's CPU too (``shaped_send_s``), and it is handled ``shaped_late_s`` after its
  link's delay (the shaper's timers on this host, the receiver waking up: a delay, not
  CPU); a message inside a DC that finds its receiver's thread idle waits ``wakeup_s``
  for it to wake;
* each node's CPU work is one FIFO queue (one thread), so a node's messages queue for
  its CPU as in a real process, and with ``[host] cores = N`` the nodes of the job share
  N cores: a piece of work starts when both its node's thread and a core are free;
* every piece of CPU work takes the profile's ``[cpu] stretch`` times its CPU seconds:
  the share of a core the host's other processes left when it was calibrated.

All of it lives in the emulator's fabric, between the node's transport and the network:
node code is not told, and the real runtime needs nothing (its CPU cost is simply real).
Without a profile the job's fabric is the plain :class:`SimFabric` and nothing changes.
Compute (``compute_per_iter``) is not CPU here: it is charged as before, per node.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from geomx.host_profile import HostProfile
from geomx.sim.network import Network
from geomx.sim.transport import SimFabric
from geomx.wire import Kind

__all__ = ["NodeCpus", "ChargedFabric", "SERVER_ROLES", "KVSTORE_ROLES"]

#: Roles whose nodes take pushes into a store (the profile's per-push cost).
SERVER_ROLES = frozenset({"global_server", "local_server", "mesh_server"})
#: Roles whose pushes and pulls are kvstore calls (the profile's per-call cost).
KVSTORE_ROLES = frozenset({"worker", "master_worker"})

_PUSH, _PULL, _PULL_REPLY = Kind.PUSH, Kind.PULL, Kind.PULL_REPLY
#: what a server aggregates: a worker's or a local server's push, a neighbour's chunk
_TAKEN_IN = frozenset({Kind.PUSH, Kind.RELAY})


def _dense_bytes(meta: dict[str, Any]) -> int:
    """Bytes of the dense tensor a coded payload stands for (``meta`` of an encoding)."""
    n = meta.get("n")
    if not isinstance(n, int):
        return 0
    dtype = meta.get("dtype", "<f4")
    try:
        return n * np.dtype(dtype).itemsize
    except TypeError:
        return 4 * n


def _payload_bytes(msg: Any) -> int:
    return sum(p.nbytes for p in msg.payloads)


class NodeCpus:
    """Each node's thread and the host's cores, as times they are next free.

    ``occupy(node, now, cost_s, wakeup_s)`` books ``cost_s`` of CPU (times the profile's
    stretch) for ``node`` and returns when it ends: after the node's earlier work (one
    thread: FIFO), or ``wakeup_s`` after ``now`` when the thread is idle (a process
    asleep in its event loop is woken first), and, with a core limit, on the core that
    frees first. Work is booked in the order it is asked for, which in the emulator is
    virtual-time order, so the booking is deterministic.
    """

    def __init__(self, profile: HostProfile, roles: dict[str, str], cores: int = 0,
                 dc_of: dict[str, str] | None = None) -> None:
        if cores < 0:
            raise ValueError(f"cores must be >= 0 (0 = a core per node), got {cores}")
        self.profile = profile
        self.roles = dict(roles)
        #: wall seconds per CPU second of the profile's host (its other processes' share)
        self.stretch = profile.cpu_stretch
        #: node -> DC: a message between DCs is shaped in the real runtime
        self.dc_of = dict(dc_of or {})
        self.cores_free_s: list[float] | None = [0.0] * cores if cores else None
        self._free_s: dict[str, float] = {}
        #: CPU seconds booked per node (reported in summary.json)
        self.busy_s: dict[str, float] = {}

    def occupy(self, node: str, now_s: float, cost_s: float, wakeup_s: float = 0.0) -> float:
        start = self._free_s.get(node, -1.0)
        if start < now_s:  # the node's thread is idle: it first wakes up
            start = now_s + wakeup_s
        if cost_s <= 0.0:
            return start  # nothing to do, but not before the node's earlier work
        cost_s *= self.stretch
        cores = self.cores_free_s
        if cores is not None:
            i = min(range(len(cores)), key=cores.__getitem__)
            if cores[i] > start:
                start = cores[i]
            cores[i] = start + cost_s
        end = start + cost_s
        self._free_s[node] = end
        self.busy_s[node] = self.busy_s.get(node, 0.0) + cost_s
        return end

    # ------------------------------------------------------------------ costs
    def crosses_dcs(self, msg: Any) -> bool:
        """Whether ``msg`` goes between DCs (shaped over sockets; inside a DC it is not). A
        node of no known DC is taken to share the other's."""
        dc_of = self.dc_of
        a, b = dc_of.get(msg.src), dc_of.get(msg.dst)
        return a is not None and b is not None and a != b

    def send_cost_s(self, msg: Any) -> float:
        """What ``msg.src`` pays to send ``msg`` (a BATCH: what its messages cost)."""
        p = self.profile
        if msg.batch is not None:  # one frame: shaped once
            shaped = p.shaped_send_s * (len(msg.batch) - 1) if self.crosses_dcs(msg) else 0.0
            return sum(self.send_cost_s(m) for m in msg.batch) + p.send_cost_s(0) - shaped
        cost = p.send_cost_s(msg.nbytes)
        if self.crosses_dcs(msg):
            cost += p.shaped_send_s
        meta = msg.meta
        codec = meta.get("codec") if meta else None
        dense = _dense_bytes(meta) if codec else _payload_bytes(msg)
        if codec:
            cost += p.encode_cost_s(str(codec), dense)
        kind, role = msg.kind, self.roles.get(msg.src)
        if role in KVSTORE_ROLES:
            if kind is _PUSH:
                cost += p.kvstore_call_s + p.kvstore_call_s_per_byte * dense
            elif kind is _PULL:
                cost += p.kvstore_call_s
        elif role in SERVER_ROLES and kind is _PULL_REPLY:
            cost += p.pull_cost_s(dense)
        return cost

    def recv_cost_s(self, msg: Any) -> float:
        """What ``msg.dst`` pays to take ``msg`` in."""
        p = self.profile
        if msg.batch is not None:
            return sum(self.recv_cost_s(m) for m in msg.batch) + p.recv_cost_s(0)
        cost = p.recv_cost_s(msg.nbytes)
        meta = msg.meta
        codec = meta.get("codec") if meta else None
        dense = _dense_bytes(meta) if codec else _payload_bytes(msg)
        if codec:
            cost += p.decode_cost_s(str(codec), dense)
        kind, role = msg.kind, self.roles.get(msg.dst)
        if role in SERVER_ROLES:
            if kind in _TAKEN_IN:
                cost += p.push_cost_s(dense)
            elif kind is _PULL:
                cost += p.pull_cost_s(0)
        elif role in KVSTORE_ROLES and kind is _PULL_REPLY:
            cost += p.kvstore_call_s_per_byte * dense
        return cost


class ChargedFabric(SimFabric):
    """A :class:`SimFabric` whose nodes pay their CPU costs (see the module docstring)."""

    def __init__(self, network: Network, cpus: NodeCpus, clock: Callable[[], float],
                 call_at: Callable[[float, Callable[[Any], Any], Any], None]) -> None:
        super().__init__(network)
        self.cpus = cpus
        self._clock = clock
        self._call_at = call_at  # the loop's call_at_plain(when, fn, arg)
        self._send_now = super().send
        self._deliver_now = super().deliver

    def send(self, msg: Any) -> None:
        now = self._clock()
        end = self.cpus.occupy(msg.src, now, self.cpus.send_cost_s(msg))
        if end <= now:
            self._send_now(msg)
        else:
            self._call_at(end, self._send_now, msg)

    def deliver(self, msg: Any) -> None:
        now = self._clock()
        cpus = self.cpus
        profile = cpus.profile
        if cpus.crosses_dcs(msg):
            end = cpus.occupy(msg.dst, now + profile.shaped_late_s, cpus.recv_cost_s(msg))
        else:
            end = cpus.occupy(msg.dst, now, cpus.recv_cost_s(msg), profile.wakeup_s)
        if end <= now:
            self._deliver_now(msg)
        else:
            self._call_at(end, self._deliver_now, msg)
