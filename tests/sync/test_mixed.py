"""MixedSync: async across DCs, the optimizer requirement, the staleness bound, codecs."""


import numpy as np
import pytest

from geomx.experiment import run_scenario
from geomx.scenario import ScenarioError
from geomx.policy.registry import policy_class
from geomx.policy.sync import KVSTORE_ALGORITHMS

from tests.helpers.events import run_events

FAST = ("metrics.plot=false", "metrics.trace=false")


def _nodes(seen):
    return {n.name: n for n in seen["nodes"]}


def test_kvstore_types_map_to_algorithms():
    kvstore_type = lambda name: policy_class("sync", name).kvstore_type
    assert kvstore_type("fsa") == "dist_sync"
    assert kvstore_type("mixed") == "dist_async"
    assert kvstore_type("hfa") == kvstore_type("esync") == "dist_sync"
    # and under [sync] algorithm = "auto" each store type names the algorithm of its type
    assert {t: kvstore_type(a) for t, a in KVSTORE_ALGORITHMS.items()} == {
        "dist_sync": "dist_sync", "dist_async": "dist_async"}


def test_each_dc_push_is_its_own_global_step(scenario_of):
    seen = {}
    r = run_scenario(scenario_of("mixed.toml", "run.iterations=12", "run.target_accuracy=0",
                                 *FAST), inspect=lambda nodes: seen.setdefault("nodes", nodes))
    nodes = _nodes(seen)
    rounds = sum(nodes[ls].slots[0].round for ls in ("ls:party-a", "ls:party-b"))
    assert rounds == 24
    assert nodes["gs:0"].slots[(0, 0)].version == rounds        # FSA would have 12
    # the workers asked for dist_async, which is what the scenario says: no warning
    assert not [e for e in run_events(r.run_dir) if e["ev"] == "warning"]


def test_mixed_reaches_target(scenario_of):
    summary = run_scenario(scenario_of("mixed.toml", *FAST)).summary
    assert summary.time_to_target_s is not None and summary.final_accuracy >= 0.9


def test_mixed_beats_fsa_on_heterogeneous_dcs(scenario_of):
    fsa = run_scenario(scenario_of("heterogeneous.toml", *FAST, "metrics.events=false")).summary
    mixed = run_scenario(scenario_of("heterogeneous.toml", "sync.algorithm=mixed", *FAST,
                                     "metrics.events=false")).summary
    assert fsa.time_to_target_s is not None and mixed.time_to_target_s is not None
    assert mixed.time_to_target_s < fsa.time_to_target_s


def test_mixed_without_optimizer_is_a_scenario_error(scenario_of):
    with pytest.raises(ScenarioError, match="training.optimizer.*needs a global optimizer"):
        scenario_of("mixed.toml", "training.optimizer=none")


def test_mixed_without_optimizer_fails_at_job_start_not_mid_run(scenario_of, monkeypatch):
    """A job built past the scenario check (a user's own program that never calls
    set_optimizer) is refused at the first INIT, with the reason, instead of hanging."""
    import geomx.cluster

    monkeypatch.setattr(geomx.cluster, "_optimizer_config", lambda *a, **k: None)
    s = scenario_of("mixed.toml", "run.iterations=5", *FAST)
    with pytest.raises(Exception, match="needs a global optimizer") as info:
        run_scenario(s)
    assert "mw" in str(info.value)


def _lead_over_time(events, fast, slow):
    """For each iteration the fast DC's worker started, the slow DC's progress then."""
    slow_done = 0
    leads = []
    for e in sorted((e for e in events if e["ev"] == "compute"), key=lambda e: e["t"]):
        if e["node"] == slow:
            slow_done = max(slow_done, e["iteration"])
        elif e["node"] == fast:
            leads.append(e["iteration"] - slow_done)
    return leads


@pytest.mark.parametrize("staleness", [0, 2])
def test_staleness_bound_holds_fast_dc_back(scenario_of, staleness):
    r = run_scenario(scenario_of("mixed.toml", "run.iterations=30", "run.target_accuracy=0",
                                 "wan.party-b:central.latency=150ms",
                                 f"sync.staleness={staleness}", *FAST))
    events = run_events(r.run_dir)
    leads = _lead_over_time(events, "w:party-a:0", "w:party-b:0")
    if staleness == 0:
        assert max(leads) > 10           # unbounded: party-a races ahead
        assert not [e for e in events if e["ev"] == "staleness_wait"]
    else:
        # starting iteration i needs the acks of i-1, i.e. lead(i-1) <= S
        assert max(leads) <= staleness + 1
        assert [e for e in events if e["ev"] == "staleness_wait"]


class _SparseWanCodec:
    """A stand-in for Bi-Sparse on the LS<->GS link: top-10% indices + values (no dense
    payload), dense elsewhere. Decodes into a dense value, as the real codec does."""

    enabled = True

    def __init__(self, config=None, num_dcs=1):
        from geomx.node.link_codec import LinkCodec

        self._dense = LinkCodec({"type": "none"})

    def _sparse(self, value):
        from geomx.wire import Payload

        flat = np.asarray(value).reshape(-1)
        keep = np.sort(np.argsort(-np.abs(flat), kind="stable")[:max(1, flat.size // 10)])
        return ([Payload.of(keep.astype(np.int32)), Payload.of(flat[keep].astype(np.float32))],
                {"codec": "test-sparse", "n": int(flat.size)})

    def encode_push(self, key, value, *, tier):
        return self._sparse(value) if tier == "wan" else self._dense.encode_push(key, value, tier=tier)

    def encode_pull(self, key, value, *, tier, weights=False):
        if tier == "wan" and not weights:
            return self._sparse(value)
        return self._dense.encode_pull(key, value, tier=tier, weights=weights)

    def decode(self, msg, *, like=None):
        if msg.meta.get("codec") != "test-sparse":
            return self._dense.decode(msg, like=like)
        idx, vals = (p.data for p in msg.payloads)
        out = np.zeros(int(msg.meta["n"]), dtype=np.float32)
        out[idx] = vals
        return out.reshape(like.shape) if like is not None else out


def test_mixed_with_a_sparse_wan_codec_completes(scenario_of, monkeypatch):
    """GeoMX's async Bi-Sparse handler is an empty stub and the job hangs; here every
    codec goes through LinkCodec on the same path as FSA."""
    import geomx.node.global_server as gs_mod
    import geomx.node.local_server as ls_mod

    monkeypatch.setattr(gs_mod, "LinkCodec", _SparseWanCodec)
    monkeypatch.setattr(ls_mod, "LinkCodec", _SparseWanCodec)
    r = run_scenario(scenario_of("mixed.toml", "run.iterations=40", "run.target_accuracy=0",
                                 *FAST))
    events = run_events(r.run_dir)
    wan_pushes = [e for e in events if e["ev"] == "xfer" and e["msg"] == "PUSH"
                  and e["src"].startswith("ls:") and e["key"] == 0]
    assert len(wan_pushes) == 80
    dense_bytes = 128 * 64 * 4
    assert all(e["bytes"] < dense_bytes / 4 for e in wan_pushes)
    assert r.summary.final_accuracy > 0.5


@pytest.mark.slow
def test_mixed_with_bsc(scenario_of):
    """MixedSync with the real Bi-Sparse codec on the WAN hop trains to the end."""
    r = run_scenario(scenario_of("mixed.toml", "run.iterations=40", "run.target_accuracy=0",
                                 "codec.type=bsc", "codec.threshold=0.1",
                                 "codec.size_lower_bound=1000", *FAST))
    assert r.summary.iterations == 40


class _Server:
    """The global context MixedSync's side needs, in memory: two DCs, one key."""

    def __init__(self, checkpoint_rounds=()):
        from types import SimpleNamespace

        self.pushers = ["ls:a", "ls:b"]
        self.departed: set[str] = set()
        self.stop_requested = False
        self.has_optimizer = True
        self.slots = {(0, 0): SimpleNamespace(version=0)}
        self.answered: list[tuple[str, int]] = []
        self.replies: list = []
        self.completed: list[int] = []
        self.checkpoint_rounds = set(checkpoint_rounds)

    def slot(self, key, part):
        return self.slots[(key, part)]

    def apply_update(self, key, slot, value, *, sender, completes=None):
        slot.version += 1
        if completes:
            self.completed.append(completes)

    def reply_push(self, msg, slot):
        self.answered.append((msg.src, msg.version))
        self.replies.append(msg)

    def is_checkpoint_round(self, round_):
        return round_ in self.checkpoint_rounds

    def record(self, *a, **k):
        pass


def _push(src, round_):
    from geomx.wire import Kind, Message

    return Message(Kind.PUSH, src, "gs:0", key=0, part=0, version=round_)


def test_a_checkpoint_round_is_a_barrier_and_rounds_count_per_dc():
    from geomx.sync.mixed import AsyncAcrossDCs

    gs, side = _Server(checkpoint_rounds={2}), AsyncAcrossDCs()
    slot = gs.slot(0, 0)
    side.on_push(gs, _push("ls:a", 1), slot, None)
    side.on_push(gs, _push("ls:a", 2), slot, None)       # a's round 2: held
    assert gs.answered == [("ls:a", 1)] and gs.completed == []
    assert side.reply_round(_push("ls:a", 0), slot) == 1  # answered rounds only
    side.on_push(gs, _push("ls:b", 1), slot, None)
    assert gs.completed == [1] and gs.answered[-1] == ("ls:b", 1)
    side.on_push(gs, _push("ls:b", 2), slot, None)       # completes 2: both answered
    assert gs.completed == [1, 2]
    assert sorted(gs.answered[-2:]) == [("ls:a", 2), ("ls:b", 2)]
    assert side.state_dict() == {"applied": {(0, 0): {"ls:a": 2, "ls:b": 2}}}
    assert slot.version == 4


def test_a_resent_push_is_answered_or_takes_the_held_ones_place():
    from geomx.sync.mixed import AsyncAcrossDCs

    gs, side = _Server(checkpoint_rounds={2}), AsyncAcrossDCs()
    slot = gs.slot(0, 0)
    for src, r in (("ls:a", 1), ("ls:a", 2)):
        side.on_push(gs, _push(src, r), slot, None)
    assert side.resent_push(gs, _push("ls:a", 1), slot) == "applied"
    assert gs.answered[-1] == ("ls:a", 1)
    again = _push("ls:a", 2)
    assert side.resent_push(gs, again, slot) == "parked"
    assert side.resent_push(gs, _push("ls:a", 3), slot) is None  # a new round
    for r in (1, 2):
        side.on_push(gs, _push("ls:b", r), slot, None)
    # the successor's request got the answer, and a's push of round 2 counted once
    assert any(m is again for m in gs.replies)
    assert side.state_dict()["applied"][(0, 0)] == {"ls:a": 2, "ls:b": 2}
