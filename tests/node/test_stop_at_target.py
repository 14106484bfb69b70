"""Stopping at the target accuracy when the party DCs' WAN latencies differ.

The evaluator's stop travels with its next pushes, so it reaches the global server in the
round after the one the evaluator was answered for. A DC with a longer WAN latency can
still be waiting for that earlier round's replies then. Those replies must not carry the
stop: the DC would stop a round early, and the others would wait forever in the next
round for its push (an emulation deadlock; a hang over sockets). Every synchronous
algorithm and every transfer scheduler must instead end the job with all DCs past the
same last round (``GlobalSide.stop_version``, geomx/policy/sync.py).
"""

from __future__ import annotations

import pytest

from geomx.experiment import run_scenario

from tests.helpers.events import run_events
from tests.helpers.paths import ROOT

#: a low target (reached in a few dozen iterations) keeps each run short
QUICK = ("run.target_accuracy=0.85", "run.eval_every=5", "metrics.plot=false",
         "metrics.trace=false")
#: the second party DC a round or more behind; the first party DC (the evaluator's) behind
SKEWS = {
    "party-b 80ms": ("wan.1.latency=80ms",),
    "party-b 200ms": ("wan.1.latency=200ms",),
    "party-a 80ms": ("wan.0.latency=80ms",),
}
#: built-in scenarios whose DCs move in lockstep rounds (every worker ends on the same
#: iteration), with extra overrides that keep them short
LOCKSTEP = {
    "quickstart.toml": (),
    "quickstart_bsc.toml": (),
    "hfa.toml": ("sync.k1=2", "sync.k2=2"),
    "p3.toml": (),
    "dgt.toml": (),
    "tsengine.toml": (),
    "vanilla_ps.toml": (),
}
#: scenarios whose workers iterate at their own pace (ESync's budgets, MixedSync's DCs)
OWN_PACE = {"esync.toml": (), "mixed.toml": ()}
#: the combinations the fast tier runs (each of them deadlocked before the fix; so did
#: quickstart_bsc, dgt, vanilla_ps and esync with party-b at 200ms); the others are the
#: slow tier's. P3 and TSEngine answer a round's pushes with the new value at once, so
#: no reply of the round before can be sent after the stop arrives; they are swept too.
FAST = {("quickstart.toml", "party-b 80ms"), ("quickstart.toml", "party-b 200ms"),
        ("hfa.toml", "party-b 200ms"), ("dgt.toml", "party-b 80ms"),
        ("vanilla_ps.toml", "party-b 80ms"), ("esync.toml", "party-b 80ms")}


def _sweep(scenarios: dict[str, tuple[str, ...]]) -> list:
    return [pytest.param(name, skew, id=f"{name[:-5]}-{skew.replace(' ', '-')}",
                         marks=() if (name, skew) in FAST else pytest.mark.slow)
            for name in scenarios for skew in SKEWS]


def _stopped_at_target(run) -> list[dict]:
    done = run_events(run.run_dir, "worker_done")
    assert done, "no worker finished"
    assert {e["stop_reason"] for e in done} == {"stop requested (target accuracy or time limit)"}
    assert run.summary.time_to_target_s is not None
    return done


@pytest.mark.parametrize(("scenario", "skew"), _sweep(LOCKSTEP))
def test_lockstep_job_stops_every_dc_after_the_same_round(scenario_of, scenario, skew):
    sets = (*QUICK, *LOCKSTEP[scenario], *SKEWS[skew])
    run = run_scenario(scenario_of(scenario, *sets), runtime="emu")
    done = _stopped_at_target(run)
    assert len({e["iterations"] for e in done}) == 1, done


@pytest.mark.parametrize(("scenario", "skew"), _sweep(OWN_PACE))
def test_own_pace_job_ends_at_target(scenario_of, scenario, skew):
    run = run_scenario(scenario_of(scenario, *QUICK, *OWN_PACE[scenario], *SKEWS[skew]),
                       runtime="emu")
    _stopped_at_target(run)


def test_program_job_stops_at_target_with_skewed_latency(scenario_of):
    """A training program (tools/pair_program.py) stops through the same kvstore flag."""
    run = run_scenario(scenario_of("quickstart.toml", *QUICK, "run.target_accuracy=0.5",
                                   f"training.program={ROOT / 'tools' / 'pair_program.py'}",
                                   "wan.1.latency=80ms"),
                       runtime="emu")
    done = run_events(run.run_dir, "worker_done")
    assert len(done) == 4
    assert run.summary.time_to_target_s is not None


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["quickstart.toml", "hfa.toml"])
def test_job_over_sockets_stops_at_target_with_skewed_latency(scenario_of, scenario):
    """The same over real sockets on loopback, the shaper giving each WAN link its delay
    (where the bug hung until a request timeout instead of deadlocking)."""
    run = run_scenario(scenario_of(scenario, *QUICK, *LOCKSTEP[scenario], "real.shape=true",
                                   "wan.1.latency=200ms"),
                       runtime="real")
    done = _stopped_at_target(run)
    assert len({e["iterations"] for e in done}) == 1, done
