"""``[membership]`` (registration, heartbeats, request bounds) and ``[[fault]]`` (faults to inject)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from geomx.scenario.kinds import Choice, Duration, Flag, ListOf, Real, Section, Text, setting
from geomx.topology.link_faults import LinkFault


@dataclass(frozen=True)
class MembershipConfig(Section):
    """Liveness: registration and heartbeats (ps-lite's PS_HEARTBEAT_*, on both tiers)."""

    heartbeat_interval_s: float = setting(Duration(), "1s",
                                          "Each node heartbeats its scheduler(s) this often "
                                          "(0 = off).", key="heartbeat_interval")
    heartbeat_timeout_s: float = setting(Duration(), "10s",
                                         "A node not heard from for this long is declared "
                                         "dead, reported by name, and the job stops.",
                                         key="heartbeat_timeout")
    register_timeout_s: float = setting(Duration(), "120s",
                                        "A scheduler gives up (naming the missing nodes) if "
                                        "not every node has registered by then (0 = wait "
                                        "forever).", key="register_timeout")
    request_timeout_s: float | None = setting(
        Duration(auto=True), "auto",
        "A request (push, pull, init, command, barrier) that gets no reply for this long fails "
        "its node with an error naming the peer, instead of hanging. `auto` = 10 x the "
        "scenario's slowest round (compute, local steps and the model's transfer over the "
        "slowest link), at least 30 s; 0 = wait forever. Active where heartbeats are.",
        key="request_timeout")
    on_worker_loss: str = setting(Choice("fail", "continue"), "fail",
                                  "A worker declared dead (missed heartbeats): `fail` stops the "
                                  "job naming it; `continue` (HiPS) lets its DC go on "
                                  "without it: the round it held up completes once the loss is "
                                  "declared (bounded by heartbeat_timeout), and the DC's sum is "
                                  "scaled by workers / contributors.")
    on_server_loss: str = setting(Choice("fail", "wait"), "fail",
                                  "A server declared dead (missed heartbeats): `fail` "
                                  "stops the job naming it; `wait` (HiPS) holds the job "
                                  "for a local server (and a global one, with checkpoints): "
                                  "its peers keep their unanswered requests and send them "
                                  "again when a process takes over its name (`geomx node "
                                  "--rejoin`, or a `crash` fault with a duration); a local "
                                  "server re-pulls the model from the global tier, a global "
                                  "one takes its optimizer from its last snapshot and the "
                                  "model from the local servers; duplicates are dropped by "
                                  "round. Needs heartbeats (in the emulator: in_emulator = "
                                  "true).")
    server_loss_timeout_s: float = setting(Duration(positive=True), "60s",
                                           "With on_server_loss = 'wait': how long the job "
                                           "waits for a lost server to come back before it "
                                           "fails naming it.", key="server_loss_timeout")
    in_emulator: bool = setting(Flag(), False,
                                "Run heartbeats in the emulator too (off by default: they "
                                "add traffic and hide deadlocks behind endless timers).")


@dataclass(frozen=True)
class FaultConfig(Section):
    """A fault to inject, the same way in both runtimes (testing failure handling).

    `crash` kills a node; `slow` makes a worker a straggler for a while; `link_down` takes a
    WAN link down (both directions) and lets the network reroute around it after
    `converge`, as link-state routing does (geomx/topology/link_faults.py); `partition`
    cuts a set of DCs off from the rest (every WAN link between them and the others goes
    down) for `duration`. Times count from the job's start, which over real
    sockets includes the processes' start-up (seconds); `--set fault.0.kind=link_down`
    adds a fault from the command line.
    """

    node: str = setting(Text(), "", "`crash`: the node to crash, e.g. `w:party-a:1`, "
                                    "`ls:party-b`.")
    link: tuple[str, ...] = setting(ListOf(Text(non_empty=True)), [],
                                    '`link_down`: the `[[wan]]` link, as its two DC names, '
                                    'e.g. `["b", "c"]`.')
    dcs: tuple[str, ...] = setting(ListOf(Text(non_empty=True)), [],
                                   '`partition`: the DCs cut off from the others, e.g. `["party-a"]`.')
    at_s: float = setting(Duration(), "1s", "When, from the job's start (emulated or wall seconds).",
                          key="at")
    kind: str = setting(Choice("crash", "link_down", "slow", "partition"), "crash",
                        "`crash`: the node stops dead (its process is killed with SIGKILL in the "
                        "real runtime; its task is cancelled and its messages dropped in the "
                        "emulator). `link_down`: the WAN link carries nothing from `at`; traffic "
                        "that crossed it stalls, then is rerouted over the other WAN links "
                        "`converge` later (in the real runtime, by each sender's shaper). "
                        "`slow`: the worker `node` computes `factor` times slower from `at` "
                        "for `duration` (a straggler). `partition`: every WAN link between the "
                        "DCs `dcs` and the others carries nothing from `at` for `duration`; no "
                        "route is left, so traffic across the cut stalls until it heals.")
    duration_s: float = setting(Duration(), "0s", "`link_down`, `slow`, `partition`: how long "
                                "the fault lasts (0 = to the end of the run). `crash` of a worker "
                                "with membership.on_worker_loss = 'continue' (emulator), or of a "
                                "server with on_server_loss = 'wait' (both runtimes): restart "
                                "it that much later, as `geomx node --rejoin` (0 = never).",
                                key="duration")
    factor: float = setting(Real(min=1.0), 4.0, "`slow`: how many times longer the node's "
                            "compute takes.")
    converge_s: float = setting(Duration(), "1s", "`link_down`: routing convergence, from the "
                                "failure until traffic is rerouted around the link.",
                                key="converge")


def link_faults(faults: Iterable[FaultConfig], wans: Iterable[Any] = ()) -> list[LinkFault]:
    """The ``link_down`` faults, and each ``partition`` as the failure of every ``[[wan]]``
    link (of ``wans``) that crosses its cut, as the runtimes' shared timeline takes them."""
    wans = list(wans)
    out = []
    for f in faults:
        if f.kind == "link_down":
            out.append(LinkFault(f.link[0], f.link[1], f.at_s, f.duration_s, f.converge_s))
        elif f.kind == "partition":
            cut = set(f.dcs)
            out += [LinkFault(w.a, w.b, f.at_s, f.duration_s, f.converge_s)
                    for w in wans if (w.a in cut) != (w.b in cut)]
    return out
