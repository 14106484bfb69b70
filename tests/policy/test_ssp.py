"""examples/policies/ssp.py, bounded staleness across DCs written against
geomx.policy.sync: checked at load, and run in the emulator where the node roles build
sync algorithms from the registry (a DC ahead of the bound waits; a side that raises
fails the job in one line naming the policy and the node; its checkpoints are cuts, so a
resumed run continues bit for bit)."""

from __future__ import annotations

import pytest

from geomx.experiment import JobFailed
from geomx.scenario import ScenarioError, load_scenario
from geomx.testing import run_policy

from tests.helpers.events import run_events
from tests.helpers.resume import straight_and_resumed
from tests.policy.conftest import EXAMPLES, SSP_SPEC

#: party-b's workers 4x slower than party-a's, as examples/policies/ssp.toml
SLOW_B = ["dc.party-b.compute_per_iter=40ms", "dc.party-a.compute_per_iter=10ms"]

RAISING_SIDE = '''
import sys
sys.path.insert(0, {folder!r})
from ssp import BoundedStaleness, StaleSynchronousServer


class Broken(StaleSynchronousServer):
    def on_push(self, ctx, push, slot, value):
        if ctx.slot(push.key, push.part).version >= 2:
            raise KeyError("clock of an unknown DC")
        super().on_push(ctx, push, slot, value)


class BrokenSsp(BoundedStaleness):
    def global_side(self, job):
        return Broken(self.options.staleness)
'''


def test_the_example_scenario_loads_with_its_options():
    s = load_scenario(EXAMPLES / "ssp.toml")
    assert s.sync.algorithm == SSP_SPEC and dict(s.sync.options) == {"staleness": 2}


def test_a_dc_ahead_of_the_bound_waits_and_the_job_beats_lock_step():
    until = [*SLOW_B, "run.target_accuracy=0.6"]
    ssp = run_policy(SSP_SPEC, {"staleness": 1}, kind="sync", overrides=until, iterations=40)
    fsa = run_policy("fsa", kind="sync", overrides=until, iterations=40)
    waits = ssp.events_of("ssp_wait")
    assert waits and {w["dc"] for w in waits} == {"ls:party-a"}  # only the fast DC waits
    assert all(w["ahead"] == 2 for w in waits)
    # the fast DC need not wait for every step of the slow one: the target comes sooner
    assert ssp.summary.final_accuracy >= 0.6 and fsa.summary.final_accuracy >= 0.6
    assert ssp.summary.time_to_target_s < 0.8 * fsa.summary.time_to_target_s


def test_a_sync_side_that_raises_fails_the_job_in_one_line(tmp_path):
    (tmp_path / "broken_ssp.py").write_text(RAISING_SIDE.format(folder=str(EXAMPLES)))
    with pytest.raises(JobFailed) as info:
        run_policy(f"{tmp_path / 'broken_ssp.py'}:BrokenSsp", kind="sync", iterations=8)
    message = str(info.value)
    assert "\n" not in message and message.startswith("node gs:0 failed: PolicyFailed: ")
    assert "raised in on_push() at broken_ssp.py:" in message
    assert message.endswith("KeyError: 'clock of an unknown DC'")


def test_a_resumed_ssp_run_continues_bit_for_bit(tmp_path):
    """``checkpoint_cuts = True``: a checkpoint round holds the fast DC until the slow one
    pushed it too, so the files of the round are a cut and the resumed run is the run."""
    sets = [*SLOW_B, "run.target_accuracy=0", "run.eval_every=5", "checkpoint.every=5",
            "metrics.plot=false", "metrics.trace=false"]
    straight, resumed = straight_and_resumed(EXAMPLES / "ssp.toml", sets, runtime="emu",
                                             stop=10, end=20, out=tmp_path)
    assert resumed.summary.iterations == 20
    assert (resumed.summary.extra["final_eval"] == straight.summary.extra["final_eval"])
    waits = [e for e in run_events(straight.run_dir) if e["ev"] == "ssp_wait"]
    assert waits  # the fast DC is held within the bound meanwhile: the runs are not lock-step


NOT_A_CUT = """
import sys
sys.path.insert(0, {folder!r})
from ssp import BoundedStaleness


class Unsure(BoundedStaleness):
    checkpoint_cuts = False
"""


def test_checkpoints_with_a_policy_not_declaring_cuts_are_refused_naming_the_flag(tmp_path):
    (tmp_path / "unsure.py").write_text(NOT_A_CUT.format(folder=str(EXAMPLES)))
    with pytest.raises(ScenarioError, match=r"sync.algorithm = '.*unsure.py:Unsure': "
                                            r"Unsure.checkpoint_cuts is False .*allowed "
                                            r"with checkpoints: .*a policy of your own whose "
                                            r"checkpoint_cuts is True"):
        load_scenario(EXAMPLES / "ssp.toml", [f"sync.algorithm={tmp_path / 'unsure.py'}:Unsure",
                                              "checkpoint.every=5"])
