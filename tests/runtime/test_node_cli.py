"""``geomx node``: one node per process from CLI flags, environment and the scenario.

Precedence (docs/real-runtime.md): CLI > environment (GEOMX_*, then GeoMX's DMLC_*) >
scenario file > default, for every setting; GeoMX's role variables map onto geomx node
names. The last test starts a whole job by hand -- one ``geomx node`` per node, no
launcher -- with the schedulers' addresses given in all the supported ways.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from geomx.cli import main
from geomx.runtime.config import (ConfigError, NodeArgs, NothingToRun, interface_ipv4,
                                  resolve_node_config)

from tests.helpers.paths import ROOT
from tests.helpers.ports import free_port_block

QUICKSTART = str(ROOT / "scenarios" / "quickstart.toml")


def resolve(env=None, **cli):
    cli.setdefault("scenario", QUICKSTART)
    return resolve_node_config(NodeArgs(**cli), env or {}, now=1000.0)


def write(tmp_path, text: str, name: str = "s.toml") -> str:
    p = tmp_path / name
    p.write_text(Path(QUICKSTART).read_text() + "\n" + text)
    return str(p)


# ---------------------------------------------------------------- precedence

def test_defaults_give_geomx_demo_ports_and_now():
    c = resolve(name="w:party-a:1")
    assert (c.role, c.dc) == ("worker", "party-a")
    assert c.book == {"gh": "127.0.0.1:9092", "lh:party-a": "127.0.0.1:9094",
                      "lh:party-b": "127.0.0.1:9095"}
    assert (c.host, c.bind_host, c.port) == ("127.0.0.1", "127.0.0.1", 0)
    assert c.start_epoch == 1000.0 and c.sources["start_epoch"] == "default (now)"
    assert c.secret is None and c.tls is None and c.shape is True
    assert c.run_dir == Path("runs/quickstart")


def test_cli_beats_env_beats_file_beats_default(tmp_path):
    path = write(tmp_path, '[real]\nglobal_scheduler = "10.0.0.1:7000"\nshape = false\n')
    env = {"GEOMX_SCHEDULER_gh": "10.0.0.2:7001", "DMLC_PS_GLOBAL_ROOT_URI": "10.0.0.3",
           "DMLC_PS_GLOBAL_ROOT_PORT": "7002", "GEOMX_SHAPE": "1", "GEOMX_HOST": "10.9.9.9",
           "DMLC_NODE_HOST": "10.8.8.8", "GEOMX_PORT": "6001", "PORT": "6002",
           "GEOMX_RUN_DIR": "/tmp/env-run", "GEOMX_START_EPOCH": "5.5"}
    # file only
    c = resolve(scenario=path, name="ls:party-a")
    assert c.book["gh"] == "10.0.0.1:7000" and c.sources["scheduler gh"].startswith("file")
    assert c.shape is False and c.sources["shape"] == "file [real].shape"
    # DMLC beats the file, GEOMX beats DMLC
    c = resolve({k: env[k] for k in ("DMLC_PS_GLOBAL_ROOT_URI", "DMLC_PS_GLOBAL_ROOT_PORT")},
                scenario=path, name="ls:party-a")
    assert c.book["gh"] == "10.0.0.3:7002"
    c = resolve(env, scenario=path, name="ls:party-a")
    assert c.book["gh"] == "10.0.0.2:7001" and c.sources["scheduler gh"] == "env GEOMX_SCHEDULER_gh"
    assert (c.host, c.port, c.shape) == ("10.9.9.9", 6001, True)
    assert (str(c.run_dir), c.start_epoch) == ("/tmp/env-run", 5.5)
    # the CLI beats everything
    c = resolve(env, scenario=path, name="ls:party-a", global_scheduler="10.0.0.4:7003",
                host="10.7.7.7", port=6003, run_dir="/tmp/cli-run", start_epoch=9.0, shape=False)
    assert c.book["gh"] == "10.0.0.4:7003" and c.sources["scheduler gh"] == "cli --global-scheduler"
    assert (c.host, c.port, c.shape, str(c.run_dir), c.start_epoch) == \
        ("10.7.7.7", 6003, False, "/tmp/cli-run", 9.0)
    # ps-lite's own names come after ours
    c = resolve({"DMLC_NODE_HOST": "10.8.8.8", "PORT": "6002"}, name="ls:party-a")
    assert (c.host, c.port) == ("10.8.8.8", 6002)


def test_per_dc_scheduler_addresses_from_file_env_and_cli(tmp_path):
    path = write(tmp_path, "[real]\nport_base = 20000\n")
    text = Path(path).read_text().replace('name = "party-b"\n',
                                          'name = "party-b"\nscheduler_port = 21000\n'
                                          'host = "10.1.1.2"\n')
    Path(path).write_text(text)
    c = resolve(scenario=path, name="w:party-b:0")
    assert c.book == {"gh": "127.0.0.1:20000", "lh:party-a": "127.0.0.1:20002",
                      "lh:party-b": "10.1.1.2:21000"}
    assert c.host == "10.1.1.2"  # the DC's host is what its nodes advertise by default
    c = resolve({"GEOMX_SCHEDULER_LH_PARTY_B": "10.5.5.5:1"}, scenario=path, name="w:party-b:0")
    assert c.book["lh:party-b"] == "10.5.5.5:1"
    c = resolve({"DMLC_PS_ROOT_URI": "10.6.6.6", "DMLC_PS_ROOT_PORT": "2"}, scenario=path,
                name="w:party-b:0")
    assert c.book["lh:party-b"] == "10.6.6.6:2" and c.book["lh:party-a"] == "127.0.0.1:20002"
    c = resolve({"GEOMX_SCHEDULER_lh_party_b": "10.5.5.5:1"}, scenario=path, name="w:party-b:0",
                schedulers=["lh:party-b=10.4.4.4:3"])
    assert c.book["lh:party-b"] == "10.4.4.4:3"
    # a scheduler listens on its rendezvous port
    c = resolve(scenario=path, name="lh:party-b")
    assert (c.host, c.port) == ("10.1.1.2", 21000)


def test_bad_settings_name_the_flag_or_variable():
    cases = [
        ({"GEOMX_SCHEDULER_lh_party_z": "1.2.3.4:5"}, {}, "GEOMX_SCHEDULER_lh_party_a"),
        ({"GEOMX_SCHEDULER_gh": "nohost"}, {}, "env GEOMX_SCHEDULER_gh"),
        ({"GEOMX_PORT": "70000"}, {}, "GEOMX_PORT"),
        ({"GEOMX_SHAPE": "maybe"}, {}, "GEOMX_SHAPE"),
        ({}, {"schedulers": ["lh:party-a"]}, "NAME=HOST:PORT"),
        ({}, {"schedulers": ["lh:nowhere=1.2.3.4:5"]}, "allowed: gh, lh:party-a, lh:party-b"),
        ({"DMLC_ROLE": "boss"}, {"name": None}, "allowed: scheduler, server, worker"),
        ({}, {"name": "w:party-a:7"}, "allowed: gh, gs:0"),
        ({"GEOMX_TLS": "1"}, {}, "tls_cert and tls_key"),
        ({"GEOMX_TLS": "1", "GEOMX_TLS_CERT": "/nope.pem"}, {}, "GEOMX_TLS_CERT"),
        ({"GEOMX_SECRET_FILE": "/nope"}, {}, "GEOMX_SECRET_FILE"),
    ]
    for env, cli, words in cases:
        cli = {"name": "w:party-a:0", **cli}
        with pytest.raises(ConfigError, match=words.replace("(", r"\(")):
            resolve(env, **cli)


# ---------------------------------------------------------------- GeoMX's environment

DEMO = {  # docs/geomx-behaviour.md §1.3, the demo scripts' environment
    "gh": {"DMLC_ROLE_GLOBAL": "global_scheduler", "DMLC_PS_GLOBAL_ROOT_URI": "127.0.0.1",
           "DMLC_PS_GLOBAL_ROOT_PORT": "9092", "DMLC_NUM_GLOBAL_SERVER": "1",
           "DMLC_NUM_GLOBAL_WORKER": "2"},
    "gs:0": {"DMLC_ROLE_GLOBAL": "global_server", "DMLC_ROLE": "server",
             "DMLC_PS_GLOBAL_ROOT_URI": "127.0.0.1", "DMLC_PS_GLOBAL_ROOT_PORT": "9092",
             "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "9093",
             "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "1", "DMLC_NUM_GLOBAL_SERVER": "1",
             "DMLC_NUM_GLOBAL_WORKER": "2", "DMLC_ENABLE_CENTRAL_WORKER": "0",
             "DMLC_NUM_ALL_WORKER": "4"},
    "mw": {"DMLC_ROLE": "worker", "DMLC_ROLE_MASTER_WORKER": "1", "DMLC_PS_ROOT_URI": "127.0.0.1",
           "DMLC_PS_ROOT_PORT": "9093", "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "1",
           "DMLC_NUM_ALL_WORKER": "4"},
    "lh:party-a": {"DMLC_ROLE": "scheduler", "DMLC_PS_ROOT_URI": "127.0.0.1",
                   "DMLC_PS_ROOT_PORT": "9094", "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "2"},
    "ls:party-b": {"DMLC_PS_GLOBAL_ROOT_URI": "127.0.0.1", "DMLC_PS_GLOBAL_ROOT_PORT": "9092",
                   "DMLC_NUM_GLOBAL_SERVER": "1", "DMLC_NUM_GLOBAL_WORKER": "2",
                   "DMLC_ROLE": "server", "DMLC_PS_ROOT_URI": "127.0.0.1",
                   "DMLC_PS_ROOT_PORT": "9095", "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "2"},
    "w:party-a:1": {"DMLC_ROLE": "worker", "DMLC_PS_ROOT_URI": "127.0.0.1",
                    "DMLC_PS_ROOT_PORT": "9094", "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "2",
                    "DMLC_NUM_ALL_WORKER": "4", "GEOMX_RANK": "1"},
}


def test_geomx_demo_environment_maps_onto_node_names():
    for name, env in DEMO.items():
        c = resolve_node_config(NodeArgs(), env, now=0.0)  # the built-in default scenario
        assert c.name == name, (name, c.sources)
        assert c.book["gh"] == "127.0.0.1:9092" and c.book["lh:party-a"] == "127.0.0.1:9094"
    # the central DC's local scheduler has no geomx counterpart: nothing to run
    with pytest.raises(NothingToRun, match="central"):
        resolve_node_config(NodeArgs(), {"DMLC_ROLE": "scheduler", "DMLC_PS_ROOT_URI": "127.0.0.1",
                                         "DMLC_PS_ROOT_PORT": "9093", "DMLC_NUM_SERVER": "1",
                                         "DMLC_NUM_WORKER": "1"})


def test_geomx_counts_override_the_scenario_and_are_checked():
    env = {**DEMO["w:party-a:1"], "DMLC_NUM_WORKER": "3", "DMLC_NUM_ALL_WORKER": "5",
           "GEOMX_RANK": "2"}
    c = resolve_node_config(NodeArgs(), env)
    assert c.name == "w:party-a:2" and c.scenario.dc("party-a").workers == 3
    with pytest.raises(ConfigError, match="DMLC_NUM_ALL_WORKER=4 but the scenario has 5"):
        resolve_node_config(NodeArgs(), {**env, "DMLC_NUM_ALL_WORKER": "4"})
    with pytest.raises(ConfigError, match="exactly one local server"):
        resolve_node_config(NodeArgs(), {**DEMO["ls:party-b"], "DMLC_NUM_SERVER": "2"})
    with pytest.raises(ConfigError, match="DMLC_NUM_GLOBAL_WORKER=3"):
        resolve_node_config(NodeArgs(), {**DEMO["gh"], "DMLC_NUM_GLOBAL_WORKER": "3"})
    # no rank (a pure GeoMX script): the node claims the first free one when it starts
    c = resolve_node_config(NodeArgs(), {k: v for k, v in DEMO["w:party-a:1"].items()
                                         if k != "GEOMX_RANK"})
    assert c.claim_rank and c.name == "w:party-a:0" and "claimed" in c.sources["rank"]
    with pytest.raises(ConfigError, match="not supported"):
        resolve_node_config(NodeArgs(), {**DEMO["gs:0"], "DMLC_ENABLE_CENTRAL_WORKER": "1"})
    c = resolve_node_config(NodeArgs(), {**DEMO["gs:0"], "DMLC_NUM_SERVER": "2",
                                         "DMLC_NUM_GLOBAL_SERVER": "2", "GEOMX_RANK": "1"})
    assert c.name == "gs:1" and c.scenario.central_dc.global_servers == 2
    c = resolve_node_config(NodeArgs(), {**DEMO["mw"], "PS_HEARTBEAT_INTERVAL": "2",
                                         "PS_HEARTBEAT_TIMEOUT": "30"})
    assert (c.scenario.membership.heartbeat_interval_s,
            c.scenario.membership.heartbeat_timeout_s) == (2.0, 30.0)


def test_interface_and_kubernetes_addresses():
    c = resolve({"DMLC_INTERFACE": "lo"}, name="w:party-a:0")
    assert c.host == "127.0.0.1" and interface_ipv4("lo") == "127.0.0.1"
    assert "DMLC_INTERFACE" in c.sources["host"]
    with pytest.raises(ConfigError, match="no such network interface.*allowed:.*lo"):
        resolve({"DMLC_INTERFACE": "nope0"}, name="w:party-a:0")
    c = resolve({"DMLC_USE_KUBERNETES": "1"}, name="lh:party-a")
    assert c.bind_host == "0.0.0.0" and c.host == "127.0.0.1"


# ---------------------------------------------------------------- security settings

def test_secret_comes_from_the_environment_never_the_file(tmp_path):
    c = resolve({"GEOMX_SECRET": "s3"}, name="gh")
    assert c.secret == b"s3" and c.sources["secret"] == "env GEOMX_SECRET"
    path = write(tmp_path, '[security]\nsecret_env = "JOB_KEY"\nrequire_secret = true\n')
    assert resolve({"JOB_KEY": "k", "GEOMX_SECRET": "x"}, scenario=path, name="gh").secret == b"k"
    with pytest.raises(ConfigError, match="JOB_KEY"):
        resolve({"GEOMX_SECRET": "x"}, scenario=path, name="gh")
    secret_file = tmp_path / "secret"
    secret_file.write_text("from-file\n")
    c = resolve({"JOB_KEY": "k"}, scenario=path, name="gh", secret_file=str(secret_file))
    assert c.secret == b"from-file"
    bad = write(tmp_path, '[security]\nsecret = "hunter2"\n', "bad.toml")
    with pytest.raises(ConfigError, match="never goes in the scenario file"):
        resolve(scenario=bad, name="gh")


def test_tls_settings_resolve_in_order(tmp_path):
    from geomx.runtime.security import generate_self_signed, tls_tooling

    if tls_tooling() is None:
        pytest.skip("neither 'cryptography' nor 'openssl' is available to make a certificate")
    cert, key = generate_self_signed(tmp_path / "tls")
    path = write(tmp_path, f'[security]\ntls = true\ntls_cert = "{cert}"\ntls_key = "{key}"\n'
                           f'tls_ca = "{cert}"\n')
    c = resolve(scenario=path, name="gh")
    assert c.tls is not None and c.tls.cert == str(cert) and c.tls.ca == str(cert)
    assert resolve({"GEOMX_TLS": "0"}, scenario=path, name="gh").tls is None
    assert resolve({"GEOMX_TLS": "0"}, scenario=path, name="gh", tls=True).tls is not None


def test_print_config_shows_values_and_sources(capsys, monkeypatch):
    monkeypatch.setenv("GEOMX_SCHEDULER_gh", "10.0.0.9:9000")
    monkeypatch.setenv("GEOMX_SECRET", "do-not-print-me")
    assert main(["node", QUICKSTART, "--role", "worker", "--dc", "party-b", "--rank", "1",
                 "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "w:party-b:1" in out and "10.0.0.9:9000" in out and "env GEOMX_SCHEDULER_gh" in out
    assert "do-not-print-me" not in out and "secret" in out
    assert main(["node", QUICKSTART, "--name", "w:party-q:0"]) == 2
    assert "allowed:" in capsys.readouterr().err


# ---------------------------------------------------------------- a job started by hand

@pytest.mark.slow
def test_a_job_started_node_by_node_without_a_launcher(tmp_path):
    """Eleven ``geomx node`` processes meet through the schedulers' addresses alone."""
    base = free_port_block(4)
    scenario = tmp_path / "job.toml"
    scenario.write_text(Path(QUICKSTART).read_text() + f"\n[real]\nport_base = {base}\n")
    run_dir = tmp_path / "run"
    common = {**os.environ, "PYTHONUNBUFFERED": "1", "GEOMX_START_EPOCH": repr(time.time()),
              "GEOMX_RUN_DIR": str(run_dir), "GEOMX_SECRET": "by-hand"}
    sets = ["--set", "run.iterations=15", "--set", "run.target_accuracy=0",
            "--set", "metrics.plot=false"]
    node = [sys.executable, "-m", "geomx", "node"]
    gh, lh_a, lh_b = (f"127.0.0.1:{base}", f"127.0.0.1:{base + 2}", f"127.0.0.1:{base + 3}")
    launches = {
        # the schedulers: CLI names, the file's port_base
        "gh": (node + [str(scenario), "--name", "gh"] + sets, {}),
        "lh:party-a": (node + [str(scenario), "--name", "lh:party-a"] + sets, {}),
        "lh:party-b": (node + sets, {"GEOMX_SCENARIO": str(scenario), "GEOMX_NODE": "lh:party-b"}),
        # GeoMX's variables (their addresses override the file's)
        "gs:0": (node + [str(scenario)] + sets,
                 {"DMLC_ROLE_GLOBAL": "global_server", "DMLC_ROLE": "server",
                  "DMLC_PS_GLOBAL_ROOT_URI": "127.0.0.1", "DMLC_PS_GLOBAL_ROOT_PORT": str(base),
                  "DMLC_NUM_GLOBAL_SERVER": "1", "DMLC_NUM_ALL_WORKER": "4"}),
        "ls:party-a": (node + [str(scenario)] + sets,
                       {"DMLC_ROLE": "server", "DMLC_PS_ROOT_URI": "127.0.0.1",
                        "DMLC_PS_ROOT_PORT": str(base + 2), "DMLC_PS_GLOBAL_ROOT_URI": "127.0.0.1",
                        "DMLC_PS_GLOBAL_ROOT_PORT": str(base), "DMLC_NUM_SERVER": "1",
                        "DMLC_NUM_WORKER": "2"}),
        "w:party-a:0": (node + [str(scenario)] + sets,
                        {"DMLC_ROLE": "worker", "DMLC_PS_ROOT_URI": "127.0.0.1",
                         "DMLC_PS_ROOT_PORT": str(base + 2), "GEOMX_RANK": "0",
                         "DMLC_INTERFACE": "lo"}),
        # our own variables and flags
        "mw": (node + [str(scenario), "--role", "mw"] + sets, {"GEOMX_SCHEDULER_gh": gh}),
        "ls:party-b": (node + [str(scenario), "--role", "ls", "--dc", "party-b"] + sets,
                       {"GEOMX_SCHEDULER_gh": gh, "GEOMX_SCHEDULER_lh_party_b": lh_b}),
        "w:party-a:1": (node + [str(scenario), "--role", "worker", "--dc", "party-a", "--rank",
                                "1", "--scheduler", f"lh:party-a={lh_a}"] + sets, {}),
        # no rank at all, as GeoMX's scripts start workers: each claims the first free rank
        "w:party-b:?a": (node + [str(scenario), "--role", "worker", "--dc", "party-b",
                                 "--host", "127.0.0.1", "--port", "0"] + sets, {}),
        "w:party-b:?b": (node + [str(scenario)] + sets,
                         {"GEOMX_HOST": "127.0.0.1", "DMLC_ROLE": "worker",
                          "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(base + 3)}),
    }
    procs = {}
    try:
        for name, (cmd, env) in launches.items():
            log = open(tmp_path / f"{name.replace(':', '_').replace('?', 'q')}.log", "w")
            procs[name] = subprocess.Popen(cmd, env={**common, **env}, stdout=log,
                                           stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 120

        def log_of(name: str) -> str:
            return (tmp_path / f"{name.replace(':', '_').replace('?', 'q')}.log").read_text()[-2000:]

        # wait for all together; report the first failure, or who is still running, with
        # their logs (a node that died early explains why the others wait)
        while time.time() < deadline and any(p.poll() is None for p in procs.values()):
            bad = {n: p.returncode for n, p in procs.items() if p.returncode not in (None, 0)}
            assert not bad, (bad, {n: log_of(n) for n in bad})
            time.sleep(0.2)
        running = [n for n, p in procs.items() if p.poll() is None]
        assert not running, ("still running after 120 s", {n: log_of(n) for n in running})
        bad = {n: p.returncode for n, p in procs.items() if p.returncode != 0}
        assert not bad, (bad, {n: log_of(n) for n in bad})
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    results = {f.name: json.loads(f.read_text()) for f in (run_dir / "nodes").glob("*.result.json")}
    assert len(results) == 11  # the two rank-less workers claimed w:party-b:0 and :1
    assert {"w_party-b_0.result.json", "w_party-b_1.result.json"} <= set(results)
    evaluator = results["w_party-a_0.result.json"]
    assert evaluator["iterations"] == 15 and evaluator["result"]["accuracy"] > 0.3
    # the nodes left the scenario they resolved (their --set included), so `geomx
    # collect` needs nothing else to merge their files into the run folder `geomx
    # launch` leaves
    from geomx.cli import main as cli_main
    from geomx.scenario import load_scenario

    assert load_scenario(run_dir / "scenario.toml").run.iterations == 15
    assert not list(run_dir.glob(".scenario.*"))
    assert cli_main(["collect", str(run_dir)]) == 0
    for name in ("scenario.toml", "events.jsonl", "progress.csv", "summary.json", "trace.json"):
        assert (run_dir / name).exists(), name
    assert not (run_dir / "accuracy.png").exists()  # the job's metrics.plot = false holds
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["iterations"] == 15
    assert summary["final_accuracy"] == pytest.approx(evaluator["result"]["accuracy"], rel=1e-6)
    assert summary["bytes_wan"] > 0
