"""A sync policy of your own on a flat PS (no local servers): allowed unless its class
sets ``needs_local_tier``, as the policy API documents; the built-ins that need local
servers (HFA, ESync) are still refused. Run in both runtimes: a user algorithm built
from FSA's sides trains as the built-in FSA does on the same flat job."""

from __future__ import annotations

import pytest

from geomx.scenario import ScenarioError
from geomx.testing import run_policy

USER_FSA = '''
from geomx.policy.sync import SyncAlgorithm
from geomx.sync.fsa import ForwardEveryRound, FullySync, GradientSync


class MyFsa(SyncAlgorithm):
    name = "test-my-fsa"
    needs_local_tier = {needs_local_tier}

    def global_side(self, job):
        return FullySync()

    def local_side(self, job):
        return ForwardEveryRound()

    def worker_side(self, ctx):
        return GradientSync(ctx)
'''

FLAT = ["topology.kind=flat"]


def _policy(tmp_path, needs_local_tier: bool) -> str:
    path = tmp_path / f"my_fsa_{needs_local_tier}.py"
    path.write_text(USER_FSA.format(needs_local_tier=needs_local_tier))
    return f"{path}:MyFsa"


@pytest.mark.parametrize("runtime", ["emu", "real"])
def test_a_user_sync_policy_runs_on_a_flat_ps(tmp_path, runtime):
    mine = run_policy(_policy(tmp_path, False), kind="sync", overrides=FLAT, iterations=12,
                      runtime=runtime)
    assert mine.summary.iterations == 12 and mine.summary.final_accuracy > 0.3  # chance: 0.1
    assert mine.summary.bytes_lan < 0.05 * mine.summary.bytes_wan  # no local tier: control only
    if runtime == "emu":
        fsa = run_policy("fsa", kind="sync", overrides=FLAT, iterations=12)
        assert mine.summary.final_accuracy == fsa.summary.final_accuracy
        assert mine.summary.emulated_seconds == fsa.summary.emulated_seconds


def test_a_policy_that_needs_local_servers_is_refused_on_flat_naming_what_is_allowed(tmp_path):
    with pytest.raises(ScenarioError) as info:
        run_policy(_policy(tmp_path, True), kind="sync", overrides=FLAT, iterations=4)
    message = str(info.value)
    assert "needs local servers, which topology.kind = 'flat' does not have" in message
    assert "a sync policy of your own whose needs_local_tier is False" in message
    with pytest.raises(ScenarioError, match="'hfa' needs local servers"):
        run_policy("hfa", kind="sync", overrides=FLAT, iterations=4)
