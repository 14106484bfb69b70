"""The emulated job as geomx/sim assembles it: its steps give what run_scenario gives,
its supervisor names the root failure, and geomx.experiment loads it only when used."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from types import SimpleNamespace

import pytest

from geomx.errors import JobFailed
from geomx.node.base import NodeFailure
from geomx.sim.job import assemble_job, run_emulated, run_job, summarise
from geomx.sim.loop import run_virtual
from geomx.sim.supervise import deadlock_hint, run_nodes


def test_the_steps_of_an_emulated_run_give_what_run_emulated_gives(scenario_of, tmp_path):
    s = scenario_of("quickstart.toml", "run.iterations=4", "run.target_accuracy=0",
                    "metrics.trace=false", "metrics.plot=false")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    whole = run_emulated(s, tmp_path / "a", progress=False)

    job = assemble_job(s, tmp_path / "b", progress=False)
    assert [n.name for n in job.nodes] == job.plan.nodes
    assert job.loop.time() == 0.0 and not job.loop.is_closed()
    run_job(job)
    assert job.loop.is_closed()
    parts = summarise(job, wall_s=1.0)

    events = [(d / "events.jsonl").read_bytes() for d in (tmp_path / "a", tmp_path / "b")]
    assert events[0] == events[1] and events[0]
    assert parts.emulated_seconds == whole.emulated_seconds
    assert parts.bytes_per_link == whole.bytes_per_link
    assert parts.iterations == whole.iterations == 4
    assert parts.extra["messages_delivered"] == whole.extra["messages_delivered"]


class _Node:
    """The least run_nodes needs of a node: a name, a run coroutine, events, a transport."""

    def __init__(self, name: str, fail_after_s: float | None = None,
                 exc: type[BaseException] = RuntimeError) -> None:
        self.name = name
        self.fail_after_s = fail_after_s
        self.exc = exc
        self.events: list[str] = []
        self.transport = SimpleNamespace(close=self._close)
        self.closed = False

    async def _close(self) -> None:
        self.closed = True

    def record(self, ev: str, **fields: object) -> None:
        self.events.append(ev)

    async def run(self) -> None:
        await asyncio.sleep(self.fail_after_s if self.fail_after_s is not None else 10.0)
        if self.fail_after_s is not None:
            raise self.exc(f"{self.name} broke")


def test_the_root_cause_is_named_not_the_node_that_saw_it():
    # b fails first in time, but with a NodeFailure ("another node failed"): c, whose own
    # error is a root cause, is named even though it comes later in plan order
    nodes = [_Node("a"), _Node("b", 1.0, NodeFailure), _Node("c", 1.0, ValueError)]
    with pytest.raises(JobFailed, match=r"^node c failed: ValueError: c broke$"):
        run_virtual(run_nodes(nodes))


def test_a_crash_cancels_the_node_closes_its_transport_and_is_reported():
    nodes = [_Node("a"), _Node("b")]
    crashes: list[tuple[str, float]] = []
    fault = SimpleNamespace(kind="crash", node="b", at_s=2.0, duration_s=0.0)
    run_virtual(run_nodes(nodes, (fault,), on_crash=lambda n, t: crashes.append((n, t))))
    assert crashes == [("b", 2.0)]
    assert nodes[1].events == ["crash"] and nodes[1].closed
    assert nodes[0].events == [] and not nodes[0].closed


def test_a_crash_with_a_duration_restarts_the_node_in_its_place():
    nodes = [_Node("a"), _Node("b")]
    restarted: list[_Node] = []

    def restart(name: str) -> _Node:
        restarted.append(_Node(name))
        return restarted[-1]

    fault = SimpleNamespace(kind="crash", node="b", at_s=2.0, duration_s=3.0)
    run_virtual(run_nodes(nodes, (fault,), restart=restart))
    assert [n.name for n in restarted] == ["b"]
    assert nodes[1] is restarted[0]


def test_the_deadlock_hint_names_every_fault_that_may_explain_it():
    s = SimpleNamespace(faults=[
        SimpleNamespace(kind="crash", node="w:0"),
        SimpleNamespace(kind="link_down", link=("dc1", "dc2")),
        SimpleNamespace(kind="partition", dcs=("dc3",)),
    ])
    hint = deadlock_hint(s)  # type: ignore[arg-type]
    assert hint.startswith(" after the injected crash of w:0")
    assert "the failed WAN link dc1-dc2" in hint and "cutting off dc3" in hint
    assert deadlock_hint(SimpleNamespace(faults=[])) == ""  # type: ignore[arg-type]


def test_experiment_offers_the_emulator_names_without_loading_the_emulator():
    code = (
        "import sys\n"
        "import geomx.experiment as e\n"
        "assert not [m for m in sys.modules if m.startswith('geomx.sim')], 'loaded geomx.sim'\n"
        "from geomx.experiment import EmuServices, build_network, run_emulated\n"
        "import geomx.sim.job, geomx.sim.job_network, geomx.sim.services\n"
        "assert run_emulated is geomx.sim.job.run_emulated\n"
        "assert build_network is geomx.sim.job_network.build_network\n"
        "assert EmuServices is geomx.sim.services.EmuServices\n"
        "assert e.counters_from_network is geomx.sim.job_network.counters_from_network\n"
        "assert e.resume_time_s is geomx.sim.job.resume_time_s\n"
        "try:\n"
        "    e.no_such_name\n"
        "except AttributeError as x:\n"
        "    assert 'no_such_name' in str(x)\n"
        "else:\n"
        "    raise SystemExit('no AttributeError')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
