"""geomx.scenario: TOML -> validated dataclasses, errors a person can act on, overrides,
a resolved TOML that reads back equal, and a reference doc that lists every field."""

import dataclasses
import tomllib
from pathlib import Path

import pytest

from geomx import scenario as sc
from geomx.scenario.command import main as scenario_main
from geomx.scenario import (
    DCConfig,
    Scenario,
    ScenarioError,
    WanConfig,
    apply_override,
    load_scenario,
    override_scenario,
    parse_scenario,
    reference_markdown,
    scenario_to_dict,
    scenario_to_toml,
    sections,
    settings_of,
)

from tests.helpers.paths import ROOT

DOC = ROOT / "docs" / "scenario.md"


def topology(**extra):
    """A small valid raw scenario: central + two parties, each linked to the centre."""
    raw = {
        "dc": [
            {"name": "central", "central": True, "global_servers": 2},
            {"name": "party-a", "workers": 3},
            {"name": "party-b"},
        ],
        "wan": [
            {"a": "party-a", "b": "central"},
            {"a": "party-b", "b": "central", "bandwidth": "1Gbps"},
        ],
    }
    raw.update(extra)
    return raw


def error_of(raw, source="<string>"):
    with pytest.raises(ScenarioError) as info:
        parse_scenario(raw, source=source)
    return info.value


# ------------------------------------------------------------------ defaults and units

def test_empty_scenario_is_the_default_scenario_with_every_default_filled():
    s = parse_scenario({})
    assert s == Scenario()
    assert s.run.iterations == 100 and s.run.runtime == "emu" and s.run.progress is True
    assert s.network.tcp_window_bytes == 4 * 2**20 and s.network.mss_bytes == 1460
    assert [dc.name for dc in s.dcs] == ["central", "party-a", "party-b"]
    assert s.central_dc.workers == 0 and s.central_dc.global_servers == 1
    assert all(dc.workers == 2 for dc in s.party_dcs)
    wan = s.wans[0]
    assert (wan.bandwidth_bps, wan.bandwidth_ba_bps, wan.latency_s, wan.loss, wan.jitter_s) == (1e8, None, 0.03, 0.0, 0.0)
    assert (wan.trace, wan.trace_low_bps, wan.trace_high_bps, wan.trace_period_s) == ("", 20e6, 155e6, 180.0)
    assert s.training.model == "mlp" and s.training.hidden == (64,) and s.training.optimizer == "adam"
    assert s.sync.algorithm == "auto" and s.sync.resolved_algorithm == "fsa" and s.sync.esync_epsilon_s == 0.0
    assert s.codec.type == "none" and s.codec.threshold == 0.01 and s.codec.size_lower_bound == 200_000
    assert s.sched.bigarray_bound == 1_000_000
    assert s.metrics.events and s.metrics.trace and s.metrics.plot


def test_units_are_converted_into_unit_named_fields():
    raw = topology()
    raw["dc"][1].update(lan_bandwidth="25Gbps", lan_latency="0.1 ms", compute_per_iter="2.5ms",
                        heterogeneity=2, worker_slowdown=[1, 10.0])
    raw["wan"][0].update(bandwidth="12.5MB/s", bandwidth_ba="50Mbps", latency="80ms", loss="0.5%",
                         jitter="2ms", trace="uniform", trace_low="10Mbps", trace_high="1Gbps", trace_period="1min")
    raw["network"] = {"tcp_window": "64KiB", "mss": "9000B"}
    raw["run"] = {"max_emulated_time": "2min", "max_wall_time": 30, "target_accuracy": "90%"}
    raw["training"] = {"model": "phantom", "phantom_params": "25.6M"}
    s = parse_scenario(raw)
    a = s.dc("party-a")
    assert (a.lan_bandwidth_bps, a.lan_latency_s, a.compute_s_per_iter) == (25e9, 0.0001, 0.0025)
    assert a.heterogeneity == 2.0 and a.worker_slowdown == (1.0, 10.0)
    assert a.worker_compute_s(1) == pytest.approx(0.05) and a.worker_compute_s(2) == pytest.approx(0.005)
    w = s.wans[0]
    assert (w.bandwidth_bps, w.bandwidth_ba_bps, w.latency_s, w.loss, w.jitter_s) == (1e8, 50e6, 0.08, 0.005, 0.002)
    assert w.capacity_bps("party-a", "central") == 1e8 and w.capacity_bps("central", "party-a") == 50e6
    assert s.wans[1].capacity_bps("central", "party-b") == 1e9  # symmetric without bandwidth_ba
    assert (w.trace_low_bps, w.trace_high_bps, w.trace_period_s) == (10e6, 1e9, 60.0)
    assert (s.network.tcp_window_bytes, s.network.mss_bytes) == (65536, 9000)
    assert (s.run.max_emulated_time_s, s.run.max_wall_time_s, s.run.target_accuracy) == (120.0, 30.0, 0.9)
    assert s.training.phantom_params == 25_600_000


def test_convenience_properties():
    s = parse_scenario(topology())
    assert s.central_dc.name == "central" and s.central_dc.global_servers == 2
    assert [dc.name for dc in s.party_dcs] == ["party-a", "party-b"]
    assert s.num_all_workers == 5
    assert s.dc("party-b").workers == 2
    with pytest.raises(KeyError, match="party-a"):
        s.dc("nowhere")
    assert s.wan_between("central", "party-b") is s.wans[1]
    assert s.wan_between("party-a", "party-b") is None
    assert s.training.effective_worker_lr == s.training.lr


def test_scenario_is_frozen_and_hashable():
    s = parse_scenario(topology())
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.run.seed = 3
    assert hash(s) == hash(parse_scenario(topology()))


def test_every_section_field_is_in_the_field_table():
    for spec in sections():
        declared = {f.name for f in dataclasses.fields(spec.cls)}
        assert declared == {row.attr for row in settings_of(spec.cls)}, spec.key


# ------------------------------------------------------------------ validation errors

def test_bad_enum_names_field_allowed_values_and_suggestion():
    err = error_of({"training": {"model": "mpl"}}, source="x.toml")
    assert isinstance(err, ValueError)
    assert err.path == "training.model" and err.value == "mpl"
    msg = str(err)
    assert msg.startswith("x.toml: training.model:")
    assert "'mpl'" in msg and "did you mean 'mlp'" in msg
    for option in ("'softmax'", "'mlp'", "'cnn'", "'phantom'"):
        assert option in msg


def test_unknown_key_suggests_the_closest_and_lists_allowed_keys():
    msg = str(error_of({"training": {"lrr": 0.1}}))
    assert "training" in msg and "unknown key 'lrr'" in msg and "did you mean 'lr'" in msg
    assert "allowed keys:" in msg and "batch_size" in msg and "worker_optimizer" in msg


def test_unknown_key_in_an_array_item_names_the_item():
    raw = topology()
    raw["wan"][1]["latncy"] = "3ms"
    err = error_of(raw)
    assert err.path == "wan[1]" and "did you mean 'latency'" in str(err)


def test_unknown_section_suggests_the_closest():
    msg = str(error_of({"trainig": {}}))
    assert "unknown section [trainig]" in msg and "did you mean 'training'" in msg
    assert "allowed sections: run, network, dc, wan, topology, netstorm, training, sync, codec, sched, metrics" in msg


@pytest.mark.parametrize("section, key, value, expected", [
    ("run", "seed", "seven", "expected integer, got string 'seven'"),
    ("run", "progress", "yes", "expected boolean, got string 'yes'"),
    ("training", "lr", "fast", "expected float, got string 'fast'"),
    ("training", "hidden", 64, "expected list of integer, got integer 64"),
    ("training", "model", 3, "expected enum, got integer 3"),
    ("run", "iterations", True, "expected count, got boolean true"),
])
def test_wrong_type_names_field_and_expected_type(section, key, value, expected):
    err = error_of({section: {key: value}})
    assert err.path == f"{section}.{key}"
    assert expected in str(err) and "allowed:" in str(err)


def test_list_item_error_names_the_element():
    err = error_of({"training": {"hidden": [64, 0]}})
    assert err.path == "training.hidden[1]" and ">= 1" in str(err)


def test_negative_bandwidth_names_the_wan_field():
    raw = topology()
    raw["wan"][0]["bandwidth"] = "-5Mbps"
    err = error_of(raw)
    assert err.path == "wan[0].bandwidth"
    msg = str(err)
    assert "wan[0].bandwidth" in msg and "'-5Mbps'" in msg and "negative" in msg and "100Mbps" in msg


def test_zero_bandwidth_is_out_of_range():
    raw = topology()
    raw["wan"][1]["bandwidth"] = 0
    assert "> 0bps" in str(error_of(raw))


def test_bad_unit_suggests_the_closest():
    raw = topology()
    raw["wan"][0]["latency"] = "30 msec2"
    assert "wan[0].latency" in str(error_of(raw))
    raw["wan"][0]["latency"] = "30mss"
    assert "did you mean 'ms'" in str(error_of(raw))


@pytest.mark.parametrize("section, key, value, words", [
    ("wan", "loss", "100%", ["wan[0].loss", "[0%, 100%)"]),
    ("codec", "threshold", 0, ["codec.threshold", "(0%, 100%)"]),
    ("codec", "threshold", 1.5, ["codec.threshold"]),
    ("training", "momentum", 1.0, ["training.momentum", "in [0, 1)"]),
    ("sync", "k1", 0, ["sync.k1", ">= 1"]),
    ("sync", "esync_epsilon", "-1s", ["sync.esync_epsilon"]),
    ("dc", "heterogeneity", 0, ["dc[1].heterogeneity", "> 0"]),
    ("run", "name", "my run", ["run.name", "letters, digits"]),
])
def test_out_of_range_values_name_field_and_range(section, key, value, words):
    raw = topology()
    if section == "wan":
        raw["wan"][0][key] = value
    elif section == "dc":
        raw["dc"][1][key] = value
    else:
        raw[section] = {key: value}
    msg = str(error_of(raw))
    for word in words:
        assert word in msg


def test_unknown_wan_endpoint_lists_dc_names():
    raw = topology()
    raw["wan"][1]["a"] = "party-c"
    err = error_of(raw)
    assert err.path == "wan[1].a"
    msg = str(err)
    assert "unknown DC 'party-c'" in msg and "'central', 'party-a', 'party-b'" in msg
    assert "did you mean" in msg


def test_two_central_dcs():
    raw = topology()
    raw["dc"][2].update(central=True, workers=0)
    err = error_of(raw)
    assert err.path == "dc[2].central"
    assert "two central DCs" in str(err) and "'central'" in str(err) and "'party-b'" in str(err)
    assert "exactly one" in str(err)


def test_missing_central_dc():
    raw = topology()
    raw["dc"][0]["central"] = False
    err = error_of(raw)
    assert err.path == "dc" and "no central DC" in str(err) and "central = true" in str(err)


def test_duplicate_dc_names():
    raw = topology()
    raw["dc"][2]["name"] = "party-a"
    raw["wan"].pop()
    err = error_of(raw)
    assert err.path == "dc[2].name" and "duplicate DC name 'party-a'" in str(err)


def test_dc_name_is_required():
    raw = topology()
    del raw["dc"][1]["name"]
    err = error_of(raw)
    assert err.path == "dc[1]" and "missing required key 'name'" in str(err)


def test_party_dc_needs_workers_and_central_dc_none():
    raw = topology()
    raw["dc"][1]["workers"] = 0
    err = error_of(raw)
    assert err.path == "dc[1].workers" and ">= 1" in str(err)
    raw = topology()
    raw["dc"][0]["workers"] = 2
    err = error_of(raw)
    assert err.path == "dc[0].workers" and "not supported yet" in str(err)


def test_global_servers_only_on_the_central_dc():
    raw = topology()
    raw["dc"][1]["global_servers"] = 3
    assert error_of(raw).path == "dc[1].global_servers"


def test_only_a_central_dc_is_not_enough():
    err = error_of({"dc": [{"name": "c", "central": True}], "wan": []})
    assert "at least one non-central DC" in str(err)


def test_worker_slowdown_longer_than_workers():
    raw = topology()
    raw["dc"][2]["worker_slowdown"] = [1.0, 2.0, 3.0]
    err = error_of(raw)
    assert err.path == "dc[2].worker_slowdown" and "3 entries" in str(err) and "2 workers" in str(err)


def test_wan_graph_must_reach_the_central_dc():
    raw = topology()
    raw["wan"][1] = {"a": "party-b", "b": "party-a"}  # via party-a: fine
    parse_scenario(raw)
    raw["wan"].pop(0)  # now party-a and party-b only see each other
    err = error_of(raw)
    assert err.path == "wan" and "not connected to the central DC 'central'" in str(err)
    err = error_of({"dc": topology()["dc"]})  # own DCs, no links at all
    assert "party-a" in str(err) and "[[wan]]" in str(err)


def test_wan_link_must_join_two_distinct_dcs_once():
    raw = topology()
    raw["wan"][0]["b"] = "party-a"
    assert error_of(raw).path == "wan[0].b"
    raw = topology()
    raw["wan"].append({"a": "central", "b": "party-a"})
    err = error_of(raw)
    assert err.path == "wan[2]" and "second link" in str(err) and "bandwidth_ba" in str(err)


def test_trace_checks():
    raw = topology()
    raw["wan"][0].update(trace="uniform", trace_low="200Mbps", trace_high="100Mbps")
    assert "trace_low <= trace_high" in str(error_of(raw))
    raw = topology()
    raw["wan"][0]["trace"] = "no/such/trace.csv"
    err = error_of(raw)
    assert err.path == "wan[0].trace" and "not found" in str(err) and "uniform" in str(err)


def test_array_and_table_shapes_are_checked():
    assert "[[dc]]" in str(error_of({"dc": {"name": "x"}}))
    assert "[run]" in str(error_of({"run": [{}]}))
    assert "expected a table" in str(error_of({"sync": 3}))


def test_stop_condition_required():
    err = error_of({"run": {"iterations": 0}})
    assert err.path == "run.iterations" and "never end" in str(err)
    parse_scenario({"run": {"iterations": 0, "max_emulated_time": "10min"}})
    with pytest.raises(ScenarioError, match="never end"):  # emulated time means nothing for real runs
        parse_scenario({"run": {"iterations": 0, "max_emulated_time": "10min", "runtime": "real"}})


def test_algorithm_and_model_specific_rules():
    assert "exactly one of phantom_params" in str(error_of({"training": {"model": "phantom"}}))
    both = {"training": {"model": "phantom", "phantom_params": "1M", "phantom_preset": "vgg16"}}
    assert "set only one" in str(error_of(both))
    parse_scenario({"training": {"model": "phantom", "phantom_layers": ["1M", 4096, 10]}})
    real = {"run": {"runtime": "real"}, "training": {"model": "phantom", "phantom_preset": "resnet50"}}
    assert error_of(real).path == "training.model"
    assert error_of({"training": {"model": "cnn", "dataset": "synthetic"}}).path == "training.dataset"
    err = error_of({"topology": {"kind": "flat"}, "sync": {"algorithm": "hfa"}})
    assert err.path == "sync.algorithm" and "'fsa', 'mixed'" in str(err)
    parse_scenario({"topology": {"kind": "flat"}, "sync": {"algorithm": "mixed"}})
    err = error_of({"training": {"worker_optimizer": "dcasgd"}})
    assert err.path == "training.worker_optimizer" and "'nesterov'" in str(err)


# ------------------------------------------------------------------ non-finite numbers

def _linked(**wan):
    return {"dc": [{"name": "c", "central": True}, {"name": "p"}], "wan": [{"a": "p", "b": "c", **wan}]}


@pytest.mark.parametrize("raw, path, allowed", [
    # Integer
    ({"run": {"seed": float("inf")}}, "run.seed", "an integer >= 0"),
    ({"run": {"seed": float("nan")}}, "run.seed", "an integer >= 0"),
    # Integer with counts ("1e999" is a whole number, just not a finite one)
    ({"training": {"model": "phantom", "phantom_params": "1e999"}}, "training.phantom_params",
     "an integer >= 0"),
    # Real, alone and inside a list
    ({"training": {"lr": float("inf")}}, "training.lr", "a number > 0"),
    ({"training": {"lr": float("nan")}}, "training.lr", "a number > 0"),
    ({"training": {"dirichlet_alpha": float("-inf")}}, "training.dirichlet_alpha", "a number > 0"),
    ({"dc": [{"name": "c", "central": True}, {"name": "p", "worker_slowdown": [1.0, float("inf")]}],
      "wan": [{"a": "p", "b": "c"}]}, "dc[1].worker_slowdown[1]", "a number > 0"),
    # Bandwidth
    (_linked(bandwidth="1e999Mbps"), "wan[0].bandwidth", "> 0bps"),
    (_linked(bandwidth=float("inf")), "wan[0].bandwidth", "> 0bps"),
    (_linked(bandwidth=float("nan")), "wan[0].bandwidth", "> 0bps"),
    # Duration
    ({"run": {"max_wall_time": "1e999s"}}, "run.max_wall_time", ">= 0s"),
    ({"run": {"max_wall_time": float("inf")}}, "run.max_wall_time", ">= 0s"),
    (_linked(latency=float("nan")), "wan[0].latency", ">= 0s"),
    # Fraction
    (_linked(loss=float("nan")), "wan[0].loss", "in [0%, 100%)"),
    (_linked(loss=float("inf")), "wan[0].loss", "in [0%, 100%)"),
    ({"codec": {"threshold": float("nan")}}, "codec.threshold", "in (0%, 100%)"),
    # Size
    ({"network": {"tcp_window": "1e999MiB"}}, "network.tcp_window", "in (0B, 1GiB]"),
    ({"network": {"tcp_window": float("inf")}}, "network.tcp_window", "in (0B, 1GiB]"),
    ({"network": {"mss": float("nan")}}, "network.mss", "in (0B, 65535B]"),
])
def test_non_finite_numbers_are_refused_naming_field_value_and_range(raw, path, allowed):
    err = error_of(raw)
    assert err.path == path
    text = str(err)
    assert "not a finite number" in text and allowed in text and allowed in err.allowed
    assert err.value is _value_at(raw, path)  # the value as written (nan != nan, so by identity)


def _value_at(raw, path):
    """The raw value at a field path like ``dc[1].worker_slowdown[1]``."""
    node = raw
    for part in path.replace("]", "").replace("[", ".").split("."):
        node = node[int(part)] if part.isdigit() else node[part]
    return node


def test_non_finite_numbers_are_refused_in_files_and_overrides(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text("[run]\nmax_wall_time = inf\n")
    with pytest.raises(ScenarioError, match=r"s.toml: run.max_wall_time: inf is not a finite number"):
        load_scenario(f)
    f.write_text("[training]\nlr = nan\n")
    with pytest.raises(ScenarioError, match=r"training.lr: nan is not a finite number; allowed: a number > 0"):
        load_scenario(f)
    with pytest.raises(ScenarioError, match=r"sync.esync_epsilon: '1e999s' is not a finite number"):
        override_scenario(Scenario(), ["sync.esync_epsilon=1e999s"])


# ------------------------------------------------------------------ moved keys

def test_training_mode_is_refused_with_where_it_moved():
    err = error_of({"training": {"mode": "flat_ps"}})
    assert err.path == "training.mode" and err.value == "flat_ps"
    assert 'moved to topology.kind' in str(err) and 'kind = "flat" in [topology]' in str(err)
    with pytest.raises(ScenarioError, match=r'training.mode has moved to topology.kind.*kind = "hips"'):
        apply_override({}, "training.mode=hips")


def test_topology_kind_chooses_the_planner():
    assert Scenario().topology.kind == "hips"
    assert parse_scenario({"topology": {"kind": "flat"}}).topology.kind == "flat"
    err = error_of({"topology": {"kind": "flat_ps"}})
    assert err.path == "topology.kind" and "did you mean 'flat'" in str(err)


# ------------------------------------------------------------------ overrides

def test_override_scalar_parses_toml_values():
    raw = apply_override({}, "training.lr=0.05")
    assert raw == {"training": {"lr": 0.05}}
    assert apply_override({}, "run.progress=false")["run"]["progress"] is False
    assert apply_override({}, "training.hidden=[128, 64]")["training"]["hidden"] == [128, 64]
    assert parse_scenario(apply_override({}, "sync.k1 = 5")).sync.k1 == 5


def test_override_falls_back_to_bare_strings():
    raw = apply_override({}, "sync.algorithm=mixed")
    assert raw["sync"]["algorithm"] == "mixed"
    raw = apply_override(topology(), "wan.0.bandwidth=1Gbps")
    assert parse_scenario(raw).wans[0].bandwidth_bps == 1e9
    raw = apply_override({}, "training.data_path=")
    assert raw["training"]["data_path"] == ""
    # a string setting keeps the text even when it would read as a number
    assert apply_override({}, "run.name=2024")["run"]["name"] == "2024"
    assert apply_override({}, "dc.1.host=10.0.0.7")["dc"][1]["host"] == "10.0.0.7"


def test_override_does_not_mutate_its_input():
    raw = topology()
    before = repr(raw)
    apply_override(raw, "dc.1.workers=7")
    assert repr(raw) == before


def test_override_nested_and_list_items_by_index_and_name():
    raw = topology()
    raw = apply_override(raw, "dc.1.workers=4")
    raw = apply_override(raw, "dc.party-b.worker_slowdown=[1.0, 10.0]")
    raw = apply_override(raw, "dc[0].global_servers=3")
    raw = apply_override(raw, "wan.central:party-b.loss=1%")
    raw = apply_override(raw, "wan[0].latency=5ms")
    s = parse_scenario(raw)
    assert s.dc("party-a").workers == 4
    assert s.dc("party-b").worker_slowdown == (1.0, 10.0)
    assert s.central_dc.global_servers == 3
    assert s.wans[1].loss == 0.01 and s.wans[0].latency_s == 0.005


def test_override_on_the_default_topology_makes_it_explicit():
    raw = apply_override({}, "dc.party-a.workers=4")
    s = parse_scenario(raw)
    assert s.dc("party-a").workers == 4
    assert s.wans == Scenario().wans
    s = parse_scenario(apply_override({}, "wan.1.bandwidth=10Mbps"))
    assert s.wans[1].bandwidth_bps == 10e6 and s.dcs == Scenario().dcs


@pytest.mark.parametrize("assignment, words", [
    ("training.lrr=0.1", ["training.lrr", "unknown key 'lrr'", "did you mean 'lr'", "allowed keys in [training]", "batch_size"]),
    ("trainig.lr=0.1", ["unknown section 'trainig'", "did you mean 'training'", "allowed sections"]),
    ("dc.party-aa.workers=1", ["no DC named 'party-aa'", "did you mean 'party-a'", "'central'"]),
    ("dc.9.workers=1", ["index 9 is out of range", "0..2"]),
    ("dc.1.wrokers=1", ["did you mean 'workers'", "lan_bandwidth"]),
    ("dc.workers=1", ["dc.INDEX_OR_NAME.KEY"]),
    ("training=1", ["training.KEY"]),
    ("wan.a:b.loss=1%", ["no link 'a:b'", "'party-a:central'"]),
    ("training.lr", ["PATH=VALUE"]),
])
def test_override_unknown_path_names_it_and_the_allowed_keys(assignment, words):
    with pytest.raises(ScenarioError) as info:
        apply_override(topology(), assignment)
    msg = str(info.value)
    assert msg.startswith(f"--set {assignment}")
    for word in words:
        assert word in msg


def test_override_scenario_returns_a_new_validated_scenario():
    s = parse_scenario(topology())
    t = override_scenario(s, ["training.lr=0.2", "dc.party-a.workers=1"])
    assert t.training.lr == 0.2 and t.dc("party-a").workers == 1 and s.training.lr == 0.01
    with pytest.raises(ScenarioError, match="training.optimizer"):
        override_scenario(s, ["training.optimizer=adamw"])


# ------------------------------------------------------------------ files and round trip

def test_load_scenario_with_overrides_and_relative_trace(tmp_path):
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "bw.csv").write_text("0,100Mbps\n10,20Mbps\n")
    path = tmp_path / "x.toml"
    path.write_text(
        '[run]\nname = "demo"\n\n'
        '[[dc]]\nname = "hq"\ncentral = true\n\n[[dc]]\nname = "edge"\nworkers = 1\n\n'
        '[[wan]]\na = "edge"\nb = "hq"\ntrace = "traces/bw.csv"\n')
    s = load_scenario(path, ["run.seed=9"])
    assert s.run.name == "demo" and s.run.seed == 9 and s.source == str(path)
    assert Path(s.wans[0].trace) == (tmp_path / "traces" / "bw.csv").resolve()
    again = parse_scenario(tomllib.loads(scenario_to_toml(s)))
    assert again == s


def test_load_scenario_errors_name_the_file(tmp_path):
    with pytest.raises(ScenarioError, match="not found"):
        load_scenario(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[run\n")
    with pytest.raises(ScenarioError, match="bad.toml: not valid TOML"):
        load_scenario(bad)
    typo = tmp_path / "typo.toml"
    typo.write_text('[sync]\nalgorithm = "hfaa"\n')
    with pytest.raises(ScenarioError) as info:
        load_scenario(typo)
    assert str(info.value).startswith(f"{typo}: sync.algorithm: 'hfaa'")


def rich_scenario():
    raw = topology()
    raw["run"] = {"name": "rich.run-1", "seed": 42, "iterations": "10k", "epochs": 3, "target_accuracy": 0.925,
                  "max_emulated_time": "0.1 ms", "max_wall_time": 1 / 3, "eval_every": 7,
                  "out_dir": 'out "dir" \\ ünïcode\t', "progress": False}
    raw["network"] = {"tcp_window": 123457, "mss": "1.5KiB"}
    raw["dc"][1].update(lan_bandwidth="12.5MB/s", lan_latency=0.1 + 0.2, compute_per_iter="0s",
                        heterogeneity=1.25, worker_slowdown=[1, 3.5], host="10.1.2.3")
    raw["wan"][0].update(bandwidth=123456789.123, bandwidth_ba="155Mbit", loss=1 / 7, jitter="3ms",
                         trace="uniform", trace_low="1Mbps", trace_high="2Gbps", trace_period=7.25)
    raw["training"] = {"model": "phantom", "phantom_layers": ["25.6M", 23834568, 7], "hidden": [],
                       "dataset": "synthetic", "partition": "dirichlet", "dirichlet_alpha": 0.1,
                       "optimizer": "dcasgd_shared", "worker_lr": 0.003, "synthetic_samples": "1.5M"}
    raw["sync"] = {"algorithm": "esync", "esync_epsilon": "250us", "dcasgd_lambda": 0.5}
    raw["codec"] = {"type": "bsc", "threshold": "0.1%", "size_lower_bound": 0}
    raw["sched"] = {"bigarray_bound": "25.6M"}
    raw["metrics"] = {"events": False, "trace": True, "plot": False}
    return parse_scenario(raw)


@pytest.mark.parametrize("make", [Scenario, lambda: parse_scenario(topology()), rich_scenario])
def test_resolved_toml_round_trips_to_an_equal_scenario(make):
    s = make()
    text = scenario_to_toml(s)
    again = parse_scenario(tomllib.loads(text))
    assert again == s
    assert scenario_to_toml(again).splitlines()[2:] == text.splitlines()[2:]  # stable (header names source)


def test_resolved_toml_lists_every_key_with_readable_units():
    text = scenario_to_toml(parse_scenario(topology()))
    data = tomllib.loads(text)
    for spec in sections():
        if getattr(spec.cls, "omit_defaults", False):  # [expect]: only what is set
            assert spec.key not in data
            continue
        tables = data.get(spec.key, []) if spec.array else [data[spec.key]]
        for table in tables:
            assert list(table) == [row.key for row in settings_of(spec.cls)]
    assert 'bandwidth = "100Mbps"' in text and 'latency = "30ms"' in text
    assert 'tcp_window = "4MiB"' in text and 'bandwidth_ba = ""' in text
    assert scenario_to_dict(Scenario())["wan"][1]["bandwidth"] == "100Mbps"


def test_scenario_objects_built_in_code_round_trip_too():
    s = Scenario(dcs=[DCConfig(name="c", central=True), DCConfig(name="p", workers=1, worker_slowdown=[2.0])],
                 wans=[WanConfig(a="p", b="c", bandwidth_bps=5e7)])
    assert isinstance(s.dcs, tuple) and s.dcs[1].worker_slowdown == (2.0,)  # lists become tuples
    assert s.central_dc.workers == 0  # workers defaults to 0 on the central DC
    assert parse_scenario(tomllib.loads(scenario_to_toml(s))) == s


def test_module_entry_point_prints_the_resolved_scenario(capsys, tmp_path):
    assert scenario_main(["--set", "sync.k1=3"]) == 0
    assert parse_scenario(tomllib.loads(capsys.readouterr().out)).sync.k1 == 3
    assert scenario_main(["--set", "sync.k1=0"]) == 2
    assert "sync.k1" in capsys.readouterr().err
    doc = tmp_path / "doc.md"
    doc.write_text(f"intro\n{sc.DOC_BEGIN}\nSTALE-TEXT\n{sc.DOC_END}\noutro\n")
    assert scenario_main(["--write-docs", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("intro\n") and text.endswith("outro\n") and "STALE-TEXT" not in text
    assert reference_markdown().strip() in text


# ------------------------------------------------------------------ reference doc

def test_doc_lists_every_section_and_field():
    doc = DOC.read_text(encoding="utf-8")
    for spec in sections():
        header = f"[[{spec.key}]]" if spec.array else f"[{spec.key}]"
        assert f"### `{header}`" in doc, header
        for row in settings_of(spec.cls):
            assert f"| `{row.key}`" in doc, f"{spec.key}.{row.key}"


def test_doc_reference_is_generated_from_the_field_tables():
    doc = DOC.read_text(encoding="utf-8")
    start = doc.index(sc.DOC_BEGIN) + len(sc.DOC_BEGIN)
    generated = doc[start:doc.index(sc.DOC_END)].strip()
    assert generated == reference_markdown().strip(), (
        "docs/scenario.md is stale: run `python -m geomx.scenario --write-docs docs/scenario.md`")


def test_doc_example_is_a_valid_scenario():
    doc = DOC.read_text(encoding="utf-8")
    example = doc.split("```toml\n", 1)[1].split("```", 1)[0]
    s = parse_scenario(tomllib.loads(example), source="docs/scenario.md")
    assert s.wans[1].capacity_bps("central", "party-b") == 200e6 and s.sync.algorithm == "hfa"


def test_a_scheduler_key_that_does_not_exist_is_refused_not_silently_ignored():
    # GeoMX spells it ENABLE_TS / tsengine; geomx has one flag per overlay
    raw = topology()
    raw["sched"] = {"tsengine": True}
    with pytest.raises(ScenarioError, match=r"sched: unknown key 'tsengine' \(did you mean "
                                            r"'tsengine_intra'\?\); allowed keys: "
                                            r"bigarray_bound, p3, .*tsengine_inter"):
        parse_scenario(raw)
