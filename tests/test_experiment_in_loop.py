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
