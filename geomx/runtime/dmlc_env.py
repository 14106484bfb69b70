"""GeoMX's and ps-lite's environment variables, mapped onto a geomx node and its scenario.

GeoMX (docs/geomx-behaviour.md §1.1, §1.4, §5) starts each process with its identity and the
job's shape in the environment -- ``DMLC_ROLE``, ``DMLC_ROLE_GLOBAL``,
``DMLC_ROLE_MASTER_WORKER``, ``DMLC_PS_ROOT_URI/PORT``, ``DMLC_PS_GLOBAL_ROOT_URI/PORT``,
``DMLC_NUM_*``, ``DMLC_NODE_HOST``, ``DMLC_INTERFACE``, ``PORT``, ``PS_HEARTBEAT_*``,
DGT's ``ENABLE_DGT``, ``DMLC_K``, ``DMLC_K_MIN``, ``ADAPTIVE_K_FLAG``,
``DMLC_UDP_CHANNEL_NUM``, ``DGT_BLOCK_SIZE``, ``DGT_CONTRIBUTION_ALPHA`` (table
``DGT_ENV``) and the ``MXNET_*`` switches (table in :mod:`geomx.runtime.geomx_switches`).
ps-lite reads these through one place (its ``Environment`` in ``env.h``) and so does
geomx: this module owns

* reading a variable (:func:`env_value`, :func:`int_env`, :func:`bool_env`; a bad value
  raises :class:`ConfigError` naming the variable and what is allowed);
* the roles GeoMX's role variables name (:func:`role_from_dmlc`) and the vocabulary of
  geomx roles they map onto (``ROLES``, ``ROLE_ALIASES``, ``CENTRAL_ROLES``);
* the job's shape as ``--set`` overrides of the scenario (:func:`env_overrides`: the
  ``DMLC_NUM_*`` counts, ps-lite's heartbeats, the ``MXNET_*`` switches, DGT's
  variables) and the totals every process must agree on (:func:`check_dmlc_totals`);
* where the rendezvous is: the DC a ``DMLC_PS_ROOT_PORT`` points at
  (:func:`dc_from_root`), the scheduler addresses ``DMLC_PS_(GLOBAL_)ROOT_URI/PORT``
  give (:func:`dmlc_scheduler_addresses`), an interface's address
  (:func:`interface_ipv4`, ``DMLC_INTERFACE``), GeoMX's demo port base.

How these values rank against CLI flags, ``GEOMX_*`` variables and the scenario file is
decided by :mod:`geomx.runtime.config`, which resolves a node's configuration and uses
this module for everything GeoMX-specific. Two differences from GeoMX, on purpose: geomx
names nodes from the scenario, so a worker or global server without a rank (``--rank`` /
``GEOMX_RANK``) claims the first free one from its scheduler before it starts, in the
order processes ask, as ps-lite numbers nodes at registration
(:mod:`geomx.runtime.rank_claim`), and geomx has no local scheduler in the central DC (the master worker and
global servers register with the global scheduler), so a process started as that
scheduler has nothing to do and exits 0. The full mapping is in docs/real-runtime.md.
"""

from __future__ import annotations

import fcntl
import socket
import struct
import sys
from collections.abc import Mapping
from pathlib import Path

from geomx.runtime.geomx_switches import SwitchError, switch_overrides
from geomx.scenario import Scenario

#: GeoMX's demo global scheduler port; the first rendezvous port when none is configured.
GEOMX_DEFAULT_PORT_BASE = 9092

#: geomx's roles, which GeoMX's role variables (and ``--role`` / ``GEOMX_ROLE``) name.
ROLES = ("global_scheduler", "global_server", "master_worker", "state_server",
         "local_scheduler", "local_server", "worker")
#: Short and GeoMX-ish spellings accepted for ``--role`` / ``GEOMX_ROLE``.
ROLE_ALIASES = {"gh": "global_scheduler", "gs": "global_server", "mw": "master_worker",
                "ss": "state_server", "lh": "local_scheduler", "ls": "local_server",
                "w": "worker", "scheduler": "local_scheduler", "server": "local_server"}
#: The roles that run in the central DC (there, ``DMLC_NUM_SERVER`` counts global servers).
CENTRAL_ROLES = ("global_scheduler", "global_server", "master_worker", "state_server")


class ConfigError(ValueError):
    """A setting that cannot be used; the message names the flag/variable/field.

    Defined here, the lowest module that raises it; :mod:`geomx.runtime.config`
    re-exports it for everyone else.
    """


# ------------------------------------------------------------------ reading a variable

def env_value(env: Mapping[str, str], name: str) -> str | None:
    """A non-empty environment value, stripped; None when unset or empty."""
    v = env.get(name)
    if v is None:
        return None
    v = v.strip()
    return v or None


def int_env(env: Mapping[str, str], name: str, lo: int, hi: int) -> int | None:
    """An integer in ``lo..hi`` from ``env[name]``; None when unset; ConfigError if bad."""
    v = env_value(env, name)
    if v is None:
        return None
    try:
        n = int(v)
    except ValueError:
        raise ConfigError(f"{name}={v!r}: expected an integer in {lo}..{hi}") from None
    if not lo <= n <= hi:
        raise ConfigError(f"{name}={v!r}: out of range; allowed: {lo}..{hi}")
    return n


def bool_env(env: Mapping[str, str], name: str) -> bool | None:
    """A 1/0, true/false, yes/no, on/off from ``env[name]``; None when unset."""
    v = env_value(env, name)
    if v is None:
        return None
    low = v.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}={v!r}: allowed: 1/0, true/false, yes/no, on/off")


def interface_ipv4(name: str) -> str:
    """The IPv4 address of network interface ``name`` (GeoMX's ``DMLC_INTERFACE``).

    Linux: the ``SIOCGIFADDR`` ioctl on a datagram socket; no third-party package. The
    error lists the interfaces that exist (from ``/sys/class/net``).
    """
    sys_net = Path("/sys/class/net")
    known = sorted(p.name for p in sys_net.iterdir()) if sys_net.is_dir() else \
        sorted(n for _, n in socket.if_nameindex())
    if name not in known:
        raise ConfigError(f"DMLC_INTERFACE={name!r}: no such network interface; allowed: "
                          f"{', '.join(known) or 'none found'}")
    if not sys.platform.startswith("linux"):  # pragma: no cover
        raise ConfigError(f"DMLC_INTERFACE is only supported on Linux; set DMLC_NODE_HOST "
                          f"(or GEOMX_HOST) to the address of {name!r} instead")
    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), siocgifaddr,
                                 struct.pack("256s", name.encode()[:15]))
        except OSError as e:
            raise ConfigError(f"DMLC_INTERFACE={name!r}: the interface has no IPv4 address "
                              f"({e.strerror}); set DMLC_NODE_HOST instead") from None
    return socket.inet_ntoa(packed[20:24])


# ------------------------------------------------------------------ who this process is

def role_from_dmlc(env: Mapping[str, str]) -> tuple[str, str] | None:
    """GeoMX's role variables (docs/geomx-behaviour.md §1.1) -> (geomx role, description of
    the source)."""
    g = env_value(env, "DMLC_ROLE_GLOBAL")
    r = env_value(env, "DMLC_ROLE")
    master = bool_env(env, "DMLC_ROLE_MASTER_WORKER")
    if g is not None:
        if g == "global_scheduler":
            return "global_scheduler", "env DMLC_ROLE_GLOBAL"
        if g == "global_server":
            if r not in (None, "server"):
                raise ConfigError(f"DMLC_ROLE_GLOBAL=global_server needs DMLC_ROLE=server (or "
                                  f"unset), got DMLC_ROLE={r!r}")
            return "global_server", "env DMLC_ROLE_GLOBAL"
        raise ConfigError(f"DMLC_ROLE_GLOBAL={g!r}; allowed: global_scheduler, global_server")
    if r is None:
        if master:
            return "master_worker", "env DMLC_ROLE_MASTER_WORKER"
        return None
    if r == "worker":
        return ("master_worker", "env DMLC_ROLE_MASTER_WORKER") if master else \
            ("worker", "env DMLC_ROLE")
    if r == "server":
        return "local_server", "env DMLC_ROLE"
    if r == "scheduler":
        return "local_scheduler", "env DMLC_ROLE"
    raise ConfigError(f"DMLC_ROLE={r!r}; allowed: scheduler, server, worker")


def split_name(name: str) -> tuple[str | None, str | None]:
    """(role, dc) read off a node name's shape, without a scenario (dc None if central)."""
    fixed = {"gh": "global_scheduler", "mw": "master_worker", "ss": "state_server"}
    if name in fixed:
        return fixed[name], None
    kind, _, rest = name.partition(":")
    if kind == "gs":
        return "global_server", None
    if kind in ("lh", "ls"):
        return ("local_scheduler" if kind == "lh" else "local_server"), rest or None
    if kind == "w":
        return "worker", rest.rpartition(":")[0] or None
    return None, None


# ------------------------------------------------------------------ the job's shape

def dmlc_count_overrides(env: Mapping[str, str], s: Scenario, role: str | None,
                         name: str | None, dc_flag: str | None) -> list[tuple[str, str]]:
    """GeoMX's per-process counts as ``--set`` assignments (docs/geomx-behaviour.md §5)."""
    out: list[tuple[str, str]] = []
    central = s.central_dc.name
    if bool_env(env, "DMLC_ENABLE_CENTRAL_WORKER"):
        raise ConfigError("DMLC_ENABLE_CENTRAL_WORKER=1: workers in the central DC are not "
                          "supported by geomx yet; allowed: 0 or unset")
    if env_value(env, "DMLC_LOCAL") not in (None, "0"):
        raise ConfigError("DMLC_LOCAL: ipc:// transport is not supported; geomx always uses "
                          "TCP (loopback on one host); allowed: 0 or unset")
    n_gs = int_env(env, "DMLC_NUM_GLOBAL_SERVER", 1, 45)
    if n_gs is not None:
        out.append((f"dc.{central}.global_servers={n_gs}", "env DMLC_NUM_GLOBAL_SERVER"))
    dc = dc_flag or env_value(env, "GEOMX_DC")
    if name is not None:
        role, dc = split_name(name)
    if dc is None and role not in CENTRAL_ROLES:
        dc = dc_from_root(env, s)
    central_role = role in CENTRAL_ROLES or dc == central
    n_server = int_env(env, "DMLC_NUM_SERVER", 1, 45)
    n_worker = int_env(env, "DMLC_NUM_WORKER", 1, 100000)
    if n_server is not None and role is not None:
        if central_role:
            if n_gs is not None and n_gs != n_server:
                raise ConfigError(f"DMLC_NUM_SERVER={n_server} and DMLC_NUM_GLOBAL_SERVER={n_gs} "
                                  "disagree; in the central DC the servers are the global servers")
            out.append((f"dc.{central}.global_servers={n_server}", "env DMLC_NUM_SERVER"))
        elif n_server != 1:
            raise ConfigError(f"DMLC_NUM_SERVER={n_server}: a party DC has exactly one local "
                              "server (GeoMX checks this too); allowed: 1")
    if n_worker is not None and role is not None:
        if central_role:
            if n_worker != 1:
                raise ConfigError(f"DMLC_NUM_WORKER={n_worker} on a central-DC process: the "
                                  "central DC's only worker is the master worker; allowed: 1")
        elif dc is not None:
            out.append((f"dc.{dc}.workers={n_worker}", "env DMLC_NUM_WORKER"))
    return out


def ps_lite_overrides(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """ps-lite's ``PS_HEARTBEAT_INTERVAL``/``_TIMEOUT`` as ``[membership]`` overrides."""
    out = []
    for var, key in (("PS_HEARTBEAT_INTERVAL", "heartbeat_interval"),
                     ("PS_HEARTBEAT_TIMEOUT", "heartbeat_timeout")):
        v = env_value(env, var)
        if v is not None:
            try:
                seconds = float(v)
            except ValueError:
                raise ConfigError(f"{var}={v!r}: expected seconds (a number)") from None
            out.append((f"membership.{key}={seconds!r}", f"env {var}"))
    return out


#: GeoMX's DGT switches (docs/geomx-behaviour.md §4.4) -> ``[sched]`` keys; the scenario
#: validates the values (an error names the variable and the field).
DGT_ENV = (
    ("ENABLE_DGT", "dgt"),
    ("DMLC_K", "dgt_k"),
    ("DMLC_K_MIN", "dgt_k_min"),
    ("ADAPTIVE_K_FLAG", "dgt_adaptive_k"),
    ("DMLC_UDP_CHANNEL_NUM", "dgt_channels"),
    ("DGT_BLOCK_SIZE", "dgt_block_size"),
    ("DGT_CONTRIBUTION_ALPHA", "dgt_alpha"),
)
#: ENABLE_DGT's values: 1 UDP channels, 2 prioritised TCP, 3 TCP + 4-bit quantisation
DGT_MODE_OF_ENV = {"0": "off", "1": "udp", "2": "tcp", "3": "quant"}


def dgt_overrides(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """DGT's variables (``DGT_ENV``) as ``[sched]`` overrides."""
    out = []
    for var, key in DGT_ENV:
        v = env_value(env, var)
        if v is None:
            continue
        if var == "ENABLE_DGT":
            if v not in DGT_MODE_OF_ENV:
                raise ConfigError(f"ENABLE_DGT={v!r}; allowed: 0 (off), 1 (udp), 2 (tcp), "
                                  "3 (quant)")
            v = f'"{DGT_MODE_OF_ENV[v]}"'
        elif var == "ADAPTIVE_K_FLAG":
            b = bool_env(env, var)
            v = "true" if b else "false"
        out.append((f"sched.{key}={v}", f"env {var}"))
    return out


def env_overrides(env: Mapping[str, str], s: Scenario, role: str | None, name: str | None,
                  dc_flag: str | None) -> list[tuple[str, str]]:
    """Everything the environment says about the job, as ``(--set assignment, source)``.

    In order (later wins): the ``DMLC_NUM_*`` counts, ps-lite's heartbeats, the
    ``MXNET_*`` switches (:mod:`geomx.runtime.geomx_switches`) and DGT's variables.
    """
    out: list[tuple[str, str]] = []
    out += dmlc_count_overrides(env, s, role, name, dc_flag)
    out += ps_lite_overrides(env)
    try:
        out += switch_overrides(env)  # MXNET_KVSTORE_USE_HFA, ... (geomx_switches.py)
    except SwitchError as e:
        raise ConfigError(str(e)) from None
    out += dgt_overrides(env)
    return out


def check_dmlc_totals(env: Mapping[str, str], s: Scenario) -> None:
    """``DMLC_NUM_GLOBAL_WORKER``/``DMLC_NUM_ALL_WORKER`` must match the scenario."""
    n = int_env(env, "DMLC_NUM_GLOBAL_WORKER", 1, 1000)
    parties = [d.name for d in s.party_dcs]
    if n is not None and n != len(parties):
        raise ConfigError(f"DMLC_NUM_GLOBAL_WORKER={n} (the number of party DCs) but the "
                          f"scenario has {len(parties)}: {', '.join(parties)}")
    n = int_env(env, "DMLC_NUM_ALL_WORKER", 1, 10**7)
    if n is not None and n != s.num_all_workers:
        per = ", ".join(f"{d.name}={d.workers}" for d in s.party_dcs)
        raise ConfigError(f"DMLC_NUM_ALL_WORKER={n} but the scenario has {s.num_all_workers} "
                          f"workers ({per}); every process must see the same topology")


# ------------------------------------------------------------------ where the rendezvous is

def dc_from_root(env: Mapping[str, str], s: Scenario) -> str | None:
    """The DC whose local scheduler port is DMLC_PS_ROOT_PORT (GeoMX's demo: 9093 is the
    central DC's, 9094 and 9095 the parties'), narrowed by DMLC_PS_ROOT_URI if needed."""
    port = int_env(env, "DMLC_PS_ROOT_PORT", 1, 65535)
    if port is None:
        return None
    uri = env_value(env, "DMLC_PS_ROOT_URI")
    base = s.real.port_base or GEOMX_DEFAULT_PORT_BASE
    matches = []
    for i, d in enumerate(s.dcs):
        p = (d.scheduler_port if not d.central else 0) or base + 1 + i
        if p == port:
            matches.append(d)
    if len(matches) > 1 and uri is not None:
        matches = [d for d in matches if d.host == uri] or matches
    return matches[0].name if len(matches) == 1 else None


def dmlc_scheduler_addresses(env: Mapping[str, str], files: Mapping[str, tuple[str, str]],
                             known: Mapping[str, str], dc: str, role: str
                             ) -> dict[str, tuple[str, str]]:
    """Scheduler addresses from ``DMLC_PS_(GLOBAL_)ROOT_URI/PORT``: name -> (address, source).

    ``files`` holds the scenario's addresses (``config.file_scheduler_addresses``), which
    fill in the host or port a variable leaves out; ``known`` the scenario's schedulers.
    ``DMLC_PS_ROOT_*`` names the process's own DC's local scheduler, so it counts only
    outside the central DC.
    """
    g_port = int_env(env, "DMLC_PS_GLOBAL_ROOT_PORT", 1, 65535)
    g_uri = env_value(env, "DMLC_PS_GLOBAL_ROOT_URI")
    dmlc: dict[str, tuple[str, str]] = {}
    if g_port is not None or g_uri is not None:
        host0, _, port0 = files["gh"][0].rpartition(":")
        dmlc["gh"] = (f"{g_uri or host0}:{g_port or port0}", "env DMLC_PS_GLOBAL_ROOT_URI/PORT")
    root_port = int_env(env, "DMLC_PS_ROOT_PORT", 1, 65535)
    root_uri = env_value(env, "DMLC_PS_ROOT_URI")
    own_lh = f"lh:{dc}"
    if (root_port is not None or root_uri is not None) and own_lh in known \
            and role not in CENTRAL_ROLES:
        host0, _, port0 = files[own_lh][0].rpartition(":")
        dmlc[own_lh] = (f"{root_uri or host0}:{root_port or port0}",
                        "env DMLC_PS_ROOT_URI/PORT")
    return dmlc
