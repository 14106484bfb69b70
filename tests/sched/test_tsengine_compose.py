"""TSEngine composed with codecs and with P3 (geomx/sched/ts_merge_codec.py,
geomx/sched/ts_overlay.py).

Relays: a merge's sender encodes its whole buffer with the hop's codec and keeps its own
error-feedback state per (key, part); what a relay drops is not lost (it travels later),
the state is deterministic and saved with the local server's checkpoint. Emulator, per
pair on the Bi-Sparse quickstart (and P3's layered quickstart): both mechanisms show in
the event log, the model trains as with the codec alone, the run is deterministic. Real
sockets: Bi-Sparse with both overlays over loopback.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from geomx.codec import create_codec, decode
from geomx.experiment import run_scenario
from geomx.sched.dgt import DgtSettings
from geomx.policy.wire_keys import split_slice_key
from geomx.sched.p3 import layer_priority
from geomx.sched.ts_dgt import BlockMerges
from geomx.sched.ts_merge_codec import MergeCodec
from geomx.wire import Kind, Message, Payload

from tests.helpers.events import run_events

SHORT = ("run.target_accuracy=0", "metrics.plot=false", "metrics.trace=false")
BOTH = ("sched.tsengine_inter=true", "sched.tsengine_intra=true")
CODECS = {
    "bsc": ("codec.type=bsc",),
    "onebit": ("codec.type=onebit", "codec.size_lower_bound=1000"),
    "mpq": ("codec.type=mpq",),
}


# ------------------------------------------------------------------ relays (no network)

class _Ctx:
    """The two operations MergeCodec uses of a scheduler context."""

    def __init__(self, codec: Any):
        self.policy = codec

    def codec_for(self, n: int, *, tier: str) -> Any:
        c = self.policy.codec_for(n, tier)
        return None if c.name == "none" else c

    def decode(self, msg: Message, like: Any = None) -> Any:
        meta = {k: v for k, v in msg.meta.items() if k in ("codec", "n", "dtype", "shape")}
        return decode(([p.data for p in msg.payloads], meta))


def _merge(mc: MergeCodec, key: int, value: np.ndarray, received: Any = None) -> Message:
    payloads, meta = mc.encode(key, 0, value, received=received)
    return Message(Kind.PUSH, "a", "b", key=key, meta={**meta, "ts": "inter"},
                   payloads=payloads)


@pytest.mark.parametrize("name,params", [("onebit", {}), ("bsc", {"threshold": 0.05,
                                                                  "size_lower_bound": 10,
                                                                  "momentum": 0.0})])
def test_a_relay_re_encodes_the_sum_and_keeps_what_it_drops(name, params):
    """A chain a -> b -> root over several rounds: each sender encodes its buffer (b's
    holds a's decoded merge), so the root receives the codec's message of the sum, and
    what the root got plus every relay's residual is everything pushed (error feedback
    at every hop: nothing is lost)."""
    codec = create_codec(name, **params)
    rng = np.random.default_rng(0)
    a, b = MergeCodec(_Ctx(codec), "wan"), MergeCodec(_Ctx(codec), "wan")
    n, pushed, got = 400, np.zeros(400, np.float32), np.zeros(400, np.float64)
    for _ in range(6):
        ga, gb = rng.normal(size=n).astype(np.float32), rng.normal(size=n).astype(np.float32)
        pushed += ga + gb
        m1 = _merge(a, 7, ga.copy())
        assert m1.meta["codec"] == name
        got_a = b.add_decoded(m1, gb, None)               # b: decode and add ...
        m2 = _merge(b, 7, gb.copy(), got_a)               # ... and encode again
        sent = b.decode(m2, None)
        if name == "bsc":
            assert np.count_nonzero(sent) <= int(n * 0.05)  # a top-k of the merged sum
        got += sent
    residual = sum(_residual(mc) for mc in (a, b))
    np.testing.assert_allclose(got + residual, pushed, rtol=1e-4, atol=1e-3)
    # a deterministic state: the same inputs give the same bytes
    again = MergeCodec(_Ctx(codec), "wan")
    x = np.linspace(-1, 1, n).astype(np.float32)
    p1 = _merge(again, 3, x.copy()).payloads
    p2 = _merge(MergeCodec(_Ctx(codec), "wan"), 3, x.copy()).payloads
    assert all(np.array_equal(u.data, v.data) for u, v in zip(p1, p2))


def test_a_relay_does_not_apply_momentum_to_what_it_relays():
    """Bi-Sparse with momentum: a1 and a2 each push one gradient and then zeros, b has
    nothing of its own and relays twice its capacity in the first round. What the root
    receives from b over the rounds plus b's accumulator is what a1 and a2 sent: b's
    momentum acts on b's own gradients only (fed with the relayed values, it multiplies
    them by about 4 here, up to 1/(1-m) = 10)."""
    codec = create_codec("bsc", threshold=0.05, size_lower_bound=10, momentum=0.9)
    a1, a2, b = (MergeCodec(_Ctx(codec), "wan") for _ in range(3))
    n = 400
    rng = np.random.default_rng(2)
    g1, g2 = rng.normal(size=n).astype(np.float32), rng.normal(size=n).astype(np.float32)
    sent, got = np.zeros(n), np.zeros(n)

    def zero() -> np.ndarray:
        return np.zeros(n, np.float32)

    for r in range(30):
        m1 = _merge(a1, 1, g1.copy() if r == 0 else zero())
        m2 = _merge(a2, 1, g2.copy() if r == 0 else zero())
        sent += b.decode(m1, None) + b.decode(m2, None)
        received = b.add_decoded(m2, zero(), b.add_decoded(m1, zero(), None))
        got += b.decode(_merge(b, 1, zero(), received), None)
    v_b = next(e["arrays"]["v"] for e in b.state_dict())
    np.testing.assert_allclose(got + v_b, sent, rtol=1e-4, atol=1e-4)
    assert np.abs(got).sum() > 0.95 * np.abs(sent).sum()  # delivered, not kept


def _residual(mc: MergeCodec) -> np.ndarray:
    states = mc.state_dict() or []
    out = np.zeros(400, np.float64)
    for e in states:
        arr = e["arrays"]
        out += arr.get("residual", arr.get("v"))
    return out


def test_dense_hop_and_phantoms_travel_as_without_a_codec():
    """On the LAN Bi-Sparse picks no codec: the merge is the buffer as it is, no meta;
    a phantom merge is sized by the codec without a kernel."""
    codec = create_codec("bsc", size_lower_bound=10)
    lan = MergeCodec(_Ctx(codec), "lan")
    v = np.arange(100, dtype=np.float32)
    payloads, meta = lan.encode(0, 0, v)
    assert meta == {} and np.array_equal(payloads[0].data, v)
    assert lan.state_dict() is None
    wan = MergeCodec(_Ctx(codec), "wan")
    payloads, meta = wan.encode(0, 0, Payload.phantom((100,), "<f4"))
    assert meta["codec"] == "bsc" and [p.num_elements for p in payloads] == [1, 1]
    assert all(p.is_phantom for p in payloads)


def test_relay_state_survives_a_checkpoint():
    codec = create_codec("onebit")
    a = MergeCodec(_Ctx(codec), "wan")
    rng = np.random.default_rng(1)
    for _ in range(3):
        _merge(a, 5, rng.normal(size=64).astype(np.float32))
    saved = a.state_dict()
    b = MergeCodec(_Ctx(codec), "wan")
    b.load_state_dict(saved)
    x = rng.normal(size=64).astype(np.float32)
    pa, pb = _merge(a, 5, x.copy()).payloads, _merge(b, 5, x.copy()).payloads
    assert all(np.array_equal(u.data, v.data) for u, v in zip(pa, pb))
    c = MergeCodec(_Ctx(create_codec("bsc", size_lower_bound=1)), "wan")
    c.load_state_dict(saved)  # another codec's state is not taken for this one
    _merge(c, 5, x.copy())
    assert c.state_dict()[0]["codec"] == "bsc"


# ------------------------------------------------------------------ emulator, per pair

def _run(scenario_of, name, *overrides):
    return run_scenario(scenario_of(name, *SHORT, *overrides))


#: the overlays without a codec, run once for the per-codec comparisons
_DENSE: dict[str, Any] = {}


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_codec_and_tsengine_both_act_and_train(scenario_of, codec):
    """quickstart_bsc with both overlays and the codec: the merges across DCs travel under
    the codec (``ts_xfer`` with ``codec``), the coordinators decide (``ts_choose``), the
    model trains as with the codec alone and the WAN carries less than the overlay
    without a codec."""
    base = ("run.iterations=30", "run.eval_every=30", *CODECS[codec])
    alone = _run(scenario_of, "quickstart_bsc.toml", *base).summary
    both = _run(scenario_of, "quickstart_bsc.toml", *base, *BOTH)
    if "s" not in _DENSE:
        _DENSE["s"] = _run(scenario_of, "quickstart_bsc.toml", "run.iterations=30",
                           "run.eval_every=30", "codec.type=none", *BOTH).summary
    dense = _DENSE["s"]
    ev = run_events(both.run_dir)
    wire = "bsc" if codec == "mpq" else codec  # MPQ: Bi-Sparse for the large tensors
    merges = [e for e in ev if e["ev"] == "ts_xfer" and e["msg"] == "merge"
              and e["overlay"] == "inter"]
    assert merges and {e.get("codec") for e in merges} >= {wire}
    assert {e["overlay"] for e in ev if e["ev"] == "ts_choose"} == {"inter", "intra"}
    assert both.summary.final_accuracy > 0.6
    assert both.summary.final_accuracy == pytest.approx(alone.final_accuracy, abs=0.06)
    assert both.summary.bytes_wan < 0.6 * dense.bytes_wan


def test_relays_across_dcs_re_encode_under_bi_sparse(scenario_of):
    """Eight party DCs behind a 20 Mbps central NIC: local servers merge into each other
    (a relay's push carries several DCs) and every merge stays Bi-Sparse (the relay
    encodes the sum: at most 1% of a tensor's elements, whatever it merged)."""
    r = _run(scenario_of, "tsengine_incast.toml", "run.iterations=3", "codec.type=bsc",
             "codec.size_lower_bound=1000", "training.optimizer=none",
             "training.worker_optimizer=adam")
    ev = run_events(r.run_dir)
    xfer = [e for e in ev if e["ev"] == "ts_xfer" and e["msg"] == "merge"
            and e["overlay"] == "inter" and e.get("codec") == "bsc"]
    relayed = [e for e in xfer if e["edge"].startswith("->ls:")]
    assert relayed
    # W1 (64 x 512 = 32768 elements): 327 (value, index) pairs of 8 bytes and the header
    w1 = [e["bytes"] for e in xfer if e["key"] == 0]
    assert w1 and max(w1) <= 64 + 2 * 16 + 327 * 8
    pushes = [e for e in ev if e["ev"] == "xfer" and e["msg"] == "PUSH" and e["dst"] == "gs:0"]
    assert len(pushes) < 8 * 4 * 3  # the star's count: fewer, merged pushes reach the root


def test_bsc_and_tsengine_is_deterministic(scenario_of):
    def log() -> bytes:
        r = _run(scenario_of, "quickstart_bsc.toml", "run.iterations=5", *BOTH)
        return (r.run_dir / "events.jsonl").read_bytes()
    a = log()
    assert a == log() and b'"codec":"bsc"' in a


def test_p3_and_tsengine_both_act_and_keep_the_model(scenario_of):
    """P3's layered quickstart with both overlays: the overlays carry P3's slices (keys of
    slices beyond the first), each at P3's priority (earliest layer first), and FSA's
    model is P3's alone up to float summation order."""
    base = ("run.iterations=6", "run.eval_every=6")
    seen: dict[str, Any] = {}

    def workers(r_nodes: Any) -> list[Any]:
        return [n for n in r_nodes if getattr(n, "role", "") == "worker" and not n.is_master]

    p3 = run_scenario(scenario_of("p3.toml", *SHORT, *base),
                      inspect=lambda nodes: seen.setdefault("p3", workers(nodes)))
    both = run_scenario(scenario_of("p3.toml", *SHORT, *base, *BOTH),
                        inspect=lambda nodes: seen.setdefault("both", workers(nodes)))
    for x, y in zip(seen["p3"], seen["both"]):
        for p, q in zip(x.params, y.params):
            np.testing.assert_allclose(p, q, rtol=1e-5, atol=1e-6)
    assert both.summary.final_accuracy == pytest.approx(p3.summary.final_accuracy, abs=1e-6)
    ev = run_events(both.run_dir)
    xfers = [e for e in ev if e["ev"] == "ts_xfer"]
    assert {e["overlay"] for e in xfers} == {"inter", "intra"}
    assert any(split_slice_key(e["key"])[1] > 0 for e in xfers)     # slices travel
    assert all(e["prio"] == layer_priority(e["key"]) for e in xfers)  # at P3's priority
    assert len({e["prio"] for e in xfers}) > 1


def test_p3_tsengine_and_bsc_compose(scenario_of):
    """All three: slices under Bi-Sparse on the overlay, at P3's priority; the model
    trains as P3 with Bi-Sparse does without the overlay."""
    sets = ("run.iterations=20", "run.eval_every=20", "codec.type=bsc",
            "codec.size_lower_bound=500", "training.optimizer=none",
            "training.worker_optimizer=adam")
    alone = _run(scenario_of, "p3.toml", *sets).summary
    r = _run(scenario_of, "p3.toml", *sets, *BOTH)
    ev = run_events(r.run_dir, "ts_xfer")
    coded = [e for e in ev if e.get("codec") == "bsc"]
    assert coded and all(e["prio"] == layer_priority(e["key"]) for e in coded)
    assert any(split_slice_key(e["key"])[1] > 0 for e in coded)
    assert r.summary.final_accuracy == pytest.approx(alone.final_accuracy, abs=0.05)


def test_dgt_and_the_intra_dc_overlay_compose(scenario_of):
    """DGT with the overlay inside DCs (fixed K): workers merge along the DC's tree, the
    local server sends the DC's sum as DGT's ranked blocks; the model trains as with DGT
    alone. With adaptive K the pair is refused by field."""
    base = ("run.iterations=12", "run.eval_every=12", "sched.dgt_adaptive_k=false")
    alone = _run(scenario_of, "dgt.toml", *base).summary
    both = _run(scenario_of, "dgt.toml", *base, "sched.tsengine_intra=true")
    ev = run_events(both.run_dir)
    assert {e["overlay"] for e in ev if e["ev"] == "ts_choose"} == {"intra"}
    assert any(e["ev"] == "dgt_push" for e in ev) and any(e["ev"] == "dgt_assemble" for e in ev)
    assert both.summary.final_accuracy == pytest.approx(alone.final_accuracy, abs=0.03)
    from geomx.scenario import ScenarioError
    with pytest.raises(ScenarioError, match="sched.dgt_adaptive_k.*allowed"):
        scenario_of("dgt.toml", "sched.tsengine_intra=true")


# ------------------------------------------------------------------ DGT across DCs

class _Node:
    """What DGT's sender and the overlay's reassembly use of a scheduler context: sends
    are captured (a request is answered at once), events kept."""

    def __init__(self, name: str):
        self.node_name = name
        self.sent: list[Message] = []
        self.events: list[tuple[str, dict[str, Any]]] = []

    def post(self, msg: Message) -> None:
        self.sent.append(msg)

    async def request(self, msg: Message, **_: Any) -> Message:
        msg = replace(msg, request_id=len(self.sent) + 1)
        self.sent.append(msg)
        return msg.reply(Kind.PUSH_ACK)

    def record(self, event: str, **fields: Any) -> None:
        self.events.append((event, fields))

    def codec_for(self, n: int, *, tier: str) -> Any:
        return None

    def encode_push(self, key: int, value: Any, *, tier: str) -> tuple[list[Payload], dict]:
        return [Payload.of(np.array(value, dtype=np.float32, copy=True))], {}

    def decode(self, msg: Message, like: Any = None) -> Any:
        raise AssertionError("dense blocks need no codec")


def _send(node: _Node, merges: BlockMerges, dst: str, round_: int, value: np.ndarray,
          ) -> list[Message]:
    node.sent.clear()
    asyncio.run(merges.send(dst, 7, 0, round_, value, {"ts_n": 1, "ts_from": [node.node_name]}))
    return list(node.sent)


def _deliver(receiver: BlockMerges, msgs: list[Message]) -> np.ndarray | None:
    out = None
    for m in msgs:
        if not receiver.is_block(m):  # the first push of a key goes whole
            return np.array(m.payloads[0].data)
        v = receiver.take(m)
        if v is not None:
            out = v
    return out


def test_a_relay_reassembles_adds_and_ranks_dgt_blocks_again():
    """A chain a -> b -> root with DGT over reliable bands (``tcp``): every hop sends its
    whole buffer as ranked blocks; the bands trail the end block, so they come late and
    join the receiver's next round (the relay's next merge, the root's next one). Over
    the rounds, what the root assembled plus the late blocks still held is everything
    pushed: nothing is lost on reliable channels, whichever node a block was late at."""
    s = DgtSettings(mode="tcp", block_bytes=64, k=0.3, adaptive_k=False, channels=2)
    na, nb, nr = _Node("ls:a"), _Node("ls:b"), _Node("gs:0")
    a, b, root = (BlockMerges(n, s, {"ts": "inter"}) for n in (na, nb, nr))
    rng = np.random.default_rng(3)
    n = 200  # 16 values a block: 13 blocks
    pushed, got = np.zeros(n), np.zeros(n)
    for r in range(1, 7):
        ga = rng.normal(size=n).astype(np.float32)
        gb = rng.normal(size=n).astype(np.float32)
        pushed += ga + gb
        from_a = _send(na, a, "ls:b", r, ga)
        assert all(m.meta["ts"] == "inter" for m in from_a)
        merged = _deliver(b, from_a)
        assert merged is not None
        if r > 1:  # after the first (whole) push: ranked blocks, bands on channels 1..2
            assert {m.channel for m in from_a} == {0, 1, 2} and len(from_a) == 13
            assert [m.meta["dgt"][0] for m in from_a if "dgt_sent" in m.meta] == [12]
        value = b.late_into(7, 0, gb + merged)
        from_b = _send(nb, b, "gs:0", r, value)
        at_root = _deliver(root, from_b)
        assert at_root is not None
        got += root.late_into(7, 0, at_root)
    # the relay ranked its own buffer: its DGT pushes are events of its own
    assert [f["round"] for e, f in nb.events if e == "dgt_push"] == list(range(2, 7))
    late = [f for e, f in nr.events if e == "dgt_assemble"]
    assert late and all(f["missing"] > 0 for f in late[1:])  # bands trail the end block
    got += root.late_into(7, 0, np.zeros(n, np.float32))
    np.testing.assert_allclose(got, pushed, rtol=1e-4, atol=1e-4)


def test_dgt_blocks_that_do_not_fit_are_refused():
    s = DgtSettings(mode="udp", block_bytes=64, adaptive_k=False)
    node = _Node("gs:0")
    merges = BlockMerges(node, s, {"ts": "inter"})
    bad = Message(Kind.PUSH, "ls:a", "gs:0", key=1, meta={"dgt": [0, 2, 16], "dgt_r": 1},
                  payloads=[Payload.of(np.zeros(15, np.float32))])
    with pytest.raises(ValueError, match="15 values, expected 16"):
        merges.take(bad)
    with pytest.raises(ValueError, match="channel"):
        merges.take(replace(bad, channel=60))
    end = Message(Kind.PUSH, "ls:a", "gs:0", key=1, meta={"dgt": [1, 2, 16], "dgt_r": 1},
                  payloads=[Payload.of(np.zeros(4, np.float32))])
    with pytest.raises(ValueError, match="request"):
        merges.take(end)  # an end block is answered, so it is a request


#: the incast scenario (8 party DCs, 1 worker each) kept short
INCAST = ("run.iterations=12", "run.eval_every=12", "training.hidden=[128]")


@pytest.mark.parametrize("mode", ["udp", "tcp"])
def test_dgt_and_the_inter_dc_overlay_both_act_and_train(scenario_of, mode):
    """Eight party DCs: local servers merge each other's pushes along TSEngine's tree and
    every hop travels as DGT's ranked blocks (``dgt_push`` at every local server,
    ``dgt_assemble`` at relays between local servers and at the global server); the model
    trains as with DGT alone. Over ``udp`` every WAN link drops 3% of the datagrams: the
    bands lose blocks (zeros where they were) at relays and at the root alike."""
    lossy = tuple(f"wan.{i}.loss=3%" for i in range(36)) if mode == "udp" else ()
    dgt = (f"sched.dgt={mode}", *lossy)
    alone = _run(scenario_of, "tsengine_incast.toml", *INCAST, *dgt,
                 "sched.tsengine_inter=false").summary
    both = _run(scenario_of, "tsengine_incast.toml", *INCAST, *dgt)
    ev = run_events(both.run_dir)
    merges = [e for e in ev if e["ev"] == "ts_xfer" and e["msg"] == "merge"]
    assert merges and all(e.get("dgt") for e in merges)
    relayed = [e for e in merges if e["edge"].startswith("->ls:")]
    assert relayed  # local servers merge into each other
    at = {e["node"] for e in ev if e["ev"] == "dgt_assemble"}
    assert "gs:0" in at and any(n.startswith("ls:") for n in at)
    pushers = {e["node"] for e in ev if e["ev"] == "dgt_push"}
    assert len(pushers) == 8  # each local server ranks what it sends
    assert any(b > 0 for e in ev if e["ev"] == "dgt_push" for b in e["blocks"][1:])
    bands = both.summary.extra["dgt"]["bands"]
    assert len(bands) == 4 and all(b["sent_blocks"] > 0 for b in bands)
    assert (sum(b["dropped"] for b in bands) > 0) == (mode == "udp")
    assert bands[0]["dropped"] == 0  # the reliable channel
    assert both.summary.final_accuracy > 0.8
    assert both.summary.final_accuracy == pytest.approx(alone.final_accuracy, abs=0.05)


def test_dgt_and_the_inter_dc_overlay_is_deterministic(scenario_of):
    def log() -> bytes:
        r = _run(scenario_of, "tsengine_incast.toml", "run.iterations=4", "training.hidden=[64]",
                 "sched.dgt=udp", "wan.8.loss=5%")
        return (r.run_dir / "events.jsonl").read_bytes()
    a = log()
    assert a == log() and b'"dgt_assemble"' in a


def test_dgt_with_the_inter_dc_overlay_refuses_checkpoints(scenario_of):
    from geomx.scenario import ScenarioError
    with pytest.raises(ScenarioError, match="checkpoint.*allowed with checkpoints: sched.dgt"):
        scenario_of("dgt.toml", "sched.tsengine_inter=true", "checkpoint.every=5")


# ------------------------------------------------------------------ real sockets

@pytest.mark.slow
def test_bsc_and_tsengine_over_sockets_train_like_the_emulator(scenario_of):
    over = (*SHORT, "run.iterations=30", "run.eval_every=30", *BOTH)
    emu = run_scenario(scenario_of("quickstart_bsc.toml", *over)).summary
    real = run_scenario(scenario_of("quickstart_bsc.toml", *over), runtime="real")
    assert real.summary.runtime == "real" and real.summary.iterations == 30
    # the merge trees follow wall-clock readiness, so the top-k of each merged sum may
    # differ from the emulator's: close, not equal
    assert real.summary.final_accuracy == pytest.approx(emu.final_accuracy, abs=0.05)
    ev = run_events(real.run_dir, "ts_xfer")
    assert any(e.get("codec") == "bsc" for e in ev)
    assert real.summary.extra["tsengine"]["inter"]["broadcast_decisions"] == 4 * 30 * 2


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["udp", "tcp"])
def test_dgt_and_the_inter_dc_overlay_over_sockets(scenario_of, mode):
    """The incast scenario over loopback, DGT's bands on UDP datagrams (``udp``) or on
    lower-priority TCP connections (``tcp``): local servers relay each other's blocks,
    and the model trains as in the emulator (the trees follow wall-clock readiness, and
    which bands come late differs: close, not equal)."""
    over = (*SHORT, *INCAST, f"sched.dgt={mode}")
    emu = run_scenario(scenario_of("tsengine_incast.toml", *over)).summary
    real = run_scenario(scenario_of("tsengine_incast.toml", *over), runtime="real")
    assert real.summary.runtime == "real" and real.summary.iterations == 12
    assert real.summary.final_accuracy == pytest.approx(emu.final_accuracy, abs=0.05)
    ev = run_events(real.run_dir)
    assert any(e["ev"] == "dgt_assemble" and e["node"].startswith("ls:") for e in ev)
    assert any(e["ev"] == "ts_xfer" and e.get("dgt") and e["edge"].startswith("->ls:")
               for e in ev)
    bands = real.summary.extra["dgt"]["bands"]
    assert sum(b["sent_blocks"] for b in bands[1:]) > 0


# ------------------------------------------------------------------ checkpoints

@pytest.mark.slow
def test_bsc_relays_resume_bit_exact(tmp_path):
    """Across two DCs with Bi-Sparse: the local servers' relay states (accumulator,
    momentum, round) are saved with their checkpoint, so a resumed run is the
    uninterrupted one bit for bit."""
    from tests.node.test_checkpoint import _max_difference, _stop_and_resume

    sets = ["checkpoint.every=10", "sched.tsengine_inter=true", "codec.type=bsc",
            "codec.size_lower_bound=1000"]
    clean, resumed, _ = _stop_and_resume(tmp_path, sets, stop=30, end=50)
    assert _max_difference(clean, resumed) == 0.0
