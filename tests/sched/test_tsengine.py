"""TSEngine (geomx/sched/tsengine.py, geomx/sched/ts_overlay.py).

Policy: float epsilon-greedy (mostly greedy with every candidate known, unknown
candidates explored in proportion), expiry after ``expiry_iterations`` rounds, pairing
rules, a seeded generator. Emulator: the overlays change timing, not the model (FSA with
one and two global servers, inter, intra and both), the merge tree relieves the central
DC's in-cast, the run is deterministic and reports its decisions. Real sockets: the
quickstart-shaped tsengine.toml over loopback. Bad configuration: clear errors.
"""

from __future__ import annotations


import numpy as np
import pytest

from geomx.experiment import run_scenario
from geomx.scenario import ScenarioError
from geomx.sched.tsengine import Coordinator, ThroughputTable, TsEngineError, TsSettings

from tests.helpers.events import run_events

SHORT = ("run.target_accuracy=0", "metrics.plot=false", "metrics.trace=false")
INTER = ("sched.tsengine_inter=true",)
INTRA = ("sched.tsengine_intra=true",)


def _run(scenario_of, name, *overrides):
    seen = {}
    r = run_scenario(scenario_of(name, *SHORT, *overrides),
                     inspect=lambda nodes: seen.setdefault("nodes", nodes))
    workers = [n for n in seen["nodes"] if getattr(n, "role", "") == "worker" and not n.is_master]
    return r, workers


def _coordinator(members, rate=0.9, expiry=5, seed=1):
    return Coordinator(TsSettings("inter", rate, expiry), members, np.random.default_rng(seed))


# ------------------------------------------------------------------ epsilon-greedy

def test_all_known_is_mostly_greedy_and_greedy_takes_the_fastest():
    members = ["a", "b", "c", "d", "e"]
    c = _coordinator(members)
    speeds = {"a": 1.0, "b": 5.0, "c": 2.0, "d": 3.0, "e": 4.0}
    modes = []
    for r in range(1, 2001):
        for m, s in speeds.items():
            c.table(0, 0).record("root", m, s, r)
        ch = c.ask_pull(0, 0, "root", r)
        assert ch.p_greedy == pytest.approx(0.9) and ch.known == 5 and ch.unknown == 0
        modes.append(ch.mode)
        if ch.mode == "exploit":
            assert ch.receiver == "b"  # the fastest known edge
    share = modes.count("exploit") / len(modes)
    # 90 % exploitation with rate 0.9 (GeoMX: 100 %, its rand()%10 <= 9 is always true)
    assert 0.87 < share < 0.93


def test_unknown_candidates_are_explored_and_p_greedy_is_a_fraction():
    c = _coordinator(["a", "b", "c", "d"])
    picks = {"a": 0, "b": 0, "c": 0, "d": 0}
    exploit = 0
    for r in range(1, 3001):
        c.table(0, 0).record("root", "a", 10.0, r)      # one of four measured
        ch = c.ask_pull(0, 0, "root", r)
        # known/(known+unknown) in floating point: 0.25 (GeoMX's integer division: 0)
        assert ch.p_greedy == pytest.approx(0.25)
        picks[ch.receiver] += 1
        exploit += ch.mode == "exploit"
        if ch.mode == "explore":
            assert ch.receiver in ("b", "c", "d")  # exploration goes to unmeasured edges
    assert 0.22 < exploit / 3000 < 0.28
    for m in "bcd":  # each unmeasured candidate gets a third of the exploration
        assert 0.22 < picks[m] / 3000 < 0.28


def test_greed_rate_caps_and_zero_means_always_explore():
    c = _coordinator(["a", "b"], rate=0.0)
    for r in range(1, 200):
        c.table(0, 0).record("root", "a", 1.0, r)
        c.table(0, 0).record("root", "b", 2.0, r)
        assert c.ask_pull(0, 0, "root", r).mode == "explore"


def test_measurements_expire_after_the_configured_rounds():
    t = ThroughputTable(expiry=5)
    t.record("x", "y", 100.0, 1)
    assert t.get("x", "y", 5) == 100.0
    assert t.get("x", "y", 6) is None          # five rounds later: unknown again
    t.record("x", "y", -1.0, 7)                 # no measurement is no measurement
    assert t.get("x", "y", 7) is None
    c = _coordinator(["a", "b"], expiry=2)
    c.table(0, 0).record("root", "a", 9.0, 1)
    assert c.ask_pull(0, 0, "root", 2).known == 1
    assert c.ask_pull(0, 0, "root", 3).known == 0  # expired: both candidates unknown


def test_broadcast_reaches_every_member_once_per_round_then_done():
    members = [f"m{i}" for i in range(7)]
    c = _coordinator(members, seed=3)
    for r in (1, 2, 3):
        holders, got = ["root"], []
        while holders:
            h = holders.pop(0)
            ch = c.ask_pull(0, 0, h, r)
            if ch.receiver is not None:
                got.append(ch.receiver)
                holders += [h, ch.receiver]  # the sender asks again, the receiver relays
        assert sorted(got) == members
        assert c.ask_pull(0, 0, "m0", r).mode == "done"  # a late ask of this round
    # a member cannot relay a round it was not sent
    c.ask_pull(0, 0, "root", 4)
    with pytest.raises(TsEngineError, match="was not sent"):
        c.ask_pull(0, 0, next(m for m in members if m not in c._state(0, 0).got), 4)


def test_pairing_rules():
    c = _coordinator(["a", "b", "c"])
    assert c.ask_push(5, 0, "a") == []
    (p,) = c.ask_push(5, 0, "gs", root=True)
    assert (p.sender, p.receiver, p.rule) == ("a", "gs", "root")
    c.ask_push(5, 0, "b")
    assert c.ask_push(5, 0, "b") == []          # a repeated ask is ignored
    (p,) = c.ask_push(5, 0, "c")
    assert (p.sender, p.receiver, p.rule) == ("c", "b", "fifo")  # later sends to earlier
    c.table(5, 0).record("b", "c", 10.0, 1)
    c.table(5, 0).record("c", "b", 2.0, 1)
    c.ask_push(5, 0, "b", round_=1)
    (p,) = c.ask_push(5, 0, "c", round_=1)
    assert (p.sender, p.receiver, p.rule) == ("b", "c", "throughput")  # the faster way
    # per key: another key's queue is empty
    assert c.ask_push(6, 0, "a") == []


def test_seeded_generator_gives_the_same_choices():
    def choices(seed):
        c = _coordinator(list("abcdef"), seed=seed)
        return [c.ask_pull(0, 0, "root", r).receiver for r in range(1, 50)]
    assert choices(7) == choices(7)
    assert choices(7) != choices(8)


# ------------------------------------------------------------------ emulator

@pytest.mark.parametrize("extra", [
    INTER,
    (*INTER, "dc.0.global_servers=2"),                         # MultiGPS: a root per shard
    (*INTER, "dc.0.global_servers=2", "sched.bigarray_bound=1000"),  # a key split in 2 parts
    INTRA,
    (*INTER, *INTRA, "dc.0.global_servers=2", "dc.1.workers=3"),
])
def test_overlay_changes_timing_not_the_model(scenario_of, extra):
    base = ("run.iterations=4", *[e for e in extra if not e.startswith("sched.tsengine")])
    r_off, off = _run(scenario_of, "quickstart.toml", *base)
    r_on, on = _run(scenario_of, "quickstart.toml", *base,
                    *[e for e in extra if e.startswith("sched.tsengine")])
    assert len(off) == len(on) > 0
    for x, y in zip(off, on):
        for p, q in zip(x.params, y.params):
            # FSA sums in another order (merge tree): equal up to float32 rounding
            np.testing.assert_allclose(p, q, rtol=1e-5, atol=1e-6)
    assert r_on.summary.emulated_seconds != r_off.summary.emulated_seconds
    ev = run_events(r_on.run_dir)
    overlays = {e["overlay"] for e in ev if e["ev"] == "ts_choose"}
    assert overlays == {o for o, on_ in (("inter", INTER[0] in extra),
                                         ("intra", INTRA[0] in extra)) if on_}
    if "dc.0.global_servers=2" in extra:
        roots = {e["src"] for e in ev if e["ev"] == "ts_choose" and e["overlay"] == "inter"
                 and e["src"].startswith("gs:")}
        assert roots == {"gs:0", "gs:1"}
    if "sched.bigarray_bound=1000" in extra:  # the 64x64 weight: one tree per part
        parts = {(e["part"], e["src"]) for e in ev if e["ev"] == "ts_choose"
                 and e["key"] == 0 and e["src"].startswith("gs:")}
        assert parts == {(0, "gs:0"), (1, "gs:1")}


@pytest.mark.parametrize("extra", [INTER, INTRA], ids=["inter", "intra"])
@pytest.mark.parametrize("codec", ["fp16", "bf16"])
def test_a_dense_codec_rides_the_overlay(scenario_of, extra, codec):
    """A relay decodes what it merges, adds and encodes again: a dense half-precision
    codec composes with the overlay (the model is the star's up to that rounding), and
    the merges and relays carry half the bytes."""
    base = ("run.iterations=20", "run.eval_every=20", *extra)
    r_dense, _ = _run(scenario_of, "quickstart.toml", *base)
    r_half, _ = _run(scenario_of, "quickstart.toml", *base, f"codec.type={codec}",
                     "codec.size_lower_bound=1000")
    assert r_half.summary.final_accuracy == pytest.approx(r_dense.summary.final_accuracy,
                                                          abs=0.02)
    assert r_half.summary.bytes_wan + r_half.summary.bytes_lan < \
        0.8 * (r_dense.summary.bytes_wan + r_dense.summary.bytes_lan)
    ev = run_events(r_half.run_dir)
    assert any(e["ev"] == "ts_choose" for e in ev)


@pytest.mark.parametrize("extra", [INTER, INTRA], ids=["inter", "intra"])
def test_hfa_global_syncs_ride_the_overlay(scenario_of, extra):
    """HFA's local syncs (K1) and global syncs (K2) are synchronous rounds of one key
    each, so the merge trees and the relayed model carry them like FSA's rounds."""
    base = ("run.iterations=8", "sync.algorithm=hfa", "sync.k1=2", "sync.k2=2")
    r_off, off = _run(scenario_of, "quickstart.toml", *base)
    r_on, on = _run(scenario_of, "quickstart.toml", *base, *extra)
    for x, y in zip(off, on):
        for p, q in zip(x.params, y.params):
            np.testing.assert_allclose(p, q, rtol=1e-5, atol=1e-6)
    ev = run_events(r_on.run_dir)
    assert {e["overlay"] for e in ev if e["ev"] == "ts_choose"} == \
        {"inter" if extra == INTER else "intra"}
    assert sum(e["ev"] == "global_sync" for e in ev) > 0


@pytest.mark.slow
def test_merge_tree_relieves_the_central_in_cast(scenario_of):
    over = ("run.iterations=3",)
    star = run_scenario(scenario_of("tsengine_incast.toml", *SHORT, *over,
                                    "sched.tsengine_inter=false"))
    ts = run_scenario(scenario_of("tsengine_incast.toml", *SHORT, *over))
    ev = run_events(ts.run_dir)
    pushes_to_gs = [e for e in ev if e["ev"] == "xfer" and e["msg"] == "PUSH"
                    and e["dst"] == "gs:0"]
    # the star: 8 local servers x 4 keys x 3 rounds; the tree merges between parties
    assert len(pushes_to_gs) < 8 * 4 * 3
    x = ts.summary.extra["tsengine"]["inter"]
    assert x["pairings"]["fifo"] + x["pairings"]["throughput"] > 0
    relays_from_gs = [e for e in ev if e["ev"] == "xfer" and e["msg"] == "RELAY"
                      and e["src"] == "gs:0"]
    assert len(relays_from_gs) < 8 * 4 * 3
    # emulated time: the star queues 16 copies per key and round at the 20 Mbps NIC
    assert ts.summary.emulated_seconds < 0.75 * star.summary.emulated_seconds
    assert ts.summary.final_accuracy == pytest.approx(star.summary.final_accuracy, abs=1e-6)


def test_same_seed_same_decisions_and_summary(scenario_of):
    def decisions():
        r = run_scenario(scenario_of("tsengine.toml", *SHORT, "run.iterations=3"))
        return (r.run_dir / "events.jsonl").read_bytes(), r.summary.extra["tsengine"]
    a, sa = decisions()
    b, sb = decisions()
    assert a == b and b'"ev":"ts_choose"' in a  # the whole event log, byte for byte
    assert sa == sb and set(sa) == {"inter", "intra"}
    edges = sa["intra"]["edges"]
    assert all(e["link_mbps"] == 10_000 for e in edges)  # worker <-> worker: the DC's NIC
    assert sum(e["chosen"] for e in sa["inter"]["edges"]) == sa["inter"]["broadcast_decisions"]


# ------------------------------------------------------------------ configuration

@pytest.mark.parametrize("overrides,field", [
    (("sync.algorithm=mixed",), "sync.algorithm"),
    (("sched.dgt=tcp", "sched.dgt_adaptive_k=false", "checkpoint.every=5"),
     "allowed with checkpoints: sched.dgt"),
    (("sched.dgt=tcp", "sched.tsengine_inter=false"), "sched.dgt_adaptive_k"),
    (("sched.tsengine_max_greed_rate=1.5",), "sched.tsengine_max_greed_rate"),
    (("sched.tsengine_expiry_iterations=0",), "sched.tsengine_expiry_iterations"),
])
def test_bad_configuration_is_refused_by_field(scenario_of, overrides, field):
    with pytest.raises(ScenarioError) as e:
        scenario_of("tsengine.toml", *overrides)
    assert field in str(e.value) and "allowed" in str(e.value)


def test_flat_topology_is_refused(scenario_of):
    with pytest.raises(ScenarioError, match="sched.tsengine_inter.*allowed"):
        scenario_of("vanilla_ps.toml", *INTER)


def test_settings_validate_and_switches_map():
    with pytest.raises(TsEngineError, match="allowed"):
        TsSettings("sideways")
    with pytest.raises(TsEngineError, match="tsengine_max_greed_rate"):
        TsSettings("inter", max_greed_rate=-0.1)
    from geomx.runtime.geomx_switches import SwitchError, switch_overrides

    got = switch_overrides({"ENABLE_INTER_TS": "1", "ENABLE_INTRA_TS": "0",
                            "MAX_GREED_RATE_TS": "0.8"})
    assert [o for o, _ in got] == ["sched.tsengine_inter=true", "sched.tsengine_intra=false",
                                   "sched.tsengine_max_greed_rate=0.8"]
    with pytest.raises(SwitchError, match="MAX_GREED_RATE_TS"):
        switch_overrides({"MAX_GREED_RATE_TS": "2"})
    with pytest.raises(SwitchError, match="ENABLE_INTRA_TS"):
        switch_overrides({"ENABLE_INTRA_TS": "yes please"})


# ------------------------------------------------------------------ real sockets

@pytest.mark.slow
def test_tsengine_over_sockets_trains_like_the_emulator(scenario_of):
    over = ("run.iterations=12", "run.target_accuracy=0", "metrics.plot=false",
            "metrics.trace=false", "run.eval_every=12")
    emu = run_scenario(scenario_of("tsengine.toml", *over)).summary
    real = run_scenario(scenario_of("tsengine.toml", *over), runtime="real")
    assert real.summary.runtime == "real" and real.summary.iterations == 12
    # FSA: the same model up to float summation order, whatever the overlay chose
    assert real.summary.final_accuracy == pytest.approx(emu.final_accuracy, abs=0.01)
    x = real.summary.extra["tsengine"]
    assert set(x) == {"inter", "intra"}
    assert x["inter"]["broadcast_decisions"] == 4 * 12 * 2  # keys x rounds x local servers
    assert x["intra"]["broadcast_decisions"] == 2 * 4 * 12 * 2  # DCs x keys x rounds x workers


def test_exploration_finds_the_faster_edges(scenario_of):
    # heterogeneity alone (no NIC in-cast), so each edge's own link sets its throughput
    r = run_scenario(scenario_of("tsengine_hetero.toml", *SHORT, "run.iterations=6",
                                 "dc.0.lan_bandwidth=10Gbps",
                                 *(f"dc.{i}.workers=1" for i in range(1, 5))))
    x = r.summary.extra["tsengine"]["inter"]
    gs = {e["dst"]: e for e in x["edges"] if e["src"] == "gs:0"}
    fast = [gs[d]["measured_mbps"] for d in ("ls:party-a", "ls:party-b") if d in gs]
    slow = [gs[d]["measured_mbps"] for d in ("ls:party-c", "ls:party-d") if d in gs]
    # measured throughput ranks the edges as the links do (100 vs 20 Mbps central links)
    assert fast and slow and min(fast) > 1.5 * max(slow)
    assert all(m < 20.0 for m in slow)  # never above the slow link's bandwidth
    first = x["root_first_hop"]
    exploit = sum(f["exploit"] for f in first)
    exploit_fast = sum(f["exploit"] for f in first if f["link_mbps"] == 100.0)
    assert exploit >= 8 and exploit_fast >= 0.8 * exploit


def test_coordinator_and_root_refuse_bad_overlay_messages(scenario_of):
    import asyncio

    from geomx.cluster import make_node, plan_job
    from geomx.experiment import EmuServices, build_network
    from geomx.sim.loop import run_virtual
    from geomx.sim.transport import SimFabric
    from geomx.wire import Kind, Message, Payload

    s = scenario_of("tsengine.toml")
    plan = plan_job(s)
    fabric = SimFabric(build_network(s, plan))
    services = EmuServices(0, None, None, plan.job.dc_of)
    gh = make_node(plan, "gh", fabric.transport("gh"), services)
    gs = make_node(plan, "gs:0", fabric.transport("gs:0"), services)
    mw = fabric.transport("mw")
    ls = fabric.transport("ls:party-a")
    w = fabric.transport("w:party-a:0")

    async def call(t, msg):
        await t.send(msg)
        return await asyncio.wait_for(t.recv(), 60)

    async def scenario():
        nodes = [asyncio.ensure_future(gh.run()), asyncio.ensure_future(gs.run())]
        await asyncio.sleep(0)
        # a worker is no member of the inter-DC overlay; a local server is no root there
        r = await call(w, Message(Kind.ASK_PUSH, "w:party-a:0", "gh", request_id=1,
                                  meta={"ts": "inter"}))
        assert r.kind == Kind.ERROR and "not a member of the inter overlay" in r.meta["reason"]
        r = await call(ls, Message(Kind.ASK_PUSH, "ls:party-a", "gh", request_id=2,
                                   meta={"ts": "inter", "root": True}))
        assert r.kind == Kind.ERROR and "not a root" in r.meta["reason"]
        r = await call(ls, Message(Kind.ASK_PULL, "ls:party-a", "gh", request_id=3,
                                   meta={"ts": "sideways"}))
        assert r.kind == Kind.ERROR and "no TSEngine overlay 'sideways'" in r.meta["reason"]
        # the root: a merge naming a contributor twice, or a stranger, changes nothing
        init = np.arange(10, dtype=np.float32)
        await call(mw, Message(Kind.INIT, "mw", "gs:0", key=0, request_id=4,
                               payloads=[Payload.of(init)]))
        for rid, who in ((5, ["ls:party-a", "ls:party-a"]), (6, ["ls:party-a", "w:party-b:0"])):
            r = await call(ls, Message(Kind.PUSH, "ls:party-a", "gs:0", key=0, request_id=rid,
                                       meta={"ts": "inter", "ts_n": 2, "ts_from": who},
                                       payloads=[Payload.of(np.ones(10, np.float32))]))
            assert r.kind == Kind.ERROR and "once" in r.meta["reason"]
        r = await call(ls, Message(Kind.PULL, "ls:party-a", "gs:0", key=0, request_id=7))
        np.testing.assert_array_equal(r.payloads[0].data, init)
        # only the overlay's peers may merge into or relay to a node
        lsb = make_node(plan, "ls:party-b", fabric.transport("ls:party-b"), services)
        nodes.append(asyncio.ensure_future(lsb.run()))
        await asyncio.sleep(0)
        r = await call(w, Message(Kind.PUSH, "w:party-a:0", "ls:party-b", key=0, request_id=8,
                                  meta={"ts": "inter", "ts_n": 1, "ts_from": ["w:party-a:0"]},
                                  payloads=[Payload.of(np.ones(10, np.float32))]))
        assert r.kind == Kind.ERROR and "not a peer" in r.meta["reason"]
        r = await call(mw, Message(Kind.RELAY, "mw", "ls:party-b", key=0, request_id=9,
                                   meta={"ts": "inter"}, payloads=[Payload.of(init)]))
        assert r.kind == Kind.ERROR and "not a peer" in r.meta["reason"]
        lsb.stop()
        for n in (gh, gs):
            n.stop()
        await asyncio.gather(*nodes, return_exceptions=True)

    run_virtual(scenario())
