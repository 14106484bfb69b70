"""Run a scenario file from a test and get its figures back: :func:`run_job`, the work
behind the pytest plugin's ``geomx_run`` fixture and ``wan`` marker (docs/ci.md).

It runs the job as ``geomx run`` does (the same scenario checks, the same node code, the
same run folder) with progress off and the run folder where the caller says, then checks
the scenario's ``[expect]`` table and any further expectations
(:mod:`geomx.expect`), and returns a :class:`RunSummary`: ``summary.json``'s figures as
typed attributes, plus the run folder.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from geomx.expect import (ExpectationError, Outcome, check_expectations, format_outcome,
                          lookup, parse_expectation)
from geomx.metrics.summary import Summary

__all__ = ["RunSummary", "ExpectationFailed", "run_job", "override_list", "program_spec"]


class ExpectationFailed(AssertionError):
    """Expectations that did not hold; the message has one line per failed one, with the
    measured value (an AssertionError, so pytest reports it as a test failure).
    ``summary`` is the run's :class:`RunSummary` when a run was checked."""

    summary: RunSummary | None = None


@dataclass
class RunSummary(Summary):
    """A finished run's ``summary.json`` (every field of :class:`Summary`, typed) and its
    run folder, ``run_dir``."""

    run_dir: Path | None = None

    def figure(self, name: str) -> Any:
        """A figure by the name an expectation uses: ``"bytes_wan"``,
        ``"bytes_per_dc_pair.party-a->central"``, ``"extra.final_eval.loss"``."""
        present, value = lookup(self.to_dict(), name)
        if not present:
            raise KeyError(f"no figure {name!r} in {self.run_dir}/summary.json")
        return value

    def check(self, *expectations: str) -> list[Outcome]:
        """Each ``"FIGURE OP VALUE"`` against this run (see :mod:`geomx.expect`)."""
        return check_expectations([parse_expectation(e) for e in expectations],
                                  self.to_dict())

    def expect(self, *expectations: str) -> None:
        """Raise :class:`ExpectationFailed` unless every expectation holds."""
        __tracebackhide__ = True
        _raise_if_failed(self.check(*expectations))

    def to_dict(self) -> dict[str, Any]:
        """summary.json's fields (without ``run_dir``)."""
        data = dataclasses.asdict(self)
        data.pop("run_dir")
        return data


def _raise_if_failed(outcomes: Iterable[Outcome]) -> None:
    __tracebackhide__ = True  # pytest shows the caller's line, then the failed figures
    failed = [format_outcome(o) for o in outcomes if not o.held]
    if failed:
        raise ExpectationFailed("geomx expectations failed:\n" + "\n".join(failed))


def override_list(values: Mapping[str, Any] | Sequence[str] | None) -> list[str]:
    """``--set`` assignments from ``{"wan.0.loss": "1%", "training.lr": 0.05}`` (a value
    that is not a string is written as JSON/TOML would: ``true``, ``[32, 16]``) or a list
    of ``"key=value"`` texts."""
    if values is None:
        return []
    if isinstance(values, Mapping):
        return [f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in values.items()]
    if isinstance(values, str):
        raise TypeError("set=: give a dict {'wan.0.loss': '1%'} or a list of 'key=value' texts")
    return list(values)


def program_spec(program: Any) -> str:
    """A training program as the scenario's ``[training] program`` names it: a
    module-level function object (``async def main(kv, ctx)`` in a test file) becomes
    ``/abs/file.py:main``; a text is kept."""
    if isinstance(program, str):
        return program
    import inspect

    if not callable(program) or "." in getattr(program, "__qualname__", "."):
        raise TypeError(f"program={program!r}: give a top-level function of a file "
                        "(`async def main(kv, ctx)`) or 'file.py:fn'")
    return f"{os.path.abspath(inspect.getfile(program))}:{program.__name__}"


def run_job(scenario: str | os.PathLike[str], *, set: Mapping[str, Any] | Sequence[str] | None = None,
            runtime: str = "emu", expect: Sequence[str] = (), program: Any = None,
            out_dir: str | os.PathLike[str]) -> RunSummary:
    """Run ``scenario`` (a file) with ``set`` overrides on ``runtime`` (``"emu"`` or
    ``"real"``), its run folder under ``out_dir``; with ``program``, that training program
    instead of the scenario's. Raises :class:`geomx.scenario.ScenarioError` for a bad
    scenario or override, :class:`geomx.expect.ExpectationError` for an expectation that
    cannot be read (before running), :class:`geomx.experiment.JobFailed` when the job
    fails, and :class:`ExpectationFailed` when an expectation (the scenario's ``[expect]``
    or ``expect``) does not hold."""
    __tracebackhide__ = True
    from geomx.experiment import run_scenario
    from geomx.scenario import load_scenario

    if runtime not in ("emu", "real"):
        raise ValueError(f"runtime={runtime!r}; allowed: 'emu', 'real'")
    overrides = override_list(set)
    if program is not None:
        overrides.append(f"training.program={json.dumps(program_spec(program))}")
    s = load_scenario(scenario, overrides)
    checks = s.expect.expectations()
    for text in expect:
        try:
            checks.append(parse_expectation(text))
        except ExpectationError as e:
            raise ExpectationError(f"expect={text!r}: {e}") from None
    result = run_scenario(s, runtime=runtime, out_dir=os.fspath(out_dir), progress=False)
    fields = result.summary.to_dict()
    summary = RunSummary(**fields, run_dir=Path(result.run_dir))
    try:
        _raise_if_failed(check_expectations(checks, fields))
    except ExpectationFailed as e:
        e.summary = summary
        raise
    return summary
