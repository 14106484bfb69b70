"""WAN conditions without root: the shaped real runtime takes the emulator's time per iteration.

The quickstart (100 Mbit/s, 30 ms WAN; 10 ms compute) runs on both runtimes; seconds
per iteration are measured from the evaluator's events, start-up excluded
(``geomx.fidelity``). On a quiet 2-core machine they agree within ~10%
(docs/real-runtime.md has the figures); the test allows 30% because machines are noisy,
uses the median iteration (robust to a few iterations slowed by other processes), and
measures the real run a second time before failing.
"""

from __future__ import annotations

import pytest

from geomx.cluster import plan_job
from geomx.experiment import run_scenario
from geomx.fidelity import iteration_times

TOLERANCE = 0.30


@pytest.mark.slow
def test_emulated_and_real_seconds_per_iteration_agree(scenario_of):
    s = scenario_of("quickstart.toml", "run.target_accuracy=0", "run.iterations=40",
                    "metrics.plot=false", "metrics.trace=false")
    evaluator = plan_job(s).train.evaluator
    emu = iteration_times(run_scenario(s, runtime="emu").run_dir, evaluator)
    # the emulator is exact: 10 ms compute + 4 WAN one-way trips of 30.1 ms + transfers
    assert emu.median_s_per_iter == pytest.approx(0.1334, rel=0.02)
    ratios = []
    for attempt in range(2):
        real = iteration_times(run_scenario(s, runtime="real").run_dir, evaluator)
        ratio = real.median_s_per_iter / emu.median_s_per_iter
        ratios.append((ratio, real.window_s_per_iter / emu.window_s_per_iter))
        print(f"\nemulated {emu.window_s_per_iter:.4f} s/iter, real {real.window_s_per_iter:.4f} "
              f"s/iter (window), {real.median_s_per_iter:.4f} (median): real/emu {ratio:.3f}")
        if abs(ratio - 1) <= TOLERANCE:
            break
    assert abs(ratios[-1][0] - 1) <= TOLERANCE, ratios
