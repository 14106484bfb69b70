"""A scenario names user policies like ``[training] program`` and checks their
``[<kind>.options]`` once at load (geomx/scenario/policies.py); built-in names parse
exactly as before."""

from __future__ import annotations

import tomllib

import pytest

from geomx.cluster import codec_config, plan_job
from geomx.scenario import (ScenarioError, load_scenario, parse_scenario,
                            scenario_to_toml)

from tests.policy.conftest import EXAMPLES


def _write(folder, codec: str, extra: str = "") -> str:
    path = folder / "job.toml"
    path.write_text(f"[run]\niterations = 2\n\n[codec]\n{codec}\n{extra}")
    return str(path)


def test_a_file_next_to_the_scenario_becomes_an_absolute_spec_that_round_trips(lab):
    s = load_scenario(_write(lab, 'type = "boom.py:Boom"', "[codec.options]\nafter = 7\n"))
    assert s.codec.type == f"{lab / 'boom.py'}:Boom"
    assert dict(s.codec.options) == {"after": 7}
    # every node reads the resolved scenario: the spec and the options travel in it
    again = parse_scenario(tomllib.loads(scenario_to_toml(s)), source="<run folder>")
    assert again == s
    assert codec_config(s) == {"type": f"{lab / 'boom.py'}:Boom", "after": 7}
    assert plan_job(s).job.codec == {"type": f"{lab / 'boom.py'}:Boom", "after": 7}


def test_builtin_names_resolve_as_before():
    s = load_scenario(EXAMPLES.parent.parent / "scenarios" / "quickstart.toml",
                      ["codec.type=bsc", "codec.size_lower_bound=1000"])
    assert s.codec.type == "bsc" and s.codec.options == ()
    assert codec_config(s) == {"type": "bsc", "threshold": 0.01, "size_lower_bound": 1000}
    assert "options" not in plan_job(s).job.sync
    assert "[codec.options]" in scenario_to_toml(s)  # every key listed, the table empty


@pytest.mark.parametrize("codec, extra, message", [
    ('type = "broken.py:X"', "", r"job.toml: codec.type: codec policy '.*broken.py:X' failed "
                                 r"to import: ModuleNotFoundError"),
    ('type = "boom.py:NoEncode"', "", r"codec.type: codec policy '.*NoEncode': NoEncode does "
                                      r"not implement encode"),
    ('type = "boom.py:Boom"', "[codec.options]\nafter = \"x\"\n",
     r"codec.options: codec policy '.*boom.py:Boom': codec.options.after = 'x'; allowed: an "
     r"integer$"),
    ('type = "boom.py:Boom"', "[codec.options]\nbefore = 1\n",
     r"codec.options: codec policy '.*boom.py:Boom': unknown option codec.options.before; "
     r"allowed: after$"),
    ('type = "bsc"', "[codec.options]\nratio = 0.1\n",
     r"codec policy 'bsc': unknown option codec.options.ratio; allowed: threshold"),
    ('type = "dgc"', "", r"codec.type: 'dgc' is neither a built-in codec policy nor "
                         r"'file.py:Class'; allowed: one of 'none'"),
    ('type = "boom.py:Boom"', "[codec.options]\nafter = { x = 1 }\n",
     r"codec.options.after: a nested table is not an option value"),
])
def test_bad_policies_and_options_are_one_line_errors(lab, codec, extra, message):
    with pytest.raises(ScenarioError, match=message) as info:
        load_scenario(_write(lab, codec, extra))
    assert "\n" not in str(info.value)


def test_a_builtin_sync_algorithm_refuses_options_of_its_own_table():
    raw = {"sync": {"algorithm": "fsa", "options": {"staleness": 1}}}
    with pytest.raises(ScenarioError, match=r"sync.options.*'fsa'|'fsa'.*sync.options"):
        parse_scenario(raw)


def test_user_sync_algorithm_options_are_checked_at_load(tmp_path):
    spec = f"{EXAMPLES / 'ssp.py'}:BoundedStaleness"
    s = parse_scenario({"sync": {"algorithm": spec, "options": {"staleness": 3}}})
    assert dict(s.sync.options) == {"staleness": 3}
    job = plan_job(s).job  # the nodes build the algorithm from this table
    assert job.sync["algorithm"] == spec and job.sync["options"] == {"staleness": 3}
    with pytest.raises(ScenarioError, match=r"sync.options: sync policy '.*ssp.py:"
                                            r"BoundedStaleness': sync.options: staleness = -1; "
                                            r"allowed: an integer >= 0$"):
        parse_scenario({"sync": {"algorithm": spec, "options": {"staleness": -1}}})
    with pytest.raises(ScenarioError, match=r"unknown option sync.options.bound; allowed: "
                                            r"staleness$"):
        parse_scenario({"sync": {"algorithm": spec, "options": {"bound": 3}}})


def test_set_reaches_one_option_and_is_checked(lab):
    path = _write(lab, 'type = "boom.py:Boom"')
    assert dict(load_scenario(path, ["codec.options.after=9"]).codec.options) == {"after": 9}
    with pytest.raises(ScenarioError, match=r"codec.options.after = 'nine'; allowed: an integer"):
        load_scenario(path, ["codec.options.after=nine"])


NAMELESS = '''
from geomx.policy import Codec


class Nameless(Codec):
    def encode(self, key, x, state=None): ...
    def encoded_sizes(self, n, dtype="<f4"): ...
    @classmethod
    def _decode_cpu(cls, arrays, meta, n, dtype, out, accumulate): ...


class Fp16Again(Nameless):
    name = "fp16"
'''

NO_OPTIONS_INIT = '''
from geomx.sync.fsa import FSA


class NoOptionsInit(FSA):
    name = "no_options_init"

    def __init__(self):
        super().__init__()
'''


@pytest.mark.parametrize("cls, message", [
    ("Nameless", r"Nameless has no name; set the class attribute name"),
    ("Fp16Again", r"Fp16Again.name = 'fp16' is a built-in codec's name"),
])
def test_a_codec_needs_a_name_of_its_own(tmp_path, cls, message):
    """Receivers pick a decoder by the codec's name: none, or a built-in's, is refused at
    load (it used to fail at run time in every node, or silently replace fp16's decoder)."""
    (tmp_path / "codecs.py").write_text(NAMELESS)
    with pytest.raises(ScenarioError, match=message) as info:
        load_scenario(_write(tmp_path, f'type = "codecs.py:{cls}"'))
    assert "\n" not in str(info.value)
    import geomx.codec.fp16
    from geomx.policy.codec import _DECODERS

    assert _DECODERS["fp16"] is geomx.codec.fp16.FP16Codec  # the built-in's decoder stays


def test_a_policy_whose_constructor_cannot_take_its_options_is_refused_at_load(tmp_path):
    (tmp_path / "algo.py").write_text(NO_OPTIONS_INIT)
    with pytest.raises(ScenarioError, match=r"sync.algorithm: sync policy '.*algo.py:"
                                            r"NoOptionsInit': NoOptionsInit\(NoOptions\(\.\.\.\)\)"
                                            r" raised TypeError") as info:
        parse_scenario({"sync": {"algorithm": f"{tmp_path / 'algo.py'}:NoOptionsInit"}})
    assert "\n" not in str(info.value)
