"""bench/claims.py --quick: every headline claim is either inside the paper's band
(docs/papers.md) or carries its row's fixed mechanism-level reason, and the measured fact
that reason rests on (the row's witness) holds in the same run. Emulated figures only."""

import importlib
import json
import shlex
import sys

import pytest

from geomx.scenario import load_scenario

from tests.helpers.paths import ROOT

pytestmark = pytest.mark.slow

sys.path.insert(0, str(ROOT / "bench"))
claims = importlib.import_module("claims")


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("claims")
    rows, curve = claims.collect(out / "runs", quick=True)
    claims.write(rows, curve, out, "python bench/claims.py --quick")
    return out, rows, curve


def test_every_headline_has_a_row(quick):
    _, rows, _ = quick
    keys = {r.key for r in rows}
    assert keys == set(claims.REASONS)
    assert len(keys) == len(rows)


def test_each_row_is_inside_its_band_or_carries_its_reason(quick):
    _, rows, _ = quick
    for r in rows:
        assert r.ours is not None, r.key
        if r.inside:
            assert r.reason == "", r.key
        else:
            assert r.reason == claims.REASONS[r.key], r.key
            assert r.witness is True, f"{r.key}: the stated reason does not hold: {r}"


def test_each_scenario_column_loads_as_geomx_run_arguments(quick):
    _, rows, _ = quick
    for r in rows:
        words = shlex.split(r.scenario.split("  (")[0])
        path, sets = words[0], [w for w in words[1:] if w != "--set"]
        full = ROOT / path if not path.startswith("/") else path
        load_scenario(full, sets)


def test_the_20x_curve_is_measured_against_bandwidth(quick):
    _, _, curve = quick
    assert curve.bandwidths_mbps[0] == 10.0 and curve.bandwidths_mbps[-1] == 10_000.0
    full = claims.claims_geomx.SYSTEMS[-1][0]
    per_it = curve.ratio("s_per_iteration", full)
    # the flat PS gains from bandwidth more than GeoMX's stack does: the ratio falls
    assert per_it[0] > per_it[-1] > 1.0
    assert all(n for n in curve.iterations_to_target.values())


def test_the_full_run_writes_its_files(quick):
    out, rows, _ = quick
    assert (out / "claims.png").stat().st_size > 0
    md = (out / "claims.md").read_text()
    assert all(r.claim in md for r in rows)
    data = json.loads((out / "claims.json").read_text())
    assert [r["key"] for r in data["rows"]] == [r.key for r in rows]
    assert data["provenance"]["geomx"]["source_digest"] and "Produced by geomx" in md


def test_the_committed_table_is_the_rendering_of_the_committed_json(tmp_path):
    """docs/claims.md is what claims.py writes from docs/claims.json (the full run's rows),
    so its text follows the code; re-rendering keeps the runs' provenance."""
    docs = ROOT / "docs"
    assert claims.main(["--from-json", str(docs / "claims.json"), "--out", str(tmp_path)]) == 0
    again = json.loads((tmp_path / "claims.json").read_text())
    committed = json.loads((docs / "claims.json").read_text())
    assert again == committed and committed["provenance"]["geomx"]["commit"]
    md = (tmp_path / "claims.md").read_text().replace("](claims.png)", "](img/claims.png)")
    assert md == (docs / "claims.md").read_text()
