"""Each sync algorithm over real sockets (one process per node) on the quickstart shape.

FSA over sockets is tests/runtime/test_real_job.py. These runs are short (a few
iterations): they show the same node code and sync policies work over TCP, not speed.
"""


import pytest

from geomx.experiment import run_scenario

from tests.helpers.events import run_events

SHORT = ("run.target_accuracy=0", "metrics.plot=false", "metrics.trace=false")


def _real(scenario_of, name, *overrides):
    r = run_scenario(scenario_of(name, *SHORT, *overrides), runtime="real")
    assert r.summary.runtime == "real"
    return r, run_events(r.run_dir)


@pytest.mark.slow
def test_mixed_over_sockets(scenario_of):
    r, events = _real(scenario_of, "mixed.toml", "run.iterations=4")
    assert r.summary.iterations == 4
    # every LS push was answered on its own: 4 rounds x 2 DCs x 4 keys
    acks = [e for e in events if e["ev"] == "send" and e["msg"] == "PUSH_ACK"
            and e["src"] == "gs:0"]
    assert len(acks) == 4 * 2 * 4


@pytest.mark.slow
def test_mixed_dcasgd_over_sockets(scenario_of):
    r, _ = _real(scenario_of, "mixed_dcasgd.toml", "run.iterations=4")
    assert r.summary.iterations == 4 and r.summary.final_accuracy is not None


@pytest.mark.slow
def test_hfa_over_sockets(scenario_of):
    r, events = _real(scenario_of, "hfa.toml", "run.iterations=8", "sync.k1=2", "sync.k2=2")
    assert r.summary.iterations == 8
    syncs = {}
    for e in events:
        if e["ev"] == "global_sync":
            syncs.setdefault((e["key"], e["sync"]), set()).add(e["digest"])
    assert len(syncs) == 4 * 2                        # 4 keys x global syncs at 4 and 8
    assert all(len(d) == 1 for d in syncs.values())   # both DCs: the same model


@pytest.mark.slow
def test_esync_over_sockets(scenario_of):
    r, events = _real(scenario_of, "esync.toml", "run.iterations=4")
    assert r.summary.iterations >= 4
    rounds = [e for e in events if e["ev"] == "esync_round"]
    assert rounds and all(e["node"] == "ss" for e in rounds)
    assert any(e["ev"] == "send" and e["msg"] == "STATE_QUERY" and e["dst"] == "ss"
               for e in events)
