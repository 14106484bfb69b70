"""``geomx launch``: a whole job here (with a secret and TLS), or over ssh from a hostfile.

No remote hosts: the hostfile test puts a fake ``ssh`` first on PATH that logs its
arguments and runs the remote command locally, which is enough to check how commands
are built and that the job runs from them.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from geomx.runtime.config import ConfigError
from geomx.runtime.hostfile import (assign_hosts, forwarded_env, hostfile_book, parse_hostfile,
                                    remote_node_command)
from geomx.scenario import load_scenario

from tests.helpers.paths import ROOT
from tests.helpers.ports import free_port_block
from tests.helpers.procs import command_lines

QUICKSTART = str(ROOT / "scenarios" / "quickstart.toml")
FAST = ["--set", "run.iterations=20", "--set", "run.target_accuracy=0",
        "--set", "metrics.plot=false", "--set", "metrics.trace=false"]


def _launch(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "geomx", "launch", *args],
                            env={**os.environ, **env}, stdout=log.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def _kill(p: subprocess.Popen) -> None:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def _nodes_of(run_marker: str) -> list[int]:
    """pids of live ``geomx node`` processes whose command line mentions ``run_marker``."""
    return [pid for pid, cmd in command_lines()
            if b"node" in cmd and any(run_marker.encode() in c for c in cmd)]


def _wait_for(path_glob, root: Path, timeout_s: float = 60.0) -> Path:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        found = sorted(root.glob(path_glob))
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"{path_glob} did not appear under {root}")


# ---------------------------------------------------------------- hostfile pieces

def test_hostfile_parsing_and_placement():
    text = """
    # DC      host
    central   10.0.0.1                  python=/opt/py/bin/python
    party-a   alice@10.0.1.7            address=192.168.1.7 cwd='/srv/geo mx'
    party-a   10.0.1.8                  bind=0.0.0.0
    party-b   node-b.example.org
    """
    entries = parse_hostfile(text)
    assert [e.dc for e in entries] == ["central", "party-a", "party-a", "party-b"]
    assert entries[1].address == "192.168.1.7" and entries[1].target == "alice@10.0.1.7"
    assert entries[3].address == "node-b.example.org" and entries[1].cwd == "/srv/geo mx"
    s = load_scenario(QUICKSTART)
    from geomx.cluster import plan_job

    plan = plan_job(s, "real")
    order = sorted(plan.nodes, key=lambda n: 0 if n.startswith("lh") else 1)
    hosts = assign_hosts(s, entries, order, plan.job.dc_of)
    assert hosts["lh:party-a"].target == "alice@10.0.1.7"          # scheduler: first host
    assert {hosts[n].target for n in ("ls:party-a", "w:party-a:0", "w:party-a:1")} == \
        {"alice@10.0.1.7", "10.0.1.8"}                              # round-robin
    book = hostfile_book(s, hosts)
    assert book == {"gh": "10.0.0.1:9092", "lh:party-a": "192.168.1.7:9094",
                    "lh:party-b": "node-b.example.org:9095"}
    cmd = remote_node_command(hosts["w:party-a:1"], "w:party-a:1", "/runs/x", book, 12.5,
                              ssh=["ssh", "-p", "2222"])
    assert cmd[:5] == ["ssh", "-p", "2222", "-o", "BatchMode=yes"]
    remote = shlex.split(cmd[-1])  # what the remote shell will run
    assert remote[-1] != "" and "--stdin-config" in remote and "w:party-a:1" in remote
    assert json.loads(remote[remote.index("--book") + 1]) == book
    bad = [("party-a", "unknown DC 'party-q'", "party-q 1.2.3.4\n"),
           ("", "did you mean 'address'", "party-a 1.2.3.4 adress=1.1.1.1\n"),
           ("", "expected 'DC HOST", "party-a\n")]
    for _, words, line in bad:
        with pytest.raises(ConfigError, match=words):
            assign_hosts(s, parse_hostfile("central 1.1.1.1\n" + line), order, plan.job.dc_of)
    with pytest.raises(ConfigError, match="no host for DC.*party-b"):
        assign_hosts(s, parse_hostfile("central a\nparty-a b\n"), order, plan.job.dc_of)
    env = forwarded_env(s, {"GEOMX_SECRET": "k", "GEOMX_EVENT_LOOP": "asyncio",
                            "GEOMX_NODE": "gh", "HOME": "/root", "GEOMX_SCHEDULER_gh": "x:1"})
    assert env == {"GEOMX_SECRET": "k", "GEOMX_EVENT_LOOP": "asyncio"}


FAKE_SSH = """#!{python}
# A stand-in for ssh: log the arguments, drop the options, run the remote command here.
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_SSH_LOG"], "a") as f:
    f.write(json.dumps(args) + "\\n")
i = 0
while args[i].startswith("-"):
    i += 2 if args[i] in ("-o", "-p", "-i", "-l", "-J", "-F") else 1
os.execvp("sh", ["sh", "-c", " ".join(args[i + 1:])])
"""


@pytest.mark.slow
def test_hostfile_launch_over_a_fake_ssh(tmp_path):
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    ssh = fake_bin / "ssh"
    ssh.write_text(FAKE_SSH.format(python=sys.executable))
    ssh.chmod(0o755)
    ssh_log = tmp_path / "ssh.log"
    hostfile = tmp_path / "hosts"
    py = shlex.quote(sys.executable)
    hostfile.write_text(f"central   127.0.0.1        python={py} cwd={shlex.quote(str(ROOT))}\n"
                        f"party-a   alice@127.0.0.1  python={py}\n"
                        f"party-b   localhost        address=127.0.0.1 python={py}\n")
    base = free_port_block(4)
    secret = "the-secret-must-not-show"
    out = tmp_path / "runs"
    p = _launch([QUICKSTART, "--hostfile", str(hostfile), "--out", str(out), "--quiet",
                 "--set", f"real.port_base={base}", *FAST],
                {"PATH": f"{fake_bin}:{os.environ['PATH']}", "FAKE_SSH_LOG": str(ssh_log),
                 "GEOMX_SECRET": secret}, tmp_path / "launch.log")
    try:
        code = p.wait(150)
    finally:
        _kill(p)
    text = (tmp_path / "launch.log").read_text()
    assert code == 0, text
    assert "final accuracy" in text
    calls = [json.loads(line) for line in ssh_log.read_text().splitlines()]
    assert len(calls) == 11
    targets = sorted({c[c.index("BatchMode=yes") + 1] for c in calls})
    assert targets == ["127.0.0.1", "alice@127.0.0.1", "localhost"]
    for c in calls:
        remote = shlex.split(c[-1])
        assert remote[0] == "exec" or remote[:2] == ["cd", str(ROOT)]
        assert "--stdin-config" in remote and "--book" in remote
    assert secret not in ssh_log.read_text()
    run_dir = next(out.iterdir())
    assert secret not in (run_dir / "launch.json").read_text()
    book = json.loads((run_dir / "launch.json").read_text())["schedulers"]
    assert book == {"gh": f"127.0.0.1:{base}", "lh:party-a": f"127.0.0.1:{base + 2}",
                    "lh:party-b": f"127.0.0.1:{base + 3}"}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["iterations"] == 20 and summary["final_accuracy"] > 0.3


# ---------------------------------------------------------------- security on

@pytest.mark.slow
def test_launch_with_secret_and_tls_refuses_strangers(tmp_path):
    from geomx.runtime import eventloop
    from geomx.runtime.security import generate_self_signed, make_client_context, tls_tooling
    from geomx.runtime.tcp import HandshakeRefused, TcpTransport

    if tls_tooling() is None:
        pytest.skip("neither 'cryptography' nor 'openssl' is available to make a certificate")
    cert, key = generate_self_signed(tmp_path / "tls")
    out = tmp_path / "runs"
    p = _launch([QUICKSTART, "--out", str(out), "--quiet", "--set", "security.tls=true",
                 "--set", f"security.tls_cert={cert}", "--set", f"security.tls_key={key}",
                 "--set", f"security.tls_ca={cert}", "--set", "security.require_secret=true",
                 *FAST, "--set", "run.iterations=60"], {"GEOMX_SECRET": "right"},
                tmp_path / "launch.log")
    try:
        launch_json = _wait_for("*/launch.json", out)
        gh = json.loads(launch_json.read_text())["schedulers"]["gh"]

        async def intrude(secret, tls: bool, timeout_s: float) -> str:
            t = TcpTransport("intruder", secret=secret, connect_timeout_s=timeout_s,
                             ssl_client=make_client_context(cert) if tls else None, udp=False)
            await t.start()
            t.set_address_book({"gh": gh})
            try:
                await t.connect("gh")
                return "accepted"
            except HandshakeRefused as e:
                return f"refused: {e}"
            except ConnectionError as e:
                return f"failed: {e}"
            finally:
                await t.close()

        async def all_three():
            # the TLS ones wait (up to 30 s: a loaded machine starts slowly) for gh to
            # listen; then a client that speaks no TLS, while the job is still running
            wrong, none = await asyncio.gather(intrude("wrong", True, 30),
                                               intrude(None, True, 30))
            return wrong, none, await intrude("right", False, 5)
        wrong, none, plain = eventloop.run(all_three())
        code = p.wait(120)
    finally:
        _kill(p)
    text = (tmp_path / "launch.log").read_text()
    assert code == 0, text
    assert wrong.startswith("refused") and "secret" in wrong, wrong
    assert none.startswith("refused") and "no" in none and "secret" in none, none
    assert plain.startswith("failed") and "TLS" in plain, plain
    run_dir = launch_json.parent
    gh_result = json.loads((run_dir / "nodes" / "gh.result.json").read_text())
    assert gh_result["transport"]["refused_connections"] >= 2
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["iterations"] == 60 and summary["final_accuracy"] > 0.3


@pytest.mark.slow
def test_nodes_exit_when_the_launcher_dies(tmp_path):
    """A SIGKILLed launcher cannot clean up; its nodes see stdin close and stop."""
    out = tmp_path / "runs"
    p = _launch([QUICKSTART, "--out", str(out), "--quiet", "--set", "run.iterations=100000",
                 "--set", "run.target_accuracy=0", "--set", "metrics.plot=false"], {},
                tmp_path / "launch.log")
    marker = str(out)
    try:
        _wait_for("*/nodes/w_party-b_1.events.jsonl", out)
        # all 11, or 10 once the master worker has initialised the model and left
        assert len(_nodes_of(marker)) >= 10
        os.kill(p.pid, signal.SIGKILL)  # the launcher only, not its children
        p.wait()
        deadline = time.time() + 20
        while _nodes_of(marker) and time.time() < deadline:
            time.sleep(0.1)
        left = _nodes_of(marker)
        assert not left, f"{len(left)} node processes outlived their launcher"
    finally:
        _kill(p)
        for pid in _nodes_of(marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_scheduler_addresses_follow_the_topology_not_its_name(tmp_path):
    """A user topology with a local tier (here HiPS under another name) gets local
    scheduler addresses as HiPS does; a flat one gets only the global scheduler."""
    from geomx.runtime.config import scheduler_names
    from geomx.scenario import load_scenario

    (tmp_path / "mytier.py").write_text(
        "from geomx.topology.hips import HiPS\n\n\nclass MyTier(HiPS):\n"
        "    name = 'mytier'\n")
    base = (Path(__file__).resolve().parents[2] / "scenarios" / "quickstart.toml").read_text()
    path = tmp_path / "job.toml"
    path.write_text(base + '\n[topology]\nkind = "mytier.py:MyTier"\n')
    assert scheduler_names(load_scenario(path)) == {
        "gh": "central", "lh:party-a": "party-a", "lh:party-b": "party-b"}
    path.write_text(base + '\n[topology]\nkind = "flat"\n')
    assert scheduler_names(load_scenario(path)) == {"gh": "central"}
