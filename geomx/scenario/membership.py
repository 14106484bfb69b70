"""``[membership]`` (registration, heartbeats, request bounds) and ``[[fault]]`` (faults to inject)."""

from __future__ import annotations

from dataclasses import dataclass

from geomx.scenario.kinds import Choice, Duration, Flag, Section, Text, setting


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
    in_emulator: bool = setting(Flag(), False,
                                "Run heartbeats in the emulator too (off by default: they "
                                "add traffic and hide deadlocks behind endless timers).")


@dataclass(frozen=True)
class FaultConfig(Section):
    """A fault to inject, the same way in both runtimes (testing failure handling)."""

    node: str = setting(Text(non_empty=True), doc="Node to crash, e.g. `w:party-a:1`, `ls:party-b`.")
    at_s: float = setting(Duration(), "1s", "When, from the job's start (emulated or wall seconds).",
                          key="at")
    kind: str = setting(Choice("crash"), "crash",
                        "`crash`: the node stops dead (its process is killed with SIGKILL in the "
                        "real runtime; its task is cancelled and its messages dropped in the emulator).")

