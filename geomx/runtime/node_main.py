"""``geomx node``: run one node of a scenario in this process, over real sockets.

This is the per-host entry point (GeoMX users started one ``python`` process per role
with ``DMLC_*`` variables; geomx users run ``geomx node`` once per node). Who the node
is, where its schedulers listen and how it authenticates come from CLI flags, the
environment and the scenario file, in that order (``geomx.runtime.config``). The
launchers (``geomx run --runtime real``, ``geomx launch``, ``--hostfile``) start it with
explicit flags; Slurm and Kubernetes start it with environment variables
(docs/real-runtime.md).

Each process writes, under the run folder, ``nodes/<name>.events.jsonl`` (its own
events, including every ``send``) and ``nodes/<name>.result.json``; the launcher merges
them (and collects ``logs/<name>.log``, the process's output).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from geomx.cluster import make_node, max_message_bytes, plan_job
from geomx.metrics.recorder import EventRecorder
from geomx.node.base import NodeFailure
from geomx.node.restart import RestartError, restart_mode, restart_node
from geomx.node.scheduler import CLAIM_PREFIX
from geomx.policy.guard import PolicyFailed
from geomx.runtime.config import (ConfigError, NodeArgs, NodeConfig, NothingToRun,
                                  resolve_node_config, safe_name)
from geomx.runtime.framing import STREAM_HEAD, STREAM_PIECE_BYTES
from geomx.runtime.services import RealServices
from geomx.runtime.shm_ring import DEFAULT_RING_BYTES
from geomx.runtime.wan_shapes import dc_link_phases, dc_link_shapes
from geomx.scenario import Scenario, scenario_to_toml
from geomx.transport import Transport
from geomx.wire import Kind, Message

log = logging.getLogger(__name__)

__all__ = ["safe_name", "build_shaper", "transport_limits", "run_node", "node_main", "MembersOnly"]


def build_shaper(s: Scenario, plan: Any, name: str, start_epoch: float | None = None,
                 budget_path: str | None = None, kernel_shapes: str | None = None):
    """Per-peer shapes for ``name``'s traffic (None: nothing to shape).

    Peers in other DCs get their route's shape (:func:`dc_link_shapes`); peers inside a
    DC whose NICs are modelled (``lan_bandwidth`` at most
    :data:`~geomx.runtime.wan_shapes.NIC_SHAPED_MAX_BPS`) get the LAN's. Bandwidth is
    reserved per scenario link in the budget file at ``budget_path`` (shared with every
    node of the job on this host, :mod:`geomx.runtime.link_budget`), or in one of this
    process's own when there is none. ``start_epoch`` (Unix seconds of the job's start,
    the same on every node) places traces' and ``link_down`` faults' phases on this
    process's shaper clock. ``kernel_shapes`` (``[real] shaper = "kernel"``,
    :mod:`geomx.runtime.kernel_wan`): the kernel already paces the WAN links ("rate": the
    node adds their delay, jitter and loss) or does everything ("all")."""
    from geomx.runtime.link_budget import LinkBudget, SharedLinkBudget
    from geomx.runtime.shaper import Shaper, now_s
    from geomx.runtime.wan_shapes import LinkTable, dc_routes, lan_shape, route_hops

    routes = dc_routes(s)
    shapes_by_dc = dc_link_shapes(s, routes=routes)
    phases_by_dc = dc_link_phases(s)
    dc_of = plan.job.dc_of
    table = LinkTable(s, list(plan.nodes), dc_of)
    zero = now_s() - (0.0 if start_epoch is None else time.time() - start_epoch)  # job start
    my_dc = dc_of[name]
    lan = {d.name: d.lan_latency_s for d in s.dcs}
    shapes, phases, hops = {}, {}, {}
    for peer in plan.nodes:
        if peer == name:
            continue
        pair = (my_dc, dc_of[peer])
        if pair[0] == pair[1]:
            if name in table.nic_bps or peer in table.nic_bps:
                shapes[peer] = lan_shape(s, my_dc)
                hops[peer] = table.hops(name, peer, ())
            continue
        shape = shapes_by_dc.get(pair)
        if shape is None:
            continue
        if kernel_shapes is not None:
            # the kernel's qdiscs pace the WAN links and its TCP meets their loss: only
            # the NIC links (and, without netem, delay, jitter and UDP loss) are left here
            shape = dataclasses.replace(shape, bandwidth_bps=0, tcp_window_bytes=None,
                                        **({"loss": 0.0, "jitter_s": 0.0, "delay_s":
                                            (lan[pair[0]] + lan[pair[1]]) / 2}
                                           if kernel_shapes == "all" else {}))
            nic = table.hops(name, peer, ())
            if kernel_shapes == "all" and not nic:
                continue
            shapes[peer], hops[peer] = shape, nic
            continue
        shapes[peer] = shape
        hops[peer] = table.hops(name, peer, route_hops(routes[pair]))
        if pair in phases_by_dc:  # one lazy reading of the pair's phases per peer
            phases[peer] = ((zero + t, sh, table.hops(name, peer, wan))
                            for t, sh, wan in phases_by_dc[pair]())
    if not shapes:
        return None
    budget = (SharedLinkBudget(budget_path, len(table)) if budget_path
              else LinkBudget(len(table)))
    return Shaper(shapes, seed=s.run.seed, phases=phases, hops=hops, budget=budget)


class MembersOnly:
    """The node's transport, closed to anyone outside the job.

    A message whose ``src`` is not a node of this job can only come from a stranger
    that got through the handshake (a fuzzer, a stray client, a node of another job
    sharing the secret): it is dropped before the node sees it. Replies to strangers
    are dropped too -- we never dial out to them; without that, the node's single
    sender task would die on the transport's "no address" error and the node would stop
    answering everyone. The node's own checks (who may push, which keys exist) still
    apply to members. With a shared secret, ``src`` is the name the connection
    authenticated as; without one, names are taken on trust. Both directions are
    logged (rate-limited) and counted (``dropped_from_strangers``,
    ``dropped_to_strangers``).

    It is a :class:`~geomx.transport.Transport` of its own: each call of the contract
    goes to the inner transport, through the members check where it has one; nothing
    else of the inner transport shows through (its owner keeps it for ``stats`` and
    ``close``).
    """

    def __init__(self, inner: Transport, members: set[str], *, allow_claims: bool = False):
        self._inner = inner
        self.name = inner.name
        #: the inner transport's fast path, bound once: it runs for every message sent
        self._inner_nowait = inner.send_nowait
        self._members = members
        #: schedulers also talk to processes claiming a rank (``claim:TOKEN``, REGISTER
        #: only; the scheduler bounds how many): see geomx/runtime/rank_claim.py
        self._allow_claims = allow_claims
        self.dropped_to_strangers = 0
        self.dropped_from_strangers = 0

    async def send(self, msg: Message) -> None:
        if msg.dst not in self._members and not (self._allow_claims
                                                 and msg.dst.startswith(CLAIM_PREFIX)):
            self.dropped_to_strangers += 1
            self._log("not sending", msg, msg.dst, self.dropped_to_strangers)
            return
        await self._inner.send(msg)

    def send_nowait(self, msg: Message) -> bool:
        """The inner transport's fast path, for members only (anything else goes through
        :meth:`send`, which drops and logs it)."""
        if msg.dst not in self._members:
            return False
        return self._inner_nowait(msg)

    async def recv(self) -> Message:
        while True:
            msg = await self._inner.recv()
            if self._admit(msg):
                return msg

    async def listen(self, handler: Callable[[Message], None]) -> None:
        """The inner transport's ``listen``, for members' messages only."""
        members, admit = self._members, self._admit

        def members_only(msg: Message) -> None:
            if msg.src in members or admit(msg):
                handler(msg)

        await self._inner.listen(members_only)

    def receive_into(self, peer: str, request_id: int, sink: Any) -> bool:
        """The inner transport's: a reply comes only from the member a request went to
        (a request to a stranger is never sent)."""
        return self._inner.receive_into(peer, request_id, sink)

    def forget_receive(self, request_id: int) -> None:
        self._inner.forget_receive(request_id)

    def set_address_book(self, book: dict[str, str]) -> None:
        self._inner.set_address_book(book)

    def local_address(self) -> str:
        return self._inner.local_address()

    async def close(self) -> None:
        """Closes the inner transport (the node's process usually closes it itself, with
        the flush timeout it chooses)."""
        await self._inner.close()

    def _admit(self, msg: Message) -> bool:
        """A member's message (or a rank claim's REGISTER, where allowed); anything else
        is dropped, counted and logged."""
        if msg.src in self._members:
            return True
        if self._allow_claims and msg.src.startswith(CLAIM_PREFIX) and msg.kind == Kind.REGISTER:
            return True
        self.dropped_from_strangers += 1
        self._log("dropped", msg, msg.src, self.dropped_from_strangers)
        return False

    def _log(self, what: str, msg: Message, who: str, n: int) -> None:
        if n <= 10 or n % 1000 == 0:
            log.warning("%s: %s %s %s %r: not a node of this job (%d so far)",
                        self._inner.name, what, msg.kind.name,
                        "to" if what == "not sending" else "from", who, n)


def tls_contexts(cfg: NodeConfig) -> tuple[Any, Any]:
    """(server, client) SSL contexts from the node's TLS settings, or (None, None)."""
    from geomx.runtime import security

    t = cfg.tls
    if t is None:
        return None, None
    server = security.make_server_context(t.cert, t.key,
                                          client_cafile=t.ca if t.verify_clients else None)
    client = security.make_client_context(t.ca or None, check_hostname=t.check_hostname,
                                          cert=t.cert if t.verify_clients else None,
                                          key=t.key if t.verify_clients else None)
    return server, client


def write_scenario_once(run_dir: Path, scenario: Scenario) -> None:
    """Leave the job's resolved scenario in ``run_dir/scenario.toml`` unless one is there.

    A launcher writes it before it starts the nodes; nodes started by hand (Slurm,
    Kubernetes, a script of ``geomx node`` calls) have no launcher, and ``geomx collect``
    reads the file to merge their results. Every node of a job resolves the same
    scenario, so the first node to link its copy into place wins and the others leave it
    (a hard link fails on an existing name: no half-written file is ever read).
    """
    path = run_dir / "scenario.toml"
    if path.exists():
        return
    tmp = run_dir / f".scenario.{os.getpid()}.{threading.get_ident()}.toml"
    try:
        tmp.write_text(scenario_to_toml(scenario), encoding="utf-8")
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
    except OSError as e:  # a read-only or shared folder: collect still takes --scenario
        log.warning("could not write %s: %s", path, e)
    finally:
        tmp.unlink(missing_ok=True)


async def run_node(cfg: NodeConfig, *, on_node: Callable[[Any], None] | None = None,
                   rejoin: bool = False) -> dict[str, Any]:
    """Run node ``cfg.name`` until it finishes; write its events and result files.

    ``on_node`` (tests, notebooks) is called with the node object before it starts.
    ``rejoin``: this process replaces one the job lost (``geomx node --rejoin``,
    geomx/node/restart.py); a node the job would not take back raises
    :class:`~geomx.node.restart.RestartError` before it listens.
    """
    plan = plan_job(cfg.scenario, "real")  # the job's plan: the same whatever rank is claimed
    if plan.job.checkpoint:  # [checkpoint]: this run's folder (shared by the job's hosts)
        plan.job.checkpoint["dir"] = str(cfg.run_dir / "checkpoints")
    token = ""
    if cfg.claim_rank:
        from geomx.runtime.rank_claim import claim_rank

        cfg, token = await claim_rank(cfg, plan, _start_transport)
    if rejoin and cfg.name in plan.roles:  # (an unknown name: make_node says so below)
        restart_mode(plan.job, cfg.name, plan.roles[cfg.name])
    transport = await _start_transport(cfg, plan, cfg.name)
    s, name = cfg.scenario, cfg.name
    nodes_dir = cfg.run_dir / "nodes"
    nodes_dir.mkdir(parents=True, exist_ok=True)
    write_scenario_once(cfg.run_dir, s)
    # a rejoined worker keeps the events of the process it replaces
    stem = safe_name(name) + (".rejoined" if rejoin else "")
    recorder = EventRecorder(nodes_dir / f"{stem}.events.jsonl",
                             clock=lambda: time.time() - cfg.start_epoch,
                             enabled=s.metrics.events, dc_of=plan.job.dc_of.get,
                             byte_kinds=("send",))
    services = RealServices(s.run.seed, recorder, plan.job.dc_of, cfg.start_epoch)
    members = MembersOnly(transport, set(plan.nodes),
                          allow_claims=plan.roles[name] in ("global_scheduler", "local_scheduler"))
    node = make_node(plan, name, members, services)
    if rejoin:
        restart_node(node, plan.job, plan.roles[name])
    node.address_book.update(cfg.book)
    node.claim_token = token
    _PARENT.attach(asyncio.get_running_loop(), node)
    if on_node is not None:
        on_node(node)
    log.info("%s listening on %s (bind %s)", name, transport.local_address(), cfg.bind_host)
    try:
        await node.run()
    finally:
        await transport.close(flush_timeout_s=2.0 if node.failure is not None else 10.0)
        recorder.close()
    stats = transport.stats()
    security_counts = {k: stats[k] for k in ("rejected_frames", "rejected",
                                             "refused_connections", "dropped_messages",
                                             "streams")}
    security_counts["dropped_from_strangers"] = members.dropped_from_strangers
    security_counts["dropped_to_strangers"] = members.dropped_to_strangers
    result: dict[str, Any] = {"name": name, "role": plan.roles[name],
                              "counters": recorder.counters.to_dict(),
                              "transport": security_counts}
    if hasattr(node, "iteration"):
        result["iterations"] = node.iteration
    if isinstance(getattr(node, "result", None), dict):
        result["result"] = node.result
    (nodes_dir / f"{safe_name(name)}.result.json").write_text(json.dumps(result, sort_keys=True))
    return result


#: Bytes of large frames and streamed messages a node holds while they arrive, over all
#: its connections (one message alone is always admitted; see FrameBudget).
RECEIVE_BUDGET_BYTES = 64 * 2**20


def transport_limits(s: Scenario, plan: Any) -> dict[str, Any]:
    """What a node's transport may be made to hold, from the job:

    * a UDP socket only where a scheduler sends datagrams (DGT's ``"udp"`` bands), so
      there is no reassembly for strangers to feed otherwise;
    * frames no longer than a stream's piece (a longer message travels as a stream of
      them, see geomx.runtime.framing), refused before any of it is held;
    * messages no bigger than ``[real] max_message``, by default the job's largest
      legitimate one (:func:`geomx.cluster.max_message_bytes`) for a built-in model; a
      training program creates its keys as it runs, so for it the default is this
      host's memory (a larger message could not be received anyway). A stream
      announcing more is refused before any of it is held;
    * shared-memory rings of same-host peers (``[real] shm``) mapped within the
      transport's bound on them (:mod:`geomx.runtime.shm_ring`); the peer's memory, and
      what a piece is copied into is a stream's buffer, within the budget below;
    * large frames and streams arriving at once within :data:`RECEIVE_BUDGET_BYTES`
      together (or one such message), whatever the largest message.
    """
    message_cap = s.real.max_message_bytes
    if message_cap is None:
        message_cap = (_host_memory_bytes() if plan.train.program
                       else max_message_bytes(plan))
    return {"udp": s.sched.dgt == "udp",
            "shm_ring_bytes": DEFAULT_RING_BYTES if s.real.shm else 0,
            "max_frame_bytes": min(message_cap, STREAM_PIECE_BYTES) + STREAM_HEAD.size,
            "max_message_bytes": message_cap,
            "max_partial_frame_bytes": RECEIVE_BUDGET_BYTES}


def _host_memory_bytes() -> int:
    """This host's physical memory."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


async def _start_transport(cfg: NodeConfig, plan: Any, name: str, *, shape: bool = True) -> Any:
    """The node's TCP transport, listening, with the schedulers' addresses installed
    (``shape=False``: unshaped, as a rank claim's short-lived transport is)."""
    from geomx.runtime.tcp import TcpTransport

    s = cfg.scenario
    ssl_server, ssl_client = tls_contexts(cfg)
    transport = TcpTransport(name, host=cfg.bind_host, port=cfg.port,
                             advertise_host=cfg.host if cfg.host != cfg.bind_host else None,
                             secret=cfg.secret, ssl_server=ssl_server, ssl_client=ssl_client,
                             shaper=(build_shaper(s, plan, name, cfg.start_epoch,
                                                  cfg.link_budget, cfg.kernel_shapes)
                                     if cfg.shape and shape else None),
                             connect_timeout_s=cfg.connect_timeout_s,
                             reconnect_timeout_s=_reconnect_timeout_s(s),
                             dead_after_s=s.real.dead_connection_timeout_s,
                             **transport_limits(s, plan),
                             # a peer's address arrives with registration at the latest
                             address_wait_s=max(cfg.connect_timeout_s,
                                                s.membership.register_timeout_s))
    await transport.start()
    transport.set_address_book(cfg.book)
    return transport


def _read_stdin_config(ns: Any) -> dict[str, str]:
    """``--stdin-config``: the first line of stdin is ``{"scenario": TOML, "env": {...}}``.

    Remote launchers use it so that neither the scenario nor the secret has to exist on
    the remote host beforehand or appear on a command line (``ps`` shows those).
    """
    chunks = []
    while True:  # raw reads: the buffered sys.stdin would trip the watcher thread at exit
        chunk = os.read(0, 1 << 16)
        chunks.append(chunk)
        if not chunk or b"\n" in chunk:
            break
    line, _, rest = b"".join(chunks).partition(b"\n")
    _PARENT.leftover = rest  # anything after the config line is for the watcher
    try:
        doc = json.loads(line)
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
    except ValueError as e:
        raise ConfigError(f"--stdin-config: the first line of stdin must be a JSON object "
                          f"with 'scenario' and 'env': {e}") from None
    if isinstance(doc.get("scenario"), str):
        ns.scenario_text = doc["scenario"]
    env = doc.get("env", {})
    if not isinstance(env, dict):
        raise ConfigError("--stdin-config: 'env' must be an object of strings")
    return {str(k): str(v) for k, v in env.items()}


class _ParentLink:
    """The launcher's end of stdin, as a node sees it.

    End-of-file: the launcher (or the ssh session) is gone, so the node exits. An abort
    line (``{"abort": NODE, "how": ...}``, see :func:`geomx.runtime.launcher._tell`):
    another node of the job died, so this one fails naming it -- the only way to learn of
    a node killed before it registered, which no scheduler can tell from a slow starter.
    A died line (``{"died": NODE, "how": ...}``, :func:`geomx.runtime.launcher._tell`):
    a node whose loss the job may survive died; a scheduler decides what that means
    (:meth:`geomx.node.scheduler.Scheduler.member_died`), other nodes ignore it.
    The watcher is a thread; the node lives on the event loop, so delivery goes through
    ``call_soon_threadsafe`` (lines read before the node exists wait for it).
    """

    #: died lines kept at most while the node does not exist yet (one per node of a job
    #: is all a launcher sends)
    MAX_PENDING = 4096

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._target: tuple[asyncio.AbstractEventLoop, Any] | None = None
        self._pending: list[tuple[Callable[[Any, str, str], None], str, str]] = []
        self.leftover = b""

    def attach(self, loop: asyncio.AbstractEventLoop, node: Any) -> None:
        with self._lock:
            self._target = (loop, node)
            pending, self._pending = self._pending, []
        for item in pending:
            self._deliver(*item)

    def abort(self, dead: str, how: str) -> None:
        self._post(_fail_node, dead, how)

    def died(self, dead: str, how: str) -> None:
        self._post(_member_died, dead, how)

    def _post(self, act: Callable[[Any, str, str], None], dead: str, how: str) -> None:
        with self._lock:
            if self._target is None:
                if len(self._pending) < self.MAX_PENDING:
                    self._pending.append((act, dead, how))
                return
        self._deliver(act, dead, how)

    def _deliver(self, act: Callable[[Any, str, str], None], dead: str, how: str) -> None:
        assert self._target is not None
        loop, node = self._target
        try:
            loop.call_soon_threadsafe(act, node, dead, how)
        except RuntimeError:
            pass  # the loop is closed: the node is done anyway

    def feed(self, data: bytes, buf: bytearray) -> None:
        """Take stdin bytes; act on each complete line (anything else is ignored)."""
        buf += data
        while b"\n" in buf:
            line, _, rest = bytes(buf).partition(b"\n")
            buf[:] = rest
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if not isinstance(doc, dict):
                continue
            if isinstance(doc.get("abort"), str):
                self.abort(doc["abort"][:200], str(doc.get("how", "died"))[:200])
            elif isinstance(doc.get("died"), str):
                self.died(doc["died"][:200], str(doc.get("how", "died"))[:200])


def _fail_node(node: Any, dead: str, how: str) -> None:
    if node.failure is None:
        node.failed_node, node.failed_reason = dead, f"{how} (seen by the launcher)"
        node.failure = NodeFailure(f"node {dead} {how} (seen by the launcher)")
        node.stop()


def _member_died(node: Any, dead: str, how: str) -> None:
    died = getattr(node, "member_died", None)
    if died is not None and node.failure is None:
        died(dead, f"{how} (seen by the launcher)")


_PARENT = _ParentLink()


def _watch_parent() -> None:
    """Watch stdin in a thread: abort lines fail the node, end-of-file stops it."""
    def wait() -> None:
        buf = bytearray()
        try:  # os.read, not sys.stdin: no buffer lock for the interpreter to trip on at exit
            _PARENT.feed(_PARENT.leftover, buf)
            while True:
                data = os.read(0, 1 << 16)
                if not data:
                    break
                if len(buf) + len(data) > 1 << 20:
                    buf.clear()  # a line that long is not ours: bounded memory
                _PARENT.feed(data, buf)
        except OSError:
            pass
        log.warning("stdin closed: the launcher is gone; stopping")
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=wait, name="parent-watch", daemon=True).start()


def _reconnect_timeout_s(s: Any) -> float:
    """How long to keep dialling a peer whose connection broke: ``[real]
    reconnect_timeout``, or -- when the job waits for lost servers -- at least until the
    server's successor must be there (noticing the loss, then server_loss_timeout): the
    messages queued for the dead process go to its successor, at its new address."""
    m = s.membership
    if m.on_server_loss == "wait":
        return max(s.real.reconnect_timeout_s, m.heartbeat_timeout_s + m.server_loss_timeout_s)
    return s.real.reconnect_timeout_s


def node_main(ns: Any) -> int:
    """Entry point of ``geomx node`` (argparse namespace from ``geomx.cli``)."""
    from geomx.runtime.eventloop import run

    env = dict(os.environ)
    try:
        if getattr(ns, "stdin_config", False):
            env.update(_read_stdin_config(ns))
            ns.parent_watch = True
        cfg = resolve_node_config(NodeArgs.from_namespace(ns), env)
    except NothingToRun as e:
        print(f"geomx node: {e}", flush=True)
        return 0
    except ConfigError as e:
        print(f"geomx node: {e}", file=sys.stderr, flush=True)
        return 2
    if getattr(ns, "print_config", False):
        print(cfg.describe())
        return 0
    if cfg.parent_watch:
        _watch_parent()
    try:
        run(run_node(cfg, rejoin=bool(getattr(ns, "rejoin", False))))
    except RestartError as e:  # --rejoin of a node the job would not take back
        print(f"geomx node: {e}", file=sys.stderr, flush=True)
        return 2
    except Exception as e:  # the launcher reports the node by name
        if isinstance(e, (NodeFailure, PolicyFailed)):
            # the job failed the way it says (a peer lost, a bound passed): one line, no
            # traceback for a person to read past
            log.error("node %s failed: %s", cfg.name, e)
        else:
            log.exception("node %s failed", cfg.name)
        print(f"geomx node {cfg.name}: failed: {type(e).__name__}: {e}", flush=True)
        return 1
    return 0
