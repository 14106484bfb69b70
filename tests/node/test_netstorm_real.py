"""NETSTORM over real sockets (one process per node, loopback, the userspace shaper giving
each WAN link its rate and delay): the same node code ends with the emulator's model, and
servers only ever exchange data with neighbouring DCs (application-layer relaying)."""

import pytest

from geomx.experiment import run_scenario

from tests.helpers.events import run_events

SHORT = ("run.iterations=6", "run.eval_every=6", "metrics.plot=false", "metrics.trace=false")


@pytest.mark.slow
def test_netstorm_4dc_over_sockets_matches_the_emulator(scenario_of):
    real = run_scenario(scenario_of("netstorm_4dc.toml", *SHORT, "real.shape=true"),
                        runtime="real")
    emu = run_scenario(scenario_of("netstorm_4dc.toml", *SHORT), runtime="emu")
    assert real.summary.runtime == "real" and real.summary.iterations == 6
    fr, fe = real.summary.extra["final_eval"], emu.summary.extra["final_eval"]
    # same model: same test accuracy; the loss differs only by float summation order
    assert fr["accuracy"] == fe["accuracy"]
    assert fr["loss"] == pytest.approx(fe["loss"], rel=1e-4)
    events = run_events(real.run_dir)
    links = {frozenset(p) for p in (("a", "b"), ("b", "c"), ("c", "d"), ("d", "a"), ("a", "c"))}
    relays = [e for e in events if e["ev"] == "send" and e.get("msg") == "RELAY"]
    assert relays
    assert all(frozenset((e["src"][3:], e["dst"][3:])) in links for e in relays)
    assert any(e["ev"] == "plan" for e in events)
