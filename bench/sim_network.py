"""Micro-benchmarks of the emulator's hot path (loop + network + SimTransport).

Run: ``python bench/sim_network.py [--repeat 3]``. Prints messages per wall second and
the ratio of emulated to wall time for:

* ``stream``: 100k messages over 64 reliable connections (8 x 8 hosts in two DCs),
  transmitted straight from loop callbacks; isolates loop + network cost;
* ``churn``: 64 connections that go busy and idle for every message (request/response
  with think times): the worst case for rate recomputation;
* ``transport``: the same traffic through SimTransport with one sender and one receiver
  task per node, i.e. with asyncio task switches and queues like node code;
* ``ps``: a two-tier parameter-server pattern with phantom ResNet-50-sized tensors
  (161 tensors, 25.6M parameters) on 4 DCs x 8 workers: workers push every tensor to
  their DC's local server, local servers aggregate and push to one global server over
  the WAN, replies flow back down. The ratio emulated/wall must stay above 1.

Each figure is the best of ``--repeat`` runs (the machine is shared). As a baseline
measured in the same run, ``baseline`` is the stdlib asyncio loop running three no-op
callbacks per message (about what the emulator schedules per message: a completion,
a delivery, a task wake-up); the last column is each benchmark's wall time per message
over the baseline's.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from geomx.sim.loop import run_virtual  # noqa: E402
from geomx.sim.network import Network  # noqa: E402
from geomx.sim.transport import SimFabric  # noqa: E402
from geomx.wire import Kind, Message, Payload  # noqa: E402


def _two_dc(n_hosts: int) -> Network:
    net = Network(seed=1)
    for dc in ("a", "b"):
        net.add_dc(dc, lan_delay_s=1e-4)
        for i in range(n_hosts):
            net.add_host(f"{dc}{i}", dc, nic_bandwidth_bps=10e9)
    net.add_wan("a", "b", bandwidth_bps=1e9, delay_s=0.02, jitter_s=0.001)
    return net


def _stream_messages(n_msgs: int, n_hosts: int) -> list[tuple[float, Message]]:
    rng = random.Random(0)
    pairs = [(f"a{i}", f"b{j}") for i in range(n_hosts) for j in range(n_hosts)]
    out = []
    t = 0.0
    for k in range(n_msgs):
        src, dst = pairs[k % len(pairs)]
        if k % len(pairs) == 0:
            t += rng.expovariate(50.0)  # bursts of one message per connection
        out.append((t, Message(kind=Kind.PUSH, src=src, dst=dst, key=k,
                               payloads=[Payload.phantom((rng.randrange(1, 50_000),), "<f4")])))
    return out


def bench_stream(n_msgs: int = 100_000) -> tuple[int, float, float]:
    net = _two_dc(8)
    sends = _stream_messages(n_msgs, 8)
    delivered = 0

    async def main() -> float:
        nonlocal delivered
        loop = asyncio.get_running_loop()
        done = asyncio.Event()

        def deliver(_m: Message) -> None:
            nonlocal delivered
            delivered += 1
            if delivered == n_msgs:
                done.set()

        for t, m in sends:
            loop.call_at(t, net.transmit, m, deliver)
        await done.wait()
        return loop.time()

    w0 = time.perf_counter()
    emulated_s = run_virtual(main())
    return delivered, time.perf_counter() - w0, emulated_s


def bench_churn(n_msgs: int = 100_000) -> tuple[int, float, float]:
    """64 request/response-like connections: each sends one message, waits for its
    arrival plus a random think time, then sends the next. Connections go busy and idle
    all the time, so nearly every message costs two rate recomputations over ~tens of
    concurrent flows: the worst case for the rate allocator."""
    net = _two_dc(8)
    rng = random.Random(0)
    pairs = [(f"a{i}", f"b{j}") for i in range(8) for j in range(8)]
    per_conn = n_msgs // len(pairs)
    delivered = 0
    sent = {p: 0 for p in pairs}

    async def main() -> float:
        loop = asyncio.get_running_loop()
        done = asyncio.Event()

        def send(pair: tuple[str, str]) -> None:
            sent[pair] += 1
            net.transmit(Message(kind=Kind.PUSH, src=pair[0], dst=pair[1], key=sent[pair],
                                 payloads=[Payload.phantom((rng.randrange(1, 500_000),))]),
                         deliver)

        def deliver(m: Message) -> None:
            nonlocal delivered
            delivered += 1
            pair = (m.src, m.dst)
            if sent[pair] < per_conn:
                loop.call_later(rng.expovariate(100.0), send, pair)
            elif delivered == per_conn * len(pairs):
                done.set()

        for pair in pairs:
            send(pair)
        await done.wait()
        return loop.time()

    w0 = time.perf_counter()
    emulated_s = run_virtual(main())
    print(f"  (churn: {net.rate_recomputations} rate recomputations)")
    return delivered, time.perf_counter() - w0, emulated_s


def bench_transport(n_msgs: int = 100_000) -> tuple[int, float, float]:
    net = _two_dc(8)
    fabric = SimFabric(net)
    per_sender = (n_msgs // 64) * 8  # each sender sends per_sender/8 to each receiver
    received = 0

    async def main() -> float:
        loop = asyncio.get_running_loop()
        tps = {name: fabric.transport(name) for name in
               [f"a{i}" for i in range(8)] + [f"b{i}" for i in range(8)]}

        async def sender(i: int) -> None:
            rng = random.Random(i)
            t = tps[f"a{i}"]
            for k in range(per_sender):
                await t.send(Message(kind=Kind.PUSH, src=t.name, dst=f"b{k % 8}", key=k,
                                     payloads=[Payload.phantom((rng.randrange(1, 50_000),))]))
                if k % 8 == 7:
                    await asyncio.sleep(rng.expovariate(50.0))

        async def receiver(j: int) -> None:
            nonlocal received
            t = tps[f"b{j}"]
            for _ in range(per_sender):
                await t.recv()
                received += 1

        await asyncio.gather(*(sender(i) for i in range(8)), *(receiver(j) for j in range(8)))
        return loop.time()

    w0 = time.perf_counter()
    emulated_s = run_virtual(main())
    return received, time.perf_counter() - w0, emulated_s


def _resnet50_sizes() -> list[int]:
    """161 tensor sizes adding up to ~25.6M: 53 convolutions, 53 BN gammas, 53 BN betas,
    the fully connected weight and bias (shapes follow ResNet-50's stages)."""
    sizes: list[int] = [3 * 64 * 49]
    bn: list[int] = [64]
    c_in = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            convs = [(c_in, width, 1), (width, width, 9), (width, 4 * width, 1)]
            if b == 0:
                convs.append((c_in, 4 * width, 1))
            for ci, co, k in convs:
                sizes.append(ci * co * k)
                bn.append(co)
            c_in = 4 * width
    out = []
    for s, c in zip(sizes, bn):
        out += [s, c, c]
    out += [2048 * 1000, 1000]
    return out


def bench_ps(iterations: int = 3, n_dcs: int = 4, n_workers: int = 8) -> tuple[int, float, float]:
    sizes = _resnet50_sizes()
    net = Network(seed=1)
    dcs = [f"dc{d}" for d in range(n_dcs)]
    for dc in dcs:
        net.add_dc(dc, lan_delay_s=1e-4)
        net.add_host(f"ls:{dc}", dc, nic_bandwidth_bps=10e9)
        for i in range(n_workers):
            net.add_host(f"w:{dc}:{i}", dc, nic_bandwidth_bps=10e9)
    net.add_dc("central", lan_delay_s=1e-4)
    net.add_host("gs:0", "central", nic_bandwidth_bps=10e9)
    for dc in dcs:
        net.add_wan(dc, "central", bandwidth_bps=1e9, delay_s=0.025)
    fabric = SimFabric(net)

    def push(src: str, dst: str, key: int, kind: Kind, it: int) -> Message:
        return Message(kind=kind, src=src, dst=dst, key=key, version=it,
                       payloads=[Payload.phantom((sizes[key],))])

    async def worker(dc: str, i: int) -> None:
        t = fabric.transport(f"w:{dc}:{i}")
        for it in range(iterations):
            await asyncio.sleep(0.05)  # "compute"
            for key in reversed(range(len(sizes))):
                await t.send(push(t.name, f"ls:{dc}", key, Kind.PUSH, it))
            for _ in sizes:
                await t.recv()

    async def local_server(dc: str) -> None:
        t = fabric.transport(f"ls:{dc}")
        for it in range(iterations):
            counts = [0] * len(sizes)
            pending_up = len(sizes)
            pending_down = len(sizes)
            while pending_up or pending_down:
                m = await t.recv()
                if m.kind == Kind.PUSH:
                    counts[m.key] += 1
                    if counts[m.key] == n_workers:
                        pending_up -= 1
                        await t.send(push(t.name, "gs:0", m.key, Kind.PUSH, it))
                else:
                    pending_down -= 1
                    for i in range(n_workers):
                        await t.send(push(t.name, f"w:{dc}:{i}", m.key, Kind.PULL_REPLY, it))

    async def global_server() -> None:
        t = fabric.transport("gs:0")
        for it in range(iterations):
            counts = [0] * len(sizes)
            for _ in range(len(sizes) * n_dcs):
                m = await t.recv()
                counts[m.key] += 1
                if counts[m.key] == n_dcs:
                    for dc in dcs:
                        await t.send(push(t.name, f"ls:{dc}", m.key, Kind.PULL_REPLY, it))

    async def main() -> float:
        await asyncio.gather(global_server(), *(local_server(dc) for dc in dcs),
                             *(worker(dc, i) for dc in dcs for i in range(n_workers)))
        return asyncio.get_running_loop().time()

    w0 = time.perf_counter()
    emulated_s = run_virtual(main())
    n = net.messages_delivered
    return n, time.perf_counter() - w0, emulated_s


def bench_baseline(n_msgs: int = 100_000) -> tuple[int, float, float]:
    loop = asyncio.new_event_loop()
    try:
        def noop() -> None:
            pass

        async def run() -> None:
            for _ in range(3 * n_msgs // 1000):
                for _ in range(1000):
                    loop.call_soon(noop)
                await asyncio.sleep(0)

        w0 = time.perf_counter()
        loop.run_until_complete(run())
        return n_msgs, time.perf_counter() - w0, 0.0
    finally:
        loop.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--ps-iterations", type=int, default=3)
    args = ap.parse_args()
    per_msg_baseline = None
    for name, fn in (("baseline", lambda: bench_baseline(args.messages)),
                     ("stream", lambda: bench_stream(args.messages)),
                     ("churn", lambda: bench_churn(args.messages)),
                     ("transport", lambda: bench_transport(args.messages)),
                     ("ps", lambda: bench_ps(args.ps_iterations))):
        best = None
        for _ in range(args.repeat):
            r = fn()
            if best is None or r[1] < best[1]:
                best = r
        n, wall_s, emu_s = best
        per_msg = wall_s / n
        if per_msg_baseline is None:
            per_msg_baseline = per_msg
        print(f"{name:10s} {n:8d} msgs  wall {wall_s:7.3f} s  {n / wall_s:10,.0f} msg/s  "
              f"emulated {emu_s:8.3f} s  emulated/wall {emu_s / wall_s:6.2f}  "
              f"x baseline {per_msg / per_msg_baseline:5.1f}")


if __name__ == "__main__":
    main()
