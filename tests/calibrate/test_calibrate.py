"""`geomx calibrate` end to end (real sockets on loopback, the node code) and the profile's
use: `geomx run --host`, and the fidelity report's calibrated column."""

from __future__ import annotations

import json

import pytest

from geomx.cli import main
from geomx.fidelity import report_table
from geomx.host_profile import HostProfile, load_profile, profile_to_toml

from tests.helpers.paths import QUICKSTART


@pytest.mark.slow
def test_calibrate_quick_writes_a_profile_the_emulator_loads(tmp_path, capsys):
    out = tmp_path / "host.toml"
    assert main(["calibrate", "--quick", "--out", str(out)]) == 0
    p = load_profile(out)
    printed = capsys.readouterr().out
    assert f"profile: {out}" in printed
    # what it measured: CPU per message that grows with size, every built-in codec, the
    # kvstore's and the server's costs, and where and when (figures are not asserted:
    # they are wall-clock measurements)
    assert list(p.size_bytes) == sorted(p.size_bytes) and len(p.size_bytes) == 3
    assert all(s >= 0 for s in p.send_s) and all(r >= 0 for r in p.recv_s)
    assert all(s + r > 0 for s, r in zip(p.send_s, p.recv_s))
    assert set(p.codecs) == {"fp16", "bf16", "bsc", "mpq", "onebit"}
    assert all(c.encode_s_per_byte > 0 for c in p.codecs.values())
    assert p.kvstore_call_s > 0 and p.server_push_s > 0
    prov = p.provenance
    assert prov["quick"] is True and prov["cores"] >= 1 and prov["cpu"]
    assert len(prov["load_average_before"]) == 3 and prov["event_loop"] in ("uvloop", "asyncio")


def test_geomx_run_host_charges_the_profile_and_says_so(tmp_path, capsys):
    profile = tmp_path / "host.toml"
    profile.write_text(profile_to_toml(HostProfile(send_s=(2e-3,), recv_s=(2e-3,))))
    common = ["run", str(QUICKSTART), "--quiet", "--set", "run.iterations=3",
              "--set", "run.target_accuracy=0", "--set", "metrics.plot=false",
              "--set", "metrics.trace=false"]
    assert main([*common, "--out", str(tmp_path / "plain")]) == 0
    assert main([*common, "--out", str(tmp_path / "cal"), "--host", str(profile)]) == 0
    capsys.readouterr()
    (plain,) = (tmp_path / "plain").iterdir()
    (cal,) = (tmp_path / "cal").iterdir()
    a = json.loads((plain / "summary.json").read_text())
    b = json.loads((cal / "summary.json").read_text())
    assert b["provenance"]["host_profile"] == str(profile)
    assert b["emulated_seconds"] > a["emulated_seconds"]
    assert f'profile = "{profile}"' in (cal / "scenario.toml").read_text()
    assert main([*common, "--host", str(tmp_path / "missing.toml")]) == 2
    assert "host.profile" in capsys.readouterr().err


def test_the_fidelity_table_has_a_calibrated_column_when_a_profile_was_used():
    rows = [{"case": "q", "emu_s_per_iter": 1.0, "emu_calibrated_s_per_iter": 1.1,
             "userspace_s_per_iter": 1.2, "userspace_error": 0.2,
             "userspace_error_calibrated": 1.2 / 1.1 - 1, "load_average": 1.0, "repeats": 5}]
    table = report_table(rows, ["userspace"])
    assert "| case | emulated s/iter | calibrated s/iter | real (userspace) s/iter | error | " \
           "error (calibrated) |" in table
    assert "| q | 1.000 | 1.100 | 1.200 | +20.0% | +9.1% |" in table
    assert "median of 5 runs" in table


def test_fidelity_runs_cases_in_turn_and_reports_medians(tmp_path, monkeypatch):
    from geomx import fidelity

    calls = []
    real = {"a": iter([1.3, 1.1, 1.2]), "b": iter([2.0, 2.4, 2.2])}

    def fake_compare(scenario, overrides, *, out_dir, shapers, host_profile=None):
        calls.append(scenario)
        return {"emu": {"window_s_per_iter": 1.0},
                "emu_calibrated": {"window_s_per_iter": 1.1},
                "real": {"window_s_per_iter": next(real[scenario])}}

    monkeypatch.setattr(fidelity, "compare", fake_compare)
    monkeypatch.setattr(fidelity, "plot_report", lambda rows, shapers, path: None)
    rows = fidelity.run_report([fidelity.Case("a", "a"), fidelity.Case("b", "b")],
                               out_dir=tmp_path, progress=None, host_profile="h.toml",
                               repeat=3)
    assert calls == ["a", "b", "a", "b", "a", "b"]
    assert rows[0]["userspace_s_per_iter"] == pytest.approx(1.2)
    assert rows[1]["userspace_error_calibrated"] == pytest.approx(2.2 / 1.1 - 1)
    report = json.loads((tmp_path / "fidelity.json").read_text())
    assert report["provenance"]["host_profile"] == "h.toml"


def test_fidelity_refuses_a_bad_profile_or_repeat_before_anything_runs(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("[server]\npush_s = -1\n")
    out = tmp_path / "report"
    assert main(["fidelity", str(QUICKSTART), "--host", str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--host" in err and "server.push_s" in err and len(err.strip().splitlines()) == 1
    assert main(["fidelity", str(QUICKSTART), "--repeat", "0", "--out", str(out)]) == 2
    assert "--repeat 0: allowed: an integer >= 1" in capsys.readouterr().err
    assert not out.exists()
