"""geomx's pytest plugin (geomx.testing, the ``pytest11`` entry point): a user's test
project run by pytest in a fresh interpreter, as a user's CI runs it (docs/ci.md)."""

import importlib.metadata
import os
import re
import subprocess
import sys
import textwrap
import tomllib

import pytest

from tests.helpers.paths import ROOT

JOB = """\
[run]
name = "job"
iterations = 20
eval_every = 5
target_accuracy = 0.5

[training]
model = "mlp"
hidden = [16]
dataset = "digits"
batch_size = 32
optimizer = "adam"
lr = 0.01

[metrics]
plot = false
trace = false

[expect]
final_accuracy = ">= 0.5"
"""

TESTS = '''\
import json

import pytest

import geomx.kv


async def main(kv, ctx):
    """The project's own training program: Adam on the global servers."""
    model = ctx.build_model()
    params = model.params
    if kv.is_master_worker:
        kv.set_optimizer(geomx.kv.optimizer.Adam(learning_rate=ctx.lr))
    for idx, p in enumerate(params):
        kv.init(idx, p)
        if not kv.is_master_worker:
            kv.pull(idx, out=p)
    await kv.waitall()
    if kv.is_master_worker:
        return
    data = ctx.dataset()
    batches = ctx.batches(ctx.batch_size)
    for it in ctx.iterations():
        idx = batches.next()
        loss, grads = model.loss_and_grads(data.x_train[idx], data.y_train[idx])
        for k, g in enumerate(grads):
            kv.push(k, g)
            kv.pull(k, out=params[k])
        await kv.waitall()
        if ctx.is_evaluator and (it % ctx.eval_every == 0 or it == ctx.max_iterations):
            ctx.report(it, loss=loss, accuracy=model.accuracy(data.x_test, data.y_test))


def test_fixture_runs_the_scenario_and_returns_a_typed_summary(geomx_run):
    clean = geomx_run("job.toml")
    lossy = geomx_run("job.toml", set={"wan.0.loss": "1%", "run.seed": 3}, runtime="emu")
    assert lossy.runtime == "emu" and isinstance(lossy.bytes_wan, int)
    assert lossy.final_accuracy >= 0.5 and lossy.iterations <= 20
    assert lossy.run_dir.is_dir() and lossy.run_dir != clean.run_dir
    assert json.loads((lossy.run_dir / "summary.json").read_text())["seed"] == 3
    assert lossy.figure("extra.final_eval.iteration") == lossy.iterations
    lossy.expect("bytes_wan <= 10MB", "time_to_target_s <= 1min")


def test_fixture_expectation_fails_the_test(geomx_run):
    geomx_run("job.toml", expect=["bytes_wan <= 1kB"])


@pytest.mark.wan("job.toml", set={"wan.1.latency": "80ms", "run.target_accuracy": 0},
                 expect=["bytes_wan <= 10MB"])
def test_marker_runs_the_modules_own_program(wan_run):
    assert wan_run.emulated_seconds > 0 and wan_run.iterations == 20
    scenario = (wan_run.run_dir / "scenario.toml").read_text()
    assert f'program = "{__file__}:main"' in scenario


@pytest.mark.wan("job.toml", expect=["final_accuracy >= 0.99", "time_to_target_s <= 10ms"])
def test_marker_expectation_fails_the_test():
    pass


@pytest.mark.wan("job.toml", sett={"wan.0.loss": "1%"})
def test_marker_with_a_misspelt_argument():
    pass


def test_runtime_option(request):
    assert request.config.getoption("geomx_runtime") is None
'''


def _plugin_args() -> list[str]:
    """``-p geomx.testing`` where the installed geomx does not declare the entry point yet
    (an editable install made before it was added); nothing where it does."""
    names = {ep.value for ep in importlib.metadata.entry_points(group="pytest11")}
    return [] if "geomx.testing" in names else ["-p", "geomx.testing"]


def _pytest(project, *args, timeout=300):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           "-p", "no:hypothesispytest", *_plugin_args(), *args],
                          cwd=project, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def project(tmp_path):
    (tmp_path / "job.toml").write_text(JOB)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_job.py").write_text(TESTS)
    return tmp_path


def test_pyproject_registers_the_plugin_as_pytest11_entry_point():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert data["project"]["entry-points"]["pytest11"] == {"geomx": "geomx.testing"}


def test_a_users_tests_run_jobs_through_the_fixture_and_the_marker(project):
    proc = _pytest(project, "-q", "-rA", "tests")
    out = proc.stdout
    assert re.search(r"\b2 failed, 3 passed, 1 error\b", out), out[-3000:]
    assert proc.returncode == 1
    passed = set(re.findall(r"^PASSED tests/test_job.py::(\w+)", out, re.M))
    assert passed == {"test_fixture_runs_the_scenario_and_returns_a_typed_summary",
                      "test_marker_runs_the_modules_own_program", "test_runtime_option"}
    # a failed expectation is the test's failure, with one line per failed expectation
    assert re.search(r"FAIL bytes_wan <= 1kB: measured [\d.]+ MB \(\d+ B\)", out)
    assert re.search(r"^FAILED tests/test_job.py::test_marker_expectation_fails_the_test",
                     out, re.M)
    assert re.search(r"FAIL final_accuracy >= 0.99: measured 0\.\d+", out)
    assert re.search(r"FAIL time_to_target_s <= 10ms: measured [\d.]+ s", out)
    assert "unknown argument(s) sett; allowed: expect, program, runtime, set" in out


def test_the_plugin_declares_its_option_and_marker(project):
    help_text = _pytest(project, "--help").stdout
    assert "--runtime={emu,real}, --geomx-runtime={emu,real}" in help_text
    markers = _pytest(project, "--markers").stdout
    assert "@pytest.mark.wan(scenario, program=None, set=None, expect=(), runtime=None)" in markers


def test_geomx_own_tests_run_with_the_plugin_loaded():
    """Installed, the plugin loads in geomx's own test sessions too: its option and
    fixtures must not clash with tests/conftest.py's."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *_plugin_args(), "tests/test_units.py", "tests/test_cli.py",
                           "-k", "units or help or validate"],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert re.search(r"\d+ passed", proc.stdout)


def test_loading_the_plugin_imports_nothing_heavy():
    """pytest loads it in every session of a project where geomx is installed."""
    code = ("import sys, geomx.testing\n"
            "heavy = [m for m in ('numpy', 'pytest', 'geomx.scenario', 'geomx.experiment', "
            "'geomx.metrics') if m in sys.modules]\n"
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.slow
def test_runtime_option_runs_the_jobs_over_real_sockets(project):
    (project / "tests" / "test_real.py").write_text(textwrap.dedent('''\
        def test_real(geomx_run):
            summary = geomx_run("job.toml")
            assert summary.runtime == "real" and summary.emulated_seconds is None
            summary.expect("final_accuracy >= 0.5", "bytes_wan <= 10MB")

        def test_pinned(geomx_run):
            assert geomx_run("job.toml", runtime="emu").runtime == "emu"
        '''))
    proc = _pytest(project, "-q", "--runtime", "real", "tests/test_real.py")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "2 passed" in proc.stdout
