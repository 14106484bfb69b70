"""Test a policy of your own in a tiny emulated job, and a job of your own under WAN
conditions, from a unit test.

:func:`run_policy` puts a policy (a class, or a spec as a scenario writes it) into a small
HiPS job -- two party DCs of two workers, scikit-learn's 8x8 digits, a 16-unit MLP, a
100 Mbps / 30 ms WAN, 20 iterations -- runs it in the discrete-event emulator (a second
or two of CPU) and returns the summary and the event log::

    from geomx.testing import run_policy
    from lab.topk import TopK

    def test_topk_trains_and_saves_wan_bytes():
        run = run_policy(TopK, {"ratio": 0.05}, iterations=30)
        dense = run_policy("none", kind="codec", iterations=30)
        assert run.summary.final_accuracy > 0.5
        assert run.summary.bytes_wan < dense.summary.bytes_wan

The options go through the same check as a scenario's ``[<kind>.options]``, and the job
runs the same node code as ``geomx run``, so a policy that passes here runs unchanged in
a scenario, over sockets and in a by-hand launch (docs/extending.md, "Testing").

This module is also geomx's pytest plugin (the ``pytest11`` entry point ``geomx``), which
gives a test the ``geomx_run`` fixture and the ``wan`` marker (:mod:`geomx.testing.plugin`,
docs/ci.md)::

    def test_job_survives_a_lossy_wan(geomx_run):
        summary = geomx_run("job.toml", set={"wan.0.loss": "1%"}, runtime="emu")
        assert summary.final_accuracy >= 0.9

pytest loads the plugin in every session of a project where geomx is installed, so this
module imports nothing heavy at load: the job machinery is imported when a function
runs. ``-p no:geomx`` turns the plugin off.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from geomx.metrics.summary import Summary
    from geomx.testing.job import RunSummary, run_job

__all__ = ["PolicyRun", "run_policy", "tiny_scenario", "spec_for_class", "RunSummary",
           "run_job"]


def __getattr__(name: str) -> Any:
    """:class:`RunSummary` and :func:`run_job` (geomx/testing/job.py), imported when first
    used so that loading the plugin stays cheap (PEP 562)."""
    if name in ("RunSummary", "run_job"):
        from geomx.testing import job

        return getattr(job, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def pytest_addoption(parser: Any) -> None:
    """``--runtime emu|real`` (also ``--geomx-runtime``): the runtime of ``geomx_run`` and
    ``wan`` tests that do not name one (default: the emulator)."""
    group = parser.getgroup("geomx", "geomx: WAN scenarios in tests (docs/ci.md)")
    group.addoption("--runtime", "--geomx-runtime", dest="geomx_runtime", default=None,
                    choices=("emu", "real"),
                    help="runtime of geomx_run / @pytest.mark.wan jobs that do not name one: "
                         "emu (virtual-time emulator, the default) or real (one process per "
                         "node over sockets; with --set real.shaper=kernel in the scenario, "
                         "the kernel shapes the WAN)")


def pytest_configure(config: Any) -> None:
    """Declare the ``wan`` marker and register the fixtures (geomx/testing/plugin.py,
    which imports pytest: it is only loaded inside a pytest session)."""
    from geomx.testing import plugin

    config.addinivalue_line("markers", plugin.WAN_MARKER_DOC)
    if not config.pluginmanager.is_registered(plugin):
        config.pluginmanager.register(plugin, "geomx.testing.plugin")


@dataclasses.dataclass
class PolicyRun:
    """What :func:`run_policy` returns."""

    run_dir: Path
    summary: Summary
    events: list[dict[str, Any]]

    def events_of(self, kind: str) -> list[dict[str, Any]]:
        """The events whose ``ev`` is ``kind``, in log order."""
        return [e for e in self.events if e.get("ev") == kind]


def tiny_scenario(iterations: int = 20) -> dict[str, Any]:
    """The raw scenario :func:`run_policy` runs (a dict as ``tomllib`` returns it)."""
    wan = {"bandwidth": "100Mbps", "latency": "30ms"}
    return {
        "run": {"name": "run_policy", "seed": 1, "iterations": iterations, "eval_every": 5,
                "target_accuracy": 0},
        "dc": [{"name": "central", "central": True, "workers": 0},
               {"name": "party-a", "workers": 2}, {"name": "party-b", "workers": 2}],
        "wan": [{"a": "party-a", "b": "central", **wan}, {"a": "party-b", "b": "central", **wan}],
        "training": {"model": "mlp", "hidden": [16], "dataset": "digits", "batch_size": 32,
                     "optimizer": "adam", "lr": 0.01},
        "metrics": {"plot": False, "trace": False},
    }


def _kind_of(cls: type) -> str:
    from geomx.policy.codec import CodecPolicy
    from geomx.policy.scheduling import TransferScheduler
    from geomx.policy.sync import SyncAlgorithm
    from geomx.policy.topology import Topology

    for kind, base in (("codec", CodecPolicy), ("sync", SyncAlgorithm),
                       ("sched", TransferScheduler), ("topology", Topology)):
        if issubclass(cls, base):
            return kind
    raise TypeError(f"{cls.__name__} is not a policy: subclass geomx.policy.Codec, "
                    "SyncAlgorithm, TransferScheduler or Topology")


def spec_for_class(cls: type) -> str:
    """A spec every node can load ``cls`` by: ``module:Class`` when its module is
    importable by name, else ``/abs/file.py:Class``."""
    from geomx.policy.registry import spec_of

    known = spec_of(cls)
    if known:
        return known
    if "." in cls.__qualname__:
        raise TypeError(f"{cls.__qualname__}: a policy class must be defined at the top level "
                        "of its module (nodes load it by name)")
    module = sys.modules.get(cls.__module__)
    name = cls.__module__
    if module is not None and name != "__main__" and not name.startswith("geomx_user_policy_"):
        return f"{name}:{cls.__qualname__}"
    path = getattr(module, "__file__", None)
    if not path:
        raise TypeError(f"{cls.__qualname__}: its module has no file to load it from")
    return f"{os.path.abspath(path)}:{cls.__qualname__}"


def _absolute(spec: str) -> str:
    where, sep, cls = spec.rpartition(":")
    if sep and where.endswith(".py") and not os.path.isabs(where):
        return f"{os.path.abspath(where)}:{cls}"
    return spec


def run_policy(policy: type | str, options: Mapping[str, Any] | None = None, *,
               kind: str | None = None, scenario: str | os.PathLike[str] | None = None,
               overrides: Sequence[str] = (), iterations: int = 20, runtime: str = "emu",
               out_dir: str | os.PathLike[str] | None = None) -> PolicyRun:
    """Run ``policy`` with ``options`` in a tiny job and return its summary and events.

    ``policy``: a policy class (a top-level class of an importable module or a file), or
    a spec as a scenario names it (``"lab/topk.py:TopK"``, relative to the current
    folder; ``"lab.topk:TopK"``; a built-in name such as ``"bsc"``, to compare against),
    then with ``kind`` (``"codec"``, ``"sync"``, ``"sched"``, ``"topology"``).
    ``scenario``: a scenario file to use instead of the tiny job; ``overrides``:
    ``--set`` style changes (``"wan.0.loss=1%"``). ``out_dir``: where the run folder goes
    (default: a temporary folder, removed when the process exits). Raises
    :class:`geomx.scenario.ScenarioError` for a policy or options the scenario check
    refuses and :class:`geomx.experiment.JobFailed` when the job fails (a hook that
    raised: :class:`geomx.policy.guard.PolicyFailed` names it).
    """
    from geomx.experiment import run_scenario
    from geomx.metrics import load_run
    from geomx.scenario import load_scenario, parse_scenario
    from geomx.scenario.overrides import apply_override
    from geomx.scenario.policies import POLICY_FIELDS

    if isinstance(policy, type):
        kind = kind or _kind_of(policy)
        spec = spec_for_class(policy)
    else:
        if kind is None:
            raise TypeError("run_policy: give kind= ('codec', 'sync', 'sched' or 'topology') "
                            "with a policy spec")
        spec = _absolute(policy)
    field = next((f for f in POLICY_FIELDS if f.kind == kind), None)
    if field is None:
        raise ValueError(f"kind = {kind!r}; allowed: {', '.join(f.kind for f in POLICY_FIELDS)}")
    if scenario is not None:
        base = load_scenario(scenario)
        raw = base.to_dict()
        source = base.source
    else:
        raw, source = tiny_scenario(iterations), "<run_policy>"
    section = dict(raw.get(field.section, {}))
    section[field.key] = spec
    section["options"] = dict(options or {})
    raw[field.section] = section
    for assignment in overrides:
        raw = apply_override(raw, assignment)
    s = parse_scenario(raw, source=source)
    folder = out_dir if out_dir is not None else _temporary_folder()
    result = run_scenario(s, runtime=runtime, out_dir=folder, progress=False)
    events = list(load_run(result.run_dir).events()) if s.metrics.events else []
    return PolicyRun(result.run_dir, result.summary, events)


_TEMP: list[tempfile.TemporaryDirectory[str]] = []


def _temporary_folder() -> str:
    folder = tempfile.TemporaryDirectory(prefix="geomx-run-policy-")
    _TEMP.append(folder)  # removed when the interpreter exits
    return folder.name
