"""Stop a job at a checkpoint and resume it, beside the same job run straight through:
the pair of runs every resume test compares."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from geomx.experiment import resume_scenario, run_scenario
from geomx.scenario import load_scenario


def straight_and_resumed(scenario: Path, sets: list[str], *, runtime: str, stop: int,
                         end: int, out: Path) -> tuple[Any, Any]:
    """(the run of ``end`` iterations, the run stopped after ``stop`` and resumed from its
    newest checkpoint to ``end``), both with ``sets`` applied, on ``runtime``."""
    clean = run_scenario(load_scenario(scenario, [*sets, f"run.iterations={end}"]),
                         out_dir=out, runtime=runtime, progress=False)
    first = run_scenario(load_scenario(scenario, [*sets, f"run.iterations={stop}"]),
                         out_dir=out, runtime=runtime, progress=False)
    resumed = run_scenario(resume_scenario(first.run_dir, [f"run.iterations={end}"]),
                           out_dir=out, runtime=runtime, progress=False)
    return clean, resumed
