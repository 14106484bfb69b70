"""The scenario's WAN built by the kernel: a network namespace per DC, ``tc`` on veth links.

``[real] shaper = "kernel"`` (root, every node on this host). Why have it next to the
userspace shaper: it puts the kernel's TCP -- congestion control, queues, ACK clocking --
in the loop, which a userspace shaper cannot, and so cross-checks both the shaper and
the emulator (by hand on the asymmetric 3-DC shape it agreed with the emulator within
+4.8% per iteration).

The layout, built by :class:`KernelWan` and deleted again on exit (also when the job
fails or is interrupted):

* DC number ``i`` (file order) gets namespace ``gx<tag>d<i>`` and the address
  ``10.<net>.<i>.1`` on its loopback interface; its nodes run inside with
  ``ip netns exec`` and bind that address;
* each ``[[wan]]`` link number ``k`` is a veth pair between its two DCs' namespaces
  (``10.<net+1>.<k>.1`` and ``.2``); each end's egress has a token-bucket filter at the
  bandwidth of that direction, so each direction of a link has one budget shared by
  every flow crossing it, as in the emulator;
* every namespace routes to every other DC's address along the emulator's route
  (fewest WAN hops, ties by delay: :mod:`geomx.topology.routes`, which both runtimes
  use, through :func:`geomx.runtime.wan_shapes.dc_routes`), with forwarding on, so a
  multi-hop route crosses the intermediate DC's namespace.

**Link-layer overhead.** ``tbf`` counts the bytes of each frame, Ethernet header
included: a full TCP segment carries 1448 payload bytes (MSS 1500 minus IP, TCP and
timestamp headers) in a 1514-byte frame. Emulated bandwidth is payload bandwidth, so the
filter's rate is the scenario's times ``1514 / 1448`` (:data:`FRAME_OVERHEAD`).

**Delay, jitter and loss** come from ``netem`` where the kernel has it; where it does not
(no ``sch_netem`` module, as on the machine this was written on) the nodes' own shaper
adds them, with the bandwidth left to the kernel (:func:`geomx.runtime.node_main.build_shaper`
with ``kernel_shapes``). Traces, ``link_down`` and ``partition`` faults are not applied by the
kernel mode; a scenario with them is refused with the reason.
"""

from __future__ import annotations

import os
import random
import shutil
import uuid
from typing import Any

from geomx.runtime.netns import NetnsUnavailable, run_command
from geomx.runtime.wan_shapes import dc_routes
from geomx.scenario import Scenario

__all__ = ["KernelWan", "FRAME_OVERHEAD", "kernel_mode_problem"]

#: Bytes on the wire per payload byte of a full TCP segment, as tbf counts them.
FRAME_OVERHEAD = 1514 / 1448
#: tbf bucket: at least this many full frames of credit (a smaller bucket cannot reach
#: its rate on a kernel timer tick) ...
BURST_FRAMES = 4
#: ... and at least this long at the link's rate.
BURST_S = 0.002
#: How long a packet may wait in a link's queue before tbf drops it; TCP's congestion
#: control then holds each flow near its share.
QUEUE_LATENCY_MS = 100


def tbf_rate_and_burst(bandwidth_bps: float) -> tuple[float, int]:
    """The tbf rate (``bandwidth_bps`` of payload plus each frame's headers) and bucket
    bytes a link of ``bandwidth_bps`` is shaped with; a program measured beside geomx on
    a :class:`geomx.runtime.netns.NetnsPair` is shaped with the same."""
    rate_bps = bandwidth_bps * FRAME_OVERHEAD
    return rate_bps, max(BURST_FRAMES * 1514, int(rate_bps / 8 * BURST_S))


def kernel_mode_problem(s: Scenario) -> str | None:
    """Why the kernel mode cannot run ``s`` here (None: it can)."""
    if any(w.trace for w in s.wans):
        return ("[[wan]] trace is applied by the userspace shaper only; "
                "use [real] shaper = \"userspace\"")
    if any(f.kind in ("link_down", "partition") for f in s.faults):
        return ("[[fault]] kinds \"link_down\" and \"partition\" are applied by the userspace "
                "shaper only; use [real] shaper = \"userspace\"")
    if len(s.dcs) > 250 or len(s.wans) > 250:
        return "the kernel mode numbers DCs and links in one octet: at most 250 of each"
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root (network namespaces and tc); run as root or use shaper = \"userspace\""
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the {tool!r} command (iproute2) is not installed"
    return None


def _has_netem() -> bool:
    """Whether this kernel can add a netem qdisc (probed on a throwaway dummy device)."""
    ns = f"gxprobe{uuid.uuid4().hex[:6]}"
    try:
        run_command("ip", "netns", "add", ns)
        try:
            run_command("ip", "-n", ns, "link", "add", "p0", "type", "dummy")
            r = run_command("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "p0", "root",
                     "netem", "delay", "1ms", check=False)
            return r.returncode == 0
        finally:
            run_command("ip", "netns", "del", ns, check=False)
    except NetnsUnavailable:
        return False


class KernelWan:
    """The scenario's DCs as namespaces and its WAN links as shaped veth pairs.

    ``KernelWan(s)`` as a context manager; :meth:`address` is a DC's address,
    :meth:`exec_argv` wraps a command to run inside a DC's namespace, ``netem`` says
    whether delay, jitter and loss are the kernel's (else the nodes add them).
    """

    def __init__(self, s: Scenario, *, tag: str | None = None, net: int | None = None,
                 use_netem: bool | None = None):
        problem = kernel_mode_problem(s)
        if problem is not None:
            raise NetnsUnavailable(f"[real] shaper = \"kernel\": {problem}")
        self.s = s
        self.tag = tag or uuid.uuid4().hex[:5]
        self.net = net if net is not None else random.randrange(100, 250, 2)
        self.netem = _has_netem() if use_netem is None else use_netem
        self.dc_index = {d.name: i for i, d in enumerate(s.dcs)}
        self._made: list[str] = []
        self.commands: list[list[str]] = []  # what was run, for the run folder and tests

    # -- names -----------------------------------------------------------------------------
    def namespace(self, dc: str) -> str:
        return f"gx{self.tag}d{self.dc_index[dc]}"

    def address(self, dc: str) -> str:
        return f"10.{self.net}.{self.dc_index[dc]}.1"

    def _link_addr(self, k: int, side: int) -> str:
        return f"10.{self.net + 1}.{k}.{side}"

    def exec_argv(self, dc: str, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.namespace(dc), *argv]

    # -- building ------------------------------------------------------------------------------
    def _ip(self, *cmd: str) -> None:
        self.commands.append(list(cmd))
        run_command(*cmd)

    def __enter__(self) -> "KernelWan":
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def _build(self) -> None:
        for d in self.s.dcs:
            ns = self.namespace(d.name)
            self._ip("ip", "netns", "add", ns)
            self._made.append(ns)
            self._ip("ip", "-n", ns, "link", "set", "lo", "up")
            self._ip("ip", "-n", ns, "addr", "add", f"{self.address(d.name)}/32", "dev", "lo")
            # forwarding for multi-hop routes; no reverse-path filter (routes are asymmetric
            # to it: replies leave by the DC address); no slow start after an idle spell
            # (the emulator models none, and a parameter server's links idle every round)
            for key, val in (("net.ipv4.ip_forward", "1"), ("net.ipv4.conf.all.rp_filter", "0"),
                             ("net.ipv4.conf.default.rp_filter", "0"),
                             ("net.ipv4.tcp_slow_start_after_idle", "0")):
                self._ip("ip", "netns", "exec", ns, "sysctl", "-q", "-w", f"{key}={val}")
        ends: dict[tuple[str, str], tuple[str, str]] = {}  # (dc, other dc) -> (device, peer address)
        for k, w in enumerate(self.s.wans):
            dev_a, dev_b = f"gx{self.tag}l{k}a", f"gx{self.tag}l{k}b"
            ns_a, ns_b = self.namespace(w.a), self.namespace(w.b)
            self._ip("ip", "link", "add", dev_a, "netns", ns_a, "type", "veth",
                     "peer", "name", dev_b, "netns", ns_b)
            for ns, dev, side in ((ns_a, dev_a, 1), (ns_b, dev_b, 2)):
                self._ip("ip", "-n", ns, "addr", "add", f"{self._link_addr(k, side)}/30", "dev", dev)
                self._ip("ip", "-n", ns, "link", "set", dev, "up")
            bw_ba = w.bandwidth_ba_bps or w.bandwidth_bps
            self._shape(ns_a, dev_a, w.bandwidth_bps, w)
            self._shape(ns_b, dev_b, bw_ba, w)
            ends[(w.a, w.b)] = (dev_a, self._link_addr(k, 2))
            ends[(w.b, w.a)] = (dev_b, self._link_addr(k, 1))
        for (a, b), r in dc_routes(self.s).items():
            dev, via = ends[(a, r["route"][1])]
            self._ip("ip", "-n", self.namespace(a), "route", "add", f"{self.address(b)}/32",
                     "via", via, "dev", dev, "src", self.address(a))

    def _shape(self, ns: str, dev: str, bandwidth_bps: float, w: Any) -> None:
        rate_bps, burst = tbf_rate_and_burst(bandwidth_bps)
        tbf = ["tbf", "rate", f"{rate_bps:.0f}bit", "burst", str(burst),
               "latency", f"{QUEUE_LATENCY_MS}ms"]
        tc = ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev]
        if self.netem and (w.latency_s > 0 or w.jitter_s > 0 or w.loss > 0):
            netem = ["netem", "delay", f"{w.latency_s * 1e3:.3f}ms"]
            if w.jitter_s > 0:  # netem's default jitter is uniform within +-jitter, as emulated
                netem += [f"{w.jitter_s * 1e3:.3f}ms"]
            if w.loss > 0:
                netem += ["loss", f"{w.loss * 100:.6f}%"]
            self._ip(*tc, "root", "handle", "1:", *netem)
            self._ip(*tc, "parent", "1:1", "handle", "10:", *tbf)
        else:
            self._ip(*tc, "root", *tbf)

    def close(self) -> None:
        """Delete the namespaces (their veth ends and qdiscs go with them)."""
        while self._made:
            run_command("ip", "netns", "del", self._made.pop(), check=False)

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def kernel_shapes(self) -> str:
        """What the kernel does, for the nodes' ``--kernel-shapes``: ``"all"`` (netem too)
        or ``"rate"`` (the nodes add delay, jitter and loss themselves)."""
        return "all" if self.netem else "rate"

