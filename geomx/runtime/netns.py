"""Kernel-shaped WAN on one machine: network namespaces joined by a ``tc tbf``-shaped veth.

The transport's own shaper reproduces a WAN without privileges; this is the other way,
for cross-checking it (and for people who want the kernel's TCP in the loop): each "DC"
gets a network namespace, a veth pair joins them, and a token-bucket filter
(``tc qdisc add dev VETH root tbf rate R burst B latency L``) on each end limits what
leaves it, optionally behind a ``netem`` delay. Nodes run inside with
``ip netns exec NS geomx node ...`` and ``[real].shape = false`` (the kernel shapes).

Needs root and iproute2 (``ip``, ``tc``). Only private addresses are used (10.x by
default), only inside namespaces this module creates, and everything is deleted again on
exit -- also when the body raises -- by deleting the namespaces (which takes their veth
ends with them).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass, field


class NetnsUnavailable(RuntimeError):
    """Namespaces or tbf cannot be used here; the message says why."""


def run_command(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run an ``ip``/``tc`` command; with ``check``, a failure raises
    :class:`NetnsUnavailable` with the command and what it printed."""
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise NetnsUnavailable(f"`{' '.join(cmd)}` failed: {(r.stderr or r.stdout).strip()}")
    return r


def unavailable_reason() -> str | None:
    """None when namespaces with a tbf-shaped veth work here, else why not."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root (network namespaces and tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the {tool!r} command (iproute2) is not installed"
    try:
        with NetnsPair(rate_mbit=10, probe=True):
            pass
    except NetnsUnavailable as e:
        return str(e)
    return None


@dataclass
class NetnsPair:
    """Two namespaces ``a`` and ``b`` joined by a veth pair, each direction tbf-shaped.

    ``subnet`` is the first three octets of a private /24 (``10.x.y``): ``a`` gets ``.1``
    and ``b`` ``.2``. ``delay_ms`` > 0 adds a netem delay under the tbf (needs
    ``sch_netem``). ``burst_bytes`` (when set) replaces ``burst_kbit`` as the bucket's
    size. Both namespaces turn off TCP's slow start after an idle spell, as
    :class:`geomx.runtime.kernel_wan.KernelWan` does for its DCs, so that a program
    measured here meets the same TCP as geomx's nodes do there. Use as a context manager.
    """

    rate_mbit: float = 20.0
    burst_kbit: int = 256
    burst_bytes: int | None = None
    latency_ms: int = 400
    delay_ms: float = 0.0
    subnet: str = "10.231.7"
    probe: bool = False
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])

    def __post_init__(self) -> None:
        first = self.subnet.split(".")
        if len(first) != 3 or first[0] != "10" or not all(p.isdigit() and int(p) < 256
                                                          for p in first):
            raise ValueError(f"subnet {self.subnet!r}: allowed: '10.X.Y' (a private 10/8 /24)")
        self.ns_a, self.ns_b = f"gx{self.tag}a", f"gx{self.tag}b"
        self.if_a, self.if_b = f"gx{self.tag}va", f"gx{self.tag}vb"
        self.addr_a, self.addr_b = f"{self.subnet}.1", f"{self.subnet}.2"
        self._made: list[str] = []

    def __enter__(self) -> "NetnsPair":
        try:
            for ns in (self.ns_a, self.ns_b):
                run_command("ip", "netns", "add", ns)
                self._made.append(ns)
                run_command("ip", "-n", ns, "link", "set", "lo", "up")
                run_command("ip", "netns", "exec", ns, "sysctl", "-q", "-w",
                            "net.ipv4.tcp_slow_start_after_idle=0")
            run_command("ip", "link", "add", self.if_a, "netns", self.ns_a, "type", "veth",
                 "peer", "name", self.if_b, "netns", self.ns_b)
            for ns, dev, addr in ((self.ns_a, self.if_a, self.addr_a),
                                  (self.ns_b, self.if_b, self.addr_b)):
                run_command("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
                run_command("ip", "-n", ns, "link", "set", dev, "up")
                self._shape(ns, dev)
        except BaseException:
            self.close()
            raise
        return self

    def _shape(self, ns: str, dev: str) -> None:
        burst = (str(self.burst_bytes) if self.burst_bytes is not None
                 else f"{self.burst_kbit}kbit")
        tbf = ["tbf", "rate", f"{self.rate_mbit}mbit", "burst", burst,
               "latency", f"{self.latency_ms}ms"]
        if self.delay_ms > 0:
            run_command("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root",
                 "handle", "1:", "netem", "delay", f"{self.delay_ms}ms")
            run_command("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "parent", "1:1",
                 "handle", "10:", *tbf)
        else:
            run_command("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", *tbf)

    def exec_argv(self, side: str, argv: list[str]) -> list[str]:
        """``argv`` run inside namespace ``side`` ("a" or "b")."""
        ns = {"a": self.ns_a, "b": self.ns_b}[side]
        return ["ip", "netns", "exec", ns, *argv]

    def close(self) -> None:
        """Delete what was made (namespaces take their veth ends with them)."""
        while self._made:
            run_command("ip", "netns", "del", self._made.pop(), check=False)

    def __exit__(self, *exc: object) -> None:
        self.close()
