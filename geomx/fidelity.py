"""Does the shaped real runtime take the time the emulator says? Per-iteration figures.

The emulator is the reference: it charges compute from the scenario's profile and the
network from the flow model. The real runtime reproduces the same WAN with its own
shaper and pads compute to the same profile, so an iteration should take about as long
in wall seconds as it does in emulated seconds. What remains is what the emulator does
not model: the processes' own CPU time per message (encode, decode, the event loop),
waking up on a shared machine, and the operating system's scheduling.

Both figures come from the evaluator's events, excluding start-up:

* ``window_s_per_iter`` -- time between the evaluator's first and last ``eval`` events
  divided by the iterations between them (the headline figure);
* ``median_s_per_iter`` -- the median gap between consecutive ``compute`` events of the
  evaluator: the same quantity, robust to a few iterations slowed by a busy machine.

``python -m geomx.fidelity SCENARIO [--set ...]`` runs the scenario on both
runtimes and prints them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence


@dataclass
class IterationTimes:
    window_s_per_iter: float
    median_s_per_iter: float
    iterations: int            # iterations in the eval window

    def as_dict(self) -> dict[str, float]:
        return {"window_s_per_iter": self.window_s_per_iter,
                "median_s_per_iter": self.median_s_per_iter, "iterations": self.iterations}


def iteration_times(run_dir: str | os.PathLike, evaluator: str) -> IterationTimes:
    """Per-iteration seconds of a finished run from its ``events.jsonl``."""
    evals: list[tuple[int, float]] = []
    computes: list[float] = []
    with open(Path(run_dir) / "events.jsonl") as fh:
        for line in fh:
            ev = json.loads(line)
            if ev.get("node") != evaluator:
                continue
            if ev["ev"] == "eval":
                evals.append((int(ev["iteration"]), float(ev["t"])))
            elif ev["ev"] == "compute":
                computes.append(float(ev["t"]))
    evals = sorted(dict(evals).items())  # the final eval may repeat the last periodic one
    if len(evals) < 2:
        raise ValueError(f"{run_dir}: need at least two evaluations by {evaluator} "
                         "(set run.eval_every)")
    (i0, t0), (i1, t1) = evals[0], evals[-1]
    computes.sort()
    gaps = [b - a for a, b in zip(computes, computes[1:])]
    skip = max(1, len(gaps) // 10)  # the first iterations include connection set-up
    return IterationTimes(window_s_per_iter=(t1 - t0) / (i1 - i0),
                          median_s_per_iter=statistics.median(gaps[skip:] or gaps),
                          iterations=i1 - i0)


def compare(scenario_path: str, overrides: Sequence[str] = (), *, out_dir: str | None = None
            ) -> dict[str, dict[str, float]]:
    """Run ``scenario_path`` on the emulator and on the real runtime; both figures each."""
    from geomx.cluster import plan_job
    from geomx.experiment import run_scenario
    from geomx.scenario import load_scenario

    s = load_scenario(scenario_path, [*overrides, "run.progress=false", "metrics.plot=false",
                                      "metrics.trace=false"]
                      + ([f"run.out_dir={out_dir}"] if out_dir else []))
    evaluator = plan_job(s).train.evaluator
    out: dict[str, dict[str, float]] = {}
    for runtime in ("emu", "real"):
        r = run_scenario(s, runtime=runtime)
        out[runtime] = iteration_times(r.run_dir, evaluator).as_dict()
    for k in ("window_s_per_iter", "median_s_per_iter"):
        out.setdefault("real_over_emu", {})[k] = out["real"][k] / out["emu"][k]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m geomx.fidelity",
                                description="Per-iteration time: emulator vs shaped real runtime.")
    p.add_argument("scenario")
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    res = compare(args.scenario, args.overrides, out_dir=args.out)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{'':10s} {'window s/iter':>14s} {'median s/iter':>14s}")
    for k in ("emu", "real"):
        print(f"{k:10s} {res[k]['window_s_per_iter']:14.4f} {res[k]['median_s_per_iter']:14.4f}")
    r = res["real_over_emu"]
    print(f"{'real/emu':10s} {r['window_s_per_iter']:14.3f} {r['median_s_per_iter']:14.3f}"
          f"   (load average {load:.2f} on {os.cpu_count()} CPUs)")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
