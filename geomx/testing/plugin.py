"""geomx's pytest fixtures: ``geomx_run`` and the ``wan`` marker (docs/ci.md).

Registered by :func:`geomx.testing.pytest_configure` (geomx.testing is the ``pytest11``
entry point), so this module, which imports pytest, loads only inside a pytest session.

``geomx_run(scenario, set=..., runtime=..., expect=..., program=...)`` runs a scenario
file in the test's temporary folder and returns a :class:`geomx.testing.job.RunSummary`.
``@pytest.mark.wan(scenario, program=..., set=..., expect=..., runtime=...)`` runs a
training program of the test's own (by default the test module's ``main``) under that
scenario before the test, and hands the summary to the test as the ``wan_run`` fixture.

A scenario path is looked up from the current folder, then next to the test file, then
in the rootdir. The runtime is the one a call names, else ``--runtime`` on pytest's
command line, else the emulator.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from geomx.testing.job import ExpectationFailed, RunSummary, run_job

__all__ = ["geomx_run", "wan_run", "WAN_MARKER_DOC"]

WAN_MARKER_DOC = ("wan(scenario, program=None, set=None, expect=(), runtime=None): run the "
                  "test module's training program (`main`, or program=) under the scenario "
                  "file before the test; the test gets the summary as the wan_run fixture "
                  "(geomx, docs/ci.md)")


def _find_scenario(request: pytest.FixtureRequest, scenario: str | os.PathLike[str]) -> Path:
    path = Path(scenario)
    if path.is_absolute():
        return path
    places = [Path.cwd(), Path(str(request.node.path)).parent, Path(str(request.config.rootpath))]
    for place in places:
        if (place / path).is_file():
            return (place / path).resolve()
    raise FileNotFoundError(f"scenario {os.fspath(scenario)!r} not found; looked in: "
                            + ", ".join(str(p) for p in dict.fromkeys(places)))


def _runtime(request: pytest.FixtureRequest, runtime: str | None) -> str:
    return runtime or request.config.getoption("geomx_runtime", None) or "emu"


@pytest.fixture
def geomx_run(request: pytest.FixtureRequest,
              tmp_path_factory: pytest.TempPathFactory) -> Callable[..., RunSummary]:
    """``geomx_run("job.toml", set={"wan.0.loss": "1%"}, runtime="emu",
    expect=["final_accuracy >= 0.9"], program=None) -> RunSummary``: run a scenario file
    in a temporary folder (each call its own run folder) and return its summary; a failed
    expectation fails the test with one line per failed one."""
    base = tmp_path_factory.mktemp("geomx-runs")

    def run(scenario: str | os.PathLike[str], *, set: Mapping[str, Any] | Sequence[str] | None = None,
            runtime: str | None = None, expect: Sequence[str] = (),
            program: Any = None) -> RunSummary:
        __tracebackhide__ = True
        return run_job(_find_scenario(request, scenario), set=set,
                       runtime=_runtime(request, runtime), expect=expect, program=program,
                       out_dir=base)

    return run


def _marked_program(request: pytest.FixtureRequest, program: Any) -> Any:
    """The marker's ``program``: a function, ``'file.py:fn'`` (next to the test file), a
    function name of the test module, or by default the test module's ``main``."""
    module = request.node.module
    if program is None:
        program = getattr(module, "main", None)
        if program is None or not inspect.iscoroutinefunction(program):
            return None  # the scenario's own [training] program
        return program
    if isinstance(program, str) and ":" not in program and not program.endswith(".py"):
        found = getattr(module, program, None)
        if found is None:
            raise pytest.UsageError(f"@pytest.mark.wan(program={program!r}): no function "
                                    f"{program!r} in {module.__file__}")
        return found
    if isinstance(program, str):
        where, sep, fn = program.rpartition(":")
        where = where if sep else program
        if not os.path.isabs(where):
            where = str(Path(str(request.node.path)).parent / where)
        return where + (sep + fn if sep else "")
    return program


@pytest.fixture
def wan_run(request: pytest.FixtureRequest, geomx_run: Callable[..., RunSummary]) -> RunSummary:
    """The summary of the job that ``@pytest.mark.wan(...)`` on this test ran."""
    marker = request.node.get_closest_marker("wan")
    if marker is None:
        raise pytest.UsageError(f"{request.node.nodeid}: the wan_run fixture needs "
                                "@pytest.mark.wan('scenario.toml', ...) on the test")
    if len(marker.args) != 1:
        raise pytest.UsageError(f"{request.node.nodeid}: @pytest.mark.wan takes one scenario "
                                f"file, got {marker.args!r}")
    allowed = {"program", "set", "expect", "runtime"}
    unknown = set(marker.kwargs) - allowed
    if unknown:
        raise pytest.UsageError(f"{request.node.nodeid}: @pytest.mark.wan: unknown "
                                f"argument(s) {', '.join(sorted(unknown))}; allowed: "
                                f"{', '.join(sorted(allowed))}")
    kwargs = dict(marker.kwargs)
    kwargs["program"] = _marked_program(request, kwargs.get("program"))
    try:
        return geomx_run(marker.args[0], **kwargs)
    except ExpectationFailed as e:
        # a failed expectation is the test's failure, not a broken fixture: it is raised
        # again when the test is called (pytest_runtest_call)
        request.node.stash[_FAILED] = e
        assert e.summary is not None
        return e.summary


_FAILED = pytest.StashKey[ExpectationFailed]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    """Fail a ``wan`` test whose job missed an expectation, before its body runs."""
    failed = item.stash.get(_FAILED, None)
    if failed is not None:
        pytest.fail(str(failed), pytrace=False)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test marked ``wan`` runs its job even when it does not ask for ``wan_run``."""
    for item in items:
        names = getattr(item, "fixturenames", None)
        if names is not None and "wan_run" not in names and item.get_closest_marker("wan"):
            names.append("wan_run")
