"""Start every node of a scenario as its own process and supervise them.

``geomx run SCENARIO --runtime real`` and ``geomx launch SCENARIO`` land here: every node
runs as ``python -m geomx node ...`` on this host. ``geomx launch --hostfile FILE`` starts
each DC's nodes on the hosts the file names, as ``ssh HOST geomx node ...`` (see
:mod:`geomx.runtime.hostfile`). Either way the launcher fixes the schedulers' addresses
(the rendezvous points every node is told up front, like GeoMX's DMLC_PS_ROOT_* ports),
shows progress from the evaluator's event file, and when one process fails stops all the
others and names it. At the end it merges the per-process event files and counters into
the run folder's standard files, so a real run leaves the same schema as an emulated one.

Children get a pipe as stdin and watch it (``--watch-stdin``): if the launcher dies
without cleaning up, every node sees end-of-file and exits instead of lingering. The same
pipe carries deaths: when a node dies, the launcher writes an *abort line* (JSON,
``{"abort": NODE, "how": ...}``) to every other node, which then fails naming it; when the
job may survive that node (a worker with ``on_worker_loss = "continue"``, a server with
``on_server_loss = "wait"``), a *died line* (``{"died": NODE, ...}``) instead, for its
schedulers to judge. Nodes notice a death themselves (heartbeats, failure notices to their
schedulers), but not that of a node killed before it ever registered: only the process
that started it knows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import shlex
import signal
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable

from geomx.cluster import plan_job
from geomx.errors import JobFailed
from geomx.metrics.channel_tally import DgtTally
from geomx.metrics.counters import ByteCounters
from geomx.metrics.progress import ProgressBar, ProgressWriter, read_progress
from geomx.metrics.recorder import iter_events, merge_event_files
from geomx.metrics.summary import Summary, build_summary
from geomx.node.checkpoint import note_crash
from geomx.runtime.config import file_scheduler_addresses, safe_name, scenario_uses_fixed_ports
from geomx.runtime.forked import fork_command, fork_usable, preload, signals_deferred
from geomx.scenario import Scenario, scenario_to_toml
from geomx.threads import THREADS_VAR, threads_per_worker

#: Seconds the launcher waits for the job before declaring it hung (unless the scenario
#: sets run.max_wall_time, in which case that plus a grace period).
DEFAULT_JOB_TIMEOUT_S = 1800.0


#: Where rendezvous ports are drawn from when the kernel's ephemeral range is unknown.
FALLBACK_PORT_RANGE = (10000, 32767)


def ephemeral_port_range() -> tuple[int, int]:
    """The kernel's range for ports it hands out itself (outgoing connections, bind(0))."""
    try:
        lo, hi = (int(x) for x in
                  Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                       socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port_block(host: str = "127.0.0.1", count: int = 1, *, tries: int = 200) -> int:
    """First of ``count`` consecutive ports that are free now, outside the ephemeral range.

    A port picked now is bound later by a node process; a port from the kernel's
    ephemeral range could meanwhile become the source port of any outgoing connection on
    the machine (seen on busy test machines). Like ps-lite (random ports in 10000-49999
    when binding fails), draw at random below that range instead.
    """
    host = "127.0.0.1" if host == "localhost" else host
    lo_eph, hi_eph = ephemeral_port_range()
    lo, hi = FALLBACK_PORT_RANGE
    if lo_eph - 1 - lo >= 1000:
        hi = lo_eph - 1
    elif 65535 - hi_eph >= 1000:
        lo, hi = hi_eph + 1, 65535
    rng = random.Random()
    for _ in range(tries):
        base = rng.randrange(lo, hi - count + 2)
        if all(_bindable(host, base + i) for i in range(count)):
            return base
    raise OSError(f"no {count} free consecutive port(s) on {host} in {lo}..{hi}")


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now on ``host``, outside the kernel's ephemeral range."""
    return free_port_block(host, 1)


def scheduler_book(s: Scenario, plan: Any) -> dict[str, str]:
    """Addresses of the schedulers for a job started on this host.

    Ports the scenario pins (``[real]``, ``dc.scheduler_port``) are used as given;
    otherwise each scheduler gets a free port, so that several jobs (and test runs) can
    share the host.
    """
    if scenario_uses_fixed_ports(s):
        return {name: addr for name, (addr, _) in file_scheduler_addresses(s).items()}
    hosts = {d.name: d.host for d in s.dcs}
    book: dict[str, str] = {}
    for name, role in plan.roles.items():
        if role in ("global_scheduler", "local_scheduler"):
            host = hosts[plan.job.dc_of[name]]
            while True:
                port = free_port(host)
                if f"{host}:{port}" not in book.values():
                    break
            book[name] = f"{host}:{port}"
    return book


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@dataclass
class _Child:
    """One node's process (a local ``geomx node`` or the ssh client running it remotely)."""

    name: str
    proc: subprocess.Popen
    log: IO[str]
    stdin_doc: bytes = b""
    exit_seen: float | None = None


@dataclass
class RemoteOptions:
    """Hostfile mode: where each node runs and how to reach it."""

    hostfile: str
    ssh: list[str] = field(default_factory=lambda: ["ssh"])
    env: dict[str, str] | None = None  # the environment to forward from (default os.environ)


def _start(cmd: list[str], log_path: Path, env: dict[str, str], name: str,
           stdin_doc: bytes = b"", *, into: dict[str, _Child], fork: bool = False) -> _Child:
    """Start one node's process and put it in ``into`` under ``name``. With ``fork`` a
    local ``python -m geomx node ...`` command is forked from this process instead of
    exec'd (geomx/runtime/forked.py: the same process, without a fresh interpreter's
    imports); the nodes already in ``into`` have their stdin pipes closed in it, and
    Ctrl-C waits until it is in ``into`` (so the launcher can stop it)."""
    log_file = open(log_path, "w")
    if fork and cmd[:4] == [sys.executable, "-m", "geomx", "node"]:
        others = list(into.values())
        with signals_deferred():
            proc = fork_command(cmd[3:], log_file, env, lambda: _close_in_child(others))
            child = into[name] = _Child(name, proc, log_file, stdin_doc)
    else:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.PIPE, start_new_session=True)
        child = into[name] = _Child(name, proc, log_file, stdin_doc)
    if stdin_doc:
        try:
            proc.stdin.write(stdin_doc)  # type: ignore[union-attr]
            proc.stdin.flush()  # type: ignore[union-attr]
        except (BrokenPipeError, OSError):
            pass  # it died at once; the supervisor reports it
    return child


def _close_in_child(others: list[_Child]) -> None:
    """In a forked node: the launcher's ends of the other nodes' stdin pipes (so each
    node still sees end-of-file when the launcher is gone) and their log files."""
    for c in others:
        for f in (c.proc.stdin, c.log):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass


def _local_commands(s: Scenario, plan: Any, run_dir: Path, book: dict[str, str],
                    start_epoch: float, kernel: Any = None) -> dict[str, tuple[list[str], bytes]]:
    """Each node's command line; with ``kernel`` (a :class:`~geomx.runtime.kernel_wan.KernelWan`)
    inside its DC's namespace, bound to the DC's address there."""
    out = {}
    budget = _link_budget(s, plan, run_dir)
    for name in plan.nodes:
        cmd = [sys.executable, "-m", "geomx", "node", str(run_dir / "scenario.toml"),
               "--name", name, "--run-dir", str(run_dir), "--book", json.dumps(book),
               "--start-epoch", repr(start_epoch), "--watch-stdin"]
        cmd += ["--link-budget", str(budget)] if budget else []
        if kernel is not None:
            dc = plan.job.dc_of[name]
            cmd = kernel.exec_argv(dc, cmd + ["--host", kernel.address(dc),
                                              "--kernel-shapes", kernel.kernel_shapes])
        out[name] = (cmd, b"")
    return out


def _kernel_book(s: Scenario, plan: Any, kernel: Any) -> dict[str, str]:
    """Scheduler addresses inside the DCs' namespaces (every port is free there; one from
    this host's free ports keeps them apart from anything else the user runs)."""
    book: dict[str, str] = {}
    for name, role in plan.roles.items():
        if role in ("global_scheduler", "local_scheduler"):
            book[name] = f"{kernel.address(plan.job.dc_of[name])}:{free_port('127.0.0.1')}"
    return book


def _link_budget(s: Scenario, plan: Any, run_dir: Path) -> Path | None:
    """The job's shared link budget file (every node is on this host), or None when
    ``[real] shape`` or ``shared_links`` is off (geomx/runtime/link_budget.py)."""
    if not (s.real.shape and s.real.shared_links):
        return None
    from geomx.runtime.link_budget import create_budget_file
    from geomx.runtime.wan_shapes import LinkTable

    table = LinkTable(s, list(plan.nodes), plan.job.dc_of)
    return create_budget_file(run_dir / "link_budget.bin", len(table))


def _remote_commands(s: Scenario, plan: Any, run_dir: Path, start_epoch: float,
                     remote: RemoteOptions) -> tuple[dict[str, tuple[list[str], bytes]],
                                                     dict[str, str]]:
    from geomx.runtime.hostfile import (assign_hosts, forwarded_env, hostfile_book,
                                        load_hostfile, remote_node_command)

    entries = load_hostfile(remote.hostfile)
    order = _start_order(plan)
    hosts = assign_hosts(s, entries, order, plan.job.dc_of)
    book = hostfile_book(s, hosts)
    doc = json.dumps({"scenario": scenario_to_toml(s),
                      "env": forwarded_env(s, remote.env if remote.env is not None
                                           else dict(os.environ))}) + "\n"
    out = {}
    for name in order:
        cmd = remote_node_command(hosts[name], name, str(run_dir), book, start_epoch,
                                  ssh=remote.ssh)
        out[name] = (cmd, doc.encode())
    return out, book


def _start_order(plan: Any) -> list[str]:
    """Schedulers first (they own the fixed ports), then servers, then workers."""
    return sorted(plan.nodes, key=lambda n: (0 if "scheduler" in plan.roles[n] else
                                              1 if "server" in plan.roles[n] else 2))


def run_real(s: Scenario, run_dir: Path, *, progress: bool = True,
             timeout_s: float | None = None, remote: RemoteOptions | None = None) -> Summary:
    """Run the scenario as one process per node; return the run's summary.

    Without ``remote`` every node runs on this host; with it, over ssh on the hosts of
    ``remote.hostfile``.
    """
    plan = plan_job(s, "real")
    if s.training.model == "phantom":
        raise ValueError("training.model = 'phantom' has no data to send over real sockets; "
                         "use the emulator (--runtime emu) for phantom models")
    kernel = None
    if s.real.shape and s.real.shaper == "kernel":
        if remote is not None:
            raise ValueError('[real] shaper = "kernel" builds the WAN on this host; it cannot '
                             "shape a job spread over a hostfile's hosts (use \"userspace\")")
        from geomx.runtime.kernel_wan import KernelWan

        kernel = KernelWan(s)
    with (kernel if kernel is not None else contextlib.nullcontext()):
        return _run_real(s, plan, run_dir, progress, timeout_s, remote, kernel)


def _run_real(s: Scenario, plan: Any, run_dir: Path, progress: bool, timeout_s: float | None,
              remote: RemoteOptions | None, kernel: Any) -> Summary:
    start_epoch = time.time()
    if kernel is not None:
        book = _kernel_book(s, plan, kernel)
        commands = _local_commands(s, plan, run_dir, book, start_epoch, kernel)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "kernel_wan.sh").write_text(
            "# what the kernel-shaped WAN of this run was built with (deleted after it)\n"
            + "".join(shlex.join(c) + "\n" for c in kernel.commands))
    elif remote is None:
        book = scheduler_book(s, plan)
        commands = _local_commands(s, plan, run_dir, book, start_epoch)
    else:
        commands, book = _remote_commands(s, plan, run_dir, start_epoch, remote)
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    # local nodes are forked from here where that is safe (no ssh, no network namespace)
    fork = kernel is None and remote is None and fork_usable()
    if fork:
        preload(plan.train.program)
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if remote is None and THREADS_VAR not in env:  # each worker its share (geomx/threads.py)
        workers = sum(role == "worker" for role in plan.roles.values())
        env[THREADS_VAR] = str(threads_per_worker(workers, os.cpu_count()))
    (run_dir / "launch.json").write_text(json.dumps(
        {"start_epoch": start_epoch, "start": "fork" if fork else "exec", "schedulers": book,
         "commands": {n: shlex.join(c) for n, (c, _) in commands.items()},
         THREADS_VAR: env.get(THREADS_VAR)}, indent=1))
    children: dict[str, _Child] = {}
    wall0 = time.perf_counter()

    def relaunch(name: str) -> subprocess.Popen:
        """A crash fault with a duration: the node's command again, with ``--rejoin`` (a
        new process takes over its name)."""
        cmd, doc = commands[name]
        children[name].log.close()
        return _start([*cmd, "--rejoin"], logs / f"{safe_name(name)}.rejoined.log", env, name,
                      doc, fork=fork and fork_usable(), into=children).proc

    try:
        for name in _start_order(plan):
            cmd, doc = commands[name]
            _start(cmd, logs / f"{safe_name(name)}.log", env, name, doc, fork=fork,
                   into=children)
        failure = _supervise(s, plan, children, run_dir, wall0, progress, timeout_s,
                             relaunch)
    except BaseException:  # Ctrl-C, while starting or after: stop every node started
        _stop_all({n: c.proc for n, c in children.items()})
        raise
    finally:
        for c in children.values():
            c.log.close()
    if failure is not None:
        raise JobFailed(failure)
    wall_s = time.perf_counter() - wall0
    return collect_summary(s, plan, run_dir, wall_s)


def _supervise(s: Scenario, plan: Any, children: dict[str, _Child], run_dir: Path,
               wall0: float, progress: bool, timeout_s: float | None,
               relaunch: Callable[[str], subprocess.Popen] | None = None) -> str | None:
    """Follow the job until every process has exited; the failure text, or None.

    Every 0.1 s: inject the crash faults now due and start again the crashed servers
    whose downtime is over (:class:`_Watch`); tell the others of a death the job may
    survive; on the first other death, tell every node to stop and give them ``grace_s``
    to exit by themselves naming it (stragglers are then killed); past the time limit,
    fail the job.
    """
    procs = {n: c.proc for n, c in children.items()}
    limit = timeout_s or (s.run.max_wall_time_s + 120 if s.run.max_wall_time_s > 0
                          else DEFAULT_JOB_TIMEOUT_S)
    evaluator_events = run_dir / "nodes" / f"{safe_name(plan.train.evaluator)}.events.jsonl"
    bar = ProgressBar(plan.train.iterations, enabled=progress, time_label="wall")
    seen = 0
    failure: str | None = None
    # After a node dies, the others get this long to notice (heartbeats) and exit on their
    # own, non-zero, naming it; stragglers are then killed.
    hb = s.membership
    grace_s = (2 * hb.heartbeat_timeout_s + 10.0) if hb.heartbeat_interval_s > 0 else 5.0
    drain_deadline: float | None = None
    first: str | None = None
    first_how = ""
    watch = _Watch.of(s, plan, procs, run_dir, wall0, relaunch)
    try:
        while True:
            now = time.perf_counter()
            watch.inject_crashes(now)
            watch.restart_due(now)
            running = {n: p for n, p in procs.items() if p.poll() is None}
            bad = watch.deaths_not_survived(now)
            if bad and failure is None:
                first, first_how = watch.first_death(bad)
                failure = f"node {first} {first_how}"
                drain_deadline = now + grace_s
                _tell(procs, ABORT_KEY, first, first_how)
            if not running:
                break
            if drain_deadline is not None and now > drain_deadline:
                break
            if drain_deadline is None and now - wall0 > limit:
                failure = (f"job did not finish within {limit:.0f} s; still running: "
                           f"{', '.join(sorted(running))}")
                break
            seen = _follow_progress(evaluator_events, seen, bar)
            time.sleep(0.1)
    except BaseException:
        failure = failure or "interrupted"
        _stop_all(procs)
        raise
    finally:
        if failure is not None:
            stops = _stop_after_failure(procs)
            if first is not None:
                order = sorted(procs, key=lambda n: watch.exit_seen.get(n, float("inf")))
                failure = _failure_headline(run_dir, procs, first, first_how, order)
            failure += stops
        _close_stdins(procs)
        bar.close()
    return failure


_FAILED_LINE = re.compile(r"^geomx node (\S+): failed: (\w+): (.*)$")
_RELAYED = re.compile(r"^node (\S+) (failed: |was killed|exited with)")


def _own_failure(log_path: Path) -> tuple[str, str] | None:
    """The last ``geomx node N: failed: TYPE: TEXT`` line of a node's log (node_main's
    final line), as ``(TYPE, TEXT)``; None when the node wrote none."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines[-200:]):
        m = _FAILED_LINE.match(line)
        if m:
            return m.group(2), m.group(3)
    return None


def _failure_headline(run_dir: Path, procs: dict[str, subprocess.Popen], first: str,
                      first_how: str, order: list[str]) -> str:
    """The job's failure text, headed by the node the failure started on.

    The first process to exit is often a victim: a node that heard of a peer's failure
    (``NodeFailure: node X failed: ...``) and stopped. Every node's last log line says
    why it stopped, so the origin is the node whose own line is not such a relayed
    failure; it leads, as the emulator's headline does (``node X failed: REASON``), with
    the tail of its log (the earliest to exit, in ``order``, when several failed on their
    own). A node killed from outside writes no such line: then the first death leads."""
    logs = run_dir / "logs"
    origin, headline = first, f"node {first} {first_how}"
    if procs[first].returncode is None or procs[first].returncode >= 0:
        heard: tuple[str, str] | None = None  # the first relayed failure: (origin, text)
        for name in order:
            own = _own_failure(logs / f"{safe_name(name)}.log")
            if own is None:
                continue
            kind, text = own
            relayed = _RELAYED.match(text)
            if kind == "NodeFailure" and relayed and relayed.group(1) != name:
                heard = heard or (relayed.group(1), text)
                continue
            origin = name
            headline = (text if kind == "NodeFailure" and relayed
                        else f"node {name} failed: {kind}: {text}")
            break
        else:
            if heard is not None:  # the origin wrote nothing (a host lost, say)
                origin, headline = heard[0] if heard[0] in procs else first, heard[1]
    return f"{headline}\n(first process to exit: {first}, which {first_how}; from " \
           f"{origin}'s log:)\n{_cause_tail(logs / f'{safe_name(origin)}.log')}"


_CHAINED = "The above exception was the direct cause of the following exception:"


def _cause_tail(log_path: Path, lines: int = 8) -> str:
    """The last lines of a node's log; when it ends in a chained traceback (a program
    error raised from the user's exception), the end of the first one, which shows the
    user's own frame, instead of geomx's re-raise."""
    try:
        text = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    cut = max((i for i, line in enumerate(text) if line.strip() == _CHAINED), default=None)
    if cut is not None:
        text = [line for line in text[:cut] if line.strip()]
    return "\n".join(text[-lines:])


def _how(code: int) -> str:
    return f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"


@dataclass
class _Watch:
    """What :func:`_supervise` keeps track of between polls: the crash faults still to
    inject, crashed servers to start again, when each process was seen gone, and the
    nodes whose loss the job goes on without."""

    procs: dict[str, subprocess.Popen]
    run_dir: Path
    wall0: float
    relaunch: Callable[[str], subprocess.Popen] | None
    #: crash faults still to inject, by time (link faults are each sender's shaper's)
    faults: list[Any]
    #: servers the job waits for (bounded by membership.server_loss_timeout: then the
    #: schedulers fail it by name)
    replaceable: set[str]
    #: nodes whose death the job may survive: those, and workers under
    #: [membership] on_worker_loss = "continue"
    survivable: set[str]
    exit_seen: dict[str, float] = field(default_factory=dict)
    lost: list[str] = field(default_factory=list)
    #: (when, node): crashed servers to start again (a crash fault's duration)
    restarts: list[tuple[float, str]] = field(default_factory=list)

    @classmethod
    def of(cls, s: Scenario, plan: Any, procs: dict[str, subprocess.Popen], run_dir: Path,
           wall0: float, relaunch: Callable[[str], subprocess.Popen] | None) -> "_Watch":
        faults = sorted((f for f in s.faults if f.kind == "crash"), key=lambda f: f.at_s)
        replaceable = plan.job.replaceable_servers()
        survivable = set(plan.job.all_workers) if plan.job.on_worker_loss == "continue" \
            else set()
        return cls(procs, run_dir, wall0, relaunch, faults, replaceable,
                   survivable | replaceable)

    def inject_crashes(self, now: float) -> None:
        """Kill the nodes whose crash fault is due (crashes are the launcher's to inject)."""
        faults = self.faults
        while faults and now - self.wall0 >= faults[0].at_s:
            f = faults.pop(0)
            p = self.procs[f.node]
            if p.poll() is None:
                note_crash(self.run_dir, f.node, f.at_s)  # (--resume does not repeat it)
                os.killpg(p.pid, signal.SIGKILL)
                if f.duration_s > 0 and self.relaunch is not None \
                        and f.node in self.replaceable:
                    self.restarts.append((f.at_s + f.duration_s, f.node))
                    self.restarts.sort()

    def restart_due(self, now: float) -> None:
        """Start again the crashed servers whose downtime is over."""
        restarts = self.restarts
        while restarts and now - self.wall0 >= restarts[0][0]:
            _, name = restarts.pop(0)
            self.procs[name].wait()
            assert self.relaunch is not None
            self.procs[name] = self.relaunch(name)
            self.exit_seen.pop(name, None)
            print(f"geomx: {name} restarted (takes over its name)", file=sys.stderr,
                  flush=True)

    def deaths_not_survived(self, now: float) -> list[str]:
        """The processes that exited non-zero and whose loss the job does not survive;
        the others' deaths are told to the job (once each)."""
        procs = self.procs
        for n, p in procs.items():
            if p.returncode is not None and n not in self.exit_seen:
                self.exit_seen[n] = now
        bad = [n for n, p in procs.items() if p.returncode not in (None, 0)]
        # a server the job waits for: only a process that was killed (one that exits
        # by itself has told its schedulers why, and they decide)
        for n in [n for n in bad if n in self.survivable
                  and (n not in self.replaceable or procs[n].returncode < 0)]:
            bad.remove(n)
            if n not in self.lost:
                self._survived(n)
        return bad

    def _survived(self, n: str) -> None:
        code = self.procs[n].returncode
        _tell(self.procs, DIED_KEY, n, _how(code))
        self.lost.append(n)
        again = f"its command in {self.run_dir / 'launch.json'} plus --rejoin"
        if n in self.replaceable:
            print(f"geomx: server {n} died (code {code}); the job waits for it up to "
                  f"membership.server_loss_timeout (to bring it back: {again})",
                  file=sys.stderr, flush=True)
        else:
            print(f"geomx: worker {n} died (code {code}); the job continues without it "
                  f"(to bring it back: {again})", file=sys.stderr, flush=True)

    def first_death(self, bad: list[str]) -> tuple[str, str]:
        """The first of ``bad`` to die and how; among those seen at once, a killed one
        before the ones that exited because they noticed it."""
        first = min(bad, key=lambda n: (self.exit_seen[n], self.procs[n].returncode >= 0))
        return first, _how(self.procs[first].returncode)


def _stop_after_failure(procs: dict[str, subprocess.Popen]) -> str:
    """Stop every process still running; what to add to the failure text about them."""
    stragglers = [n for n, p in procs.items() if p.poll() is None]
    _stop_all(procs)
    codes = {n: p.returncode for n, p in procs.items()}
    text = "\nexit codes: " + ", ".join(f"{n}={c}" for n, c in codes.items())
    if stragglers:
        text += f"\nkilled after the grace period: {', '.join(stragglers)}"
    return text


def _close_stdins(procs: dict[str, subprocess.Popen]) -> None:
    for p in procs.values():
        if p.stdin is not None:
            try:
                p.stdin.close()
            except OSError:
                pass


#: What the launcher writes on a node's stdin when another node died (node_main reads it).
ABORT_KEY = "abort"
#: ... and when a node died whose loss the job may survive (its schedulers decide).
DIED_KEY = "died"


def _tell(procs: dict[str, subprocess.Popen], key: str, dead: str, how: str) -> None:
    """Write a line naming ``dead`` on every other running node's stdin (best effort):
    ``key`` :data:`ABORT_KEY` fails them; :data:`DIED_KEY` tells its schedulers of a node
    whose loss the job may survive (before the job started, only this tells them it is
    gone rather than slow; :meth:`geomx.node.scheduler.Scheduler.member_died`)."""
    line = (json.dumps({key: dead, "how": how}) + "\n").encode()
    for name, p in procs.items():
        if name == dead or p.poll() is not None or p.stdin is None:
            continue
        try:
            p.stdin.write(line)
            p.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass  # it is exiting already


def _follow_progress(path: Path, offset: int, bar: ProgressBar) -> int:
    """Feed the bar the evaluator's new complete lines since byte ``offset``; return the new
    offset (reads only what was appended, so following a long run stays cheap)."""
    if not bar.enabled:
        return offset
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            chunk = f.read()
    except OSError:
        return offset
    end = chunk.rfind(b"\n") + 1  # a line still being written waits for the next call
    for line in chunk[:end].splitlines():
        if b'"eval"' not in line and b'"compute"' not in line:
            continue
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if ev.get("ev") in ("eval", "compute"):
            bar.on_event(ev)
    return offset + end


def _stop_all(procs: dict[str, subprocess.Popen], grace_s: float = 5.0) -> None:
    for p in procs.values():
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.time() + grace_s
    for p in procs.values():
        try:
            p.wait(max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def collect_summary(s: Scenario, plan: Any, run_dir: Path, wall_s: float) -> Summary:
    """Merge per-process files into events.jsonl, progress.csv and the summary (also what
    `geomx collect` does for a by-hand launch)."""
    nodes_dir = run_dir / "nodes"
    # progress.csv: evaluator's evals, with job-wide cumulative bytes at each eval time
    sends: list[tuple[float, int, bool]] = []
    evals: list[dict[str, Any]] = []
    dgt_tally = DgtTally()
    dc = plan.job.dc_of

    def tally(ev: dict[str, Any]) -> None:
        dgt_tally.on_event(ev)
        if ev["ev"] == "send":
            sends.append((ev["t"], int(ev.get("bytes", 0)),
                          dc.get(ev.get("src"), "?") != dc.get(ev.get("dst"), "?")))
        elif ev["ev"] == "eval" and ev["node"] == plan.train.evaluator:
            evals.append(ev)

    event_files = sorted(nodes_dir.glob("*.events.jsonl"))
    if s.metrics.events and event_files:
        merge_event_files(event_files, run_dir / "events.jsonl", on_event=tally)
    elif (run_dir / "events.jsonl").exists():
        for ev in iter_events(run_dir / "events.jsonl"):
            tally(ev)
    counters = ByteCounters()
    results: dict[str, dict[str, Any]] = {}
    for f in sorted(nodes_dir.glob("*.result.json")):
        r = json.loads(f.read_text())
        results[r["name"]] = r
        counters.merge(ByteCounters.from_dict(r["counters"]))
    writer = ProgressWriter(run_dir / "progress.csv")
    i = lan = wan = 0
    for ev in evals:
        while i < len(sends) and sends[i][0] <= ev["t"]:
            if sends[i][2]:
                wan += sends[i][1]
            else:
                lan += sends[i][1]
            i += 1
        writer.write(ev.get("iteration", 0), ev["t"], ev.get("loss"), ev.get("accuracy"),
                     bytes_lan=lan, bytes_wan=wan, wall_s=ev["t"])
    writer.close()
    final = results.get(plan.train.evaluator, {}).get("result", {})
    iterations = max((r.get("iterations", 0) for n, r in results.items()
                      if plan.roles.get(n) == "worker"), default=0)
    summary = build_summary(counters, read_progress(run_dir / "progress.csv"), runtime="real",
                            scenario_name=s.run.name, seed=s.run.seed, iterations=iterations,
                            emulated_seconds=None, wall_seconds=wall_s,
                            target_accuracy=s.run.target_accuracy or None,
                            extra={"final_eval": final, "processes": len(results),
                                   "transport": {n: r["transport"] for n, r in results.items()
                                                 if "transport" in r},
                                   **({"dgt": dgt_tally.as_dict()} if dgt_tally.seen else {})})
    if final.get("accuracy") is not None:  # the evaluator's own last evaluation
        summary = dataclasses.replace(summary, final_accuracy=final["accuracy"],
                                      final_loss=final.get("loss"))
    return summary
