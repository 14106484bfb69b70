"""The geomx side of ``bench/peers.py``: a training program that times kvstore operations.

Run by ``geomx run <scenario> --runtime real`` (one worker, one global server, flat PS,
no shaping, optimizer ``none`` so the server stores what it is pushed, as MXNet's server
does without an updater). The worker times, after one untimed warm-up each:

* ``big``: push + pull of one ``--mb`` MB float32 key (seconds);
* ``small``: ``--keys`` keys of ``--key-kb`` KB, every key pushed then every key pulled
  with one call per key (seconds), and ``small_list``: the same as one ``push(list)`` and
  one ``pull(list)``;
* ``rtt``: ``--pings`` push + pull pairs of a 64-byte key, each awaited (p50 seconds).

and writes them as JSON to ``--out``. The master worker only declares the keys.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np


async def main(kv, ctx):
    p = argparse.ArgumentParser("peers_geomx")
    p.add_argument("--mb", type=float, default=100.0)
    p.add_argument("--keys", type=int, default=1000)
    p.add_argument("--key-kb", type=float, default=4.0)
    p.add_argument("--pings", type=int, default=300)
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--out", required=True)
    args = p.parse_args(ctx.args)
    big = np.ones(int(args.mb * 1e6) // 4, dtype=np.float32)
    small_n = int(args.key_kb * 1024) // 4
    smalls = [np.full(small_n, i, dtype=np.float32) for i in range(args.keys)]
    ping = np.ones(16, dtype=np.float32)
    big_key, ping_key, first = 0, 1, 2
    small_keys = list(range(first, first + args.keys))
    kv.init(big_key, big)
    kv.init(ping_key, ping)
    kv.init(small_keys, smalls)
    await kv.waitall()
    if kv.is_master_worker:
        return
    out_big = np.empty_like(big)
    outs = [np.empty_like(s) for s in smalls]
    out_ping = np.empty_like(ping)

    async def do_big() -> None:
        kv.push(big_key, big)
        await kv.pull(big_key, out=out_big)

    async def do_small() -> None:
        for k, s in zip(small_keys, smalls):
            kv.push(k, s)
        for k, o in zip(small_keys, outs):
            kv.pull(k, out=o)
        await kv.waitall()

    async def do_small_list() -> None:
        kv.push(small_keys, smalls)
        await kv.pull(small_keys, out=outs)

    async def do_ping() -> None:
        await kv.push(ping_key, ping)
        await kv.pull(ping_key, out=out_ping)

    result: dict[str, float] = {}
    for name, fn in (("big", do_big), ("small", do_small), ("small_list", do_small_list)):
        await fn()  # warm-up
        times = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            await fn()
            times.append(time.perf_counter() - t0)
        result[name] = statistics.median(times)
    assert np.array_equal(out_big, big) and all(np.array_equal(o, s) for o, s in zip(outs, smalls))
    for _ in range(20):
        await do_ping()
    rtts = []
    for _ in range(args.pings):
        t0 = time.perf_counter()
        await do_ping()
        rtts.append(time.perf_counter() - t0)
    result["rtt"] = statistics.median(rtts)
    with open(args.out, "w") as f:
        json.dump(result, f)
