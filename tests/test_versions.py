"""Versions: ``geomx --version``, the changelog that goes with it, and scenario files
that state the schema they were written for (geomx/scenario/schema.py)."""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest

import geomx
from geomx.cli import build_parser, main
from geomx.scenario import ScenarioError, load_scenario, parse_scenario, scenario_to_toml
from geomx.scenario.schema import SCHEMA_VERSION, STEPS

ROOT = Path(__file__).resolve().parents[1]


def test_version_flag_prints_the_release_and_the_schema(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"geomx {geomx.__version__} (scenario schema {SCHEMA_VERSION};")


def test_installed_metadata_is_the_package_version():
    """pyproject.toml reads the version from geomx.__version__: one place to change it."""
    assert importlib.metadata.version("geomx") == geomx.__version__


def test_changelog_has_the_current_release_and_every_schema():
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\]", text, flags=re.M)
    assert releases and releases[0] == geomx.__version__, "CHANGELOG.md's newest release"
    for step in STEPS:
        assert f"schema {step.to}" in text, f"CHANGELOG.md says nothing of scenario schema {step.to}"


def test_every_command_dispatches_through_its_handler():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in sub.choices.items():
        assert callable(parser.get_default("handler")), f"geomx {name} has no handler"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(text)
    return path


OLD_FLAT = '[run]\nname = "old"\n\n[training]\nmode = "flat_ps"\nlr = 0.05\n'


def test_a_schema_1_file_is_converted_as_it_loads(tmp_path):
    s = load_scenario(_write(tmp_path, "schema = 1\n" + OLD_FLAT))
    assert s.topology.kind == "flat" and s.training.lr == 0.05


def test_overrides_of_a_schema_1_file_are_written_in_the_current_schema(tmp_path):
    s = load_scenario(_write(tmp_path, "schema = 1\n" + OLD_FLAT), ["topology.kind=hips"])
    assert s.topology.kind == "hips"


def test_an_old_key_without_a_schema_says_what_to_change(tmp_path):
    with pytest.raises(ScenarioError) as err:
        load_scenario(_write(tmp_path, OLD_FLAT))
    message = str(err.value)
    assert err.value.path == "training.mode"
    assert 'kind = "flat" in [topology]' in message and "`schema = 1`" in message


@pytest.mark.parametrize("stated, words", [
    (SCHEMA_VERSION + 1, f"written for scenario schema {SCHEMA_VERSION + 1}, newer"),
    (0, "there is no scenario schema 0"),
    ('"2"', "expected an integer, got string"),
    ("true", "expected an integer, got boolean"),
])
def test_a_bad_schema_names_the_field_and_the_range(tmp_path, stated, words):
    with pytest.raises(ScenarioError) as err:
        load_scenario(_write(tmp_path, f"schema = {stated}\n[run]\nname = 'x'\n"))
    assert err.value.path == "schema"
    assert words in str(err.value)
    assert f"an integer from 1 to {SCHEMA_VERSION}" in str(err.value)


def test_old_and_new_spelling_together_is_refused(tmp_path):
    text = "schema = 1\n" + OLD_FLAT + '\n[topology]\nkind = "hips"\n'
    with pytest.raises(ScenarioError, match="same setting"):
        load_scenario(_write(tmp_path, text))


def test_the_resolved_file_states_the_current_schema_and_loads_back(tmp_path):
    s = load_scenario(ROOT / "scenarios" / "quickstart.toml")
    text = scenario_to_toml(s)
    data = tomllib.loads(text)
    assert data["schema"] == SCHEMA_VERSION
    assert parse_scenario(data, source=s.source) == s
    assert load_scenario(_write(tmp_path, text)) == parse_scenario(data, source=str(tmp_path / "job.toml"))


def test_geomx_validate_reports_a_bad_schema(tmp_path, capsys):
    path = _write(tmp_path, f"schema = {SCHEMA_VERSION + 5}\n")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"geomx: {path}: schema:") and "Upgrade geomx" in err
