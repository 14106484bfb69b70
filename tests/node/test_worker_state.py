"""The state a worker's kvstores and its training loop share (geomx/node/worker_state.py).

The kvstore writes what replies carry (the newest round, a checkpoint round, a stop) into
the worker's declared ``state``; the built-in trainer and a user's program read it back
there and ask for a stop through it. Checked on the object itself, through the kvstore
and program APIs on a worker built as the job builds it, and at the end of a whole
emulated job.
"""

from __future__ import annotations

from pathlib import Path

from geomx.cluster import make_node, plan_job
from geomx.experiment import run_scenario
from geomx.node.kvstore import KVStore
from geomx.node.program import ProgramContext
from geomx.node.worker_state import WorkerState
from geomx.scenario import load_scenario
from geomx.sim.network import Network
from geomx.sim.transport import SimFabric
from geomx.transport import BaseServices

from tests.helpers.events import run_events
from tests.helpers.paths import QUICKSTART

SHORT = ["run.progress=false", "metrics.plot=false", "metrics.trace=false"]


def test_rounds_and_checkpoints_only_move_forward() -> None:
    st = WorkerState()
    for v in (3, 7, 5):
        st.saw_version(v)
    assert st.seen_version == 7
    st.saw_checkpoint(10)
    st.saw_checkpoint(5)  # an older announcement arriving late does not win
    assert st.ckpt_due == 10
    assert st.take_checkpoint() == 10
    assert (st.ckpt_due, st.take_checkpoint()) == (0, 0)


def test_a_stop_seen_and_a_stop_wanted_are_separate() -> None:
    st = WorkerState()
    st.want_stop()
    assert (st.stop_wanted, st.stop_seen) == (True, False)
    st.saw_stop()
    assert st.stop_seen
    st.saw_stop(False)
    assert not st.stop_seen and st.stop_wanted


def _worker(name: str = "w:party-a:1"):
    plan = plan_job(load_scenario(QUICKSTART, SHORT), "emu")
    net = Network(seed=0)
    net.add_dc("a", lan_delay_s=0.001)
    net.add_host(name, "a", nic_bandwidth_bps=1e9)
    node = make_node(plan, name, SimFabric(net).transport(name),
                     BaseServices(0, None, None, plan.job.dc_of))
    return plan, node


def test_the_kvstore_and_the_program_go_through_the_workers_state() -> None:
    plan, node = _worker()
    assert node.state == WorkerState()  # declared by the worker, empty at the start
    kv = KVStore(node, "dist_sync")
    assert node.state.kv_stores == [kv]
    kv.request_stop()
    assert node.state.stop_wanted and not kv.stop_requested
    kv.stop_requested = True
    assert node.state.stop_seen
    ctx = ProgramContext(node, plan.train, [], 1.0)
    assert ctx.stop_requested
    kv.stop_requested = False
    assert not ctx.stop_requested
    ctx.request_stop()
    assert node.state.stop_wanted


def test_after_a_job_each_worker_state_holds_what_its_replies_said(tmp_path: Path) -> None:
    """12 rounds with a checkpoint every 5: every worker saw round 12, saved rounds 5 and
    10 (nothing left due), kept its one store; nobody asked for a stop."""
    nodes = {}
    r = run_scenario(load_scenario(QUICKSTART, [*SHORT, "run.iterations=12",
                                                "run.target_accuracy=0", "checkpoint.every=5"]),
                     out_dir=tmp_path, inspect=lambda ns: nodes.update({n.name: n for n in ns}))
    workers = [n for name, n in nodes.items() if name.startswith("w:")]
    assert len(workers) == 4
    for w in workers:
        assert (w.state.seen_version, w.state.ckpt_due) == (12, 0)
        assert len(w.state.kv_stores) == 1
        assert not w.state.stop_seen and not w.state.stop_wanted
    saved = [(e["node"], e["round"]) for e in run_events(r.run_dir, "checkpoint")
             if e["node"].startswith("w:")]
    assert sorted(saved) == sorted((w.name, r) for w in workers for r in (5, 10))


def test_a_stop_one_worker_asks_for_reaches_every_worker(tmp_path: Path) -> None:
    """The evaluator reaches the target accuracy and asks for a stop on its pushes; the
    global tier's replies carry it to every worker, and each stops before 300 rounds."""
    nodes = {}
    r = run_scenario(load_scenario(QUICKSTART, [*SHORT, "run.target_accuracy=0.5"]),
                     out_dir=tmp_path, inspect=lambda ns: nodes.update({n.name: n for n in ns}))
    evaluator = nodes["w:party-a:0"]
    assert evaluator.state.stop_wanted
    assert not nodes["w:party-b:1"].state.stop_wanted
    for name in ("w:party-a:0", "w:party-a:1", "w:party-b:0", "w:party-b:1"):
        assert nodes[name].state.stop_seen and nodes[name].iteration < 300
    assert r.summary.iterations < 300
