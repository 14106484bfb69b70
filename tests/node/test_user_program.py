"""User training programs: ``[training] program`` runs ``main(kv, ctx)``
on every worker and the master, in the emulator and over real sockets, and leaves a run
folder as complete as the built-in trainer's."""

import json
import sys
import textwrap
from pathlib import Path

import pytest

from geomx.experiment import JobFailed, run_scenario
from geomx.metrics.recorder import iter_events
from geomx.scenario import load_scenario

from tests.helpers.forking import delegate_unless_fork_usable
from tests.helpers.paths import ROOT

EXAMPLES = ROOT / "examples"


def example(tmp_path, name, *overrides):
    return load_scenario(EXAMPLES / f"{name}.toml",
                         [f"run.out_dir={tmp_path / 'runs'}", "run.progress=false", *overrides])


def files_of(run_dir):
    return sorted(p.name for p in Path(run_dir).iterdir() if p.is_file())


@pytest.mark.slow
def test_user_program_run_folder_is_as_complete_as_the_builtin_trainers(tmp_path):
    user = run_scenario(example(tmp_path, "cnn", "run.iterations=20", "run.eval_every=5"))
    builtin = run_scenario(example(tmp_path, "cnn", "run.iterations=20", "run.eval_every=5",
                                   "training.program="))
    assert files_of(user.run_dir) == files_of(builtin.run_dir)
    for name in ("accuracy.png", "bytes.png", "summary.json", "progress.csv", "trace.json"):
        assert (user.run_dir / name).stat().st_size > 0
    s = user.summary
    assert s.iterations == 20
    assert s.final_accuracy is not None and s.final_accuracy > 0.5
    rows = (user.run_dir / "progress.csv").read_text().strip().splitlines()
    assert len(rows) == 1 + 4  # header + iterations 5, 10, 15, 20
    done = [e for e in iter_events(user.run_dir / "events.jsonl") if e["ev"] == "worker_done"]
    assert len(done) == 4 and all(e["iterations"] == 20 for e in done)
    # the same maths as the built-in loop (global Adam, mean gradients, pull weights)
    assert s.final_accuracy == pytest.approx(builtin.summary.final_accuracy, abs=0.03)


@pytest.mark.slow
def test_user_program_is_charged_heterogeneous_compute(tmp_path):
    r = run_scenario(example(tmp_path, "cnn", "run.iterations=4", "dc.party-b.heterogeneity=4",
                             "dc.party-a.worker_slowdown=[1, 2]"))
    durs = {}
    for e in iter_events(r.run_dir / "events.jsonl"):
        if e["ev"] == "compute":
            durs.setdefault(e["node"], set()).add(round(e["dur"], 6))
    assert durs["w:party-a:0"] == {0.01}
    assert durs["w:party-a:1"] == {0.02}
    assert durs["w:party-b:0"] == durs["w:party-b:1"] == {0.04}


@pytest.mark.slow
def test_target_accuracy_stops_a_user_program(tmp_path):
    r = run_scenario(example(tmp_path, "cnn", "run.iterations=200", "run.target_accuracy=0.8",
                             "run.eval_every=5"))
    assert r.summary.iterations < 200
    assert r.summary.final_accuracy >= 0.8
    assert r.summary.extra["final_eval"]["stop_reason"].startswith("stop requested")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["cnn_fp16", "cnn_mpq", "cnn_hfa"])
def test_geomx_example_programs_train_in_the_emulator(tmp_path, name):
    r = run_scenario(example(tmp_path, name, "run.iterations=40"))
    assert r.summary.iterations == 40
    assert r.summary.final_accuracy > 0.5


@pytest.mark.slow
def test_bsc_set_by_the_master_equals_the_scenario_codec(tmp_path):
    """kv.set_gradient_compression reaches the local servers (GeoMX's GS forwards it):
    the same WAN bytes and accuracy as [codec] type = "bsc"."""
    geomx_way = run_scenario(example(tmp_path, "cnn_bsc", "run.iterations=30"))
    scenario_way = run_scenario(example(
        tmp_path, "cnn_bsc", "run.iterations=30", "codec.type=bsc", "codec.threshold=0.01",
        "codec.size_lower_bound=1000", 'training.program_args=["--scenario-codec"]'))
    dense = run_scenario(example(tmp_path, "cnn", "run.iterations=30"))
    a, b = geomx_way.summary, scenario_way.summary
    assert a.final_accuracy == b.final_accuracy
    assert a.bytes_wan < dense.summary.bytes_wan / 5

    from geomx.cluster import plan_job

    dc = plan_job(example(tmp_path, "cnn_bsc")).job.dc_of.get

    def wan_data_bytes(run_dir):
        total = commands = 0
        for e in iter_events(run_dir / "events.jsonl"):
            if e["ev"] == "xfer" and dc(e["src"]) != dc(e["dst"]):
                if e["msg"].startswith("COMMAND"):
                    commands += e["bytes"]
                else:
                    total += e["bytes"]
        return total, commands

    (data_a, cmd_a), (data_b, cmd_b) = wan_data_bytes(geomx_way.run_dir), wan_data_bytes(scenario_way.run_dir)
    assert data_a == data_b  # every value on the WAN: byte for byte the same
    assert a.bytes_wan == data_a + cmd_a and cmd_b == 0  # + the command and its forwarding


@pytest.mark.slow
def test_fp16_set_by_the_master_reaches_every_tier(tmp_path):
    """FP16 set with kv.set_gradient_compression is applied on both tiers (workers learn it
    from their local server's first reply): the bytes of every value equal [codec] fp16's."""
    geomx_way = run_scenario(example(tmp_path, "cnn_bsc", "run.iterations=10",
                                     'training.program_args=["--type", "fp16"]'))
    scenario_way = run_scenario(example(tmp_path, "cnn_bsc", "run.iterations=10", "codec.type=fp16",
                                        'training.program_args=["--scenario-codec"]'))

    def value_bytes(run_dir):
        out = {}
        for e in iter_events(run_dir / "events.jsonl"):
            if e["ev"] == "xfer" and e["msg"] in ("PUSH", "PULL_REPLY", "INIT"):
                out[e["msg"]] = out.get(e["msg"], 0) + e["bytes"]
        return out

    a, b = value_bytes(geomx_way.run_dir), value_bytes(scenario_way.run_dir)
    # the first pull reply to each worker also carries the codec's name (a few dozen bytes)
    assert a["PUSH"] == b["PUSH"] and a["INIT"] == b["INIT"]
    assert 0 <= a["PULL_REPLY"] - b["PULL_REPLY"] <= 4 * 10 * 60
    assert geomx_way.summary.final_accuracy == scenario_way.summary.final_accuracy
    dense = run_scenario(example(tmp_path, "cnn_bsc", "run.iterations=10",
                                 'training.program_args=["--scenario-codec"]'))
    assert a["PUSH"] < 0.6 * value_bytes(dense.run_dir)["PUSH"]


def _program(tmp_path, body: str) -> Path:
    path = tmp_path / "prog.py"
    path.write_text(textwrap.dedent(body))
    return path


def _run_program(tmp_path, path, *overrides, runtime="emu"):
    s = example(tmp_path, "cnn", f"training.program={path}", "run.iterations=3", *overrides)
    return run_scenario(s, runtime=runtime)


def test_program_errors_name_the_program_and_the_node(tmp_path):
    with pytest.raises(JobFailed, match=r"mw.*no such file"):
        _run_program(tmp_path, tmp_path / "missing.py")
    p = _program(tmp_path, "async def train(kv, ctx):\n    pass\n")
    with pytest.raises(JobFailed, match=r"has no function 'main'"):
        _run_program(tmp_path, p)
    p = _program(tmp_path, """
        async def main(kv, ctx):
            if not kv.is_master_worker:
                raise ValueError("boom")
    """)
    with pytest.raises(JobFailed, match=r"prog.py' raised on node w:party-a:0: ValueError: boom"):
        _run_program(tmp_path, p)
    with pytest.raises(JobFailed, match=r"cnn.py' exited on node mw with status 2 .*--bogus"):
        _run_program(tmp_path, EXAMPLES / "cnn.py", 'training.program_args=["--bogus"]')


GEOMX_API = """
import numpy as np
import geomx.kv

async def main(kv, ctx):
    w = np.zeros(4, np.float32)
    if kv.is_master_worker:
        kv.set_optimizer({"name": "SGD", "learning_rate": 1.0, "rescale_grad": 1.0})  # not awaited
        kv.init(0, w)                                  # not awaited either
        kv.init("bias", np.zeros(2, np.float32))
        await kv.waitall()
        return
    kv.init(0, w)
    kv.init("bias", np.zeros(2, np.float32))
    g = np.ones(4, np.float32)
    kv.push(0, g)                                      # init then push, no pull
    g[...] = 100.0                                     # after the push: not sent
    out = await kv.pull(0, out=np.empty(4, np.float32))
    # GeoMX's scale: SGD lr 1 on the sum of 4 workers' pushes of 1 -> -4
    assert np.allclose(out, -4.0), out
    kv.push("bias", [np.ones(2, np.float32), np.ones(2, np.float32)])  # per-device: summed
    b = await kv.pull("bias")
    assert np.allclose(b, -8.0), b
    await kv._barrier()
    r = await kv.pushpull(0, np.ones(4, np.float32), out=np.empty(4, np.float32))
    assert np.allclose(r, -8.0), r
    ctx.report(1, loss=0.0, accuracy=1.0)
"""


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["emu", "real"])
def test_geomx_api_as_geomx_users_write_it(tmp_path, runtime):
    r = _run_program(tmp_path, _program(tmp_path, GEOMX_API), runtime=runtime)
    assert r.summary.final_accuracy == 1.0


@pytest.mark.slow
def test_dist_async_selects_mixed_sync_when_the_scenario_leaves_it_open(tmp_path):
    r = run_scenario(example(tmp_path, "cnn", "run.iterations=10", 'training.program_args=["-ms"]'))
    switched = sorted(e["node"] for e in iter_events(r.run_dir / "events.jsonl")
                      if e["ev"] == "command" and e.get("cmd") == "set_sync")
    assert switched == ["gs:0", "ls:party-a", "ls:party-b"]
    assert r.summary.final_accuracy > 0.5


def test_dist_async_conflicting_with_the_scenario_is_an_error(tmp_path):
    p = _program(tmp_path, """
        import geomx.kv
        async def main(kv, ctx):
            geomx.kv.create("dist_async")
    """)
    with pytest.raises(JobFailed, match=r"dist_async.*algorithm = 'fsa'.*mixed"):
        _run_program(tmp_path, p, "sync.algorithm=fsa")


@pytest.mark.slow
def test_example_program_over_real_sockets_matches_the_emulator(tmp_path):
    emu = run_scenario(example(tmp_path, "cnn", "run.iterations=10", "run.eval_every=5"))
    real = run_scenario(example(tmp_path, "cnn", "run.iterations=10", "run.eval_every=5"),
                        runtime="real")
    # (the real runtime draws no link_utilisation.png, for the built-in trainer neither:
    # it has no per-link capacities to draw against)
    assert set(files_of(real.run_dir)) >= set(files_of(emu.run_dir)) - {"link_utilisation.png"}
    assert real.summary.iterations == 10
    assert real.summary.final_accuracy == pytest.approx(emu.summary.final_accuracy, abs=0.02)
    rows = (real.run_dir / "progress.csv").read_text().strip().splitlines()
    assert len(rows) == 3


def test_cli_program_and_args(tmp_path, capsys):
    from geomx.cli import main

    p = _program(tmp_path, """
        async def main(kv, ctx):
            if not kv.is_master_worker:
                ctx.report(1, accuracy=float(ctx.args[1]))
    """)
    rc = main(["run", str(EXAMPLES / "cnn.toml"), "--quiet", "--out", str(tmp_path / "runs"),
               "--set", "run.iterations=2", "--program", str(p), "--", "--acc", "0.25"])
    assert rc == 0
    assert "final accuracy 0.2500" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("name,iterations", [("cnn_bsc", 10), ("cnn_fp16", 10), ("cnn_mpq", 10),
                                             ("cnn_hfa", 20)])
def test_geomx_example_programs_over_real_sockets(tmp_path, name, iterations):
    overrides = (f"run.iterations={iterations}", "run.eval_every=10")
    emu = run_scenario(example(tmp_path, name, *overrides))
    real = run_scenario(example(tmp_path, name, *overrides), runtime="real")
    assert real.summary.iterations == iterations
    assert real.summary.final_accuracy == pytest.approx(emu.summary.final_accuracy, abs=0.02)


@pytest.mark.parametrize("runtime", ["emu", "real"])
def test_pytorch_example(tmp_path, runtime):
    # torch is in the test extra: this runs wherever the suite does
    r = run_scenario(example(tmp_path, "cnn_torch", "run.iterations=20", "run.eval_every=10"),
                     runtime=runtime)
    assert r.summary.iterations == 20
    assert r.summary.final_accuracy > 0.5


def test_geomx_environment_switches_map_to_scenario_fields_or_are_refused(tmp_path, monkeypatch,
                                                                          capsys):
    from geomx.runtime.config import ConfigError, NodeArgs, resolve_node_config

    scenario = str(EXAMPLES / "cnn.toml")
    env = {"MXNET_KVSTORE_USE_HFA": "1", "MXNET_KVSTORE_HFA_K1": "4",
           "MXNET_KVSTORE_HFA_K2": "3", "MXNET_KVSTORE_BIGARRAY_BOUND": "5000",
           "MXNET_KVSTORE_SIZE_LOWER_BOUND": "1000"}
    cfg = resolve_node_config(NodeArgs(scenario=scenario, name="w:party-a:0"), env)
    s = cfg.scenario
    assert (s.sync.algorithm, s.sync.k1, s.sync.k2) == ("hfa", 4, 3)
    assert s.sched.bigarray_bound == 5000 and s.codec.size_lower_bound == 1000
    for var, value, field in (("PS_RESEND", "1", "membership.request_timeout"),
                              ("PS_DROP_MSG", "10", "loss"),
                              ("MXNET_KVSTORE_USE_HFA", "yes please", "allowed: 0 or 1"),
                              ("MXNET_KVSTORE_HFA_K1", "0", r"allowed: an integer in \[1")):
        with pytest.raises(ConfigError, match=field):
            resolve_node_config(NodeArgs(scenario=scenario, name="w:party-a:0"), {var: value})
    # geomx run reads the same table, so the emulator runs what `geomx node` would
    from geomx.cli import main

    p = _program(tmp_path, """
        async def main(kv, ctx):
            if not kv.is_master_worker:
                ctx.report(1, accuracy=1.0 if ctx.sync["algorithm"] == "hfa" else 0.0)
    """)
    monkeypatch.setenv("MXNET_KVSTORE_USE_HFA", "1")
    assert main(["run", scenario, "--quiet", "--out", str(tmp_path / "runs"), "--set",
                 "run.iterations=1", "--program", str(p)]) == 0
    assert "final accuracy 1.0000" in capsys.readouterr().out


def test_a_module_program_is_found_in_the_working_directory_as_python_m_finds_it(
        tmp_path, monkeypatch):
    """`program = "mine:main"` resolves from the working directory in the emulator too (the
    `geomx` command does not put it on sys.path; `python -m geomx node` does)."""
    from geomx.node.program import ProgramError, load_program

    (tmp_path / "mine_cwd_prog.py").write_text("async def main(kv, ctx):\n    return 7\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    fn = load_program("mine_cwd_prog:main")
    assert fn.__name__ == "main" and str(tmp_path) in sys.path
    with pytest.raises(ProgramError, match="no_such_prog"):
        load_program("no_such_prog:main")


@pytest.mark.slow
@pytest.mark.parametrize("start", ["fork", "exec"])
def test_a_program_slow_to_import_does_not_cost_its_node_its_heartbeats(tmp_path, monkeypatch,
                                                                         request, start):
    """A node imports its program before it registers, so an import that holds the
    interpreter for longer than the heartbeat timeout (``import torch`` on a loaded host,
    2-3 s of CPU per worker) does not get the node declared dead mid-import. Forked
    nodes share the launcher's one import (geomx/runtime/forked.py, ``preload``); nodes
    started by exec (a GPU host, ``GEOMX_NODE_START=exec``) import it each."""
    monkeypatch.setenv("GEOMX_NODE_START", start)
    if start == "fork" and delegate_unless_fork_usable(request):
        return
    p = _program(tmp_path, f"""
        import os, time
        with open({str(tmp_path / 'imports')!r}, "a") as f:
            f.write(f"{{os.getpid()}}\\n")
        time.sleep(5.0)   # an import that keeps the event loop's thread busy

        async def main(kv, ctx):
            return {{"imported": True}}
    """)
    r = _run_program(tmp_path, p, "membership.heartbeat_interval=0.5s",
                     "membership.heartbeat_timeout=3s", runtime="real")
    assert json.loads((r.run_dir / "launch.json").read_text())["start"] == start
    results = [json.loads(f.read_text()) for f in (r.run_dir / "nodes").glob("*.result.json")]
    ran = [x["name"] for x in results if x.get("result", {}).get("imported")]
    assert sorted(ran) == ["mw", "w:party-a:0", "w:party-a:1", "w:party-b:0", "w:party-b:1"]
    imports = (tmp_path / "imports").read_text().split()
    assert len(imports) == (1 if start == "fork" else 5)  # the launcher's, or each node's


def test_a_program_edited_between_runs_is_imported_again(tmp_path):
    """The nodes of one job share one import of the program file, but a notebook that
    edits the file and runs the job again gets the new code, not the first import."""
    from geomx.node.program import load_program

    path = _program(tmp_path, "async def main(kv, ctx):\n    return {'v': 1}\n")
    first = load_program(str(path))
    assert load_program(str(path)) is first
    path.write_text("async def main(kv, ctx):\n    return {'v': 22}\n")  # another size
    again = load_program(str(path))
    assert again is not first and again.__code__.co_consts != first.__code__.co_consts


def test_a_program_parsing_argv_at_import_fails_its_nodes_not_the_launcher(tmp_path):
    """The launcher imports the program before forking; argparse at module level reads the
    launcher's argv there and exits, which must leave it to the nodes to report."""
    p = _program(tmp_path, """
        import argparse
        ARGS = argparse.ArgumentParser().parse_args()

        async def main(kv, ctx):
            pass
    """)
    with pytest.raises(JobFailed, match=r"(?s)exited with code 2.*unrecognized arguments"):
        _run_program(tmp_path, p, runtime="real")
