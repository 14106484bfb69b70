"""A mesh parameter server: one per DC, aggregating over the trees the job's topology plans.

docs/papers.md §1 (b) Steps 3-6 (the reference system's server and van). The trees,
roots, shares and routes come from the job's
:class:`~geomx.policy.topology.MeshTopology` through the controller, as a
:class:`~geomx.policy.mesh_plan.MeshPlan`; this server carries them out. To its DC's workers this server looks like a HiPS local server: they push
gradients and pull values of whole keys over the LAN. Across the WAN it only ever talks
to *neighbouring* DCs' servers, along explicit source routes:

* **Round start / policy consistency (Step 6).** The first worker push of iteration v
  sends ROUTE_RELEASE(v) to the controller; the controller answers every server once all
  have arrived, with the plan for iteration v (a new one if it staged one, else "keep").
  No chunk of iteration v moves before its plan is known, so every node uses the same
  trees within an iteration and no chunk mixes two plans.
* **Up (Step 3).** Each key is cut into chunks and each chunk given a root by the
  topology (:meth:`~geomx.policy.topology.MeshTopology.divide`: by default in proportion
  to the plan's perf shares). For a chunk of root r this server waits for its DC's sum and
  each child's partial sum (children of this DC in r's tree), adds them and sends the
  result towards its parent.
* **Root.** The root's sum is the chunk's global gradient; it goes down the same tree,
  and every server (the root first) applies the optimizer to its replica of the chunk (or
  stores the sum without one), forwards it to its children, and acknowledges its workers'
  pushes of a key once all of the key's chunks are back. One deliberate difference from
  the repo, where the root alone updates and sends the new *values* down: the bytes are
  the same, the replicas are bit-identical (same deterministic update of the same data),
  and a chunk that a new plan gives to another root keeps its optimizer state (Adam's
  moments live on every server), so plan switches cannot change the result.
* **Relaying and multipath (Step 5).** A message carries its route and hop; a server on
  the way forwards it to the next hop at the application layer. The origin picks the main
  route or an auxiliary one, as the topology picks from the state of this server's
  per-neighbour send queues (:meth:`~geomx.policy.topology.MeshTopology.pick_route`,
  :mod:`geomx.node.neighbour_queues`).
* **Passive awareness (Step 4).** Every data message is acknowledged (RELAY_ACK); when
  the topology measures links, its receiver times it (:mod:`geomx.node.link_meter`) and
  sends SPEED_REPORTs.

The initial model is
the DC rank-0 worker's INIT (every worker builds it from the job seed, like the master
worker, whose INITs are acknowledged and otherwise unused).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from geomx.node.base import Node
from geomx.node.link_meter import LinkMeter
from geomx.node.neighbour_queues import NeighbourQueues
from geomx.node.scheduler import leave, register
from geomx.node.spec import JobSpec
from geomx.node.values import Value, add_into, flat_slice, from_payload, is_phantom
from geomx.policy.loading import build_policy
from geomx.policy.mesh_plan import Chunk, MeshPlan
from geomx.policy.topology import MeshTopology, SendQueue
from geomx.wire import Kind, Message, Payload

__all__ = ["MeshServer"]

UP, DOWN, PROBE = "u", "d", "p"
#: Chunks travel on their own reliable channel, a lower priority class than channel 0,
#: where their RELAY_ACKs and the control messages go: an acknowledgement never waits
#: behind the 4 MB chunks its receiver sends back the other way (which would stall the
#: sender's window).
DATA_CHANNEL = 1


@dataclass
class _Agg:
    total: Value | None = None
    count: int = 0
    stop: bool = False
    done: bool = False


@dataclass
class _Round:
    """One iteration at this server."""

    version: int
    local: dict[int, _Agg] = field(default_factory=dict)           # key -> DC sum
    parked: dict[int, list[Message]] = field(default_factory=dict)  # key -> worker pushes
    agg: dict[tuple[int, int], _Agg] = field(default_factory=dict)  # (key, chunk) -> sums
    returned: dict[int, int] = field(default_factory=dict)          # key -> chunks back
    stop: dict[int, bool] = field(default_factory=dict)
    plan: MeshPlan | None = None
    released: bool = False
    deferred: list[Message] = field(default_factory=list)           # downs before the plan


class MeshServer(Node):
    role = "mesh_server"

    def __init__(self, name: str, dc: str, transport: Any, services: Any, job: JobSpec):
        super().__init__(name, dc, transport, services)
        self.job = job
        cfg = job.mesh
        self.cfg = cfg
        self.workers = list(job.workers_of[dc])
        self.server_of = dict(job.local_server_of)
        self.dc_of_server = {s: d for d, s in self.server_of.items()}
        self.controller = job.global_scheduler
        topology = build_policy("topology", str(cfg["topology"]), cfg.get("topology_options"))
        if not isinstance(topology, MeshTopology):
            raise ValueError(f"topology {cfg['topology']!r} does not plan trees; a mesh job "
                             "needs a geomx.policy.MeshTopology")
        self.topology = topology
        self.chunk_elements = int(cfg.get("chunk_elements", 1_000_000))
        self.queues = NeighbourQueues(self, int(cfg.get("send_window", 2)))
        self.meter = LinkMeter(int(cfg.get("report_bytes", 4_000_000)),
                               int(cfg.get("report_samples", 4)),
                               float(cfg.get("report_rate", 0.0)))
        self.awareness = topology.measures_links
        self.store: dict[int, Value] = {}
        self.optimizer: Any = None
        self._opt_states: dict[tuple[int, int, int], Any] = {}
        if cfg.get("optimizer"):
            self._install_optimizer(dict(cfg["optimizer"]))
        self.rounds: dict[int, _Round] = {}
        self.plan: MeshPlan | None = None
        self._chunks: dict[int, tuple[list[Chunk], dict[int, list[Chunk]]]] = {}
        self._finished: set[str] = set()
        self._done = asyncio.Event()
        self.rounds_done = 0
        self.aux_sends = 0
        self.relayed = 0
        self.rejected = 0
        self._probe_data: np.ndarray | None = None
        #: data messages queued per neighbouring server, and their count at the last PROBE
        self._data_sent: dict[str, int] = {}
        self._data_at_probe: dict[str, int] = {}
        self.on(Kind.INIT, self._on_init)
        self.on(Kind.PUSH, self._on_push)
        self.on(Kind.PULL, self._on_pull)
        self.on(Kind.COMMAND, self._on_command)
        self.on(Kind.RELAY, self._on_relay)
        self.on(Kind.PROBE, self._on_probe)
        self.on(Kind.SHUTDOWN, self._on_stop)

    # ------------------------------------------------------------------ config
    def _install_optimizer(self, config: dict[str, Any]) -> None:
        from geomx.optim import optimizer_from_config

        self.optimizer = optimizer_from_config(dict(config))
        if "rescale_grad" not in config:
            self.optimizer.rescale_grad = 1.0 / max(1, self.job.num_all_workers)

    def _on_command(self, msg: Message) -> None:
        if msg.src != self.job.master_worker:
            self.reply_error(msg, f"only the master worker may configure {self.name}")
            return
        cmd = msg.meta.get("cmd")
        if cmd == "set_optimizer":
            self._install_optimizer(dict(msg.meta["config"]))
            self.record("command", cmd=cmd, optimizer=msg.meta["config"].get("name"))
        else:
            self.reply_error(msg, f"{self.role} takes set_optimizer only, not {cmd!r} "
                                  "(mesh topologies run FSA without codecs)")
            return
        self.post(msg.reply(Kind.COMMAND_ACK))

    # ------------------------------------------------------------------ workers
    def _on_init(self, msg: Message) -> None:
        if msg.src == self.job.master_worker:
            self.post(msg.reply(Kind.INIT_ACK))  # the DC's rank-0 worker's INIT is used
            return
        if msg.src not in self.workers or len(msg.payloads) != 1:
            self.reply_error(msg, f"{msg.src} may not initialise keys on {self.name} "
                                  "(one payload, from this DC's workers)")
            return
        if msg.key not in self.store:
            self.store[msg.key] = from_payload(msg.payloads[0])
            self._chunks.clear()
            self.record("init", key=msg.key)
        self.post(msg.reply(Kind.INIT_ACK))

    def _on_pull(self, msg: Message) -> None:
        value = self.store.get(msg.key)
        if value is None or (msg.src not in self.workers and msg.src != self.job.master_worker):
            self.reply_error(msg, f"key {msg.key} is not initialised on {self.name}"
                             if value is None else f"{msg.src} may not pull from {self.name}")
            return
        payload = (Payload.phantom(value.shape, value.dtype) if is_phantom(value)
                   else Payload.of(value))
        self.post(msg.reply(Kind.PULL_REPLY, payloads=[payload]))

    def _on_push(self, msg: Message) -> None:
        store = self.store.get(msg.key)
        if store is None or msg.src not in self.workers or len(msg.payloads) != 1:
            self.reply_error(msg, f"push of key {msg.key} from {msg.src} refused: "
                                  "uninitialised key, foreign worker or not one payload")
            return
        if msg.payloads[0].nbytes != _nbytes(store):
            self.reply_error(msg, f"push of key {msg.key}: {msg.payloads[0].nbytes} bytes, "
                                  f"the key has {_nbytes(store)}")
            return
        rnd = self._round(msg.version)
        agg = rnd.local.setdefault(msg.key, _Agg())
        if agg.done:
            self.reply_error(msg, f"key {msg.key} of iteration {msg.version} is already summed")
            return
        _accumulate(agg, from_payload(msg.payloads[0]))
        agg.stop |= bool(msg.meta.get("stop"))
        rnd.parked.setdefault(msg.key, []).append(msg)
        if not rnd.released:
            rnd.released = True
            self.spawn(self._release(rnd))
        if agg.count == len(self.workers):
            agg.done = True
            self._contribute(rnd, msg.key)

    def _round(self, version: int) -> _Round:
        rnd = self.rounds.get(version)
        if rnd is None:
            rnd = self.rounds[version] = _Round(version)
        return rnd

    async def _release(self, rnd: _Round) -> None:
        """ROUTE_RELEASE barrier: learn the plan of this iteration from the controller."""
        reply = await self.request(Message(Kind.ROUTE_RELEASE, self.name, self.controller,
                                           version=rnd.version))
        plan_json = reply.meta.get("plan")
        if plan_json is not None:
            self.plan = MeshPlan.from_json(plan_json)
            for old in [p for p in self._chunks if p < self.plan.plan_id - 1]:
                del self._chunks[old]  # no iteration in progress here uses them any more
            self.record("plan_commit", plan=self.plan.plan_id, iteration=rnd.version)
        if self.plan is None or self.plan.plan_id != reply.meta.get("plan_id"):
            raise RuntimeError(f"{self.name}: the controller kept plan "
                               f"{reply.meta.get('plan_id')} that this server never received")
        rnd.plan = self.plan
        for key in [k for k, a in rnd.local.items() if a.done]:
            self._contribute(rnd, key)
        for (key, c) in list(rnd.agg):
            self._check(rnd, key, c)
        deferred, rnd.deferred = rnd.deferred, []
        for msg in deferred:
            self._arrive(msg)

    # ------------------------------------------------------------------ chunks
    def _chunk_table(self, plan: MeshPlan) -> tuple[list[Chunk], dict[int, list[Chunk]]]:
        cached = self._chunks.get(plan.plan_id)
        if cached is None:
            sizes = {k: int(np.prod(v.shape)) for k, v in self.store.items()}
            table = self.topology.divide(plan, sizes, self.chunk_elements)
            by_key: dict[int, list[Chunk]] = {}
            for ch in table:
                by_key.setdefault(ch.key, []).append(ch)
            cached = self._chunks[plan.plan_id] = (table, by_key)
        return cached

    def _chunk(self, rnd: _Round, key: int, c: int) -> Chunk:
        assert rnd.plan is not None
        return self._chunk_table(rnd.plan)[1][key][c]

    def _contribute(self, rnd: _Round, key: int) -> None:
        """Add this DC's sum of ``key`` into each of its chunks (once the plan is known)."""
        if rnd.plan is None:
            return
        local = rnd.local[key]
        if local.total is None:
            return
        total, local.total = local.total, None  # contributed once
        rnd.stop[key] = rnd.stop.get(key, False) or local.stop
        for ch in self._chunk_table(rnd.plan)[1][key]:
            part = _copy(flat_slice(total, ch.lo, ch.hi))
            agg = rnd.agg.setdefault((key, ch.index), _Agg())
            _accumulate(agg, part)
            agg.stop |= local.stop
            self._check(rnd, key, ch.index)

    def _check(self, rnd: _Round, key: int, c: int) -> None:
        agg = rnd.agg[(key, c)]
        if rnd.plan is None or agg.done:
            return
        ch = self._chunk(rnd, key, c)
        expected = 1 + len(rnd.plan.children(ch.root, self.dc))
        if agg.count > expected:
            raise RuntimeError(f"{self.name}: {agg.count} contributions to key {key} chunk {c} "
                               f"of iteration {rnd.version}, expected {expected}")
        if agg.count < expected:
            return
        agg.done = True
        total, agg.total = agg.total, None
        if ch.root == self.dc:
            self._deliver_down(rnd, ch, total, agg.stop)
        else:
            parent = rnd.plan.parent[ch.root][self.dc]
            self._send_chunk(rnd, ch, UP, parent, total, agg.stop)

    def _apply(self, key: int, ch: Chunk, grad: Value) -> None:
        """The global step on a chunk: optimizer update, or store <- sum (no optimizer)."""
        store = self.store[key]
        if is_phantom(store) or is_phantom(grad):
            return
        weight = store.reshape(-1)[ch.lo:ch.hi]
        if self.optimizer is None:
            weight[:] = grad.reshape(-1)
            return
        sk = (key, ch.lo, ch.hi)
        if sk not in self._opt_states:
            self._opt_states[sk] = self.optimizer.create_state(sk, weight)
        self.optimizer.update(sk, weight, grad.reshape(-1), self._opt_states[sk])

    def _deliver_down(self, rnd: _Round, ch: Chunk, value: Value, stop: bool) -> None:
        """The root's aggregate of a chunk reached this server: apply it, pass it on."""
        assert rnd.plan is not None
        self._apply(ch.key, ch, value)
        for child in rnd.plan.children(ch.root, self.dc):
            self._send_chunk(rnd, ch, DOWN, child, value, stop)
        rnd.stop[ch.key] = rnd.stop.get(ch.key, False) or stop
        rnd.returned[ch.key] = rnd.returned.get(ch.key, 0) + 1
        table, by_key = self._chunk_table(rnd.plan)
        if rnd.returned[ch.key] == len(by_key[ch.key]):
            meta = {"stop": True} if rnd.stop[ch.key] else {}
            for push in rnd.parked.pop(ch.key, []):
                self.post(push.reply(Kind.PUSH_ACK, meta=dict(meta)))
        if sum(rnd.returned.values()) == len(table):
            self.rounds.pop(rnd.version, None)
            self.rounds_done += 1

    # ------------------------------------------------------------------ WAN
    def _send_chunk(self, rnd: _Round, ch: Chunk, direction: str, dst_dc: str, value: Value,
                    stop: bool) -> None:
        assert rnd.plan is not None
        routes = rnd.plan.routes_of(self.dc, dst_dc)
        payload = (Payload.phantom((ch.hi - ch.lo,), value.dtype) if is_phantom(value)
                   else Payload.of(np.ascontiguousarray(value).reshape(-1)))
        pick = 0
        if len(routes) > 1:
            pick = self.topology.pick_route(rnd.plan, routes, self._send_queue,
                                            payload.nbytes, self.now())
        route = routes[pick]
        if pick:
            self.aux_sends += 1
            self.record("aux_route", key=ch.key, part=ch.index, route=list(route))
        meta: dict[str, Any] = {"d": direction, "r": ch.root, "route": list(route), "hop": 1,
                                "plan": rnd.plan.plan_id}
        if stop:
            meta["stop"] = True
        self._data_sent[self.server_of[route[1]]] = \
            self._data_sent.get(self.server_of[route[1]], 0) + 1
        self.queues.put(Message(Kind.RELAY, self.name, self.server_of[route[1]], key=ch.key,
                                part=ch.index, version=rnd.version, meta=meta,
                                payloads=[payload], channel=DATA_CHANNEL))

    def _send_queue(self, dc: str) -> SendQueue:
        """The state of the send queue to neighbouring DC ``dc``."""
        server = self.server_of[dc]
        q = self.queues
        return SendQueue(q.depth(server), q.in_flight(server), q.backlog_bytes(server),
                         q.window)

    def _on_probe(self, msg: Message) -> None:
        """The controller asks for a measurement of the link to a neighbouring DC: send it
        ``report_samples`` messages of ``report_bytes`` (no data; the receiver times them
        like chunks and drops them) through that neighbour's queue, unless chunks went
        that way since the previous PROBE."""
        to = msg.meta.get("to")
        if msg.src != self.controller or to not in self.server_of or to == self.dc:
            self.record("reject", src=msg.src, msg=msg.kind.name, reason="bad PROBE")
            return
        server = self.server_of[to]
        sent = self._data_sent.get(server, 0)
        if sent != self._data_at_probe.get(server, 0):
            # chunks crossed the link since the last PROBE (too small to be samples): it is
            # in use, not planned around; probe it only once it has carried nothing
            self._data_at_probe[server] = sent
            return
        if self._probe_data is None:  # real bytes: over sockets a phantom would not travel
            self._probe_data = np.zeros(max(1, self.meter.report_bytes // 4), np.float32)
        payload = Payload.of(self._probe_data)
        for _ in range(self.meter.report_samples):
            self.queues.put(Message(Kind.RELAY, self.name, self.server_of[to],
                                    meta={"d": PROBE, "route": [self.dc, to], "hop": 1},
                                    payloads=[payload], channel=DATA_CHANNEL))

    def _on_relay(self, msg: Message) -> None:
        problem = self._relay_problem(msg)
        if problem:
            self.rejected += 1
            self.reply_error(msg, problem)
            return
        self.post(msg.reply(Kind.RELAY_ACK, channel=0))
        src_dc = self.dc_of_server[msg.src]
        if self.awareness and "ts" in msg.meta:
            est = self.meter.observe((src_dc, self.dc), msg.nbytes, float(msg.meta["ts"]),
                                     self.now())
            if est is not None:
                self.record("link_estimate", link=[src_dc, self.dc], bps=est)
                self.post(Message(Kind.SPEED_REPORT, self.name, self.controller,
                                  meta={"link": [src_dc, self.dc], "bps": est}))
        route, hop = msg.meta["route"], int(msg.meta["hop"])
        if msg.meta["d"] == PROBE:
            return  # a measurement only
        if hop < len(route) - 1:
            self.relayed += 1
            meta = {k: v for k, v in msg.meta.items() if k != "ts"}
            meta["hop"] = hop + 1
            nxt = self.server_of[route[hop + 1]]
            self._data_sent[nxt] = self._data_sent.get(nxt, 0) + 1
            self.queues.put(Message(Kind.RELAY, self.name, nxt,
                                    key=msg.key, part=msg.part, version=msg.version, meta=meta,
                                    payloads=list(msg.payloads), channel=DATA_CHANNEL))
            return
        self._arrive(msg)

    def _relay_problem(self, msg: Message) -> str:
        m = msg.meta
        route = m.get("route")
        if msg.src not in self.dc_of_server:
            return f"{msg.src} is not a server of this job"
        if m.get("d") not in (UP, DOWN, PROBE) or not isinstance(route, list) \
                or len(msg.payloads) != 1 or (m.get("d") == PROBE and len(route) != 2):
            return ("malformed RELAY: needs d in {u, d, p}, a route list (of two DCs for p) "
                    "and one payload")
        hop = m.get("hop")
        if not isinstance(hop, int) or not 1 <= hop < len(route) or route[hop] != self.dc \
                or route[hop - 1] != self.dc_of_server[msg.src] \
                or any(r not in self.server_of for r in route):
            return f"RELAY route {route!r} hop {hop!r} does not pass {self.dc} from {msg.src}"
        if msg.key not in self.store and hop == len(route) - 1 and m["d"] != PROBE:
            return f"RELAY of key {msg.key}, which is not initialised here"
        return ""

    def _arrive(self, msg: Message) -> None:
        """A chunk for this server: a child's partial sum, or new values from the parent."""
        rnd = self._round(msg.version)
        if msg.meta["d"] == UP:
            agg = rnd.agg.setdefault((msg.key, msg.part), _Agg())
            _accumulate(agg, from_payload(msg.payloads[0]))
            agg.stop |= bool(msg.meta.get("stop"))
            self._check(rnd, msg.key, msg.part)
            return
        if rnd.plan is None:
            rnd.deferred.append(msg)
            return
        ch = self._chunk(rnd, msg.key, msg.part)
        self._deliver_down(rnd, ch, from_payload(msg.payloads[0], copy=False),
                           bool(msg.meta.get("stop")))

    # ------------------------------------------------------------------ lifecycle
    def _on_stop(self, msg: Message) -> None:
        """A worker, or the master worker, is done. This server stops once all of them
        are: a master whose ``set_optimizer`` comes after the workers' last round (it
        started late, or its program runs on) still finds the server up, where it was
        left waiting for a server that had gone."""
        if msg.src not in self.job.all_workers and msg.src != self.job.master_worker:
            self.record("reject", src=msg.src, msg=msg.kind.name, reason="not a worker")
            return
        self._finished.add(msg.src)
        if len(self._finished) == len(self.job.all_workers) + 1:
            self._done.set()

    async def main(self) -> None:
        await register(self, self.controller)
        await self._done.wait()
        self.record("server_done", rounds=self.rounds_done, relayed=self.relayed,
                    aux_sends=self.aux_sends, rejected=self.rejected)
        leave(self, self.controller)


def _nbytes(v: Value) -> int:
    return int(v.nbytes)


def _copy(v: Value) -> Value:
    return v if is_phantom(v) else np.array(v, copy=True)


def _accumulate(agg: _Agg, v: Value) -> None:
    if agg.total is None:
        agg.total = v
    else:
        add_into(agg.total, v)
    agg.count += 1
