"""Running a scenario with the test program, and counting what its workers sent."""

from __future__ import annotations

import collections
from pathlib import Path

from geomx.experiment import run_scenario
from geomx.scenario import load_scenario

from tests.helpers.events import run_events
from tests.helpers.paths import QUICKSTART

PROGRAM = Path(__file__).with_name("programs.py")
QUIET = ["run.target_accuracy=0", "run.progress=false", "metrics.plot=false",
         "metrics.trace=false"]


def run(tmp_path, sets, *, program: bool = True, args=(), iterations: int = 12,
        runtime: str = "emu"):
    out = tmp_path / ("torch" if program else "builtin")
    extra = [f"training.program={PROGRAM}"] if program else []
    if args:
        extra.append("training.program_args=[" + ",".join(f'"{a}"' for a in args) + "]")
    scenario = load_scenario(QUICKSTART, [f"run.out_dir={out}", f"run.iterations={iterations}",
                                          "run.eval_every=4", *QUIET, *sets, *extra])
    return run_scenario(scenario, runtime=runtime, progress=False)


def pushes(run_dir) -> dict[str, int]:
    """PUSH messages per kind of sender: workers (``w``), local servers (``ls``)."""
    counts: collections.Counter[str] = collections.Counter()
    for e in run_events(run_dir, "xfer"):
        if e.get("msg") == "PUSH":
            counts[e["src"].split(":")[0]] += 1
    return dict(counts)
