"""``geomx calibrate``: measure what this host's CPU pays per message, codec byte, kvstore
call and server push, and write a host profile the emulator charges (docs/calibration.md).

Every CPU figure is CPU time (``time.process_time``), not wall time: on a busy machine a
process waits longer for a core, but the work it does once it runs costs about the
same. What is not CPU -- waking up, the shaper's timers -- is wall time and moves with
the load (docs/calibration.md gives two profiles of this project's host). Sharing cores
among the job's own nodes is modelled separately, by ``[host] cores``.

The measurements, each on the code the real runtime runs:

* **Messages** (real sockets on loopback, two processes, :class:`geomx.node.base.Node`
  and :class:`geomx.runtime.tcp.TcpTransport` on both sides, uvloop where installed):
  for each size class the driver sends requests of that size and the echo process
  answers each with an empty acknowledgement; each side's CPU per round is what it pays
  for one message of the class plus one acknowledgement. A one-way burst of empty
  messages splits the acknowledgement's cost into its send and receive parts, and from
  there each class's send and receive costs follow. Small round trips after 5 ms of
  quiet give the wake-up of an idle receiver; the same round trips through the real
  shaper (:class:`geomx.runtime.shaper.Shaper`, both ways) give what a message between
  DCs costs on top: the shaper's CPU, and how much later than the link's delay it is
  handled.
* **CPU stretch**: wall seconds per CPU second of short bursts of work between short
  sleeps (more than 1 when other processes hold the cores).
* **Codecs**: :class:`geomx.node.link_codec.LinkCodec` (what a node calls) encoding and
  decoding a 1M-element float32 tensor (256k with ``--quick``) with each built-in codec;
  CPU per dense byte.
* **kvstore and server**: a worker's ``kv.push``/``kv.pull`` calls and a global server's
  handling of them, on the node code of a one-worker flat-PS job run on the emulator's
  loop with the network left out (sends are handed over one loop turn later, so the
  timed code is the node's own: the messages' costs are the first measurement's).
  Timed at two tensor sizes, which gives a per-call and a per-byte figure.

The profile records where and when it was measured (provenance: geomx, Python, CPU
model, cores, the load average before and after).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from geomx.host_profile import CodecCost, HostProfile, load_profile, profile_to_toml
from geomx.provenance import provenance

__all__ = ["CalibrationPlan", "DEFAULT_PLAN", "QUICK_PLAN", "MessageCosts", "calibrate",
           "measure_messages", "measure_stretch", "measure_codecs", "measure_node_code",
           "kv_program", "summary_lines", "add_parser", "main"]

ECHO = "cal:echo"
DRIVER = "cal:driver"


@dataclass(frozen=True)
class CalibrationPlan:
    """How much to measure: payload sizes of the message classes, rounds per class (the
    largest class gets ``big_rounds``), repeats (each figure is the median of the
    repeats, taken in turn), codec tensor size and repeats, the kvstore/server job's
    rounds, keys and tensor sizes, paced and shaped round trips per repeat, and bursts
    of the CPU-stretch measurement."""

    payload_bytes: tuple[int, ...] = (0, 1024, 16384, 262144, 4 << 20)
    rounds: int = 2000
    big_rounds: int = 60
    repeats: int = 3
    codec_elements: int = 1 << 20
    codec_repeats: int = 5
    node_rounds: int = 400
    node_keys: int = 4
    node_elements: tuple[int, int] = (16, 65536)
    shaped_rounds: int = 200
    stretch_bursts: int = 400


DEFAULT_PLAN = CalibrationPlan()
QUICK_PLAN = CalibrationPlan(payload_bytes=(0, 4096, 262144), rounds=300, big_rounds=30,
                             repeats=1, codec_elements=1 << 18, codec_repeats=2,
                             node_rounds=60, node_keys=2, shaped_rounds=50,
                             stretch_bursts=100)


# ---------------------------------------------------------------------------- messages
def _services() -> Any:
    from geomx.runtime.services import RealServices

    return RealServices(0, None, {}, time.time())


#: The echo node whose traffic with the driver goes through the real runtime's shaper
#: (both ways), as a message between DCs does.
ECHO_SHAPED = "cal:echo-shaped"
#: The shaped link's one-way delay and rate: the message measurement's WAN.
SHAPED_DELAY_S = 0.002
SHAPED_BANDWIDTH_BPS = 1e9


def _shaper(peer: str) -> Any:
    from geomx.runtime.shaper import LinkShape, Shaper

    return Shaper({peer: LinkShape(bandwidth_bps=SHAPED_BANDWIDTH_BPS, delay_s=SHAPED_DELAY_S)})


def _echo_node(transport: Any, name: str = ECHO) -> Any:
    """The echo side: answers every push with an empty acknowledgement (none for a
    one-way push) and a command with its process's CPU time so far."""
    from geomx.node.base import Node
    from geomx.wire import Kind

    class Echo(Node):
        role = "calibrate_echo"

        def __init__(self) -> None:
            super().__init__(name, "host", transport, _services())
            self.on(Kind.PUSH, self._push)
            self.on(Kind.COMMAND, self._command)
            self._done = asyncio.Event()

        def _push(self, msg: Any) -> None:
            if not msg.meta:
                self.post(msg.reply(Kind.PUSH_ACK, meta={}))

        def _command(self, msg: Any) -> None:
            op = msg.meta.get("op")
            if op == "hello":
                self.learn_addresses({msg.src: msg.meta["address"]})
            self.post(msg.reply(Kind.COMMAND_ACK, meta={"cpu_s": time.process_time()}))
            if op == "stop":
                self._done.set()

        async def main(self) -> None:
            await self._done.wait()
            await asyncio.sleep(0.05)  # the last acknowledgement leaves

    return Echo()


async def _echo_main() -> None:
    from geomx.runtime.tcp import TcpTransport

    transport = TcpTransport(ECHO)
    shaped = TcpTransport(ECHO_SHAPED, shaper=_shaper(DRIVER))
    await transport.start()
    await shaped.start()
    nodes = [_echo_node(transport), _echo_node(shaped, ECHO_SHAPED)]
    print(json.dumps({"address": transport.local_address(),
                      "shaped_address": shaped.local_address()}), flush=True)
    try:
        await asyncio.gather(*(n.run() for n in nodes))
    finally:
        await transport.close()
        await shaped.close()


def _driver_node(transport: Any, plan: CalibrationPlan, echo: dict[str, str]) -> Any:
    from geomx.node.base import Node
    from geomx.wire import Kind, Message, Payload

    class Driver(Node):
        role = "calibrate_driver"

        def __init__(self) -> None:
            super().__init__(DRIVER, "host", transport, _services())
            self.rounds: dict[int, list[tuple[float, float]]] = {}
            self.oneway: list[tuple[float, float]] = []
            self.shaped: list[tuple[float, float, list[float]]] = []
            self.paced: list[float] = []

        async def _echo_cpu(self, op: str = "cpu", to: str = ECHO, **meta: Any) -> float:
            reply = await self.request(Message(Kind.COMMAND, DRIVER, to,
                                               meta={"op": op, **meta}))
            return float(reply.meta["cpu_s"])

        async def _shaped_round_trips(self, n: int) -> tuple[float, float, list[float]]:
            """Empty requests and acknowledgements through the shaper both ways: each
            side's CPU per round and each round's wall seconds."""
            c0, p0 = await self._echo_cpu(to=ECHO_SHAPED), time.process_time()
            walls = []
            for _ in range(n):
                w0 = time.perf_counter()
                await self.request(Message(Kind.PUSH, DRIVER, ECHO_SHAPED, key=0))
                walls.append(time.perf_counter() - w0)
            p1 = time.process_time()
            c1 = await self._echo_cpu(to=ECHO_SHAPED)
            return (p1 - p0) / n, (c1 - c0) / n, walls

        async def _round_trips(self, payload: Any, n: int) -> tuple[float, float]:
            c0, p0 = await self._echo_cpu(), time.process_time()
            for _ in range(n):
                await self.request(Message(Kind.PUSH, DRIVER, ECHO, key=0, payloads=payload))
            p1 = time.process_time()
            c1 = await self._echo_cpu()
            return (p1 - p0) / n, (c1 - c0) / n

        async def _paced_round_trips(self, n: int, gap_s: float) -> list[float]:
            """Wall seconds of small round trips each after ``gap_s`` of quiet, as a node
            of a job sees them: both processes have gone back to sleep in between."""
            walls = []
            for _ in range(n):
                await asyncio.sleep(gap_s)
                w0 = time.perf_counter()
                await self.request(Message(Kind.PUSH, DRIVER, ECHO, key=0))
                walls.append(time.perf_counter() - w0)
            return walls

        async def _one_way(self, n: int) -> tuple[float, float]:
            c0, p0 = await self._echo_cpu(), time.process_time()
            for _ in range(n):
                self.post(Message(Kind.PUSH, DRIVER, ECHO, key=0, meta={"oneway": 1}))
            c1 = await self._echo_cpu()  # after every one-way push (one ordered outbox)
            p1 = time.process_time()
            return (p1 - p0) / n, (c1 - c0) / n

        async def main(self) -> None:
            self.learn_addresses({ECHO: echo["address"], ECHO_SHAPED: echo["shaped_address"]})
            await self._echo_cpu("hello", address=transport.local_address())
            await self._echo_cpu("hello", to=ECHO_SHAPED, address=transport.local_address())
            await self._shaped_round_trips(10)
            payloads = {b: [Payload.of(np.zeros(b // 4, np.float32))] if b else []
                        for b in plan.payload_bytes}
            for b in plan.payload_bytes:  # warm up: connections, buffers, first touches
                await self._round_trips(payloads[b], 20)
            for _ in range(plan.repeats):  # in turn, so load from elsewhere hits all alike
                for b in plan.payload_bytes:
                    n = plan.big_rounds if b == plan.payload_bytes[-1] else plan.rounds
                    self.rounds.setdefault(b, []).append(
                        await self._round_trips(payloads[b], max(1, n)))
                self.oneway.append(await self._one_way(plan.rounds))
                self.shaped.append(await self._shaped_round_trips(plan.shaped_rounds))
                self.paced += await self._paced_round_trips(plan.shaped_rounds, 0.005)
            await self._echo_cpu("stop", to=ECHO_SHAPED)
            await self._echo_cpu("stop")

    return Driver()


async def _driver_main(plan: CalibrationPlan, echo: dict[str, str]) -> Any:
    from geomx.runtime.tcp import TcpTransport

    transport = TcpTransport(DRIVER, shaper=_shaper(ECHO_SHAPED))
    await transport.start()
    node = _driver_node(transport, plan, echo)
    try:
        await node.run()
    finally:
        await transport.close()
    return node


@dataclass(frozen=True)
class MessageCosts:
    """Per size class: wire bytes (``Message.nbytes``), send and receive CPU seconds; the
    wake-up of an idle receiver (a delay, not CPU); a shaped message's extra CPU and how
    much later than its link's delay it is handled."""

    size_bytes: tuple[int, ...]
    send_s: tuple[float, ...]
    recv_s: tuple[float, ...]
    wakeup_s: float
    shaped_send_s: float
    shaped_late_s: float


def measure_messages(plan: CalibrationPlan = DEFAULT_PLAN) -> MessageCosts:
    """The message costs of this host (see the module docstring)."""
    from geomx.runtime.eventloop import run
    from geomx.wire import Kind, Message, Payload

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).resolve().parent.parent),
                                                    env.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen([sys.executable, "-m", "geomx.calibrate", "--echo"],
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("the echo process did not start (see its error above)")
        node = run(_driver_main(plan, json.loads(line)))
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # the acknowledgement's round (send + receive) split as the one-way burst splits it
    burst_send = statistics.median(s for s, _ in node.oneway)
    burst_recv = statistics.median(r for _, r in node.oneway)
    share_send = burst_send / (burst_send + burst_recv) if burst_send + burst_recv > 0 else 0.5
    first = plan.payload_bytes[0]
    ack_round = statistics.median(x for pair in node.rounds[first] for x in pair)
    ack_send, ack_recv = ack_round * share_send, ack_round * (1 - share_send)
    sizes, send, recv = [], [], []
    for b in plan.payload_bytes:
        driver = statistics.median(p for p, _ in node.rounds[b])
        echo = statistics.median(c for _, c in node.rounds[b])
        payloads = [Payload.phantom((b // 4,), "<f4")] if b else []
        sizes.append(Message(Kind.PUSH, DRIVER, ECHO, payloads=payloads).nbytes)
        send.append(max(0.0, driver - ack_recv))
        recv.append(max(0.0, echo - ack_send))
    # a small round trip after a quiet spell, beyond both sides' CPU: two hops of waking up
    wakeup_s = max(0.0, (statistics.median(node.paced) - ack_round * 2) / 2)
    # through the shaper: each side's extra CPU per round (one shaped send, one shaped
    # receive) is put on the send, where the shaper runs; the round's wall time beyond
    # both delays and both sides' CPU is two hops handled late
    shaped_side = statistics.median(p + c for p, c, _ in node.shaped) / 2
    shaped_send_s = max(0.0, shaped_side - ack_round)
    wall = statistics.median(w for _, _, walls in node.shaped for w in walls)
    shaped_late_s = max(0.0, (wall - 2 * SHAPED_DELAY_S - 2 * shaped_side) / 2)
    return MessageCosts(tuple(sizes), tuple(send), tuple(recv), wakeup_s, shaped_send_s,
                        shaped_late_s)


# ---------------------------------------------------------------------------- stretch
def measure_stretch(plan: CalibrationPlan = DEFAULT_PLAN) -> float:
    """Wall seconds per CPU second of short bursts of work between short sleeps, as a
    node works: 1 on a host with a free core, more when other processes share them."""
    rng = np.random.default_rng(2)
    wall = cpu = 0.0
    for gap in rng.uniform(0.001, 0.004, plan.stretch_bursts):
        time.sleep(float(gap))
        w0, c0 = time.perf_counter(), time.process_time()
        while time.process_time() - c0 < 0.0005:
            pass
        wall += time.perf_counter() - w0
        cpu += time.process_time() - c0
    return min(100.0, max(1.0, wall / cpu))


# ---------------------------------------------------------------------------- codecs
def measure_codecs(plan: CalibrationPlan = DEFAULT_PLAN) -> dict[str, CodecCost]:
    """Per built-in codec: encode and decode CPU seconds per dense byte, through the
    node's :class:`LinkCodec` (a push on the WAN tier). A codec that leaves a tensor of
    this size dense is left out."""
    from geomx.codec.registry import CODEC_NAMES
    from geomx.node.link_codec import LinkCodec
    from geomx.wire import Kind, Message

    rng = np.random.default_rng(0)
    x = rng.standard_normal(plan.codec_elements).astype(np.float32)
    dense = x.nbytes
    out: dict[str, CodecCost] = {}
    for name in CODEC_NAMES:
        if name == "none":
            continue
        link = LinkCodec({"type": name}, num_dcs=2)
        payloads, meta = link.encode_push(0, x, tier="wan")  # warm-up (and JIT compile)
        if not meta.get("codec"):
            continue
        msg = Message(Kind.PUSH, "a", "b", key=0, payloads=payloads, meta=meta)
        link.decode(msg, like=x)
        enc, dec = [], []
        for _ in range(plan.codec_repeats):
            t0 = time.process_time()
            payloads, meta = link.encode_push(0, x, tier="wan")
            t1 = time.process_time()
            link.decode(Message(Kind.PUSH, "a", "b", key=0, payloads=payloads, meta=meta),
                        like=x)
            t2 = time.process_time()
            enc.append(t1 - t0)
            dec.append(t2 - t1)
        out[name] = CodecCost(statistics.median(enc) / dense, statistics.median(dec) / dense)
    return out


# ---------------------------------------------------------------------- kvstore, server
async def kv_program(kv: Any, ctx: Any) -> None:
    """The calibration job's training program: ``ctx.args`` = rounds, keys, elements.
    Each round pushes and pulls every key; reports the CPU its kvstore calls took."""
    rounds, keys, n = (int(a) for a in ctx.args)
    values = [np.full(n, 0.5, np.float32) for _ in range(keys)]
    for k, v in enumerate(values):
        kv.init(k, v)
    if kv.is_master_worker:
        kv.set_optimizer(ctx.optimizer_config)
        await kv.waitall()
        return
    for k, v in enumerate(values):
        kv.pull(k, out=v)
    await kv.waitall()
    cpu_s = 0.0
    for _ in range(rounds):
        for k, v in enumerate(values):
            t0 = time.process_time()
            kv.push(k, v)
            kv.pull(k, out=v)
            cpu_s += time.process_time() - t0
        await kv.waitall()
    ctx.report(rounds, kv_call_cpu_s=cpu_s, kv_calls=2 * rounds * keys)


def _node_code_scenario(plan: CalibrationPlan, n: int, out_dir: str) -> Any:
    from geomx.scenario import parse_scenario

    return parse_scenario({
        "run": {"name": "calibrate", "iterations": plan.node_rounds, "eval_every": 0, "progress": False,
                "out_dir": out_dir},
        "dc": [{"name": "central", "central": True, "global_servers": 1, "workers": 0},
               {"name": "party", "workers": 1}],
        "wan": [{"a": "party", "b": "central", "bandwidth": "10Gbps", "latency": "1ms"}],
        "topology": {"kind": "flat"},
        "training": {"program": "geomx.calibrate:kv_program", "optimizer": "adam",
                     "program_args": [str(plan.node_rounds), str(plan.node_keys), str(n)]},
        "metrics": {"events": False, "trace": False, "plot": False},
    })


def _timed_job(s: Any, run_dir: Path) -> tuple[dict[tuple[str, str], list[float]], Any]:
    """Run ``s`` on the emulator's loop with every node's message handling timed (CPU
    seconds per (node, message kind)); sends reach the network one loop turn later, so
    a handler's time is the node's own work. Returns the times and the worker's result."""
    from geomx.cluster import make_node, plan_job
    from geomx.metrics.recorder import EventRecorder
    from geomx.sim.job_network import build_network
    from geomx.sim.loop import cancel_remaining, new_virtual_loop
    from geomx.sim.services import EmuServices
    from geomx.sim.supervise import run_nodes
    from geomx.sim.transport import SimFabric, SimTransport

    times: dict[tuple[str, str], list[float]] = {}

    class TimedTransport(SimTransport):
        def listen(self, handler: Callable[[Any], None]) -> Any:
            name = self.name

            def timed(msg: Any) -> None:
                t0 = time.process_time()
                handler(msg)
                times.setdefault((name, msg.kind.name), []).append(time.process_time() - t0)
            return super().listen(timed)

    class DeferredFabric(SimFabric):
        def transport(self, name: str) -> SimTransport:
            return TimedTransport(name, self.network, fabric=self)

        def send(self, msg: Any) -> None:
            loop.call_soon(SimFabric.send, self, msg)

    plan = plan_job(s, "emu")
    loop = new_virtual_loop()
    network = build_network(s, plan)
    recorder = EventRecorder(run_dir / "events.jsonl", clock=loop.time, enabled=False,
                             dc_of=plan.job.dc_of.get)
    services = EmuServices(s.run.seed, recorder, None, plan.job.dc_of, clock=loop.time)
    fabric = DeferredFabric(network)
    nodes = [make_node(plan, name, fabric.transport(name), services) for name in plan.nodes]
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(run_nodes(nodes))
    finally:
        cancel_remaining(loop)
        asyncio.set_event_loop(None)
        loop.close()
        recorder.close()
    worker = next(n for n in nodes if plan.roles[n.name] == "worker")
    return times, worker.result


def measure_node_code(plan: CalibrationPlan = DEFAULT_PLAN) -> dict[str, float]:
    """The kvstore's per-call and the server's per-push and per-pull costs (fixed and
    per byte), from the one-worker job at two tensor sizes."""
    per: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="geomx-calibrate-") as tmp:
        for n in plan.node_elements:
            s = _node_code_scenario(plan, n, tmp)
            times, result = _timed_job(s, Path(tmp))
            calls = int(result["kv_calls"])
            worker = [t for (node, kind), ts in times.items() if node.startswith("w:")
                      and kind in ("PUSH_ACK", "PULL_REPLY") for t in ts]
            pushes = times.get(("gs:0", "PUSH"), [])
            pulls = times.get(("gs:0", "PULL"), [])
            skip = plan.node_keys * 2  # the initial pull and the first round's first touches
            per[n] = {"call": (float(result["kv_call_cpu_s"]) + sum(worker[skip:]))
                      / max(1, calls - skip),
                      "push": statistics.median(pushes[skip:] or pushes or [0.0]),
                      "pull": statistics.median(pulls[skip:] or pulls or [0.0])}
    small, big = plan.node_elements
    span = 4.0 * (big - small)

    def fixed_and_slope(key: str) -> tuple[float, float]:
        slope = max(0.0, (per[big][key] - per[small][key]) / span)
        return max(0.0, per[small][key] - slope * 4 * small), slope

    call, call_b = fixed_and_slope("call")
    push, push_b = fixed_and_slope("push")
    pull, pull_b = fixed_and_slope("pull")
    return {"kvstore_call_s": call, "kvstore_call_s_per_byte": call_b,
            "server_push_s": push, "server_push_s_per_byte": push_b,
            "server_pull_s": pull, "server_pull_s_per_byte": pull_b}


# ---------------------------------------------------------------------------- all of it
def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else []


def calibrate(plan: CalibrationPlan = DEFAULT_PLAN, *, quick: bool = False,
              progress: Callable[[str], None] | None = None) -> HostProfile:
    """Measure everything (see the module docstring) and return the profile."""
    say = progress or (lambda _: None)
    t0 = time.perf_counter()
    load_before = _load()
    say("messages over loopback sockets ...")
    messages = measure_messages(plan)
    say("CPU share ...")
    stretch = measure_stretch(plan)
    say("codecs ...")
    codecs = measure_codecs(plan)
    say("kvstore and server ...")
    node = measure_node_code(plan)
    made_by = provenance()
    machine = made_by["machine"]
    from geomx.runtime.eventloop import new_event_loop, loop_kind

    probe = new_event_loop()
    kind = loop_kind(probe)
    probe.close()
    prov = {"measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "duration_s": round(time.perf_counter() - t0, 1), "quick": quick,
            "cpu": machine["cpu"], "cores": machine["cores"], "platform": machine["platform"],
            "load_average_before": load_before, "load_average_after": _load(),
            "event_loop": kind, "python": made_by["python"],
            "numpy": made_by["numpy"], "numba": made_by["numba"],
            "geomx": made_by["geomx"]["version"],
            "commit": made_by["geomx"]["commit"] or "",
            "payload_bytes": list(plan.payload_bytes), "rounds": plan.rounds,
            "repeats": plan.repeats}
    return HostProfile(size_bytes=messages.size_bytes, send_s=messages.send_s,
                       recv_s=messages.recv_s, wakeup_s=messages.wakeup_s,
                       shaped_send_s=messages.shaped_send_s,
                       shaped_late_s=messages.shaped_late_s, codecs=codecs,
                       cpu_stretch=stretch,
                       provenance=prov, **node)


def summary_lines(p: HostProfile) -> list[str]:
    """What a person reads after calibrating: the costs in microseconds."""
    lines = ["message  wire bytes    send us    recv us"]
    for b, s, r in zip(p.size_bytes, p.send_s, p.recv_s):
        lines.append(f"         {b:10d} {s * 1e6:10.1f} {r * 1e6:10.1f}")
    lines.append(f"wake-up of an idle receiver {p.wakeup_s * 1e6:.1f} us; through the "
                 f"shaper: +{p.shaped_send_s * 1e6:.1f} us CPU per message, handled "
                 f"{p.shaped_late_s * 1e6:.1f} us after the link's delay")
    lines.append(f"CPU stretch {p.cpu_stretch:.2f} (wall seconds per CPU second of work)")
    for name, c in sorted(p.codecs.items()):
        lines.append(f"codec {name:6s} encode {c.encode_s_per_byte * 1e9:7.3f} ns/B, "
                     f"decode {c.decode_s_per_byte * 1e9:7.3f} ns/B")
    lines.append(f"kvstore call {p.kvstore_call_s * 1e6:.1f} us "
                 f"+ {p.kvstore_call_s_per_byte * 1e9:.3f} ns/B")
    lines.append(f"server push {p.server_push_s * 1e6:.1f} us "
                 f"+ {p.server_push_s_per_byte * 1e9:.3f} ns/B; pull "
                 f"{p.server_pull_s * 1e6:.1f} us + {p.server_pull_s_per_byte * 1e9:.3f} ns/B")
    return lines


CALIBRATE_EPILOG = """\
examples:
  geomx calibrate --out host.toml                    # under a minute; then:
  geomx run scenarios/quickstart.toml --host host.toml
  geomx fidelity scenarios/netstorm_4dc.toml --host host.toml
"""


def add_parser(sub: Any) -> None:
    """Register ``geomx calibrate`` on the main parser's subparsers."""
    p = sub.add_parser(
        "calibrate", help="measure this host's CPU costs per message, codec byte, kvstore "
                          "call and server push; write a host profile",
        description="Measure what this host's CPU pays per message (by size, over loopback "
                    "sockets), per codec byte, per kvstore call and per server push, and "
                    "write a host profile the emulator charges ([host] profile, --host). "
                    "docs/calibration.md",
        epilog=CALIBRATE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="host.toml", help="profile file to write (default host.toml)")
    p.add_argument("--quick", action="store_true",
                   help="fewer rounds and size classes (seconds; for tests, noisier)")
    p.set_defaults(handler=_cli)


def _cli(args: Any) -> int:
    plan = QUICK_PLAN if args.quick else DEFAULT_PLAN
    profile = calibrate(plan, quick=args.quick,
                        progress=lambda m: print(m, file=sys.stderr, flush=True))
    out = Path(args.out)
    out.write_text(profile_to_toml(profile), encoding="utf-8")
    load_profile(out)  # what was written reads back
    for line in summary_lines(profile):
        print(line)
    prov = profile.provenance
    print(f"profile: {out} ({prov['duration_s']} s; load average "
          f"{prov['load_average_before']} -> {prov['load_average_after']} on "
          f"{prov['cores']} cores)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m geomx.calibrate --echo``: the echo process of the message measurement."""
    p = argparse.ArgumentParser(prog="python -m geomx.calibrate")
    p.add_argument("--echo", action="store_true", help="run the echo side (internal)")
    args = p.parse_args(argv)
    if not args.echo:
        p.error("use `geomx calibrate`")
    from geomx.runtime.eventloop import run

    run(_echo_main())
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
