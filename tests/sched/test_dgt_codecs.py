"""DGT with a sparse or 1-bit codec (geomx/sched/dgt_codec.py): each dense block ranked by
DGT is encoded apart, with its own error-feedback state, by the whole tensor's codec; the
global server decodes each block into its slice and re-sparsifies its pull reply."""

import numpy as np
import pytest

from geomx.experiment import run_scenario
from geomx.sched.dgt import DGT_META, DgtReceiver, DgtSender, DgtSettings
from geomx.sched.dgt_codec import block_key

from tests.helpers.dgt_context import FakeSchedContext, push_round
from tests.helpers.events import run_events
from tests.node.test_checkpoint import _final_state

QUICK = ("run.target_accuracy=0", "metrics.plot=false", "metrics.trace=false")


def _deliver(rx, gs, msgs, like):
    """Every block of a round, the end block last (nothing late, nothing lost)."""
    end = [m for m in msgs if m.request_id]
    out = None
    for m in [m for m in msgs if not m.request_id] + end:
        out = rx.receive(gs, m, like)
    return out


def test_block_keys_differ_per_key_part_and_block():
    keys = {block_key(k, p, s) for k in (0, 1, 7) for p in (0, 1) for s in range(40)}
    assert len(keys) == 3 * 2 * 40


def test_block_codec_lifts_only_the_size_bound():
    from geomx.codec import create_codec

    bsc = create_codec("bsc", threshold=0.05, size_lower_bound=5000, seed=7)
    blk = bsc.block_codec()
    assert blk.size_lower_bound == 0 and blk.applies_to(10)
    assert {p: getattr(blk, p) for p in blk.params if p != "size_lower_bound"} == \
        {p: getattr(bsc, p) for p in bsc.params if p != "size_lower_bound"}
    assert create_codec("onebit", size_lower_bound=9).block_codec().size_lower_bound == 0
    fp16 = create_codec("fp16")
    assert fp16.block_codec() is fp16


def test_mpq_blocks_large_tensors_with_bisparse_and_small_ones_in_half_precision():
    s = DgtSettings(mode="tcp", block_bytes=4096, adaptive_k=False)
    sender = DgtSender(s)
    ls = FakeSchedContext({"type": "mpq", "threshold": 0.01, "size_lower_bound": 3000})
    g = np.random.default_rng(3).normal(size=4096).astype(np.float32)
    for r in (1, 2):
        big = push_round(sender, ls, g, r)
        assert len(big) == 4 and {m.meta["codec"] for m in big} == {"bsc"}
    small = push_round(sender, ls, g[:2500], 2, key=1)   # below the bound: fp16, whole at first
    assert len(small) == 1 and small[0].meta["codec"] == "fp16"


def test_bsc_blocks_below_the_size_bound_are_still_sparse():
    # the tensor (4096 values) passes the bound (2000), its 1024-value blocks alone would not
    s = DgtSettings(mode="udp", block_bytes=4096, k=0.5, channels=2, adaptive_k=False)
    sender = DgtSender(s)
    ls = FakeSchedContext({"type": "bsc", "threshold": 0.01, "size_lower_bound": 2000})
    g = np.random.default_rng(0).normal(size=4096).astype(np.float32)
    first = push_round(sender, ls, g, 1)
    # the first push: every block on the reliable channel, encoded (not one dense message)
    assert len(first) == 4 and {m.channel for m in first} == {0}
    for msgs in (first, push_round(sender, ls, g, 2)):
        for m in msgs:
            assert m.meta["codec"] == "bsc" and m.meta["n"] == 1024
            assert m.payloads[0].num_elements <= 10          # floor(1024 * 0.01)
    assert {m.channel for m in msgs} - {0}                    # some blocks on the bands
    ev = [f for e, f in ls.events if e == "dgt_push"]
    assert ev[-1]["codec"] == "bsc" and sum(ev[-1]["dense_bytes"]) == 4096 * 4
    assert sum(ev[-1]["bytes"]) < sum(ev[-1]["dense_bytes"]) / 8
    # a tensor below the bound travels as dense blocks, as without a codec
    small = push_round(sender, ls, g[:1000], 1, key=1)
    assert len(small) == 1 and "codec" not in small[0].meta and DGT_META not in small[0].meta


@pytest.mark.parametrize("mode", ["tcp", "udp"])
def test_onebit_blocks_keep_their_own_residual_and_conserve_the_sum(mode):
    """onebit's error feedback per block: what was delivered plus every block's residual
    is what was pushed, round after round (nothing double-counted, nothing lost)."""
    s = DgtSettings(mode=mode, block_bytes=256, k=0.5, channels=2, adaptive_k=False)
    sender, rx = DgtSender(s), DgtReceiver(s)
    ls, gs = FakeSchedContext({"type": "onebit"}), FakeSchedContext({"type": "onebit"}, "gs:0")
    rng = np.random.default_rng(1)
    like = np.zeros(1000, dtype=np.float32)     # 16 blocks of 64 values, the last of 40
    pushed = np.zeros(1000, dtype=np.float64)
    got = np.zeros(1000, dtype=np.float64)
    for r in range(1, 9):
        g = (rng.normal(size=1000) * np.linspace(0.1, 2, 1000)).astype(np.float32)
        pushed += g
        msgs = push_round(sender, ls, g, r)
        assert all(m.meta["codec"] == "onebit" for m in msgs)
        got += _deliver(rx, gs, msgs, like)
    residual = np.zeros(1000, dtype=np.float64)
    be = s.dense_block_elements
    for (key, part, seq), st in sender.coder.states.items():
        residual[seq * be:seq * be + st.num_elements] = st.residual
    assert len(sender.coder.states) == 16
    np.testing.assert_allclose(got + residual, pushed, atol=1e-4)
    assert rx.missing == 0


def test_block_codec_states_survive_a_checkpoint():
    """A sender restored from another's state_dict sends the same next push, bit for bit."""
    s = DgtSettings(mode="udp", block_bytes=1024, k=0.5, channels=3, adaptive_k=False)
    cfg = {"type": "bsc", "threshold": 0.05, "size_lower_bound": 1000}
    a, ls_a = DgtSender(s), FakeSchedContext(cfg)
    rng = np.random.default_rng(2)
    grads = [rng.normal(size=3000).astype(np.float32) for _ in range(4)]
    for r, g in enumerate(grads[:3], start=1):
        push_round(a, ls_a, g, r)
    state = a.state_dict()
    assert state["block_codec"]["config"]["type"] == "bsc"
    b, ls_b = DgtSender(s), FakeSchedContext(cfg)
    b.load_state_dict(state)
    ma, mb = push_round(a, ls_a, grads[3], 4), push_round(b, ls_b, grads[3], 4)
    assert [(m.channel, m.meta[DGT_META]) for m in ma] == [(m.channel, m.meta[DGT_META])
                                                           for m in mb]
    for x, y in zip(ma, mb):
        for p, q in zip(x.payloads, y.payloads):
            np.testing.assert_array_equal(p.data, q.data)


def test_a_new_codec_starts_the_block_states_afresh():
    s = DgtSettings(mode="tcp", block_bytes=256, adaptive_k=False)
    sender = DgtSender(s)
    g = np.ones(500, dtype=np.float32)
    push_round(sender, FakeSchedContext({"type": "onebit"}), g, 1)
    assert sender.coder.states and sender.coder.config["type"] == "onebit"
    push_round(sender, FakeSchedContext({"type": "bsc", "threshold": 0.1, "size_lower_bound": 0}), g, 2)
    assert sender.coder.config["type"] == "bsc"
    assert all(st.v is not None for st in sender.coder.states.values())


# ---------------------------------------------------------------- whole jobs

def _dgt_bsc(scenario_of, *overrides):
    return scenario_of("quickstart_bsc.toml", *QUICK, "run.iterations=30", "sched.dgt=udp",
                       "sched.dgt_adaptive_k=false", *overrides)


def test_dgt_with_bisparse_runs_both_active_and_is_deterministic(scenario_of):
    lossy = ("run.iterations=8", "wan.0.loss=5%", "wan.1.loss=5%")
    r1 = run_scenario(_dgt_bsc(scenario_of, *lossy))
    r2 = run_scenario(_dgt_bsc(scenario_of, *lossy))
    e1, e2 = run_events(r1.run_dir), run_events(r2.run_dir)
    assert e1 == e2                                   # same scenario and seed, same log
    # DGT: key 0 (64 x 256 values, Bi-Sparse above 1000) goes as 16 ranked blocks, some on
    # the unreliable bands (datagram channels 9..11), some of them lost
    pushed = [e for e in e1 if e["ev"] == "dgt_push" and e["key"] == 0]
    assert pushed and all(sum(e["blocks"]) == 16 and e["codec"] == "bsc" for e in pushed)
    assert sum(sum(e["blocks"][1:]) for e in pushed) > 0
    chans = {e["channel"] for e in e1 if e["ev"] == "xfer" and e["msg"] == "PUSH"
             and e["src"].startswith("ls:")}
    assert chans == {0, 9, 10, 11}
    d = r1.summary.extra["dgt"]
    assert d["bands"][0]["dropped"] == 0 and sum(b["dropped"] for b in d["bands"]) > 0
    # Bi-Sparse: each block carries at most 10 of its 1024 values (8 bytes each)
    sent = sum(sum(e["bytes"]) for e in pushed)
    assert sent < sum(sum(e["dense_bytes"]) for e in pushed) / 10
    # ... and the global server's pull reply of key 0 is re-sparsified
    replies = [e["bytes"] for e in e1 if e["ev"] == "xfer" and e["msg"] == "PULL_REPLY"
               and e["src"] == "gs:0" and e["key"] == 0]
    assert sorted(replies)[len(replies) // 2] < 64 * 256 * 4 / 10
    assert r1.summary.iterations == 8


@pytest.mark.slow
def test_dgt_with_bisparse_trains_as_bisparse_alone(scenario_of):
    # the quickstart scores about 0.1 untrained; in 30 rounds bsc alone reaches 0.84 here
    both = run_scenario(_dgt_bsc(scenario_of, "wan.0.loss=2%", "wan.1.loss=2%"))
    alone = run_scenario(scenario_of("quickstart_bsc.toml", *QUICK, "run.iterations=30"))
    assert both.summary.iterations == 30
    assert both.summary.final_accuracy > 0.7
    assert abs(both.summary.final_accuracy - alone.summary.final_accuracy) <= 0.05


@pytest.mark.slow
def test_dgt_with_bisparse_over_real_sockets(scenario_of):
    r = run_scenario(_dgt_bsc(scenario_of, "run.iterations=20", "wan.0.loss=1%"),
                     runtime="real")
    assert r.summary.iterations == 20 and r.summary.final_accuracy > 0.5
    d = r.summary.extra["dgt"]
    assert d["bands"][0]["dropped"] == 0
    assert sum(b["sent_blocks"] for b in d["bands"][1:]) > 0
    events = run_events(r.run_dir)
    pushed = [e for e in events if e["ev"] == "dgt_push" and e["key"] == 0]
    assert pushed and all(e["codec"] == "bsc" for e in pushed)
    assert sum(sum(e["bytes"]) for e in pushed) < sum(sum(e["dense_bytes"])
                                                      for e in pushed) / 10
    # the bands went as datagrams
    chans = {e["channel"] for e in events if e["ev"] == "send" and e.get("msg") == "PUSH"
             and e["src"].startswith("ls:")}
    assert {9, 10, 11} <= chans


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["tcp", "udp"])
def test_dgt_with_bisparse_resumes_bit_exact(scenario_of, mode):
    """Each block's Bi-Sparse state is in the local server's checkpoint: stopped at round
    30 and resumed from its round-20 checkpoint, the job ends with the arrays of an
    uninterrupted 50-round run, bit for bit."""
    from geomx.experiment import resume_scenario

    sets = (*QUICK, "metrics.events=false", "checkpoint.every=10", f"sched.dgt={mode}")
    clean, resumed = {}, {}
    run_scenario(scenario_of("quickstart_bsc.toml", *sets, "run.iterations=50"),
                 inspect=_final_state(clean))
    first = run_scenario(scenario_of("quickstart_bsc.toml", *sets, "run.iterations=30"))
    second = run_scenario(resume_scenario(first.run_dir, ["run.iterations=50"]),
                          inspect=_final_state(resumed))
    assert second.summary.iterations == 50
    assert clean.keys() == resumed.keys() and clean
    for name in clean:
        for x, y in zip(clean[name], resumed[name]):
            np.testing.assert_array_equal(x, y)
