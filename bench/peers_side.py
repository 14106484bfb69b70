"""The peer side of ``bench/peers.py``: the same operations through gloo, pyzmq and MXNet.

Runs under whichever Python has the peer installed (a torch or MXNet venv), so it
imports only numpy and the peer library, never geomx. One process per role:

    python peers_side.py --peer gloo-p2p|gloo-allreduce|zmq|mxnet --role worker|server
        --port P --mb 100 --keys 1000 --key-kb 4 --pings 300 --reps 1 [--out result.json]

The worker times what ``bench/peers_geomx.py`` times (``big``, ``small``, ``small_list``
where the peer has a list call, ``rtt``: seconds, p50 for ``rtt``) after one warm-up
each and writes JSON to ``--out``. Semantics per peer, chosen to be each system's own
way of doing a push then a pull:

* ``gloo-p2p``: torch.distributed ``send`` to the server rank, which ``recv``s into a
  buffer and ``send``s it back (no acknowledgement of the push: one round trip);
* ``gloo-allreduce``: ``all_reduce`` of the tensor over the two ranks;
* ``zmq``: DEALER -> ROUTER, a push carries the data and is acknowledged, a pull asks
  and gets the stored value (ps-lite's exchange, two round trips), zero-copy frames;
  the server copies a push into its store;
* ``mxnet``: ``mx.kv.create("dist_sync")``, ``kv.push`` then ``kv.pull`` and
  ``wait_to_read`` (ps-lite over ZeroMQ; the server stores a push, no updater). The
  MXNet server and scheduler are ``import mxnet`` with their DMLC_ROLE.
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import time

import numpy as np

HDR = struct.Struct("<cq")  # op, key


def _arrays(args):
    big = np.ones(int(args.mb * 1e6) // 4, dtype=np.float32)
    n = int(args.key_kb * 1024) // 4
    smalls = [np.full(n, i, dtype=np.float32) for i in range(args.keys)]
    ping = np.ones(16, dtype=np.float32)
    return big, smalls, ping


def _timed(ops, reps: int, pings: int) -> dict[str, float]:
    """Warm up and time each op in ``ops`` (name -> callable); ``rtt`` is a p50."""
    out = {}
    for name, fn in ops.items():
        if name == "rtt":
            continue
        fn()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        out[name] = statistics.median(times)
    for _ in range(20):
        ops["rtt"]()
    rtts = []
    for _ in range(pings):
        t0 = time.perf_counter()
        ops["rtt"]()
        rtts.append(time.perf_counter() - t0)
    out["rtt"] = statistics.median(rtts)
    return out


# -- gloo ------------------------------------------------------------------------------

def gloo(args, allreduce: bool) -> dict[str, float] | None:
    import torch
    import torch.distributed as dist

    rank = 0 if args.role == "worker" else 1
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                            rank=rank, world_size=2)
    nbig, nsmalls, nping = _arrays(args)
    big = torch.from_numpy(nbig)
    smalls = [torch.from_numpy(s) for s in nsmalls]
    ping = torch.from_numpy(nping)
    obig, osmalls, oping = torch.empty_like(big), [torch.empty_like(s) for s in smalls], \
        torch.empty_like(ping)
    if allreduce:
        def one(t, o):
            dist.all_reduce(t)

        def many(ts, os_):
            for t in ts:
                dist.all_reduce(t)
    elif rank == 0:
        def one(t, o):
            dist.send(t, 1)
            dist.recv(o, 1)

        def many(ts, os_):
            for t in ts:
                dist.send(t, 1)
            for o in os_:
                dist.recv(o, 1)
    else:
        def one(t, o):
            dist.recv(o, 0)
            dist.send(o, 0)

        def many(ts, os_):
            for o in os_:
                dist.recv(o, 0)
            for o in os_:
                dist.send(o, 0)
    ops = {"big": lambda: one(big, obig), "small": lambda: many(smalls, osmalls),
           "rtt": lambda: one(ping, oping)}
    res = _timed(ops, args.reps, args.pings)
    dist.barrier()
    dist.destroy_process_group()
    return res if rank == 0 else None


# -- zmq -------------------------------------------------------------------------------

def zmq_server(args) -> None:
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(f"tcp://127.0.0.1:{args.port}")
    store: dict[int, np.ndarray] = {}
    while True:
        frames = sock.recv_multipart(copy=False)
        ident, hdr = frames[0], frames[1]
        op, key = HDR.unpack(hdr.bytes)
        if op == b"P":
            data = np.frombuffer(frames[2].buffer, dtype=np.float32)
            dst = store.get(key)
            if dst is None or dst.shape != data.shape:
                dst = store[key] = np.empty_like(data)
            np.copyto(dst, data)
            sock.send_multipart([ident, hdr], copy=False)
        elif op == b"G":
            sock.send_multipart([ident, hdr, store[key]], copy=False)
        else:
            sock.send_multipart([ident, hdr])
            break
    sock.close(linger=1000)
    ctx.term()


def zmq_worker(args) -> dict[str, float]:
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(f"tcp://127.0.0.1:{args.port}")
    big, smalls, ping = _arrays(args)
    obig, osmalls, oping = np.empty_like(big), [np.empty_like(s) for s in smalls], \
        np.empty_like(ping)

    def many(keys, ts, os_):
        for k, t in zip(keys, ts):
            sock.send_multipart([HDR.pack(b"P", k), t], copy=False)
        for _ in keys:
            sock.recv_multipart(copy=False)
        for k in keys:
            sock.send(HDR.pack(b"G", k))
        got = {}
        for _ in keys:
            frames = sock.recv_multipart(copy=False)
            got[HDR.unpack(frames[0].bytes)[1]] = frames[1]
        for k, o in zip(keys, os_):
            np.copyto(o, np.frombuffer(got[k].buffer, dtype=np.float32))

    skeys = list(range(2, 2 + len(smalls)))
    ops = {"big": lambda: many([0], [big], [obig]), "small": lambda: many(skeys, smalls, osmalls),
           "rtt": lambda: many([1], [ping], [oping])}
    res = _timed(ops, args.reps, args.pings)
    assert np.array_equal(obig, big)
    sock.send(HDR.pack(b"Q", 0))
    sock.recv_multipart()
    sock.close()
    ctx.term()
    return res


# -- mxnet -----------------------------------------------------------------------------

def mxnet_worker(args) -> dict[str, float]:
    import mxnet as mx

    kv = mx.kv.create("dist_sync")
    nbig, nsmalls, nping = _arrays(args)
    big, ping = mx.nd.array(nbig), mx.nd.array(nping)
    smalls = [mx.nd.array(s) for s in nsmalls]
    obig, oping = mx.nd.zeros(big.shape), mx.nd.zeros(ping.shape)
    osmalls = [mx.nd.zeros(s.shape) for s in smalls]
    skeys = list(range(2, 2 + len(smalls)))
    kv.init(0, big)
    kv.init(1, ping)
    kv.init(skeys, smalls)
    mx.nd.waitall()

    def one(k, t, o):
        kv.push(k, t)
        kv.pull(k, out=o)
        o.wait_to_read()

    def many():
        for k, t in zip(skeys, smalls):
            kv.push(k, t)
        for k, o in zip(skeys, osmalls):
            kv.pull(k, out=o)
        mx.nd.waitall()

    def many_list():
        kv.push(skeys, smalls)
        kv.pull(skeys, out=osmalls)
        mx.nd.waitall()

    ops = {"big": lambda: one(0, big, obig), "small": many, "small_list": many_list,
           "rtt": lambda: one(1, ping, oping)}
    res = _timed(ops, args.reps, args.pings)
    assert np.array_equal(obig.asnumpy(), nbig)
    return res


def main() -> None:
    p = argparse.ArgumentParser("peers_side")
    p.add_argument("--peer", required=True, choices=["gloo-p2p", "gloo-allreduce", "zmq", "mxnet"])
    p.add_argument("--role", required=True, choices=["worker", "server"])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--mb", type=float, default=100.0)
    p.add_argument("--keys", type=int, default=1000)
    p.add_argument("--key-kb", type=float, default=4.0)
    p.add_argument("--pings", type=int, default=300)
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--out", default="")
    args = p.parse_args()
    res = None
    if args.peer.startswith("gloo"):
        res = gloo(args, allreduce=args.peer == "gloo-allreduce")
    elif args.peer == "zmq":
        if args.role == "server":
            zmq_server(args)
        else:
            res = zmq_worker(args)
    else:
        res = mxnet_worker(args)
    if res is not None and args.out:
        with open(args.out, "w") as f:
            json.dump(res, f)


if __name__ == "__main__":
    main()
