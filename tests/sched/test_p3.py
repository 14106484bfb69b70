"""P3 (geomx/sched/p3.py) and the per-layer compute model (geomx/node/layered.py).

Emulator: slicing bounds and placement, the send order by priority (node outbox and on
the wire), push/pull fusion saving the pull round trip, P3 changing timing and not maths
(FSA, HiPS and flat, one and two global servers), composition with codecs and HFA, the
scenario's checks, GeoMX's environment switches. Real sockets: the quickstart-shaped
p3.toml over loopback reaching the emulator's accuracy.
"""

import asyncio

import numpy as np
import pytest

from geomx.experiment import run_scenario
from geomx.node.base import Node
from geomx.policy.wire_keys import (MAX_SLICES_PER_KEY, SLICE_KEY_STRIDE, WireKeyError,
                                    slice_key, split_slice_key)
from geomx.sched.p3 import P3Error, slices_of
from geomx.sched.placement import place
from geomx.scenario import ScenarioError
from geomx.transport import TransportDefaults
from geomx.wire import Kind, Message

from tests.helpers.events import run_events

SHORT = ("run.target_accuracy=0", "metrics.plot=false", "metrics.trace=false")
P3 = ("sched.p3=true", "sched.p3_slice_elements=500")


def _workers(nodes):
    return [n for n in nodes if getattr(n, "role", "") == "worker" and not n.is_master]


def _run(scenario_of, name, *overrides):
    seen = {}
    r = run_scenario(scenario_of(name, *SHORT, *overrides),
                     inspect=lambda nodes: seen.setdefault("nodes", nodes))
    return r, seen["nodes"]


# ------------------------------------------------------------------ slicing, placement

def test_slices_cover_the_tensor_within_the_bound():
    for n, size in [(0, 10), (1, 10), (10, 10), (11, 10), (4096, 500), (1_000_000, 50_000)]:
        sl = slices_of(7, n, size)
        assert sl[0].lo == 0 and sl[-1].hi == n
        assert all(a.hi == b.lo for a, b in zip(sl, sl[1:]))
        assert all(0 <= s.size <= size for s in sl) and all(s.size == size for s in sl[:-1])
        assert [split_slice_key(s.skey) for s in sl] == [(7, i) for i in range(len(sl))]
    assert slices_of(3, 100, 1000)[0].skey == 3  # an unsliced key keeps its number
    with pytest.raises(P3Error, match="p3_slice_elements"):
        slices_of(0, 10, 0)
    with pytest.raises(WireKeyError, match="out of range"):
        slice_key(0, MAX_SLICES_PER_KEY + 1)


@pytest.mark.parametrize("servers", [2, 3, 4, 5, 8, 16])
def test_consecutive_slices_go_round_robin_over_the_servers(servers):
    for key in (0, 1, 5, 160):
        sl = slices_of(key, 50 * servers, 10)
        homes = [place(s.skey, s.size, servers, 1_000_000)[0].server for s in sl]
        assert sorted(homes[:servers]) == list(range(servers))
        assert homes == [homes[i % servers] for i in range(len(homes))]


# ------------------------------------------------------------------ send order

class _GatedTransport(TransportDefaults):
    """A transport whose sends wait on a gate: messages pile up in the node's outbox."""

    def __init__(self):
        self.sent: list[Message] = []
        self.gate = asyncio.Event()
        self.inbox: asyncio.Queue = asyncio.Queue()

    async def send(self, msg):
        await self.gate.wait()
        self.sent.append(msg)

    async def recv(self):
        return await self.inbox.get()

    def set_address_book(self, book):
        pass

    async def close(self):
        pass


class _Services:
    def record(self, *a, **k):
        pass

    def count_bytes(self, msg):
        pass

    def now(self):
        return 0.0


def test_node_outbox_serves_highest_priority_first_fifo_among_equals():
    async def main():
        tr = _GatedTransport()
        node = Node("w", "dc", tr, _Services())
        node._running = True
        node.post(Message(Kind.PUSH, "w", "ls", key=0, priority=0))
        for _ in range(3):
            await asyncio.sleep(0)  # the sender takes the first message and blocks on the gate
        for i, prio in enumerate([-5, -1, 3, -1, 3, -5], start=1):
            node.post(Message(Kind.PUSH, "w", "ls", key=i, priority=prio))
        node.post(Message(Kind.PUSH, "w", "ls", key=7, priority=1))  # arrives late, overtakes
        tr.gate.set()
        for _ in range(20):
            await asyncio.sleep(0)
        for t in node._senders.values():
            t.cancel()
        return [(m.key, m.priority) for m in tr.sent]

    order = asyncio.run(main())
    assert order == [(0, 0), (3, 3), (5, 3), (7, 1), (2, -1), (4, -1), (1, -5), (6, -5)]


def test_a_late_early_layer_slice_overtakes_queued_deeper_slices_on_the_wire(scenario_of):
    # flat PS over a 100 Mbps WAN: a worker's pushes queue on its connection, so the
    # first layer's slices (ready last in backward) overtake deeper slices ready before
    r, _ = _run(scenario_of, "vanilla_ps.toml", "run.iterations=3", "training.layer_compute=flops",
                *P3)
    ev = run_events(r.run_dir)
    w = "w:party-a:0"
    ready = {(e["skey"]): e["t_start"] for e in ev if e["ev"] == "p3_slice" and e["node"] == w}
    pushes = [e for e in ev if e["ev"] == "xfer" and e["msg"] == "PUSH" and e["src"] == w]
    assert pushes and ready
    overtakes = 0
    for i, a in enumerate(pushes):
        for b in pushes[i + 1:]:
            ka, kb = split_slice_key(a["key"]), split_slice_key(b["key"])
            if ka[0] == kb[0]:  # equal priority: never reordered
                assert ka[1] < kb[1] or a["t"] < b["t"] - 1e-9 or ka[1] != kb[1]
            if ka[0] < kb[0] and a["t"] < b["t"] and ready[a["key"]] > ready[b["key"]]:
                overtakes += 1
    assert overtakes > 0
    # within one key (equal priority) slices leave in slice order, every iteration
    by_key: dict[int, list[int]] = {}
    for e in pushes:
        k, i = split_slice_key(e["key"])
        by_key.setdefault(k, []).append(i)
    for k, idx in by_key.items():
        n = max(idx) + 1
        for it in range(0, len(idx), n):
            assert idx[it:it + n] == sorted(idx[it:it + n]), k


# ------------------------------------------------------------------ fusion, maths, topologies

def test_fusion_saves_the_pull_round_trip(scenario_of):
    off, _ = _run(scenario_of, "quickstart.toml", "run.iterations=6", "training.layer_compute=flops")
    on, _ = _run(scenario_of, "quickstart.toml", "run.iterations=6", "training.layer_compute=flops",
                 "sched.p3=true")  # GeoMX's slice size: nothing sliced, only fusion + priority
    pulls = {}
    for name, r in (("off", off), ("on", on)):
        ev = run_events(r.run_dir)
        pulls[name] = sum(1 for e in ev if e["ev"] == "xfer" and e["msg"] == "PULL"
                          and e["src"].startswith(("w:", "ls:")))
    keys, dcs, workers = 4, 2, 4
    assert pulls["on"] == keys * (workers + dcs)  # only the first pull of every key
    assert pulls["off"] == keys * (workers + dcs) * 7
    # two WAN round trips (60 ms each) fewer per iteration
    assert on.summary.emulated_seconds < off.summary.emulated_seconds - 5 * 0.06


def _same_params(a_nodes, b_nodes, exact=True):
    wa, wb = _workers(a_nodes), _workers(b_nodes)
    assert len(wa) == len(wb) > 0
    for x, y in zip(wa, wb):
        for p, q in zip(x.params, y.params):
            if exact:
                np.testing.assert_array_equal(p, q)
            else:
                np.testing.assert_allclose(p, q, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name,extra,exact", [
    ("quickstart.toml", (), True),
    ("quickstart.toml", ("dc.0.global_servers=2",), True),        # MultiGPS
    # flat PS: the global server adds 4 workers' float32 pushes in arrival order, which
    # P3 changes; sums of two (HiPS: 2 workers per DC, 2 DCs) are order-free
    ("vanilla_ps.toml", ("dc.0.global_servers=2",), False),       # flat PS, sharded
])
def test_p3_changes_timing_not_the_model(scenario_of, name, extra, exact):
    base = ("run.iterations=5", "training.layer_compute=flops", *extra)
    r_off, off = _run(scenario_of, name, *base)
    r_on, on = _run(scenario_of, name, *base, *P3)
    _same_params(off, on, exact)
    assert r_on.summary.emulated_seconds != r_off.summary.emulated_seconds
    # the per-layer compute model changes timing only, too
    _, plain = _run(scenario_of, name, "run.iterations=5", *extra)
    _same_params(off, plain, exact)


def test_slices_spread_over_two_global_servers(scenario_of):
    _, nodes = _run(scenario_of, "quickstart.toml", "run.iterations=2", "dc.0.global_servers=2",
                    *P3)
    gs = {n.name: n for n in nodes if getattr(n, "role", "") == "global_server"}
    held = {name: {split_slice_key(k) for k, _ in g.slots} for name, g in gs.items()}
    # key 0 (64x64 = 4096 elements) has 9 slices of <= 500: both servers hold some
    k0 = {name: {i for k, i in h if k == 0} for name, h in held.items()}
    assert k0["gs:0"] and k0["gs:1"] and not (k0["gs:0"] & k0["gs:1"])
    assert k0["gs:0"] | k0["gs:1"] == set(range(9))


def test_p3_composes_with_a_sparsifying_codec_and_every_sync_algorithm(scenario_of):
    r, nodes = _run(scenario_of, "quickstart_bsc.toml", "run.iterations=6",
                    "codec.size_lower_bound=100", *P3)
    assert r.summary.iterations == 6
    ls = next(n for n in nodes if getattr(n, "role", "") == "local_server")
    w = _workers(nodes)[0]
    n0 = w.params[0].size
    assert n0 > 500
    # every slice of key 0 is a key of its own at the local server (its own codec state)
    assert len([k for k in ls.slots if split_slice_key(k)[0] == 0]) == len(slices_of(0, n0, 500))
    r, _ = _run(scenario_of, "hfa.toml", "run.iterations=8", "sync.k1=2", "sync.k2=2", *P3)
    assert r.summary.iterations == 8
    for name in ("mixed_dcasgd.toml", "esync.toml"):
        r, nodes = _run(scenario_of, name, "run.iterations=6", *P3)
        assert r.summary.iterations == 6, name
        assert all(np.isfinite(p).all() for p in _workers(nodes)[0].params)


def test_summary_and_trace_show_the_mechanism(scenario_of):
    r = run_scenario(scenario_of("p3.toml", "run.iterations=4", "run.target_accuracy=0",
                                 "metrics.plot=false"))
    p3 = r.summary.extra["p3"]
    assert p3["slices"] == 4 * 4 * (5 + 1 + 1 + 1)   # workers x iterations x slices (1000 max)
    assert set(p3["per_priority"]) == {"0", "-1", "-2", "-3"}
    assert p3["queue_delay_s"]["max"] >= 0 and p3["ready_to_ack_s"]["mean"] > 0.06
    trace = (r.run_dir / "trace.json").read_text()
    assert '"name":"p3_slice prio -3"' in trace and "w:party-a:0 p3_slice" in trace


# ------------------------------------------------------------------ scenario, env, FLOPs

def test_scenario_checks(scenario_of):
    with pytest.raises(ScenarioError, match="sync.algorithm = 'hfa'"):
        scenario_of("hfa.toml", "training.layer_compute=flops")
    with pytest.raises(ScenarioError, match="layer_compute_shares"):
        scenario_of("quickstart.toml", "training.layer_compute=shares")
    with pytest.raises(ScenarioError, match="phantom_preset"):
        scenario_of("quickstart.toml", "training.model=phantom", "training.phantom_params=1M",
                    "training.layer_compute=flops")
    with pytest.raises(ScenarioError, match="sched.p3_slice_elements"):
        scenario_of("quickstart.toml", "sched.p3_slice_elements=0")
    from geomx.cluster import plan_job

    with pytest.raises(ScenarioError, match="3 entries but the model has 4"):
        plan_job(scenario_of("quickstart.toml", "training.layer_compute=shares",
                             "training.layer_compute_shares=[1,2,3]"))
    plan = plan_job(scenario_of("quickstart.toml", "training.layer_compute=shares",
                                "training.layer_compute_shares=[1,1,2,0]"))
    assert plan.train.layer_shares == [0.25, 0.25, 0.5, 0.0]
    assert plan.job.transfer_schedulers == ()
    p3 = plan_job(scenario_of("quickstart.toml", "sched.p3=true")).job.transfer_schedulers
    assert [s.name for s in p3] == ["p3"] and p3[0].options.slice_elements == 1_000_000


def test_geomx_environment_switches_map_onto_sched():
    from geomx.runtime.config import NodeArgs, resolve_node_config

    env = {"DMLC_ROLE": "worker", "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "9094",
           "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "2", "GEOMX_RANK": "1",
           "ENABLE_P3": "1", "MXNET_KVSTORE_BIGARRAY_BOUND": "50000"}
    c = resolve_node_config(NodeArgs(), env, now=0.0)
    assert c.scenario.sched.p3 and c.scenario.sched.p3_slice_elements == 50000
    assert c.scenario.sched.bigarray_bound == 50000
    from geomx.runtime.config import ConfigError

    with pytest.raises(ConfigError, match="ENABLE_P3"):
        resolve_node_config(NodeArgs(), {**env, "ENABLE_P3": "maybe"}, now=0.0)


def test_per_layer_flops_of_the_phantom_presets_and_numpy_models(scenario_of):
    from geomx.cluster import plan_job
    from geomx.ml.flops import preset_key_flops

    r50, vgg = preset_key_flops("resnet50"), preset_key_flops("vgg19")
    assert len(r50) == 161 and sum(r50) / 2 == pytest.approx(3.87e9, rel=0.01)
    assert len(vgg) == 38 and sum(vgg) / 2 == pytest.approx(19.6e9, rel=0.01)
    assert vgg[0] == 2 * 64 * 3 * 9 * 224 * 224  # conv0 weight at full resolution
    plan = plan_job(scenario_of("quickstart.toml", "training.layer_compute=flops"))
    # mlp 64 -> 64 -> 10 on 8x8 digits: the 64x64 weight has most of the FLOPs
    shares = plan.train.layer_shares
    assert len(shares) == 4 and sum(shares) == pytest.approx(1.0)
    assert shares[0] > shares[2] > shares[3] and shares[0] > shares[1]


# ------------------------------------------------------------------ real sockets

@pytest.mark.slow
def test_p3_over_sockets_reaches_the_emulators_accuracy(scenario_of):
    over = ("run.iterations=40", "run.target_accuracy=0", "metrics.plot=false")
    emu = run_scenario(scenario_of("p3.toml", *over)).summary
    real = run_scenario(scenario_of("p3.toml", *over), runtime="real")
    assert real.summary.runtime == "real" and real.summary.iterations == 40
    assert real.summary.final_accuracy == pytest.approx(emu.final_accuracy, abs=0.02)
    ev = run_events(real.run_dir)
    assert any(e["ev"] == "p3_slice" for e in ev)
    # fusion over sockets too: workers pull each key only once (the first pull)
    pulls = [e for e in ev if e["ev"] == "send" and e["msg"] == "PULL" and e["src"].startswith("w:")]
    assert len(pulls) == 4 * 8  # workers x slices of the 4 keys
    assert real.summary.extra["p3"]["slices"] == 4 * 40 * 8


def test_string_keys_slice_into_a_range_of_their_own():
    # a geomx.torch parameter's key is STRING_KEY_BASE + crc32(name) (geomx/node/kv_state.py)
    from geomx.node.kv_state import STRING_KEY_BASE

    lo, hi = STRING_KEY_BASE, STRING_KEY_BASE + 2**32 - 1
    for key in (lo, lo + 12345, hi):
        sl = slices_of(key, 4000, 1000)
        assert sl[0].skey == key  # slice 0 is the key itself
        assert [split_slice_key(s.skey) for s in sl] == [(key, i) for i in range(4)]
        assert all(s.skey >= 1 << 62 for s in sl[1:]) and all(s.skey < 2**63 for s in sl)
        homes = [place(s.skey, s.size, 4, 1_000_000)[0].server for s in sl]
        assert sorted(homes) == [0, 1, 2, 3]  # round robin, as for int keys
    # no slice of one string key is a slice of another, or of an int key
    a = {s.skey for s in slices_of(lo, 10_000, 10)}
    b = {s.skey for s in slices_of(lo + 1, 10_000, 10)}
    c = {s.skey for s in slices_of(SLICE_KEY_STRIDE - 1, 10_000, 10)}
    assert not (a & b) and not (a & c) and not (b & c)
    with pytest.raises(WireKeyError, match="out of range"):
        slice_key(hi + 1, 1)
