"""``geomx launch --hostfile FILE``: which host runs each DC's nodes, and the ssh commands.

The hostfile maps DC names to hosts, one line per host (MPI/Horovod-style, not a cluster
manager)::

    # DC       ssh target         options (all optional)
    central    10.0.0.1
    party-a    alice@10.0.1.7     address=192.168.1.7 python=/opt/geomx/bin/python
    party-a    10.0.1.8           cwd=/srv/geomx
    party-b    node-b.example.org

* ``ssh target`` -- what ``ssh`` is given (``[user@]host``);
* ``address=`` -- the address the node advertises to its peers (default: the target's
  host part); ``bind=`` -- the address it listens on (default: ``address``; ``0.0.0.0``
  for every interface, e.g. behind NAT); ``python=`` -- the interpreter with geomx
  installed (default ``python3``); ``cwd=`` -- directory to run in (default: the login
  directory).

A DC with several lines spreads its nodes round-robin over them, its scheduler on the
first. Every DC of the scenario must appear; the scheduler addresses become the
hostfile's first host per DC and ``[real]`` ports (GeoMX's 9092, 9093, ... by default).

Each node is started as ``ssh TARGET 'cd CWD && exec PYTHON -m geomx node --stdin-config
--name NAME ...'``: the scenario text and the forwarded environment (the shared secret,
``GEOMX_*``) travel on the ssh session's stdin, never on a command line, and the remote
node exits when that stdin closes, so stopping the launcher (or losing the ssh
connection) stops the remote node as well.
"""

from __future__ import annotations

import difflib
import json
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from geomx.runtime.config import ConfigError, GEOMX_DEFAULT_PORT_BASE, scheduler_names
from geomx.scenario import Scenario

OPTIONS = ("address", "bind", "python", "cwd")


@dataclass(frozen=True)
class HostEntry:
    dc: str
    target: str               # ssh destination, [user@]host
    address: str              # what peers dial
    python: str = "python3"
    cwd: str = ""
    bind: str = ""            # "" = address
    line: int = 0


def parse_hostfile(text: str, source: str = "<hostfile>") -> list[HostEntry]:
    """Entries in file order; ConfigError naming the line for anything malformed."""
    out = []
    for i, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = shlex.split(line)
        if len(parts) < 2:
            raise ConfigError(f"{source}:{i}: expected 'DC HOST [address=IP] [bind=IP] "
                              f"[python=PATH] [cwd=DIR]', got {raw.strip()!r}")
        dc, target, *opts = parts
        values: dict[str, str] = {}
        for opt in opts:
            key, sep, value = opt.partition("=")
            if not sep or key not in OPTIONS:
                hint = difflib.get_close_matches(key, OPTIONS, n=1)
                raise ConfigError(f"{source}:{i}: unknown option {opt!r}"
                                  + (f" (did you mean {hint[0]!r}?)" if hint else "")
                                  + f"; allowed: {', '.join(o + '=...' for o in OPTIONS)}")
            values[key] = value
        host = target.rpartition("@")[2]
        out.append(HostEntry(dc=dc, target=target, address=values.get("address", host),
                             python=values.get("python", "python3"), cwd=values.get("cwd", ""),
                             bind=values.get("bind", ""), line=i))
    if not out:
        raise ConfigError(f"{source}: no hosts (expected lines of 'DC HOST')")
    return out


def load_hostfile(path: str | os.PathLike) -> list[HostEntry]:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"hostfile {os.fspath(path)!r}: {e.strerror}") from None
    return parse_hostfile(text, os.fspath(path))


def assign_hosts(s: Scenario, entries: list[HostEntry], nodes: list[str],
                 dc_of: Mapping[str, str]) -> dict[str, HostEntry]:
    """node -> host: each DC's nodes round-robin over its hostfile lines, in node order."""
    names = [d.name for d in s.dcs]
    by_dc: dict[str, list[HostEntry]] = {}
    for e in entries:
        if e.dc not in names:
            hint = difflib.get_close_matches(e.dc, names, n=1)
            raise ConfigError(f"hostfile line {e.line}: unknown DC {e.dc!r}"
                              + (f" (did you mean {hint[0]!r}?)" if hint else "")
                              + f"; allowed: {', '.join(names)}")
        by_dc.setdefault(e.dc, []).append(e)
    missing = [n for n in names if n not in by_dc]
    if missing:
        raise ConfigError(f"hostfile has no host for DC(s) {', '.join(missing)}; every DC of "
                          f"the scenario needs a line 'DC HOST'")
    out: dict[str, HostEntry] = {}
    count: dict[str, int] = {}
    for n in nodes:
        dc = dc_of[n]
        k = count.get(dc, 0)
        out[n] = by_dc[dc][k % len(by_dc[dc])]
        count[dc] = k + 1
    return out


def hostfile_book(s: Scenario, hosts: Mapping[str, HostEntry]) -> dict[str, str]:
    """Scheduler addresses: the host each scheduler was placed on, at the ``[real]`` port."""
    base = s.real.port_base or GEOMX_DEFAULT_PORT_BASE
    index = {d.name: i for i, d in enumerate(s.dcs)}
    book = {}
    for sched, dc in scheduler_names(s).items():
        d = s.dcs[index[dc]]
        if sched == "gh" and s.real.global_scheduler:
            book[sched] = s.real.global_scheduler
            continue
        port = d.scheduler_port or (base if sched == "gh" else base + 1 + index[dc])
        addr = hosts[sched].address
        book[sched] = f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"
    return book


def remote_node_command(entry: HostEntry, name: str, run_dir: str, book: Mapping[str, str],
                        start_epoch: float, *, ssh: list[str]) -> list[str]:
    """The local argv that starts node ``name`` on ``entry`` over ssh.

    The remote part is one shell command line (ssh passes a string to the remote shell);
    every piece is quoted with :func:`shlex.quote`.
    """
    node = [entry.python, "-m", "geomx", "node", "--stdin-config", "--name", name,
            "--run-dir", run_dir, "--book", json.dumps(dict(book), sort_keys=True),
            "--start-epoch", repr(start_epoch), "--host", entry.address,
            "--bind", entry.bind or entry.address]
    remote = "exec " + " ".join(shlex.quote(a) for a in node)
    if entry.cwd:
        remote = f"cd {shlex.quote(entry.cwd)} && {remote}"
    return [*ssh, "-o", "BatchMode=yes", entry.target, remote]


def forwarded_env(s: Scenario, env: Mapping[str, str]) -> dict[str, str]:
    """What a remote node gets from the launcher's environment: ``GEOMX_*`` settings and
    the secret variable named by ``[security].secret_env`` (never the per-node ones)."""
    skip = {"GEOMX_NODE", "GEOMX_ROLE", "GEOMX_DC", "GEOMX_RANK", "GEOMX_HOST", "GEOMX_PORT",
            "GEOMX_BIND_HOST", "GEOMX_RUN_DIR", "GEOMX_SCENARIO", "GEOMX_START_EPOCH"}
    out = {k: v for k, v in env.items()
           if k.startswith("GEOMX_") and k not in skip and not k.startswith("GEOMX_SCHEDULER_")}
    var = s.security.secret_env
    if env.get(var):
        out[var] = env[var]
    return out
