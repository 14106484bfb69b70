"""Nodes the local launcher forks instead of exec'ing (geomx/runtime/forked.py): each
must behave as an exec'd ``python -m geomx node`` would -- its own streams, environment,
session, command line and exit code -- and still stop when the launcher goes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from geomx.runtime import forked
from geomx.runtime.forked import ForkedProcess, fork_command

from tests.helpers.forking import delegate_unless_fork_usable
from tests.helpers.paths import ROOT
from tests.helpers.ports import free_port

QUICKSTART = ROOT / "scenarios" / "quickstart.toml"

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the launcher forks nodes on Linux only")


@pytest.fixture
def delegated(request, monkeypatch) -> bool:
    """For the tests that fork from this process: True when the test ran in a new
    interpreter instead (tests/helpers/forking.py) and returns at once here."""
    monkeypatch.delenv(forked.ENV_VAR, raising=False)
    return delegate_unless_fork_usable(request)


def _wait(p: ForkedProcess, timeout_s: float) -> int | None:
    try:
        return p.wait(timeout_s)
    except subprocess.TimeoutExpired:
        return None


@pytest.mark.slow
def test_a_forked_node_gets_its_own_streams_environment_and_exit_code(tmp_path, capfd,
                                                                    delegated):
    if delegated:
        return
    log = open(tmp_path / "config.log", "w")
    env = {**os.environ, "GEOMX_HOST": "127.0.0.9"}
    p = fork_command(["node", str(QUICKSTART), "--name", "w:party-a:1", "--print-config"],
                     log, env)
    assert p.wait(60) == 0
    text = (tmp_path / "config.log").read_text()
    assert "w:party-a:1" in text and "127.0.0.9" in text and "GEOMX_HOST" in text, text
    log.close()

    bad = open(tmp_path / "bad.log", "w")
    p = fork_command(["node", str(tmp_path / "missing.toml"), "--name", "gh"], bad,
                     dict(os.environ))
    assert p.wait(60) == 2  # what `geomx node missing.toml` exits with
    assert "missing.toml" in (tmp_path / "bad.log").read_text()
    bad.close()
    # nothing reached this process's streams, and its environment is unchanged
    out, err = capfd.readouterr()
    assert "w:party-a:1" not in out + err and "missing.toml" not in out + err
    assert os.environ.get("GEOMX_HOST") != "127.0.0.9"


def _scheduler(tmp_path: Path, name: str, book: dict[str, str], siblings=()):
    log = open(tmp_path / f"{name.replace(':', '_')}.log", "w")
    argv = ["node", str(QUICKSTART), "--name", name, "--run-dir", str(tmp_path / "run"),
            "--book", json.dumps(book), "--watch-stdin"]
    others = list(siblings)

    def close_in_child():
        for p in others:
            p.stdin.close()

    return fork_command(argv, log, dict(os.environ), close_in_child), log


@pytest.mark.slow
def test_each_node_sees_its_launcher_go_even_with_siblings_forked_after_it(tmp_path, delegated):
    """The second child must not hold the first one's stdin open: closing the first's
    pipe (what the launcher's death does) stops the first while the second runs on."""
    if delegated:
        return
    book = {"gh": f"127.0.0.1:{free_port()}", "lh:party-a": f"127.0.0.1:{free_port()}",
            "lh:party-b": f"127.0.0.1:{free_port()}"}
    first, log1 = _scheduler(tmp_path, "gh", book)
    second, log2 = _scheduler(tmp_path, "lh:party-a", book, siblings=[first])
    try:
        time.sleep(1.0)
        assert first.poll() is None and second.poll() is None
        # each is a session leader with its own command line, as an exec'd node is
        assert os.getsid(first.pid) == first.pid and os.getsid(second.pid) == second.pid
        cmdline = Path(f"/proc/{second.pid}/cmdline").read_bytes()
        assert b"-m geomx node" in cmdline and b"--name lh:party-a" in cmdline
        first.stdin.close()
        assert _wait(first, 30) is not None, (tmp_path / "gh.log").read_text()
        assert "stdin closed" in (tmp_path / "gh.log").read_text()
        assert second.poll() is None  # its pipe is still open: it runs on
        os.killpg(second.pid, signal.SIGKILL)
        assert second.wait(30) == -signal.SIGKILL
    finally:
        for p in (first, second):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(30)
        log1.close()
        log2.close()


@pytest.mark.slow
def test_wait_times_out_like_popen(tmp_path, delegated):
    if delegated:
        return
    log = open(tmp_path / "x.log", "w")
    book = {"gh": f"127.0.0.1:{free_port()}", "lh:party-a": f"127.0.0.1:{free_port()}",
            "lh:party-b": f"127.0.0.1:{free_port()}"}
    p = fork_command(["node", str(QUICKSTART), "--name", "gh", "--run-dir",
                      str(tmp_path / "run"), "--book", json.dumps(book)], log,
                     dict(os.environ))
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            p.wait(0.2)
        assert p.returncode is None
        os.killpg(p.pid, signal.SIGTERM)
        assert p.wait(30) != 0
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(30)
        log.close()


def _in_fresh_python(code: str) -> subprocess.CompletedProcess:
    """``code`` in a new interpreter: this test process may already run threads or a
    Numba pool (earlier tests), which rule fork out here."""
    environ = {k: v for k, v in os.environ.items() if k != forked.ENV_VAR}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, env=environ)


def test_fork_is_only_used_where_it_is_safe():
    code = ("import os, threading\n"
            "from geomx.runtime import forked\n"
            "assert forked.start_method() == 'fork' and forked.fork_usable()\n"
            "os.environ[forked.ENV_VAR] = 'exec'\n"
            "assert forked.start_method() == 'exec' and not forked.fork_usable()\n"
            "os.environ[forked.ENV_VAR] = 'spawn'\n"
            "try:\n"
            "    forked.start_method()\n"
            "except ValueError as e:\n"
            "    print('refused:', e)\n"
            "del os.environ[forked.ENV_VAR]\n"
            "stop = threading.Event()\n"
            "t = threading.Thread(target=stop.wait)\n"
            "t.start()\n"
            "print('with a thread:', forked.fork_usable())\n"
            "stop.set()\n"
            "t.join()\n"
            "print('after it:', forked.fork_usable())\n")
    r = _in_fresh_python(code)
    assert r.returncode == 0, r.stderr
    assert "refused: GEOMX_NODE_START='spawn': expected one of fork, exec" in r.stdout
    # another thread could hold a lock the child would then wait on forever
    assert "with a thread: False" in r.stdout and "after it: True" in r.stdout


@pytest.mark.slow
@pytest.mark.parametrize("how", ["fork", "exec"])
def test_a_real_job_runs_either_way(tmp_path, how):
    """As a user runs it (``geomx run --runtime real`` from a shell): both ways finish the
    job, every node with its own log and result."""
    r = subprocess.run([sys.executable, "-m", "geomx", "run", str(QUICKSTART), "--runtime",
                        "real", "--quiet", "--out", str(tmp_path), "--set", "run.iterations=20",
                        "--set", "run.target_accuracy=0", "--set", "metrics.plot=false"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env={**os.environ, forked.ENV_VAR: how})
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = Path(r.stdout.split("run folder: ")[1].split()[0])
    assert json.loads((run_dir / "launch.json").read_text())["start"] == how
    assert json.loads((run_dir / "summary.json").read_text())["iterations"] == 20
    assert len(list((run_dir / "nodes").glob("*.result.json"))) == 11
    assert len(list((run_dir / "logs").glob("*.log"))) == 11


@pytest.mark.slow
def test_native_threads_rule_fork_out_too():
    """A Numba parallel kernel (a tensor of more than one chunk) leaves an
    OpenMP/workqueue pool running, invisible to ``threading``; a child forked after it
    would abort. It is run in a child here, so
    this test process stays free of such threads."""
    code = ("import numpy as np\n"
            "from geomx.runtime.forked import fork_usable\n"
            "assert fork_usable()\n"
            "from geomx.codec import create_codec\n"
            "from geomx.codec.cpu_kernels import PARALLEL_MIN\n"
            "small = np.random.rand(1 << 16).astype(np.float32)  # one chunk: serial\n"
            "c = create_codec('fp16').codec_for(small.size, 'wan')\n"
            "c.encode(0, small, c.new_state(small.size))\n"
            "print('usable after a one-chunk kernel:', fork_usable())\n"
            "g = np.random.rand(2 * PARALLEL_MIN).astype(np.float32)  # two chunks\n"
            "c.encode(0, g, c.new_state(g.size))\n"
            "import threading\n"
            "assert threading.active_count() == 1\n"
            "print('usable after a parallel kernel:', fork_usable())\n")
    r = _in_fresh_python(code)
    assert r.returncode == 0, r.stderr
    assert "usable after a one-chunk kernel: True" in r.stdout
    assert "usable after a parallel kernel: False" in r.stdout


def test_a_gpu_torch_rules_fork_out(tmp_path):
    """On a host with a GPU, torch's autograd engine starts per-device threads at the
    first backward pass, and a node forked after it fails its own first backward
    ("Unable to handle autograd's threading in combination with fork-based
    multiprocessing"; seen on an H200 when a test trained in the emulator before a
    real-runtime run). A stand-in torch module plays each state, in a fresh Python."""
    device_file = tmp_path / "nvidiactl"
    code = ("import sys, types\n"
            "from geomx.runtime import forked\n"
            f"forked.GPU_DEVICE_FILES = ({str(device_file)!r},)\n"
            "def fake(cuda_build, initialized):\n"
            "    t = types.ModuleType('torch')\n"
            "    t.version = types.SimpleNamespace(cuda='13.0' if cuda_build else None, hip=None)\n"
            "    t.cuda = types.SimpleNamespace(is_initialized=lambda: initialized)\n"
            "    sys.modules['torch'] = t\n"
            "print('no torch:', forked.fork_usable())\n"
            "fake(False, False)\n"
            "print('cpu torch:', forked.fork_usable())\n"
            "fake(True, False)\n"
            "print('gpu torch, no gpu here:', forked.fork_usable())\n"
            f"open({str(device_file)!r}, 'w').close()\n"
            "print('gpu torch, gpu here:', forked.fork_usable())\n"
            "fake(False, True)\n"
            "print('cuda initialised:', forked.fork_usable())\n")
    r = _in_fresh_python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "no torch: True", "cpu torch: True", "gpu torch, no gpu here: True",
        "gpu torch, gpu here: False", "cuda initialised: False"]


#: Armed by the test below: send this process SIGINT from inside os.fork()'s parent-side
#: at-fork callbacks, where CPython would report the KeyboardInterrupt as "Exception
#: ignored" and drop it. (Registered once; it does nothing unless armed.)
_SIGINT_IN_FORK: list[bool] = []
os.register_at_fork(after_in_parent=lambda: _SIGINT_IN_FORK and _SIGINT_IN_FORK.pop()
                    and os.kill(os.getpid(), signal.SIGINT))


@pytest.mark.slow
def test_ctrl_c_while_a_node_is_forked_is_not_lost(tmp_path, delegated):
    """Found with Ctrl-C right after `geomx run --runtime real` started (the launcher then
    ran on forever): the interrupt must reach the launcher, after the new node is in its
    table so that it can be stopped."""
    if delegated:
        return
    from geomx.runtime.launcher import _start

    table: dict = {}
    cmd = [sys.executable, "-m", "geomx", "node", str(QUICKSTART), "--name", "gh",
           "--print-config"]
    # Ctrl-C as from a terminal, even where this process was started with SIGINT ignored
    # (a background job): the launcher leaves an ignored signal ignored
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    _SIGINT_IN_FORK.append(True)
    try:
        with pytest.raises(KeyboardInterrupt):
            _start(cmd, tmp_path / "gh.log", dict(os.environ), "gh", fork=True, into=table)
    finally:
        _SIGINT_IN_FORK.clear()
        signal.signal(signal.SIGINT, handler)
    assert isinstance(table["gh"].proc, ForkedProcess)
    assert table["gh"].proc.wait(60) == 0
    table["gh"].log.close()
