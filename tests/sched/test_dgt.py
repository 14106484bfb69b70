"""DGT (geomx/sched/dgt.py) in the emulator: blocks, ranking, bands, reassembly, adaptive K,
MultiGPS, fp16, determinism, accuracy; plus the scenario's validation."""

import json

import numpy as np
import pytest

from geomx.experiment import run_scenario
from geomx.scenario import ScenarioError
from geomx.sched.dgt import (DGT_META, SENT_META, DgtReceiver, DgtSender, DgtSettings,
                             adaptive_k, assign_bands, block_means)
from geomx.sched.dgt_quant import dequantise4, quantise4
from geomx.wire import UNRELIABLE_BASE, Kind, Message

from tests.helpers.dgt_context import FakeSchedContext, push_round
from tests.helpers.events import run_events
from tests.helpers.paths import QUICKSTART

QUICK = ("run.target_accuracy=0", "metrics.plot=false", "metrics.trace=false")


# ---------------------------------------------------------------- pure parts

def test_block_means_cut_by_bytes_with_a_short_last_block():
    x = np.arange(10, dtype=np.float32) - 5  # blocks of 4: [-5..-2], [-1..2], [3, 4]
    np.testing.assert_allclose(block_means(x, 4), [3.5, 1.0, 3.5])
    assert DgtSettings(block_bytes=4096).block_elements == 1024
    assert DgtSettings(block_bytes=4096, codec="fp16").block_elements == 2048


def test_bands_reproduce_geomx_example():
    """docs/geomx-behaviour.md §4.4: 128 blocks, K = 0.8, C = 3 -> ranks 0-101 on channel 0,
    102-110 band 1, 111-118 band 2, 119-126 band 3, the end block on channel 0."""
    c = np.linspace(2.0, 1.0, 128).astype(np.float32)  # already in rank order
    bands = assign_bands(c, 0.8, 3)
    assert list(bands[:102]) == [0] * 102
    assert list(bands[102:111]) == [1] * 9
    assert list(bands[111:119]) == [2] * 8
    assert list(bands[119:127]) == [3] * 8
    assert bands[127] == 0


def test_bands_follow_contribution_skip_zero_blocks_and_keep_the_end_block():
    c = np.array([0.1, 0.0, 0.9, 0.5, 0.3, 0.0], dtype=np.float32)
    bands = assign_bands(c, 0.5, 2)
    # ranked non-zero, non-end: 2 (0.9), 3 (0.5), 4 (0.3), 0 (0.1); round(0.5*4) = 2 reliable
    assert bands[2] == 0 and bands[3] == 0
    assert bands[4] == 1 and bands[0] == 2
    assert bands[1] == -1           # never contributed: not sent
    assert bands[5] == 0            # the end block always goes, on channel 0
    assert list(assign_bands(c, 1.0, 2)[[0, 2, 3, 4]]) == [0, 0, 0, 0]


def test_adaptive_k_follows_the_loss_and_stops_at_k_min():
    assert adaptive_k(0.8, 0.2, 2.0, 2.0) == pytest.approx(0.8)
    assert adaptive_k(0.8, 0.2, 1.0, 2.0) == pytest.approx(0.4)
    assert adaptive_k(0.8, 0.2, 0.1, 2.0) == pytest.approx(0.2)
    assert adaptive_k(0.8, 0.2, 5.0, 2.0) == 1.0     # a fraction: at most every block


def test_quantise4_packs_two_codes_per_byte_and_puts_max_in_the_top_bin():
    x = np.array([0.0, 1.0, 15.99, 16.0, 8.0], dtype=np.float32)  # [lo, hi] = [0, 16]
    packed, bounds, decoded = quantise4(x)
    assert packed.dtype == np.uint8 and packed.size == 3
    codes = [packed[0] & 15, packed[0] >> 4, packed[1] & 15, packed[1] >> 4, packed[2] & 15]
    assert codes == [0, 1, 15, 15, 8]                # 16.0 is bin 15, not an overflowing 16
    np.testing.assert_allclose(decoded, [0.5, 1.5, 15.5, 15.5, 8.5])
    np.testing.assert_array_equal(dequantise4(packed, bounds, 5), decoded)
    with pytest.raises(ValueError):
        dequantise4(packed, bounds, 7)
    with pytest.raises(ValueError):
        dequantise4(packed, np.array([1.0, 0.0], dtype=np.float32), 5)


def test_quantisation_error_feedback_keeps_the_sum_unbiased():
    rng = np.random.default_rng(0)
    r = np.zeros(1024, dtype=np.float32)
    sent = np.zeros(1024, dtype=np.float64)
    total = np.zeros(1024, dtype=np.float64)
    for _ in range(50):
        g = rng.normal(size=1024).astype(np.float32)
        total += g
        _, _, dec = quantise4(g + r)
        r = g + r - dec
        sent += dec
    # what was not sent is exactly the residual, which stays bounded (one bin)
    np.testing.assert_allclose(total - sent, r, atol=1e-3)
    assert np.abs(r).max() < 1.0


# ---------------------------------------------------------------- sender + receiver

def test_sender_first_push_whole_then_blocks_in_strict_order():
    s = DgtSettings(mode="udp", block_bytes=64, k=0.5, channels=2, adaptive_k=False)
    sender, ls = DgtSender(s), FakeSchedContext()
    g = np.arange(1, 65, dtype=np.float32)  # 4 blocks of 16 values, rising contribution
    first = push_round(sender, ls, g, 1)
    assert len(first) == 1 and DGT_META not in first[0].meta and first[0].channel == 0
    msgs = push_round(sender, ls, g, 2)
    seqs = [m.meta[DGT_META][0] for m in msgs]
    chans = [m.channel for m in msgs]
    # ranked non-end blocks 2, 1, 0; round(0.5*3) = 2 reliable; then the end block (3) on
    # channel 0 *before* the band (block 0 on unreliable channel 8 + 1)
    assert seqs == [2, 1, 3, 0]
    assert chans == [0, 0, 0, UNRELIABLE_BASE + 1]
    assert msgs[2].request_id and msgs[2].meta[SENT_META] == [3, 1, 0]
    # tcp mode: the same band on reliable channel 1
    tcp = DgtSender(DgtSettings(mode="tcp", block_bytes=64, k=0.5, channels=2,
                                adaptive_k=False))
    push_round(tcp, ls, g, 1)
    assert [m.channel for m in push_round(tcp, ls, g, 2)] == [0, 0, 0, 1]


def test_receiver_zero_fills_missing_blocks_and_adds_late_ones_into_the_next_round_once():
    s = DgtSettings(mode="udp", block_bytes=64, k=0.5, channels=2, adaptive_k=False)
    sender, ls, gs = DgtSender(s), FakeSchedContext(), FakeSchedContext(name="gs:0")
    rx = DgtReceiver(s)
    like = np.zeros(64, dtype=np.float32)
    g1 = np.arange(1, 65, dtype=np.float32)
    push_round(sender, ls, g1, 1)                          # initialisation push (whole)
    r2 = push_round(sender, ls, g1, 2)                     # band block 0 travels last
    band = r2[3]
    assert band.meta[DGT_META][0] == 0
    for m in r2[:3]:                                  # the band block is late
        out = rx.receive(gs, m, like)
    expect = g1.copy()
    expect[:16] = 0                                   # missing -> zeros
    np.testing.assert_array_equal(out, expect)
    assert rx.receive(gs, band, like) is None         # arrives after its round: buffered
    r3 = push_round(sender, ls, g1, 3)
    out3 = None
    for m in r3[:3]:
        out3 = rx.receive(gs, m, like)
    expect3 = g1.copy()
    expect3[:16] = g1[:16]                            # round 2's late block, not round 3's
    np.testing.assert_array_equal(out3, expect3)
    assert rx.receive(gs, r3[3], like) is None        # round 3's band: late again
    out4 = None
    for m in push_round(sender, ls, g1, 4)[:3]:
        out4 = rx.receive(gs, m, like)
    np.testing.assert_array_equal(out4[:16], g1[:16])  # applied once, not twice
    assert [t.late for t in rx.totals] == [0, 2, 0]
    assert rx.missing == 3                            # one band block missing per round
    assert rx.pending_late() == 0


def test_receiver_refuses_blocks_that_do_not_fit():
    s = DgtSettings(mode="tcp", block_bytes=64, channels=2)
    rx, gs = DgtReceiver(s), FakeSchedContext(name="gs:0")
    like = np.zeros(64, dtype=np.float32)
    blk = np.ones(16, dtype=np.float32)
    from geomx.wire import Payload

    def msg(desc, channel=0, rid=0, data=blk):
        return Message(Kind.PUSH, "ls:a", "gs:0", key=0, channel=channel, request_id=rid,
                       meta={DGT_META: desc, "dgt_r": 1}, payloads=[Payload.of(data)])

    for bad in ([0, 5, 16], [4, 4, 16], [0, 4, 0], "x", [0, 4]):
        with pytest.raises(ValueError):
            rx.receive(gs, msg(bad), like)
    with pytest.raises(ValueError):
        rx.receive(gs, msg([0, 4, 16], channel=5), like)        # only 2 bands
    with pytest.raises(ValueError):
        rx.receive(gs, msg([0, 4, 16], data=np.ones(3, np.float32)), like)
    with pytest.raises(ValueError):
        rx.receive(gs, msg([3, 4, 16]), like)                   # an end block must be a request
    assert rx.pending_late() == 0


# ---------------------------------------------------------------- whole jobs (emulator)

def _run(scenario_of, *overrides, inspect=None):
    r = run_scenario(scenario_of("dgt.toml", *QUICK, *overrides), inspect=inspect)
    return r, run_events(r.run_dir)


def test_channels_on_the_wire_end_block_on_channel_0(scenario_of):
    r, events = _run(scenario_of, "run.iterations=4", "sched.dgt=udp", "sched.dgt_k=0.5",
                     "sched.dgt_adaptive_k=false")
    pushes = [e for e in events if e["ev"] == "xfer" and e["msg"] == "PUSH"
              and e["src"].startswith("ls:")]
    chans = {e["channel"] for e in pushes}
    assert chans == {0, 9, 10, 11}                    # channel 0 + three unreliable bands
    # key 0 (64 x 256 fp32 = 16 blocks): 15 ranked, round(7.5) = 8 reliable + the end block
    dp = [e for e in events if e["ev"] == "dgt_push" and e["key"] == 0]
    assert dp and all(e["blocks"] == [9, 3, 2, 2] for e in dp)
    s = r.summary.extra["dgt"]
    assert [b["sent_blocks"] for b in s["bands"]][0] == sum(e["blocks"][0] for e in events
                                                           if e["ev"] == "dgt_push")
    # lossless WAN: nothing dropped; what missed its round's end block came late
    assert all(b["dropped"] == 0 for b in s["bands"])
    late = sum(b["late"] for b in s["bands"])
    assert s["missing_at_assembly"] == late
    assert 0 < s["late_unapplied_at_end"] <= late     # the last round's late blocks: counted


def test_lossy_udp_drops_blocks_counts_them_and_is_deterministic(scenario_of):
    args = ("run.iterations=6", "sched.dgt=udp", "wan.0.loss=5%", "wan.1.loss=5%",
            "sched.dgt_k=0.5", "sched.dgt_adaptive_k=false")
    r1, e1 = _run(scenario_of, *args)
    r2, e2 = _run(scenario_of, *args)
    assert e1 == e2                                   # same scenario and seed, same log
    s = r1.summary.extra["dgt"]
    dropped = sum(b["dropped"] for b in s["bands"])
    assert dropped > 0 and s["bands"][0]["dropped"] == 0   # channel 0 is reliable
    assert s["missing_at_assembly"] >= dropped - s["late_unapplied_at_end"]
    assert r1.summary.iterations == 6


def test_tcp_bands_arrive_late_on_a_slow_wan_and_are_applied_next_round(scenario_of):
    r, events = _run(scenario_of, "run.iterations=6", "sched.dgt=tcp", "wan.0.bandwidth=5Mbps",
                     "wan.1.bandwidth=5Mbps", "sched.dgt_adaptive_k=false", "sched.dgt_k=0.5")
    s = r.summary.extra["dgt"]
    late = sum(b["late"] for b in s["bands"])
    assert late > 0
    for b in s["bands"]:
        # reliable: every band block arrives, on time or late (or was in flight at the end)
        assert b["on_time"] + b["late"] + b["dropped"] == b["sent_blocks"]
    assert s["bands"][0]["late"] == 0


@pytest.mark.slow
def test_adaptive_k_lowers_k_as_the_loss_falls(scenario_of):
    _, events = _run(scenario_of, "run.iterations=20", "sched.dgt=tcp", "sched.dgt_k=0.8",
                     "sched.dgt_k_min=0.2")
    ks = [e["k"] for e in events if e["ev"] == "dgt_push" and e["node"] == "ls:party-a"
          and e["key"] == 0]
    assert ks[0] == pytest.approx(0.8)
    assert ks[-1] < 0.5 and min(ks) >= 0.2
    _, fixed = _run(scenario_of, "run.iterations=5", "sched.dgt=tcp", "sched.dgt_k=0.8",
                    "sched.dgt_adaptive_k=false")
    assert {e["k"] for e in fixed if e["ev"] == "dgt_push"} == {0.8}
    # without adaptive K the workers do not carry their loss
    assert all("loss" not in e for e in fixed if e["ev"] == "xfer")


def test_multigps_each_global_server_gets_only_its_part(scenario_of):
    seen = {}
    r, events = _run(scenario_of, "run.iterations=4", "sched.dgt=tcp", "dc.central.global_servers=2",
                     "sched.bigarray_bound=1000", "sched.dgt_adaptive_k=false",
                     inspect=lambda nodes: seen.setdefault("nodes", nodes))
    asm = [e for e in events if e["ev"] == "dgt_assemble" and e["key"] == 0]
    assert {(e["node"], e["part"]) for e in asm} == {("gs:0", 0), ("gs:1", 1)}
    # key 0 has 16384 values = 16 blocks; each server's part is 8 blocks
    assert all(e["sent"] <= 8 for e in asm)
    pushed = [e for e in events if e["ev"] == "dgt_push" and e["key"] == 0]
    assert all(sum(e["blocks"]) == 8 for e in pushed)
    workers = [n for n in seen["nodes"] if getattr(n, "role", "") == "worker" and not n.is_master]
    for w in workers[1:]:
        for a, b in zip(workers[0].params, w.params):
            np.testing.assert_array_equal(a, b)


def test_fp16_composes_blocks_of_2048_half_values(scenario_of):
    r, events = _run(scenario_of, "run.iterations=4", "sched.dgt=tcp", "codec.type=fp16",
                     "sched.dgt_adaptive_k=false")
    pushed = [e for e in events if e["ev"] == "dgt_push" and e["key"] == 0]
    assert pushed and all(sum(e["blocks"]) == 8 for e in pushed)   # 16384 / 2048
    blocks = [e for e in events if e["ev"] == "xfer" and e["msg"] == "PUSH"
              and e["src"] == "ls:party-a" and e["key"] == 0]
    big = [e["bytes"] for e in blocks[1:]]            # the first push is whole
    assert max(big) < 4096 + 400                      # 2048 fp16 values + header
    assert r.summary.final_accuracy is not None


@pytest.mark.slow
def test_accuracy_within_one_point_of_dgt_off_on_a_lossless_wan(scenario_of):
    acc = {}
    for mode in ("off", "tcp", "quant"):
        r, _ = _run(scenario_of, "run.iterations=120", "metrics.events=false",
                    f"sched.dgt={mode}")
        acc[mode] = r.summary.final_accuracy
    assert acc["off"] > 0.9
    assert abs(acc["tcp"] - acc["off"]) <= 0.01
    assert abs(acc["quant"] - acc["off"]) <= 0.01


@pytest.mark.parametrize("override, field", [
    (("topology.kind=flat",), "sched.dgt"),
    (("codec.type=bsc", "sched.dgt=quant"), "sched.dgt"),
    (("codec.type=onebit", "sched.dgt=quant"), "sched.dgt"),
    (("codec.type=bsc", "sched.dgt_block_size=256"), "sched.dgt_block_size"),
    (("sched.dgt_k=0.1", "sched.dgt_k_min=0.3"), "sched.dgt_k_min"),
    (("sched.dgt_block_size=16",), "sched.dgt_block_size"),
])
def test_scenario_refuses_what_does_not_compose(scenario_of, override, field):
    with pytest.raises(ScenarioError) as e:
        scenario_of("dgt.toml", *override)
    assert field in str(e.value)


def test_geomx_dgt_environment_maps_onto_sched_keys():
    from geomx.runtime.config import ConfigError, NodeArgs, resolve_node_config

    qs = str(QUICKSTART)
    env = {"ENABLE_DGT": "1", "DMLC_K": "0.8", "DMLC_K_MIN": "0.3", "ADAPTIVE_K_FLAG": "0",
           "DMLC_UDP_CHANNEL_NUM": "7", "DGT_BLOCK_SIZE": "8192", "DGT_CONTRIBUTION_ALPHA": "0.5"}
    c = resolve_node_config(NodeArgs(scenario=qs, name="ls:party-a"), env, now=1000.0)
    q = c.scenario.sched
    assert (q.dgt, q.dgt_k, q.dgt_k_min, q.dgt_adaptive_k, q.dgt_channels, q.dgt_block_bytes,
            q.dgt_alpha) == ("udp", 0.8, 0.3, False, 7, 8192, 0.5)
    for mode, name in (("0", "off"), ("2", "tcp"), ("3", "quant")):
        c = resolve_node_config(NodeArgs(scenario=qs, name="gs:0"), {"ENABLE_DGT": mode},
                                now=1000.0)
        assert c.scenario.sched.dgt == name
    with pytest.raises(ConfigError, match="ENABLE_DGT='4'"):
        resolve_node_config(NodeArgs(scenario=qs, name="gs:0"), {"ENABLE_DGT": "4"}, now=1000.0)
    with pytest.raises(ConfigError, match="DMLC_UDP_CHANNEL_NUM.*dgt_channels"):
        resolve_node_config(NodeArgs(scenario=qs, name="gs:0"), {"DMLC_UDP_CHANNEL_NUM": "9"},
                            now=1000.0)


def test_trace_has_a_track_per_channel(scenario_of):
    r = run_scenario(scenario_of("dgt.toml", "run.target_accuracy=0", "metrics.plot=false",
                                 "run.iterations=3", "sched.dgt=udp"))
    trace = json.loads((r.run_dir / "trace.json").read_text())
    names = {e["args"]["name"] for e in trace["traceEvents"]
             if e.get("ph") == "M" and e["name"] == "thread_name"}
    assert {"ls:party-a xfer", "ls:party-a xfer ch9", "ls:party-a xfer ch10",
            "ls:party-a xfer ch11"} <= names
