"""``[netstorm]`` holds every setting of the netstorm and mlnet topologies (the route rule,
probe timing and auxiliary-route count included); ``[topology.options]`` is refused for
them, and a scenario schema 2 file that used it is converted with the meaning it had
(geomx/scenario/netstorm.py, docs/scenario.md "Schema versions")."""

from __future__ import annotations

import dataclasses
import tomllib

import pytest

from geomx.cluster import plan_job, scenario_topology
from geomx.scenario import ScenarioError, load_scenario, scenario_to_toml
from geomx.scenario.kinds import setting_by_key
from geomx.scenario.netstorm import SECTION_OPTION_KEYS, NetstormConfig
from geomx.topology import topology_class
from tests.helpers.paths import ROOT

IDLE = ROOT / "scenarios" / "netstorm_idle_paths.toml"


@pytest.mark.parametrize("kind", sorted(SECTION_OPTION_KEYS))
def test_every_option_of_the_kind_is_a_netstorm_key_and_reaches_the_topology(kind):
    keys = SECTION_OPTION_KEYS[kind]
    fields = {f.name: f for f in dataclasses.fields(topology_class(kind).Options)}
    assert set(keys) == set(fields)
    table = setting_by_key(NetstormConfig)
    assert set(keys.values()) <= set(table)
    # a value other than the default for every option arrives in the topology's options
    other = {"roots": 2, "dynamic_roots": True, "multipath": False, "cost": "latency",
             "awareness": False, "max_aux": 1, "aux_rule": "queue", "probe_after_s": 3.0,
             "fan_in": 2}
    assert all(other[f] != fields[f].default for f in keys)
    sets = [f"topology.kind={kind}"] + [
        f"netstorm.{key}={str(other[f]).lower() if isinstance(other[f], bool) else other[f]}"
        for f, key in keys.items()]
    s = load_scenario(IDLE, sets)
    options = scenario_topology(s).options
    assert {f: getattr(options, f) for f in keys} == {f: other[f] for f in keys}
    # and in what every mesh node builds its own topology object from
    assert plan_job(s).job.mesh["topology_options"] == {f: other[f] for f in keys}


@pytest.mark.parametrize("assignment, words", [
    ("netstorm.aux_rule=queu", "one of 'arrival', 'queue'"),
    ("netstorm.probe_after=-1s", ">= 0s"),
    ("netstorm.max_aux=65", "an integer in [0, 64]"),
])
def test_a_wrong_value_names_the_field_and_the_allowed_range(assignment, words):
    with pytest.raises(ScenarioError) as err:
        load_scenario(IDLE, [assignment])
    assert err.value.path == assignment.split("=")[0]
    assert words in str(err.value)


@pytest.mark.parametrize("assignment, path, words", [
    ("topology.options.aux_rule=queue", "topology.options.aux_rule",
     'write aux_rule = "queue" in [netstorm]'),
    ("topology.options.probe_after_s=0", "topology.options.probe_after_s",
     "write probe_after = 0 in [netstorm]"),
    ("topology.options.hub=a", "topology.options.hub", "allowed: aux_rule, awareness"),
])
def test_topology_options_of_netstorm_are_refused_naming_the_new_key(assignment, path,
                                                                     words):
    with pytest.raises(ScenarioError) as err:
        load_scenario(IDLE, [assignment])
    assert err.value.path == path
    assert words in str(err.value)
    # an option the kind had is one a schema 2 file may hold: converting it is offered
    assert ("`schema = 2`" in str(err.value)) == ("hub" not in assignment)


def test_topology_options_of_mlnet_are_refused_naming_its_key():
    with pytest.raises(ScenarioError, match=r"mlnet_fan_in = 2 in \[netstorm\]"):
        load_scenario(IDLE, ["topology.kind=mlnet", "topology.options.fan_in=2"])


def _schema_2_file(tmp_path, options: str, netstorm: str = "") -> object:
    text = IDLE.read_text().replace('[topology]\nkind = "netstorm"\n',
                                    f'[topology]\nkind = "netstorm"\n\n[topology.options]\n'
                                    f'{options}\n')
    text = text.replace("[netstorm]\n", f"[netstorm]\n{netstorm}")
    path = tmp_path / "old.toml"
    path.write_text("schema = 2\n" + text)
    return path


def test_a_schema_2_file_is_converted_with_the_meaning_it_had(tmp_path):
    # under schema 2 the options replaced [netstorm]'s planning settings: multipath took
    # its default (on) although the section said false
    path = _schema_2_file(tmp_path, 'aux_rule = "queue"\nprobe_after_s = 0\n',
                          "multipath = false\n")
    s = load_scenario(path)
    assert (s.netstorm.aux_rule, s.netstorm.probe_after_s, s.netstorm.multipath) == \
        ("queue", 0.0, True)
    assert s.topology.options == ()
    resolved = tomllib.loads(scenario_to_toml(s))
    assert resolved["schema"] == 3 and resolved["netstorm"]["probe_after"] == "0s"
    assert "options" not in resolved["topology"] or not resolved["topology"]["options"]
    # overrides are in the current schema: the old spelling is refused there too
    with pytest.raises(ScenarioError, match="has moved to netstorm.max_aux"):
        load_scenario(path, ["topology.options.max_aux=1"])


def test_a_schema_2_file_with_both_spellings_is_refused(tmp_path):
    path = _schema_2_file(tmp_path, 'aux_rule = "queue"\n', 'aux_rule = "arrival"\n')
    with pytest.raises(ScenarioError, match="same setting") as err:
        load_scenario(path)
    assert err.value.path == "topology.options.aux_rule"


def test_a_user_topology_still_takes_its_options():
    s = load_scenario(ROOT / "examples" / "policies" / "ring.toml")
    assert s.topology.options
