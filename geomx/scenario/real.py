"""``[real]`` (where the schedulers listen) and ``[security]`` (who may join): real runtime only."""

from __future__ import annotations

from dataclasses import dataclass

from geomx.scenario.kinds import (Choice, Duration, Flag, Integer, Section, Size, Text,
                                  setting)


#: A host:port address (host: a name, an IPv4 address, or an IPv6 address in brackets).
_ADDRESS = r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):[0-9]{1,5}"
_ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]*"


@dataclass(frozen=True)
class RealConfig(Section):
    """Real runtime: where the schedulers listen and how nodes reach each other.

    Every node finds its schedulers from these settings (or from the environment, see
    docs/real-runtime.md), so nodes started separately on different hosts meet without a
    launcher: the GeoMX/ps-lite rendezvous (docs/geomx-behaviour.md §1.4). The global scheduler
    listens on `port_base` and DC number i (file order) on `port_base + 1 + i`, which with
    the default 9092 gives GeoMX's demo ports (global 9092, central 9093, parties 9094, ...).
    """

    global_scheduler: str = setting(Text(rf"({_ADDRESS})?", "'host:port' or empty"), "",
                                    "Address of the global scheduler (GeoMX's DMLC_PS_GLOBAL_ROOT_URI/"
                                    "PORT); \"\" = the central DC's host and scheduler port.")
    port_base: int = setting(Integer(min=0, max=65535 - 64), 0,
                             "First rendezvous port (see above). 0 = automatic: free ports when one "
                             "launcher starts every node on this host (`geomx run`, `geomx launch`), "
                             "9092 otherwise.")
    bind_host: str = setting(Text(), "",
                             "Address every node binds to; \"\" = the address it advertises (its DC's "
                             "`host`); \"0.0.0.0\" = every interface.")
    shape: bool = setting(Flag(), True,
                          "Reproduce the scenario's WAN links with the transport's own shaper (turn "
                          "off when the DCs really are far apart).")
    shaper: str = setting(Choice("userspace", "kernel"), "userspace",
                          "How `shape` reproduces the WAN: \"userspace\" = each node's transport "
                          "paces its own traffic; \"kernel\" = (root, one host) each DC's nodes "
                          "run in their own network namespace joined by veth pairs shaped "
                          "with `tc` (delay, jitter and loss stay in userspace where the kernel "
                          "has no netem).")
    shared_links: bool = setting(Flag(), True,
                                 "Every sender on this host draws on one bandwidth budget per scenario "
                                 "link (a file in the run folder), so flows crossing a link from "
                                 "different nodes share it as in the emulator; false = each node "
                                 "shares links only among its own flows.")
    shm: bool = setting(Flag(), True,
                        "Nodes on the same host (and network namespace) pass large values' "
                        "pieces through a shared-memory ring instead of their TCP "
                        "connection: one copy in, one out, no kernel stack "
                        "(docs/real-runtime.md). Never used for shaped traffic; false = every "
                        "byte through the sockets.")
    connect_timeout_s: float = setting(Duration(positive=True), "30s",
                                       "How long a node retries reaching a peer that is not up yet.",
                                       key="connect_timeout")
    reconnect_timeout_s: float = setting(Duration(positive=True), "30s",
                                         "How long a node keeps dialling again a peer whose "
                                         "connection dropped with messages still to deliver "
                                         "(they are then written again, in order, once); past it "
                                         "they are dropped and the peer counts as unreachable.",
                                         key="reconnect_timeout")
    dead_connection_timeout_s: float = setting(
        Duration(), "20s",
        "How long a connection that died silently (a NAT or firewall on the path forgot it, "
        "the far host lost power) may go unnoticed: keepalive probes after half of it idle "
        "and a TCP user timeout on unacknowledged data; a dead one is then dialled again "
        "and its messages resent. 0 = the kernel's defaults (about 15 minutes with data "
        "outstanding, never when idle).", key="dead_connection_timeout")
    max_message_bytes: int | None = setting(
        Size(auto=True), "auto",
        "Largest message a node accepts; a longer one is refused (a value travels as a stream "
        "of frames of at most 4 MiB, so this bounds the value, not the frame). `auto` = twice "
        "the model plus 16 MiB for a built-in model, this host's memory for a training "
        "program (its keys are unknown up front). Without a shared secret, anyone who can "
        "reach a node can make it hold one message of this size: set it to your largest "
        "value to bound that.", key="max_message")


@dataclass(frozen=True)
class SecurityConfig(Section):
    """Who may join the job: a shared-secret handshake and TLS (real runtime only).

    The secret itself never goes in this file: `secret_env` names the environment variable
    that holds it. Relative certificate paths are read next to the scenario file when they
    exist there, else from the working directory.
    """

    secret_env: str = setting(Text(_ENV_NAME, "an environment variable name"), "GEOMX_SECRET",
                              "Environment variable holding the shared secret (HMAC handshake); "
                              "unset or empty = no authentication.")
    require_secret: bool = setting(Flag(), False,
                                   "Refuse to start a node when the variable named by `secret_env` "
                                   "is unset or empty.")
    tls: bool = setting(Flag(), False, "Encrypt every connection with TLS (needs `tls_cert` and `tls_key`).")
    tls_cert: str = setting(Text(), "", "PEM certificate (chain) each node presents.")
    tls_key: str = setting(Text(), "", "PEM private key of `tls_cert`.")
    tls_ca: str = setting(Text(), "",
                          "PEM CA bundle peers' certificates must chain to; \"\" = the system trust store.")
    tls_verify_clients: bool = setting(Flag(), False,
                                       "Mutual TLS: a node also requires a certificate from the nodes that "
                                       "connect to it (signed by `tls_ca`).")
    tls_check_hostname: bool = setting(Flag(), True,
                                       "Check that a peer's certificate names the address it was dialled at.")


