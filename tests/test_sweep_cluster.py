"""`geomx sweep --cluster` on a real Dask cluster: a `dask scheduler` and two `dask worker`
processes (one thread each) on this machine, on random ports.

What it shows: the cluster's sweep.csv equals a local `--jobs 2` sweep point by point
(wall-clock columns aside), with runs sent back as bytes or written in place; a worker
killed mid-sweep does not stop it; and each bad input (no scheduler, no Dask, a worker
without geomx, a trace a worker cannot see) is refused in one line before anything runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import distributed  # the `test` extra installs it: these tests run, never skip

from geomx.cli import main
from geomx.metrics.sweep_results import read_sweep
from geomx.sweep import GridAxis, run_sweep
from geomx import sweep_cluster
from geomx.sweep_cluster import ClusterError, ClusterPool

from tests.helpers.paths import ROOT
from tests.helpers.procs import sigint_as_from_a_terminal

QUICKSTART = ROOT / "scenarios" / "quickstart.toml"
BASE = ["run.iterations=12", "run.target_accuracy=0", "run.eval_every=4", "metrics.trace=false",
        "metrics.plot=false"]
GRID = ["codec.type=none,fp16", "training.lr=0.01,0.005"]
#: columns that measure this machine's wall clock, not the emulated run
WALL_COLUMNS = {"wall_seconds", "extra.emulated_over_wall"}

pytestmark = pytest.mark.timeout(240)


def _sweep_argv(out: Path, *extra: str) -> list[str]:
    return ["sweep", str(QUICKSTART), *[a for g in GRID for a in ("--grid", g)], "--seeds", "2",
            "--out", str(out), "--quiet", "--no-plots",
            *[a for s in BASE for a in ("--set", s)], *extra]


class Cluster:
    """A scheduler and its workers as child processes, each in its own process group."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: dict[str, subprocess.Popen] = {}
        self.worker_cwd = root / "worker-cwd"  # not the client's: relative paths differ
        self.worker_cwd.mkdir()
        self.address = ""

    def _start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "w")
        proc = subprocess.Popen(argv, cwd=self.worker_cwd, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.procs[name] = proc
        return proc

    def start_scheduler(self) -> None:
        sched_file = self.root / "scheduler.json"
        # a task whose worker dies is moved to another worker once, then reported
        env = {**os.environ, "PYTHONPATH": str(ROOT),
               "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "1"}
        self._start("scheduler", [sys.executable, "-m", "distributed.cli.dask_scheduler",
                                  "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                                  "--scheduler-file", str(sched_file)], env)
        deadline = time.monotonic() + 60
        while not sched_file.exists() or not sched_file.read_text().strip():
            assert time.monotonic() < deadline, (self.root / "scheduler.log").read_text()
            time.sleep(0.1)
        import json

        time.sleep(0.2)
        self.address = json.loads(sched_file.read_text())["address"]

    def start_worker(self, name: str, env: dict[str, str] | None = None,
                     python: list[str] | None = None) -> subprocess.Popen:
        env = env if env is not None else {**os.environ, "PYTHONPATH": str(ROOT)}
        return self._start(name, [*(python or [sys.executable]), "-m",
                                  "distributed.cli.dask_worker", self.address, "--name", name,
                                  "--nthreads", "1", "--no-nanny", "--no-dashboard",
                                  "--host", "127.0.0.1"], env)

    def wait_for(self, n_workers: int) -> None:
        with distributed.Client(self.address, timeout=30) as client:
            deadline = time.monotonic() + 60
            while len(client.scheduler_info(n_workers=-1)["workers"]) != n_workers:
                if time.monotonic() > deadline:
                    logs = {n: (self.root / f"{n}.log").read_text()[-2000:] for n in self.procs}
                    raise AssertionError(f"{n_workers} workers never joined: {logs}")
                time.sleep(0.1)

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def stop(self) -> None:
        for name in [n for n in self.procs if n != "scheduler"] + ["scheduler"]:
            if name in self.procs:
                self.kill(name)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("dask"))
    try:
        c.start_scheduler()
        c.start_worker("w1")
        c.start_worker("w2")
        c.wait_for(2)
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("local") / "sweep"
    assert main(_sweep_argv(out, "--jobs", "2")) == 0
    return read_sweep(out)


def _assert_same_values(table, local) -> None:
    assert table.keys() == local.keys()
    assert len(table) == len(local) == 8
    assert set(table["status"]) == {"done"}
    for col in table.keys():
        if col not in WALL_COLUMNS:
            assert list(table[col]) == list(local[col]), col


def test_a_cluster_sweep_equals_the_local_one_and_resumes(cluster, local_sweep, tmp_path,
                                                          capsys):
    out = tmp_path / "sweep"
    assert main(_sweep_argv(out, "--cluster", cluster.address, "--no-shared-fs")) == 0
    assert "8 runs: 8 ran, 0 resumed, 0 failed" in capsys.readouterr().out
    _assert_same_values(read_sweep(out), local_sweep)
    for run in read_sweep(out)["run"]:  # the run folders came back whole
        files = sorted(p.relative_to(out / run).as_posix() for p in (out / run).rglob("*"))
        assert "summary.json" in files and "scenario.toml" in files
    assert not (out / ".tmp").exists()
    # a rerun skips the finished points without asking the cluster for anything
    assert main(_sweep_argv(out, "--cluster", "tcp://127.0.0.1:1")) == 0
    assert "8 runs: 0 ran, 8 resumed, 0 failed" in capsys.readouterr().out


def test_the_scenario_names_its_cluster_and_it_changes_no_point(cluster, local_sweep, tmp_path,
                                                                monkeypatch):
    """`[sweep] cluster` (here through --set, as a file's table reads) sends the points to
    the cluster with no --cluster or $GEOMX_CLUSTER; where points run is not part of what
    they compute, so their folders are the local sweep's."""
    import geomx.sweep

    monkeypatch.delenv("GEOMX_CLUSTER", raising=False)

    def no_local_processes(*args, **kwargs):
        raise AssertionError("the points ran in local processes")

    monkeypatch.setattr(geomx.sweep, "ProcessPoolExecutor", no_local_processes)
    out = tmp_path / "sweep"
    assert main(_sweep_argv(out, "--set", f"sweep.cluster={cluster.address}",
                            "--no-shared-fs")) == 0
    _assert_same_values(read_sweep(out), local_sweep)  # the run folders' names included


def test_relative_paths_and_files_that_travel(cluster, tmp_path, monkeypatch, capsys):
    """Paths given relative to the client's folder, for workers that run in another one:
    the scenario and a trace next to it travel with the tasks, or are read in place
    through absolute paths; a trace that is only relative to the client's folder is
    refused in place. GEOMX_CLUSTER stands for --cluster."""
    client_cwd = tmp_path / "client"
    (client_cwd / "traces").mkdir(parents=True)
    (client_cwd / "traces" / "bw.csv").write_text("time_s,bandwidth\n0,50Mbps\n0.2,100Mbps\n")
    (client_cwd / "quickstart.toml").write_text(QUICKSTART.read_text())
    monkeypatch.chdir(client_cwd)
    monkeypatch.setenv("GEOMX_CLUSTER", cluster.address)
    argv = ["sweep", "quickstart.toml", "--grid", "wan.1.bandwidth=20Mbps,1Gbps", "--quiet",
            "--no-plots", "--set", "wan.0.trace=traces/bw.csv",
            *[a for s in BASE for a in ("--set", s)]]
    assert main([*argv, "--out", "sent", "--no-shared-fs"]) == 0
    assert main([*argv, "--out", "in-place"]) == 0
    sent, in_place = read_sweep("sent"), read_sweep("in-place")
    assert list(sent["status"]) == list(in_place["status"]) == ["done", "done"]
    assert sent["emulated_seconds"][0] > sent["emulated_seconds"][1]
    for col in sent.keys():
        if col not in WALL_COLUMNS:
            assert list(sent[col]) == list(in_place[col]), col
    capsys.readouterr()
    # the scenario elsewhere: the trace is found only relative to this folder
    argv[1] = str(QUICKSTART)
    assert main([*argv, "--out", "refused", "--shared-fs"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "wan.0.trace 'traces/bw.csv' is not there" in err and "worker tcp://" in err
    assert not (client_cwd / "refused" / "runs").exists()
    # a data set never travels, shared file system or not
    (client_cwd / "train.svm").write_bytes(
        (ROOT / "scenarios" / "data" / "libsvm_example.svm").read_bytes())
    libsvm = ["sweep", str(ROOT / "scenarios" / "libsvm_example.toml"), "--seeds", "2",
              "--set", "training.data_path=train.svm", "--out", "data", "--no-shared-fs"]
    assert main(libsvm) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "training.data_path 'train.svm' is not there (data paths do not travel" in err, err


def test_a_failing_point_is_retried_on_the_other_worker_then_reported_by_name(
        cluster, tmp_path, capsys):
    """A training program that raises on one grid value: that point fails on both
    workers in turn and is named with both; the other point is done. The program is
    read in place, then sent with the tasks."""
    (tmp_path / "flaky.py").write_text(
        "async def main(kv, ctx):\n"
        "    if ctx.args == ['--boom']:\n"
        "        raise RuntimeError('boom')\n")
    scenario = tmp_path / "job.toml"
    scenario.write_text(QUICKSTART.read_text().replace(
        "[training]\n", "[training]\nprogram = \"flaky.py:main\"\n"))
    out = tmp_path / "sweep"
    argv = ["sweep", str(scenario), "--grid", "training.program_args=[],[\"--boom\"]",
            "--out", str(out), "--quiet", "--no-plots", "--cluster", cluster.address,
            *[a for s in BASE for a in ("--set", s)]]
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert "2 runs: 2 ran, 0 resumed, 1 failed" in captured.out
    failed = [line for line in captured.err.splitlines() if line.startswith("failed: ")]
    assert len(failed) == 1 and "program_args=" in failed[0] and "boom" in failed[0], failed
    tried = failed[0].split("(tried on ")[1]
    workers = [w.strip(" )") for w in tried.split(" and then ")]
    assert len(workers) == 2 and workers[0] != workers[1], failed[0]
    assert list(read_sweep(out)["status"]) == ["done", "failed"]
    # the same with the program sent along with the tasks
    argv[argv.index(str(out))] = str(tmp_path / "sent")
    assert main([*argv, "--no-shared-fs"]) == 1
    assert list(read_sweep(tmp_path / "sent")["status"]) == ["done", "failed"]
    assert "(tried on tcp://" in capsys.readouterr().err


def test_a_worker_without_geomx_is_refused_before_anything_runs(cluster, tmp_path, capsys):
    """A worker whose Python has this one's packages except geomx: its site-packages,
    without geomx, as the only path (-S: no site-packages, so no editable-install hook)."""
    site = Path(distributed.__file__).parents[1]
    env_dir = tmp_path / "site-without-geomx"
    env_dir.mkdir()
    for entry in site.iterdir():
        if not entry.name.startswith(("geomx", "__editable__")):
            (env_dir / entry.name).symlink_to(entry)
    cluster.start_worker("bare", env={"PATH": os.environ.get("PATH", ""),
                                      "PYTHONPATH": str(env_dir)}, python=[sys.executable, "-S"])
    try:
        cluster.wait_for(3)
        out = tmp_path / "sweep"
        assert main(_sweep_argv(out, "--cluster", cluster.address)) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1
        assert "cannot import geomx" in err and "No module named 'geomx'" in err, err
        assert "pip install" in err
        assert not (out / "runs").exists()
    finally:
        cluster.kill("bare")
        cluster.wait_for(2)


def test_a_worker_with_another_geomx_is_refused_before_anything_runs(cluster, tmp_path,
                                                                      capsys):
    """The same version string, one source file changed: the source hashes differ."""
    import shutil

    alt = tmp_path / "alt"
    shutil.copytree(ROOT / "geomx", alt / "geomx", ignore=shutil.ignore_patterns("__pycache__"))
    with open(alt / "geomx" / "sweep.py", "a") as f:
        f.write("\n# a local edit on one worker\n")
    cluster.start_worker("other", env={**os.environ, "PYTHONPATH": str(alt)})
    try:
        cluster.wait_for(3)
        out = tmp_path / "sweep"
        assert main(_sweep_argv(out, "--cluster", cluster.address)) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1
        assert "runs a different geomx (source hash" in err, err
        assert not (out / "runs").exists()
    finally:
        cluster.kill("other")
        cluster.wait_for(2)


def test_unreachable_scheduler_and_missing_dask_are_one_line(tmp_path, monkeypatch, capsys):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(_sweep_argv(tmp_path / "a", "--cluster", f"tcp://127.0.0.1:{port}")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"--cluster tcp://127.0.0.1:{port}: no Dask scheduler answered" in err
    assert not (tmp_path / "a").exists()

    monkeypatch.setitem(sys.modules, "distributed", None)  # as if it were not installed
    assert main(_sweep_argv(tmp_path / "b", "--cluster", "tcp://127.0.0.1:8786")) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("geomx: --cluster needs Dask distributed, which is not installed here: "
                   "pip install 'geomx[cluster]' (or: pip install 'distributed>=2024.1')")


def test_a_local_sweep_does_not_import_dask(tmp_path):
    argv = ["sweep", str(QUICKSTART), "--seeds", "2", "--jobs", "1", "--out", str(tmp_path / "s"),
            "--quiet", "--no-plots", "--set", "run.iterations=4", "--set", "metrics.plot=false",
            "--set", "metrics.trace=false"]
    code = ("import sys; from geomx.cli import main; "
            f"assert main({argv!r}) == 0; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GEOMX_CLUSTER", None)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]"
    assert len(list((tmp_path / "s" / "runs").glob("*/summary.json"))) == 2


def test_ctrl_c_cancels_the_tasks_and_keeps_the_finished_points(cluster, tmp_path):
    from geomx.cli import EXIT_INTERRUPTED

    out = tmp_path / "sweep"
    argv = _sweep_argv(out, "--cluster", cluster.address)
    # points of a few seconds each, so that most are still to run when the first finishes
    argv[argv.index("run.iterations=12")] = "run.iterations=400"
    proc = subprocess.Popen([sys.executable, "-m", "geomx", *argv], cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_as_from_a_terminal)
    try:
        deadline = time.monotonic() + 120
        while not any((out / "runs").glob("*/summary.json")):
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == EXIT_INTERRUPTED, err
    assert "interrupted" in err
    with distributed.Client(cluster.address, timeout=30) as client:
        deadline = time.monotonic() + 60  # a point already running finishes; none starts
        while any(client.processing().values()):
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finished = list((out / "runs").glob("*/summary.json"))
    assert 1 <= len(finished) < 8
    assert set(read_sweep(out)["status"]) == {"done"}


def test_a_worker_killed_mid_sweep_does_not_stop_it(cluster, local_sweep, tmp_path):
    """Runs in place (the workers see the sweep folder); one worker is killed as soon as
    the first point is done, and the other finishes the sweep."""
    out = tmp_path / "sweep"
    axes = [GridAxis("codec.type", ("none", "fp16")), GridAxis("training.lr", ("0.01", "0.005"))]
    result: dict = {}

    def sweep() -> None:
        try:
            result["r"] = run_sweep(QUICKSTART, axes, seeds=2, out=out, base_overrides=BASE,
                                    progress=False, plots=False, cluster=cluster.address)
        except BaseException as exc:  # reported by the assertion below
            result["error"] = exc

    thread = threading.Thread(target=sweep)
    thread.start()
    deadline = time.monotonic() + 120
    while not any((out / "runs").glob("*/summary.json")):
        assert time.monotonic() < deadline and thread.is_alive(), result
        time.sleep(0.05)
    cluster.kill("w1")
    done_at_kill = len(list((out / "runs").glob("*/summary.json")))
    assert done_at_kill < 8 and thread.is_alive()
    thread.join(timeout=180)
    assert "error" not in result, result["error"]
    r = result["r"]
    assert (r.ran, r.failed) == (8, 0)
    assert len(list((out / "runs").glob("*/summary.json"))) == 8
    _assert_same_values(r.table, local_sweep)


def test_a_pool_refuses_a_bad_address_in_one_line():
    with pytest.raises(ClusterError, match="allowed: a scheduler address"):
        ClusterPool("nonsense://x", timeout_s=1)


def test_a_point_that_kills_its_workers_is_reported_by_name(cluster, tmp_path, capsys):
    """After the killed-worker test one worker is left; a second joins. A program that
    ends its process on one grid value takes one worker, is moved to the other
    (allowed-failures = 1), takes it too, and is reported; the other point is done."""
    cluster.start_worker("w3")
    cluster.wait_for(2)
    # the deadly point waits a second before it ends its worker: moved to the worker that
    # has just finished the other point, it lets that point's result be fetched first (a
    # result lost with its worker runs again: the next test)
    (tmp_path / "deadly.py").write_text(
        "import os, time\n\n"
        "async def main(kv, ctx):\n"
        "    if ctx.args == ['--die']:\n"
        "        time.sleep(1.0)\n"
        "        os._exit(1)\n")
    scenario = tmp_path / "job.toml"
    scenario.write_text(QUICKSTART.read_text().replace(
        "[training]\n", "[training]\nprogram = \"deadly.py:main\"\n"))
    out = tmp_path / "sweep"
    argv = ["sweep", str(scenario), "--grid", "training.program_args=[],[\"--die\"]",
            "--out", str(out), "--quiet", "--no-plots", "--cluster", cluster.address,
            *[a for s in BASE for a in ("--set", s)]]
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert "2 runs: 2 ran, 0 resumed, 1 failed" in captured.out
    failed = [line for line in captured.err.splitlines() if line.startswith("failed: ")]
    assert len(failed) == 1 and "program_args=" in failed[0], failed
    assert "the worker running it died, 2 times" in failed[0], failed[0]
    assert list(read_sweep(out)["status"]) == ["done", "failed"]


def test_a_sweep_whose_workers_are_all_gone_ends_and_names_the_points(cluster, tmp_path,
                                                                       capsys, monkeypatch):
    """A worker joins, and the first point ends it: no worker is left, so the points wait
    for one only NO_WORKER_GRACE_S, are reported failed, and the sweep ends instead of
    waiting forever."""
    monkeypatch.setattr(sweep_cluster, "NO_WORKER_GRACE_S", 3.0)
    cluster.start_worker("w4")
    cluster.wait_for(1)
    (tmp_path / "deadly.py").write_text("import os\n\nasync def main(kv, ctx):\n"
                                        "    os._exit(1)\n")
    scenario = tmp_path / "job.toml"
    scenario.write_text(QUICKSTART.read_text().replace(
        "[training]\n", "[training]\nprogram = \"deadly.py:main\"\n"))
    out = tmp_path / "sweep"
    argv = ["sweep", str(scenario), "--grid", "run.seed=1,2", "--out", str(out), "--quiet",
            "--no-plots", "--cluster", cluster.address, *[a for s in BASE for a in ("--set", s)]]
    assert main(argv) == 1
    failed = [line for line in capsys.readouterr().err.splitlines()
              if line.startswith("failed: ")]
    assert len(failed) == 2 and all("no Dask worker was left to run it for 3 s" in f
                                    for f in failed), failed
    assert list(read_sweep(out)["status"]) == ["failed", "failed"]
