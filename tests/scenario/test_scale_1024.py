"""scenarios/scale_1024.toml: the 1,024-worker study is valid and is the bench's 16 x 64 row.

Only validated here (running it takes minutes: ``python bench/emulator.py --scale --sizes
scenarios/scale_1024.toml``)."""

from __future__ import annotations

import importlib.util

from geomx.scenario import load_scenario

from tests.helpers.paths import ROOT


def _bench():
    spec = importlib.util.spec_from_file_location("bench_emulator", ROOT / "bench" / "emulator.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_scale_1024_is_16_dcs_of_64_workers_with_the_resnet50_wan_shape():
    s = load_scenario(ROOT / "scenarios" / "scale_1024.toml")
    workers = [dc.workers for dc in s.dcs if not dc.central]
    assert workers == [64] * 16
    assert s.run.iterations == 10
    assert not s.metrics.events and not s.metrics.trace  # a million transfers a round
    assert s.training.model == "phantom" and s.training.phantom_preset == "resnet50"
    # the same job as bench/emulator.py's scaled resnet50_phantom.toml at 16 x 64
    scaled = _bench().scaled_scenario(16, 64, 10)
    assert (s.dcs, s.wans, s.training, s.sync) == (scaled.dcs, scaled.wans, scaled.training,
                                                   scaled.sync)
