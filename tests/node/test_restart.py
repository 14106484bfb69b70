"""One restart path for both runtimes (geomx/node/restart.py).

Which nodes a job takes back (a worker when it goes on without lost workers, a server it
waits for), the one-line refusal otherwise, and the node's own declared state: a node is
told it restarts through ``restart_as`` before it runs, and ``rejoining`` /
``taking_over`` follow from that alone. The emulated and real restarts themselves are in
tests/node/test_worker_loss.py and tests/node/test_server_takeover.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from geomx.cli import main
from geomx.cluster import make_node, plan_job
from geomx.node.base import Node
from geomx.node.restart import RestartError, restart_mode, restart_node
from geomx.scenario import load_scenario
from geomx.sim.job import assemble_job
from geomx.sim.loop import run_virtual
from geomx.sim.network import Network
from geomx.sim.transport import SimFabric
from geomx.transport import BaseServices

from tests.helpers.paths import QUICKSTART

CONTINUE = ["membership.on_worker_loss=continue", "membership.in_emulator=true"]
WAIT = ["membership.on_server_loss=wait", "membership.in_emulator=true"]
WAIT_CKPT = [*WAIT, "checkpoint.every=5"]


def _plan(sets: list[str]):
    return plan_job(load_scenario(QUICKSTART, sets), "emu")


def _node(plan, name: str):
    net = Network(seed=0)
    net.add_dc("a", lan_delay_s=0.001)
    net.add_host(name, "a", nic_bandwidth_bps=1e9)
    return make_node(plan, name, SimFabric(net).transport(name),
                     BaseServices(0, None, None, plan.job.dc_of))


@pytest.mark.parametrize("sets,name,mode", [
    (CONTINUE, "w:party-a:1", "rejoin"),
    (WAIT, "ls:party-a", "takeover"),
    (WAIT_CKPT, "ls:party-b", "takeover"),
    (WAIT_CKPT, "gs:0", "takeover"),
    ([*WAIT, "sync.algorithm=mixed"], "ls:party-a", "takeover"),
    ([*WAIT_CKPT, "sync.algorithm=esync", "training.worker_optimizer=adam"], "gs:0",
     "takeover"),
    ([*CONTINUE, "sync.algorithm=esync", "training.worker_optimizer=adam"], "w:party-a:1",
     "rejoin"),
    ([*WAIT_CKPT, "sync.algorithm=mixed"], "gs:0", "takeover"),
])
def test_the_job_takes_back_what_its_membership_settings_allow(sets, name, mode) -> None:
    plan = _plan(sets)
    assert restart_mode(plan.job, name, plan.roles[name]) == mode


@pytest.mark.parametrize("sets,name,words", [
    ([], "w:party-a:1", "(membership.on_worker_loss = 'fail'); allowed: 'continue'"),
    (WAIT, "w:party-a:1", "membership.on_worker_loss = 'fail'"),
    ([], "ls:party-a", "does not wait for a lost local server; allowed: "
                       "membership.on_server_loss = 'wait'"),
    (CONTINUE, "ls:party-a", "does not wait for a lost local server"),
    (WAIT, "gs:0", "does not wait for a lost global server; allowed: "
                   "membership.on_server_loss = 'wait' with topology.kind = 'hips' and "
                   "checkpoint.every"),
    (CONTINUE, "mw", "a master worker cannot restart"),
    (CONTINUE, "gh", "a global scheduler cannot restart"),
    (WAIT_CKPT, "lh:party-a", "a local scheduler cannot restart"),
])
def test_a_restart_the_job_cannot_take_is_refused_in_one_line(sets, name, words) -> None:
    plan = _plan(sets)
    with pytest.raises(RestartError) as e:
        restart_mode(plan.job, name, plan.roles[name])
    text = str(e.value)
    assert text.startswith(f"restart of {name}: ") and words in text
    assert "\n" not in text


def test_restart_node_declares_the_mode_on_the_node() -> None:
    plan = _plan([*CONTINUE, *WAIT_CKPT])
    worker, ls, gs = (_node(plan, n) for n in ("w:party-a:1", "ls:party-a", "gs:0"))
    assert (worker.restarted_as, worker.rejoining, ls.taking_over) == (None, False, False)
    assert restart_node(worker, plan.job, "worker") == "rejoin"
    assert restart_node(ls, plan.job, "local_server") == "takeover"
    assert restart_node(gs, plan.job, "global_server") == "takeover"
    assert (worker.restarted_as, worker.rejoining) == ("rejoin", True)
    assert (ls.restarted_as, ls.taking_over) == ("takeover", True)
    assert gs.restarted_as == "takeover"
    # read-only from outside: a role's flag follows from restart_as alone
    with pytest.raises(AttributeError):
        worker.rejoining = False
    with pytest.raises(AttributeError):
        ls.taking_over = False


def test_a_refused_restart_leaves_the_node_as_it_was() -> None:
    plan = _plan([])
    worker = _node(plan, "w:party-a:1")
    with pytest.raises(RestartError, match="on_worker_loss"):
        restart_node(worker, plan.job, "worker")
    assert worker.restarted_as is None and not worker.rejoining


def test_restart_as_takes_a_known_mode_before_the_node_runs() -> None:
    plan = _plan(CONTINUE)
    worker = _node(plan, "w:party-a:1")
    with pytest.raises(ValueError, match="allowed: rejoin, takeover"):
        worker.restart_as("resume")  # type: ignore[arg-type]

    class Late(Node):
        role = "test"

        async def main(self) -> None:
            self.restart_as("rejoin")

    net = Network(seed=0)
    net.add_dc("a", lan_delay_s=0.001)
    net.add_host("late", "a", nic_bandwidth_bps=1e9)
    late = Late("late", "a", SimFabric(net).transport("late"), BaseServices(0, None, None, {}))
    with pytest.raises(RuntimeError, match="after the node started"):
        run_virtual(late.run())
    assert late.restarted_as is None


def test_the_emulator_refuses_a_restart_before_the_run(tmp_path: Path) -> None:
    """A crash fault with a duration restarts its node through restart_node; one the job
    cannot take back is refused when the job is assembled (the scenario checks refuse it
    first; a scenario built around them still meets this)."""
    import dataclasses

    s = load_scenario(QUICKSTART, ["membership.on_worker_loss=continue",
                                   "membership.in_emulator=true", "fault.0.node=w:party-a:1",
                                   "fault.0.at=3s", "fault.0.duration=2s"])
    bad = dataclasses.replace(s, membership=dataclasses.replace(s.membership,
                                                                on_worker_loss="fail"))
    with pytest.raises(RestartError, match=r"restart of w:party-a:1: .*on_worker_loss"):
        assemble_job(bad, tmp_path, progress=False)
    job = assemble_job(s, tmp_path / "ok", progress=False)
    try:
        crashed = job.nodes[job.plan.nodes.index("w:party-a:1")]
        job.loop.run_until_complete(crashed.transport.close())  # (as a crash does)
        back = job.restart("w:party-a:1")
        assert back.rejoining and back is not crashed and not crashed.rejoining
    finally:
        job.loop.close()
        job.recorder.close()
        job.writer.close()


def test_geomx_node_rejoin_of_a_node_the_job_cannot_take_back(tmp_path: Path, capsys) -> None:
    """``geomx node --rejoin``: refused in one line, exit status 2, before it listens."""
    for name, words in [("mw", "a master worker cannot restart"),
                        ("w:party-a:1", "membership.on_worker_loss = 'fail'"),
                        ("ls:party-a", "does not wait for a lost local server")]:
        code = main(["node", str(QUICKSTART), "--name", name, "--rejoin",
                     "--run-dir", str(tmp_path / "run")])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2
        assert len(err) == 1 and err[0].startswith(f"geomx node: restart of {name}: ")
        assert words in err[0]
    assert not (tmp_path / "run" / "nodes").exists()  # it never started


def test_the_real_runtime_and_the_emulator_share_the_check() -> None:
    """Both runtimes import the same function (no second copy of the rules)."""
    from geomx.runtime import node_main
    from geomx.sim import job

    assert node_main.restart_node is job.restart_node is restart_node
    assert node_main.restart_mode is job.restart_mode is restart_mode
