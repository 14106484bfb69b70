"""run_scenario works where an asyncio loop is already running (a Jupyter kernel)."""

import asyncio

from geomx.experiment import run_scenario


def test_emulated_run_inside_a_running_loop_gives_the_same_run(scenario_of):
    s = scenario_of("quickstart.toml", "run.iterations=6", "run.target_accuracy=0",
                    "metrics.trace=false", "metrics.plot=false")
    outside = run_scenario(s).summary

    async def in_a_kernel():
        return run_scenario(s).summary

    inside = asyncio.run(in_a_kernel())
    assert inside.emulated_seconds == outside.emulated_seconds
    assert inside.bytes_per_link == outside.bytes_per_link
    assert inside.final_accuracy == outside.final_accuracy


def test_runs_started_in_the_same_second_get_folders_of_their_own(tmp_path, monkeypatch):
    """Parallel runs into one out_dir (tools/feature_pairs.py, sweeps) can start in the same
    second: each claims its folder with mkdir, so none fails or shares one."""
    import time
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    from geomx.experiment import make_run_dir

    monkeypatch.setattr(time, "strftime", lambda fmt: "20261128-120000")
    # a folder another process makes after this one looked: every look says "free"
    monkeypatch.setattr(Path, "exists", lambda self: False)
    with ThreadPoolExecutor(8) as pool:
        dirs = list(pool.map(lambda _: make_run_dir(tmp_path, "job"), range(16)))
    assert sorted(d.name for d in dirs) == sorted(
        ["job-20261128-120000"] + [f"job-20261128-120000-{n}" for n in range(2, 17)])
