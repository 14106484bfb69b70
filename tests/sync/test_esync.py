"""ESync: the ready rule, step budgets, the state server, and the payoff on stragglers."""

import numpy as np
import pytest

from geomx.experiment import run_scenario
from geomx.sync.esync import StateBoard, is_ready, local_step_budget, slowest_of

from tests.helpers.events import run_events

FAST = ("metrics.plot=false", "metrics.trace=false")


# ----------------------------------------------------------------- the paper's rule
def test_ready_rule():
    c = {"fast": 0.01, "slow": 0.1}
    e = {"slow": 0.0}
    kw = dict(step_s=c, end_s=e, slowest="slow", slowest_ready=False, epsilon_s=0.0)
    assert not is_ready(worker="fast", steps_done=0, now_s=0.5, **kw)      # k = 0: never
    assert not is_ready(worker="slow", steps_done=0, now_s=0.5, **kw)
    assert is_ready(worker="slow", steps_done=1, now_s=0.1, **kw)          # r = s
    # rest = 0.1 - 0.05 = 0.05: one more 10 ms step still ends in time
    assert not is_ready(worker="fast", steps_done=5, now_s=0.05, **kw)
    # rest = 0.1 - 0.095 = 0.005 < 0.01: one more step would overshoot
    assert is_ready(worker="fast", steps_done=9, now_s=0.095, **kw)
    # epsilon makes it ready earlier
    assert is_ready(worker="fast", steps_done=5, now_s=0.05,
                    **{**kw, "epsilon_s": 0.05})
    # s already ready
    assert is_ready(worker="fast", steps_done=1, now_s=0.0, **{**kw, "slowest_ready": True})


def test_step_budgets_follow_the_slowest_worker():
    c = {"a0": 0.04, "a1": 0.04, "b0": 0.01, "b1": 0.1}
    assert slowest_of(c) == "b1"
    budgets = {w: local_step_budget(w, c, epsilon_s=0.0, max_steps=64) for w in c}
    assert budgets == {"a0": 2, "a1": 2, "b0": 10, "b1": 1}
    assert local_step_budget("b0", c, epsilon_s=0.0, max_steps=4) == 4          # capped
    assert local_step_budget("b0", c, epsilon_s=0.035, max_steps=64) == 6       # slack
    assert local_step_budget("new", c, epsilon_s=0.0, max_steps=64) == 1        # unmeasured


def test_state_board_answers_a_round_when_every_worker_asked():
    board = StateBoard(["w0", "w1"], epsilon_s=0.0, max_steps=64)
    assert board.report("w0", round_=2, step_s=0.01, end_s=1.0, steps=1) is None
    assert board.report("w1", round_=2, step_s=0.03, end_s=1.0, steps=1) == {"w0": 3, "w1": 1}
    with pytest.raises(ValueError, match="not a training worker"):
        board.report("w9", round_=3, step_s=0.01, end_s=1.0, steps=1)


# ----------------------------------------------------------------- in the emulator
def test_state_server_sizes_rounds_on_the_heterogeneous_scenario(scenario_of):
    seen = {}
    r = run_scenario(scenario_of("heterogeneous.toml", "sync.algorithm=esync",
                                 "run.iterations=40", "run.target_accuracy=0", *FAST),
                     inspect=lambda nodes: seen.setdefault("nodes", nodes))
    events = run_events(r.run_dir)
    rounds = [e for e in events if e["ev"] == "esync_round"]
    assert rounds, "the state server answered no round"
    # party-a is 4x slower (40 ms), party-b has a 10 ms and a 100 ms worker
    assert rounds[0]["budgets"] == {"w:party-a:0": 2, "w:party-a:1": 2,
                                    "w:party-b:0": 10, "w:party-b:1": 1}
    # its messages travel through the Transport (and across the WAN)
    queries = [e for e in events if e["ev"] == "xfer" and e["msg"] == "STATE_QUERY"]
    assert queries and all(e["dst"] == "ss" for e in queries)
    assert any(any(hop.startswith("party-") for hop in e["path"]) for e in queries)
    assert any(e["ev"] == "xfer" and e["msg"] == "STATE_REPLY" for e in events)
    # a round ends with every worker holding the same model
    workers = [n for n in seen["nodes"] if getattr(n, "role", "") == "worker" and not n.is_master]
    for w in workers[1:]:
        for a, b in zip(workers[0].params, w.params):
            np.testing.assert_allclose(a, b, rtol=0, atol=0)
    # the 100 ms straggler did one step per round, its 10 ms neighbour ten
    its = {w.name: w.iteration for w in workers}
    assert its["w:party-b:0"] == 40 and its["w:party-b:1"] < 10


def test_esync_reaches_the_target_at_least_twice_as_soon_as_fsa(scenario_of):
    fsa = run_scenario(scenario_of("heterogeneous.toml", *FAST, "metrics.events=false")).summary
    esync = run_scenario(scenario_of("heterogeneous.toml", "sync.algorithm=esync", *FAST,
                                     "metrics.events=false")).summary
    assert fsa.time_to_target_s is not None and esync.time_to_target_s is not None
    assert esync.time_to_target_s * 2 <= fsa.time_to_target_s


def test_esync_quickstart_scenario_runs(scenario_of):
    summary = run_scenario(scenario_of("esync.toml", *FAST)).summary
    assert summary.final_accuracy >= 0.9


def test_state_board_drops_a_lost_worker():
    """A lost worker's pending query is forgotten; a round that waited only for it is
    answered at once, and later rounds are sized for the workers left."""
    board = StateBoard(["a", "b", "c"], max_steps=8)
    for w, step_s in (("a", 0.01), ("b", 0.03), ("c", 0.03)):
        board.report(w, round_=2, step_s=step_s, end_s=0.0, steps=1)
    assert board.report("a", round_=3, step_s=0.01, end_s=0.0, steps=3) is None
    assert board.report("c", round_=3, step_s=0.03, end_s=0.0, steps=1) is None
    assert board.drop("b") == {3: {"a": 3, "c": 1}}
    assert board.drop("b") == {}  # once
    assert board.report("a", round_=4, step_s=0.01, end_s=0.0, steps=3) is None
    assert board.report("c", round_=4, step_s=0.03, end_s=0.0, steps=1) == {"a": 3, "c": 1}
