"""What one ``geomx node`` process runs: settings from CLI flags, environment and scenario.

A node started by hand (or by ssh, Slurm, Kubernetes) must find out who it is, where its
schedulers listen, which address to advertise, and whether to authenticate, without a
launcher. Every setting is resolved here, once, with one precedence rule::

    CLI flag  >  environment (GEOMX_*, then the GeoMX/ps-lite DMLC_* names)  >
    scenario file ([real], [security], [[dc]])  >  built-in default

and each resolved value remembers where it came from (``geomx node --print-config``
shows the table), so a surprising value can be traced to its source.

GeoMX compatibility: what GeoMX's and ps-lite's
environment variables mean -- roles, counts, rendezvous addresses, heartbeats, DGT and
the ``MXNET_*`` switches -- is :mod:`geomx.runtime.dmlc_env`'s (and
:mod:`geomx.runtime.geomx_switches`'); this module decides where those values rank and
resolves the node. The full mapping is in docs/real-runtime.md.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from geomx.cluster import scenario_topology
from geomx.policy.layout import DCShape
from geomx.policy.registry import policy_class
from geomx.runtime.dmlc_env import (CENTRAL_ROLES, GEOMX_DEFAULT_PORT_BASE, ROLE_ALIASES, ROLES,
                                    ConfigError, bool_env, check_dmlc_totals, dc_from_root,
                                    dmlc_scheduler_addresses, env_overrides, env_value, int_env,
                                    interface_ipv4, role_from_dmlc)
from geomx.scenario import (Scenario, ScenarioError, apply_override, parse_scenario,
                            scenario_to_dict)
from geomx.topology import plan_nodes

# ConfigError, GEOMX_DEFAULT_PORT_BASE, the role names and interface_ipv4 live in dmlc_env
# and are imported from here by the rest of geomx and by the tests.
__all__ = [
    "ConfigError", "NothingToRun", "TlsFiles", "NodeConfig", "NodeArgs", "resolve_node_config",
    "GEOMX_DEFAULT_PORT_BASE", "ROLES", "ROLE_ALIASES", "CENTRAL_ROLES", "interface_ipv4",
    "check_address", "env_key", "safe_name", "scheduler_names", "file_scheduler_addresses",
    "scenario_uses_fixed_ports",
]


class NothingToRun(Exception):
    """The requested GeoMX process has no geomx counterpart (reason in the message)."""


@dataclass
class TlsFiles:
    cert: str
    key: str
    ca: str
    verify_clients: bool
    check_hostname: bool


@dataclass
class NodeConfig:
    """Everything ``run_node`` needs; ``sources`` says where each value came from."""

    scenario: Scenario
    name: str
    role: str
    dc: str
    run_dir: Path
    book: dict[str, str]            # scheduler name -> "host:port"
    host: str                        # advertised
    bind_host: str
    port: int                        # listening port (0 = any; schedulers: their book port)
    start_epoch: float
    secret: bytes | None
    tls: TlsFiles | None
    shape: bool
    connect_timeout_s: float
    sources: dict[str, str] = field(default_factory=dict)
    #: the job's shared link budget file on this host (geomx/runtime/link_budget.py);
    #: None = the node keeps its own
    link_budget: str | None = None
    #: what a kernel-shaped WAN (``[real] shaper = "kernel"``) already does, so the node's
    #: own shaper leaves it out: "rate" (bandwidth) or "all" (netem too); None = nothing
    kernel_shapes: str | None = None
    parent_watch: bool = False      # exit when stdin closes (ssh / launcher pipe)
    #: no rank was given: ``name`` is rank 0 of its kind until run_node claims the first
    #: free rank from its scheduler (geomx/runtime/rank_claim.py)
    claim_rank: bool = False

    def describe(self) -> str:
        """The resolution table (``--print-config``); the secret is never shown."""
        rows = [("name", self.name), ("role", self.role), ("dc", self.dc),
                ("scenario", self.scenario.source), ("run_dir", str(self.run_dir)),
                ("host", self.host), ("bind_host", self.bind_host), ("port", str(self.port))]
        rows += [(f"scheduler {n}", a) for n, a in sorted(self.book.items())]
        rows += [("start_epoch", repr(self.start_epoch)),
                 ("secret", "set" if self.secret else "none"),
                 ("tls", "off" if self.tls is None else
                  f"cert={self.tls.cert} key={self.tls.key} ca={self.tls.ca or '(system)'}"),
                 ("shape", str(self.shape)), ("link_budget", self.link_budget or "(own)"),
                 ("connect_timeout_s", f"{self.connect_timeout_s:g}")]
        width = max(len(k) for k, _ in rows)
        lines = []
        for k, v in rows:
            src = self.sources.get(k, "")
            lines.append(f"{k.ljust(width)}  {v}" + (f"   [{src}]" if src else ""))
        return "\n".join(lines)


# ------------------------------------------------------------------ small helpers

def check_address(addr: str, what: str) -> str:
    """``host:port`` (``[v6]:port``) or ConfigError naming ``what``."""
    host, sep, port = str(addr).strip().rpartition(":")
    ok = bool(sep and host.strip("[]") and port.isdigit() and 0 < int(port) < 65536)
    if not ok:
        raise ConfigError(f"{what} = {addr!r}: expected 'host:port' with a port in 1..65535")
    return f"{host}:{int(port)}"


def env_key(node: str) -> str:
    """Environment-variable form of a node name: ``lh:party-a`` -> ``lh_party_a``."""
    return re.sub(r"[^A-Za-z0-9]", "_", node).lower()


def safe_name(node: str) -> str:
    """File-name form of a node name (``w:party-a:0`` -> ``w_party-a_0``)."""
    return node.replace(":", "_").replace("/", "_")


# ------------------------------------------------------------------ rendezvous addresses

def scheduler_names(s: Scenario) -> dict[str, str]:
    """scheduler node name -> DC name, for the schedulers this scenario has: the global
    one and the local tier's, as the job's topology lays them out (a user topology's
    local schedulers get addresses the same way HiPS's do)."""
    layout = plan_nodes(scenario_topology(s), s.central_dc.name,
                        [DCShape(d.name, d.workers) for d in s.party_dcs],
                        global_servers=s.central_dc.global_servers,
                        state_server=policy_class("sync", s.sync.resolved_algorithm)
                        .needs_state_server)
    out = {layout.global_scheduler: s.central_dc.name}
    out.update({lh: dc for dc, lh in layout.local_scheduler_of.items()})
    return out


def file_scheduler_addresses(s: Scenario, *, auto_port_base: int | None = None
                             ) -> dict[str, tuple[str, str]]:
    """Scheduler addresses from the scenario alone: name -> (address, where from).

    Port of DC number i (file order): its ``scheduler_port`` or ``port_base + 1 + i``;
    the global scheduler: ``real.global_scheduler``, else the central DC's host and
    ``scheduler_port`` or ``port_base``. ``port_base = 0`` means ``auto_port_base`` when
    given, else GeoMX's 9092.
    """
    base = s.real.port_base or auto_port_base or GEOMX_DEFAULT_PORT_BASE
    base_src = "file [real].port_base" if s.real.port_base else "default port base 9092"
    index = {d.name: i for i, d in enumerate(s.dcs)}
    out: dict[str, tuple[str, str]] = {}
    for name, dc_name in scheduler_names(s).items():
        d = s.dcs[index[dc_name]]
        if name == "gh" and s.real.global_scheduler:
            out[name] = (s.real.global_scheduler, "file [real].global_scheduler")
            continue
        if d.scheduler_port:
            out[name] = (f"{d.host}:{d.scheduler_port}",
                         f"file dc[{index[dc_name]}].scheduler_port")
        else:
            port = base if name == "gh" else base + 1 + index[dc_name]
            out[name] = (f"{d.host}:{port}", base_src)
    return out


def scenario_uses_fixed_ports(s: Scenario) -> bool:
    """True when the file pins some rendezvous port (a launcher must then use them)."""
    return bool(s.real.port_base or s.real.global_scheduler
                or any(d.scheduler_port for d in s.dcs))


# ------------------------------------------------------------------ the resolver

@dataclass
class NodeArgs:
    """The ``geomx node`` command line (all optional; argparse fills it)."""

    scenario: str | None = None
    overrides: Sequence[str] = ()
    name: str | None = None
    role: str | None = None
    dc: str | None = None
    rank: int | None = None
    run_dir: str | None = None
    book: str | None = None                  # JSON {scheduler: host:port} (launcher)
    schedulers: Sequence[str] = ()           # NAME=HOST:PORT
    global_scheduler: str | None = None
    host: str | None = None
    bind: str | None = None
    port: int | None = None
    start_epoch: float | None = None
    secret_env: str | None = None
    secret_file: str | None = None
    tls: bool | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    shape: bool | None = None
    link_budget: str | None = None           # shared link budget file (launcher)
    kernel_shapes: str | None = None         # "rate" | "all" (kernel-shaped launcher)
    scenario_text: str | None = None         # from --stdin-config
    parent_watch: bool = False

    @classmethod
    def from_namespace(cls, ns: Any) -> "NodeArgs":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in vars(ns).items() if k in names and v is not None})


class _Resolver:
    def __init__(self, args: NodeArgs, env: Mapping[str, str]):
        self.a = args
        self.env = env
        self.sources: dict[str, str] = {}
        self.claim_rank = False

    def pick(self, key: str, *candidates: tuple[Any, str]) -> Any:
        """The first candidate that is not None; remember its source under ``key``."""
        for value, src in candidates:
            if value is not None:
                self.sources[key] = src
                return value
        return None

    # -- scenario ------------------------------------------------------------------------
    def load_scenario(self) -> Scenario:
        a, env = self.a, self.env
        src = None
        if a.scenario_text is not None:
            text, source = a.scenario_text, "<stdin>"
            self.sources["scenario"] = "stdin (launcher)"
        else:
            path = self.pick("scenario", (a.scenario, "cli"),
                             (env_value(env, "GEOMX_SCENARIO"), "env GEOMX_SCENARIO"))
            if path is None:
                self.sources["scenario"] = "default (built-in scenario)"
                text, source = None, "<defaults>"
            else:
                src = path
                try:
                    text, source = Path(path).read_text(), path
                except FileNotFoundError:
                    raise ConfigError(f"scenario file not found: {path} (from "
                                      f"{self.sources['scenario']})") from None
        try:
            raw: dict[str, Any] = (tomllib.loads(text) if text is not None
                                   else scenario_to_dict(Scenario()))
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{src or source}: not valid TOML: {e}") from None
        self._raw, self._source = raw, source
        self._orig = {k: v for k, v in raw.items()} if text is not None else {}
        self._overridden: dict[str, str] = {}
        return self._parse(raw)

    def scenario_src(self, section: str, key: str) -> str:
        """Where a non-array scenario setting came from: an override, the file, or default."""
        path = f"{section}.{key}"
        if path in self._overridden:
            return self._overridden[path]
        table = self._orig.get(section)
        if isinstance(table, Mapping) and key in table:
            return f"file [{section}].{key}"
        return f"default [{section}].{key}"

    def _parse(self, raw: Mapping[str, Any]) -> Scenario:
        try:
            return parse_scenario(raw, source=self._source)
        except ScenarioError as e:
            src = self._overridden.get(e.path)  # a value from the environment: name it
            raise ConfigError(f"{src}: {e}" if src else str(e)) from None

    def apply_overrides(self, overrides: list[tuple[str, str]]) -> Scenario:
        """``(assignment, source)`` pairs, applied in order (later wins)."""
        raw = self._raw
        for assignment, src in overrides:
            self._overridden[assignment.partition("=")[0].strip()] = src
            try:
                raw = apply_override(raw, assignment)
            except ScenarioError as e:
                raise ConfigError(f"{src}: {e}") from None
        self._raw = raw
        return self._parse(raw)


def _parse_name(name: str, s: Scenario) -> tuple[str, str]:
    from geomx.cluster import plan_job

    plan = plan_job(s, "real")
    if name not in plan.roles:
        raise ConfigError(f"no node named {name!r} in this scenario; allowed: "
                          f"{', '.join(plan.nodes)}")
    return plan.roles[name], plan.job.dc_of[name]


def resolve_node_config(args: NodeArgs, env: Mapping[str, str] | None = None, *,
                        now: float | None = None) -> NodeConfig:
    """Resolve one node's settings (CLI > env > file > defaults); ConfigError on bad input.

    In order: the scenario; who this node is (a name, or a role to place by DC and rank);
    GeoMX's environment and ``--set`` as scenario overrides; the name and the schedulers'
    addresses; this node's own address; the run folder and the job clock; secret, TLS
    and shaping. Raises :class:`NothingToRun` for a GeoMX process geomx does not need (the
    central DC's local scheduler).
    """
    env = dict(os.environ if env is None else env)
    r = _Resolver(args, env)
    s = r.load_scenario()
    name, role = _resolve_identity(r, args, env)

    # GeoMX's counts, switches, ... (dmlc_env) become scenario overrides, then --set
    overrides: list[tuple[str, str]] = []
    overrides += env_overrides(env, s, role, name, args.dc)
    overrides += [(o, f"--set {o}") for o in args.overrides]
    if overrides:
        s = r.apply_overrides(overrides)
    check_dmlc_totals(env, s)

    if name is None:
        assert role is not None
        dc = _resolve_dc(r, s, role, env)
        name = _name_for(r, s, role, dc, env)
        if name is None:
            raise NothingToRun(
                f"geomx has no local scheduler in the central DC {dc!r}: the master worker and "
                "the global servers register with the global scheduler. Nothing to run here.")
        r.sources["name"] = "from role, DC and rank"
    role, dc = _parse_name(name, s)
    r.sources.setdefault("role", "from the node name")
    r.sources.setdefault("dc", "from the node name")

    book = _resolve_book(r, s, name, dc, role, env)
    is_scheduler = role in ("global_scheduler", "local_scheduler")
    host = _resolve_host(r, s, args, env, name, dc, book if is_scheduler else None)
    bind = _resolve_bind_host(r, s, args, env, host, book[name] if is_scheduler else None)
    port = _resolve_port(r, args, env, name, book[name] if is_scheduler else None)
    run_dir = r.pick("run_dir", (args.run_dir, "cli --run-dir"),
                     (env_value(env, "GEOMX_RUN_DIR"), "env GEOMX_RUN_DIR"))
    if run_dir is None:
        run_dir = str(Path(s.run.out_dir) / s.run.name)
        r.sources["run_dir"] = "default (<run.out_dir>/<run.name>)"
    start_epoch = _resolve_start_epoch(r, args, env, now)

    secret = _resolve_secret(r, s, env)
    tls = _resolve_tls(r, s, env)
    shape = r.pick("shape", (args.shape, "cli --shape/--no-shape"),
                   (bool_env(env, "GEOMX_SHAPE"), "env GEOMX_SHAPE"),
                   (s.real.shape, r.scenario_src("real", "shape")))
    link_budget = r.pick("link_budget", (args.link_budget, "cli --link-budget"),
                         (env_value(env, "GEOMX_LINK_BUDGET"), "env GEOMX_LINK_BUDGET"))
    kernel_shapes = r.pick("kernel_shapes", (args.kernel_shapes, "cli --kernel-shapes"),
                           (env_value(env, "GEOMX_KERNEL_SHAPES"), "env GEOMX_KERNEL_SHAPES"))
    if kernel_shapes not in (None, "", "rate", "all"):
        raise ConfigError(f"kernel shapes {kernel_shapes!r}: allowed: 'rate', 'all'")
    r.sources["connect_timeout_s"] = r.scenario_src("real", "connect_timeout")
    return NodeConfig(scenario=s, name=name, role=role, dc=dc, run_dir=Path(run_dir), book=book,
                      host=host, bind_host=bind, port=port, start_epoch=start_epoch,
                      secret=secret, tls=tls, shape=bool(shape),
                      connect_timeout_s=s.real.connect_timeout_s, sources=r.sources,
                      link_budget=link_budget or None, kernel_shapes=kernel_shapes or None,
                      parent_watch=args.parent_watch, claim_rank=r.claim_rank)


# ------------------------------------------------------------------ pieces of the resolver

def _resolve_identity(r: _Resolver, args: NodeArgs,
                      env: Mapping[str, str]) -> tuple[str | None, str | None]:
    """Who this node is: ``(name, None)`` when named, else ``(None, role)`` to be placed
    by DC and rank (``--role``, ``GEOMX_ROLE`` or GeoMX's ``DMLC_ROLE*``)."""
    name = r.pick("name", (args.name, "cli --name"),
                  (env_value(env, "GEOMX_NODE"), "env GEOMX_NODE"))
    if name is not None:
        return name, None
    role = role_src = None
    if args.role is not None:
        role, role_src = args.role, "cli --role"
    elif env_value(env, "GEOMX_ROLE") is not None:
        role, role_src = env_value(env, "GEOMX_ROLE"), "env GEOMX_ROLE"
    else:
        dmlc_role = role_from_dmlc(env)
        if dmlc_role is not None:
            role, role_src = dmlc_role
    if role is None:
        raise ConfigError("which node is this? give --name NAME (e.g. w:party-a:0), or "
                          "--role/GEOMX_ROLE with --dc and --rank, or GeoMX's DMLC_ROLE / "
                          "DMLC_ROLE_GLOBAL environment")
    role = ROLE_ALIASES.get(role, role)
    if role not in ROLES:
        raise ConfigError(f"role {role!r} (from {role_src}); allowed: {', '.join(ROLES)} "
                          f"(or {', '.join(sorted(ROLE_ALIASES))})")
    r.sources["role"] = role_src  # type: ignore[assignment]
    return None, role


def _resolve_host(r: _Resolver, s: Scenario, args: NodeArgs, env: Mapping[str, str],
                  name: str, dc: str, book: dict[str, str] | None) -> str:
    """The host peers reach this node at; ``book`` is given for a scheduler, whose
    rendezvous address names it."""
    iface = env_value(env, "DMLC_INTERFACE")
    host = r.pick("host", (args.host, "cli --host"),
                  (env_value(env, "GEOMX_HOST"), "env GEOMX_HOST"),
                  (env_value(env, "DMLC_NODE_HOST"), "env DMLC_NODE_HOST"))
    if host is None and iface is not None:
        host = interface_ipv4(iface)
        r.sources["host"] = f"env DMLC_INTERFACE ({iface})"
    if book is not None:
        book_host = book[name].rpartition(":")[0]
        if host is None:
            host = book_host
            r.sources["host"] = "its scheduler address"
    if host is None:
        dc_cfg = s.dc(dc)
        host = dc_cfg.host
        r.sources["host"] = f"file dc {dc!r} host" if dc_cfg.host != "127.0.0.1" else \
            "default (dc.host)"
    return host.strip("[]")


def _resolve_bind_host(r: _Resolver, s: Scenario, args: NodeArgs, env: Mapping[str, str],
                       host: str, scheduler_address: str | None) -> str:
    """The address this node listens on (its advertised host, unless told otherwise)."""
    kube = bool_env(env, "DMLC_USE_KUBERNETES")
    bind = r.pick("bind_host", (args.bind, "cli --bind"),
                  (env_value(env, "GEOMX_BIND_HOST"), "env GEOMX_BIND_HOST"),
                  ("0.0.0.0" if kube else None, "env DMLC_USE_KUBERNETES"),
                  (s.real.bind_host or None, r.scenario_src("real", "bind_host")))
    if bind is None:
        bind = (scheduler_address.rpartition(":")[0].strip("[]")
                if scheduler_address is not None else host)
        r.sources["bind_host"] = "the advertised host"
    return bind


def _resolve_port(r: _Resolver, args: NodeArgs, env: Mapping[str, str], name: str,
                  scheduler_address: str | None) -> int:
    """A scheduler's rendezvous port (a port given otherwise must agree), or the port
    given, or 0 (any free port)."""
    if scheduler_address is not None:
        port = int(scheduler_address.rpartition(":")[2])
        r.sources["port"] = r.sources.get(f"scheduler {name}", "its scheduler address")
        given = args.port if args.port is not None else int_env(env, "GEOMX_PORT", 0, 65535)
        if given not in (None, 0, port):
            raise ConfigError(f"{name} is a scheduler and listens on its rendezvous port {port}; "
                              f"--port/GEOMX_PORT = {given} disagrees (set the scheduler address "
                              "instead)")
        return port
    port = r.pick("port", (args.port, "cli --port"),
                  (int_env(env, "GEOMX_PORT", 0, 65535), "env GEOMX_PORT"),
                  (int_env(env, "PORT", 0, 65535), "env PORT (ps-lite)"))
    if port is None:
        port = 0
        r.sources["port"] = "default (any free port)"
    return port


def _resolve_start_epoch(r: _Resolver, args: NodeArgs, env: Mapping[str, str],
                         now: float | None) -> float:
    """The job clock's zero in Unix seconds (the launcher's, or now)."""
    epoch_env = env_value(env, "GEOMX_START_EPOCH")
    epoch_val = None
    if epoch_env is not None:
        try:
            epoch_val = float(epoch_env)
        except ValueError:
            raise ConfigError(f"GEOMX_START_EPOCH={epoch_env!r}: expected Unix seconds, "
                              "e.g. 1700000000.5") from None
    start_epoch = r.pick("start_epoch", (args.start_epoch, "cli --start-epoch"),
                         (epoch_val, "env GEOMX_START_EPOCH"))
    if start_epoch is None:
        start_epoch = time.time() if now is None else now
        r.sources["start_epoch"] = "default (now)"
    if not math.isfinite(start_epoch):
        raise ConfigError(f"start epoch {start_epoch!r} is not a finite number of seconds")
    return start_epoch


def _resolve_dc(r: _Resolver, s: Scenario, role: str, env: Mapping[str, str]) -> str:
    names = [d.name for d in s.dcs]
    given = r.pick("dc", (r.a.dc, "cli --dc"), (env_value(env, "GEOMX_DC"), "env GEOMX_DC"))
    central = s.central_dc.name
    if given is not None and given not in names:
        raise ConfigError(f"DC {given!r} (from {r.sources['dc']}); allowed: {', '.join(names)}")
    if role in CENTRAL_ROLES:
        if given is not None and given != central:
            raise ConfigError(f"a {role} runs in the central DC {central!r}, not {given!r}")
        r.sources.setdefault("dc", "central DC (role)")
        return central
    if given is not None:
        return given
    dc = dc_from_root(env, s)
    if dc is not None:
        r.sources["dc"] = "env DMLC_PS_ROOT_URI/PORT (matches the DC's scheduler port)"
        return dc
    parties = [d.name for d in s.party_dcs]
    if len(parties) == 1:
        r.sources["dc"] = "the only party DC"
        return parties[0]
    raise ConfigError(f"which DC does this {role} belong to? set --dc or GEOMX_DC (allowed: "
                      f"{', '.join(parties)}), or DMLC_PS_ROOT_PORT to that DC's scheduler port")


def _name_for(r: _Resolver, s: Scenario, role: str, dc: str, env: Mapping[str, str]) -> str | None:
    if role == "global_scheduler":
        return "gh"
    if role == "master_worker":
        return "mw"
    if role == "state_server":
        return "ss"
    if role == "local_scheduler":
        if s.dc(dc).central:
            return None
        return f"lh:{dc}"
    if role == "local_server":
        if s.dc(dc).central:
            raise ConfigError(f"DMLC_ROLE=server in the central DC {dc!r} is a global server: "
                              "add DMLC_ROLE_GLOBAL=global_server (or --role global_server)")
        return f"ls:{dc}"
    count = s.central_dc.global_servers if role == "global_server" else s.dc(dc).workers
    rank = r.pick("rank", (r.a.rank, "cli --rank"),
                  (int_env(env, "GEOMX_RANK", 0, 10**6), "env GEOMX_RANK"))
    if rank is None:
        rank = 0
        if count != 1:
            r.claim_rank = True
            r.sources["rank"] = ("claimed from the scheduler at start-up: the first free one "
                                 "(ps-lite's registration order)")
        else:
            r.sources["rank"] = "the only one"
    if not 0 <= rank < count:
        raise ConfigError(f"rank {rank} (from {r.sources['rank']}); allowed: 0..{count - 1}")
    return f"gs:{rank}" if role == "global_server" else f"w:{dc}:{rank}"


def _resolve_book(r: _Resolver, s: Scenario, name: str, dc: str, role: str,
                  env: Mapping[str, str]) -> dict[str, str]:
    """Every scheduler's address, each with its own precedence chain."""
    import json

    a = r.a
    known = scheduler_names(s)
    cli: dict[str, tuple[str, str]] = {}
    if a.book:
        try:
            book = json.loads(a.book)
        except ValueError as e:
            raise ConfigError(f"--book: not JSON ({e})") from None
        if not isinstance(book, dict):
            raise ConfigError("--book: expected a JSON object {scheduler: 'host:port'}")
        for k, v in book.items():
            cli[str(k)] = (str(v), "cli --book")
    for item in a.schedulers:
        k, sep, v = item.partition("=")
        if not sep:
            raise ConfigError(f"--scheduler {item!r}: expected NAME=HOST:PORT, e.g. "
                              "lh:party-a=10.0.0.2:9094")
        cli[k.strip()] = (v.strip(), "cli --scheduler")
    if a.global_scheduler:
        cli["gh"] = (a.global_scheduler, "cli --global-scheduler")
    for k in cli:
        if k not in known:
            raise ConfigError(f"scheduler {k!r} (from {cli[k][1]}); allowed: "
                              f"{', '.join(known)}")
    env_book: dict[str, tuple[str, str]] = {}
    by_key = {env_key(n): n for n in known}
    for var, value in env.items():
        if not var.startswith("GEOMX_SCHEDULER_") or not value.strip():
            continue
        suffix = var[len("GEOMX_SCHEDULER_"):]
        target = by_key.get(suffix.lower())
        if target is None:
            allowed = ", ".join(f"GEOMX_SCHEDULER_{env_key(n)}" for n in known)
            raise ConfigError(f"{var}: no scheduler {suffix!r} in this scenario; "
                              f"allowed: {allowed}")
        env_book[target] = (value.strip(), f"env {var}")
    if env_value(env, "GEOMX_GLOBAL_SCHEDULER") is not None and "gh" not in env_book:
        env_book["gh"] = (env_value(env, "GEOMX_GLOBAL_SCHEDULER"), "env GEOMX_GLOBAL_SCHEDULER")
    files = file_scheduler_addresses(s)
    dmlc = dmlc_scheduler_addresses(env, files, known, dc, role)
    out: dict[str, str] = {}
    for sched in known:
        for layer in (cli, env_book, dmlc, files):
            if sched in layer:
                addr, src = layer[sched]
                out[sched] = check_address(addr, f"address of {sched} (from {src})")
                r.sources[f"scheduler {sched}"] = src
                break
    return out


def _resolve_secret(r: _Resolver, s: Scenario, env: Mapping[str, str]) -> bytes | None:
    a = r.a
    path = a.secret_file
    src = "cli --secret-file"
    if path is None and env_value(env, "GEOMX_SECRET_FILE") is not None:
        path, src = env_value(env, "GEOMX_SECRET_FILE"), "env GEOMX_SECRET_FILE"
    if path is not None:
        try:
            data = Path(path).read_bytes().rstrip(b"\r\n")
        except OSError as e:
            raise ConfigError(f"secret file {path!r} (from {src}): {e.strerror}") from None
        if not data:
            raise ConfigError(f"secret file {path!r} (from {src}) is empty")
        r.sources["secret"] = src
        return data
    var = r.pick("secret_env", (a.secret_env, "cli --secret-env"),
                 (env_value(env, "GEOMX_SECRET_ENV"), "env GEOMX_SECRET_ENV"),
                 (s.security.secret_env, r.scenario_src("security", "secret_env")))
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", var):
        raise ConfigError(f"secret variable name {var!r} (from {r.sources['secret_env']}): "
                          "allowed: an environment variable name")
    value = env.get(var)
    if value:
        r.sources["secret"] = f"env {var}"
        return value.encode()
    if s.security.require_secret:
        raise ConfigError(f"security.require_secret = true but the environment variable {var} "
                          f"(named by {r.sources['secret_env']}) is unset or empty")
    r.sources["secret"] = f"none ({var} unset)"
    return None


def _resolve_tls(r: _Resolver, s: Scenario, env: Mapping[str, str]) -> TlsFiles | None:
    a, sec = r.a, s.security
    on = r.pick("tls", (a.tls, "cli --tls/--no-tls"),
                (bool_env(env, "GEOMX_TLS"), "env GEOMX_TLS"),
                (sec.tls, r.scenario_src("security", "tls")))
    if not on:
        return None

    def path(key: str, flag: str | None, var: str, file_value: str) -> str:
        v = r.pick(f"tls_{key}", (flag, f"cli --tls-{key}"), (env_value(env, var), f"env {var}"),
                   (file_value or None, r.scenario_src("security", f"tls_{key}")))
        if v is None:
            return ""
        if not Path(v).is_file():
            raise ConfigError(f"TLS {key} file {v!r} (from {r.sources[f'tls_{key}']}) not found")
        return v

    cert = path("cert", a.tls_cert, "GEOMX_TLS_CERT", sec.tls_cert)
    key = path("key", a.tls_key, "GEOMX_TLS_KEY", sec.tls_key)
    ca = path("ca", a.tls_ca, "GEOMX_TLS_CA", sec.tls_ca)
    if not cert or not key:
        missing = [k for k, v in (("tls_cert", cert), ("tls_key", key)) if not v]
        raise ConfigError(f"TLS is on (from {r.sources['tls']}) but {' and '.join(missing)} "
                          "is not set; give [security].tls_cert/tls_key, GEOMX_TLS_CERT/"
                          "GEOMX_TLS_KEY or --tls-cert/--tls-key")
    verify = bool_env(env, "GEOMX_TLS_VERIFY_CLIENTS")
    check = bool_env(env, "GEOMX_TLS_CHECK_HOSTNAME")
    tls = TlsFiles(cert=cert, key=key, ca=ca,
                   verify_clients=sec.tls_verify_clients if verify is None else verify,
                   check_hostname=sec.tls_check_hostname if check is None else check)
    if tls.verify_clients and not tls.ca:
        raise ConfigError("tls_verify_clients needs tls_ca (the CA that signs the nodes' "
                          "certificates)")
    return tls
