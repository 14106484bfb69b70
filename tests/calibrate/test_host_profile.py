"""Host profiles (geomx/host_profile.py): what `geomx calibrate` writes reads back equal,
costs interpolate between size classes, and a bad file is refused in one line naming its
field -- on its own and as a scenario's `[host] profile`."""

from __future__ import annotations

import pytest

from geomx.host_profile import (CodecCost, HostProfile, ProfileError, load_profile,
                                parse_profile, profile_to_toml)
from geomx.scenario import ScenarioError, load_scenario

from tests.helpers.paths import QUICKSTART

PROFILE = HostProfile(size_bytes=(64, 1000, 100_000), send_s=(1e-5, 2e-5, 1.2e-4),
                      recv_s=(2e-5, 3e-5, 2.3e-4), wakeup_s=1.5e-4, shaped_send_s=2.5e-4,
                      shaped_late_s=5e-4, cpu_stretch=1.25,
                      codecs={"fp16": CodecCost(1e-10, 2e-10), "bsc": CodecCost(5e-10, 0.0)},
                      kvstore_call_s=7e-6, kvstore_call_s_per_byte=4e-11,
                      server_push_s=1.8e-5, server_push_s_per_byte=3e-10,
                      server_pull_s=6e-6, server_pull_s_per_byte=1e-11,
                      provenance={"measured_at": "2026-11-28T18:00:00Z", "cores": 2,
                                  "load_average_before": [1.5, 1.2, 1.0], "quick": False,
                                  "geomx": "0.2.0"})


def test_a_profile_round_trips_through_its_toml(tmp_path):
    path = tmp_path / "host.toml"
    path.write_text(profile_to_toml(PROFILE))
    assert load_profile(path) == PROFILE


def test_message_costs_interpolate_between_classes_and_extend_past_the_last():
    p = PROFILE
    assert p.send_cost_s(0) == p.send_cost_s(64) == 1e-5  # below the first class: its cost
    assert p.send_cost_s(532) == pytest.approx(1.5e-5)     # halfway between 64 and 1000
    assert p.recv_cost_s(100_000) == pytest.approx(2.3e-4)
    # past the last class, the last segment's per-byte cost goes on
    slope = (2.3e-4 - 3e-5) / (100_000 - 1000)
    assert p.recv_cost_s(200_000) == pytest.approx(2.3e-4 + slope * 100_000)
    assert p.encode_cost_s("fp16", 1000) == pytest.approx(1e-7)
    assert p.encode_cost_s("mpq", 1000) == 0.0  # a codec not measured costs nothing
    assert p.push_cost_s(1000) == pytest.approx(1.8e-5 + 3e-7)


@pytest.mark.parametrize("text, field", [
    ("[message]\nsize_bytes = [64, 10]\nsend_s = [1, 1]\nrecv_s = [1, 1]\n", "message.size_bytes"),
    ("[message]\nsize_bytes = [64]\nsend_s = [-1e-5]\nrecv_s = [0.0]\n", "message.send_s[0]"),
    ("[message]\nsize_bytes = [64, 128]\nsend_s = [1e-5]\n", "message.send_s"),
    ("[message]\nwakeup_s = \"1ms\"\n", "message.wakeup_s"),
    ("[codec.fp16]\nencode_s_per_byte = 0.5\n", "codec.fp16.encode_s_per_byte"),
    ("[server]\npush_s = 2.0\n", "server.push_s"),
    ("[server]\npush_ms = 2.0\n", "server.push_ms"),
    ("[kvstore]\ncall_s = true\n", "kvstore.call_s"),
    ("format = 7\n", "format"),
    ("[cpu]\nstretch = 0.5\n", "cpu.stretch"),
    ("[message]\nshaped_late_s = -1.0\n", "message.shaped_late_s"),
    ("[gpu]\nx = 1\n", "gpu"),
])
def test_a_bad_profile_is_refused_in_one_line_naming_the_field(tmp_path, text, field):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: {field}: "), message


def test_a_scenario_names_host_profile_and_the_bad_field(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[message]\nsize_bytes = [64]\nsend_s = [-1.0]\nrecv_s = [0.0]\n")
    with pytest.raises(ScenarioError) as err:
        load_scenario(QUICKSTART, [f"host.profile={bad}"])
    message = str(err.value)
    assert "\n" not in message
    assert "host.profile" in message and "message.send_s[0]" in message
    with pytest.raises(ScenarioError, match="host.profile: .*no such file"):
        load_scenario(QUICKSTART, [f"host.profile={tmp_path / 'none.toml'}"])
    with pytest.raises(ScenarioError, match=r"host.cores: .*allowed: an integer in \[0, 4096\]"):
        load_scenario(QUICKSTART, ["host.cores=-2"])


def test_a_scenario_finds_its_profile_next_to_it(tmp_path):
    (tmp_path / "host.toml").write_text(profile_to_toml(PROFILE))
    scenario = tmp_path / "job.toml"
    scenario.write_text(QUICKSTART.read_text() + '\n[host]\nprofile = "host.toml"\ncores = 2\n')
    s = load_scenario(scenario)
    assert s.host.profile == str(tmp_path / "host.toml") and s.host.cores == 2


def test_parse_profile_defaults_to_charging_nothing():
    p = parse_profile({})
    assert p.send_cost_s(10**6) == p.recv_cost_s(10**6) == 0.0
    assert p.push_cost_s(10**6) == p.wakeup_s == p.shaped_late_s == p.shaped_send_s == 0.0
    assert p.cpu_stretch == 1.0
