"""``geomx collect RUN_DIR``: merge the per-node files of a by-hand launch into a run folder.

``geomx launch`` merges what each node process leaves under ``RUN_DIR/nodes/``
(``<name>.events.jsonl``, ``<name>.result.json``) into ``events.jsonl``, ``progress.csv``,
``summary.json``, ``trace.json`` and the plots. Nodes started one by one with ``geomx node
--run-dir RUN_DIR`` (ssh, Slurm, Kubernetes, a GeoMX-style shell script) leave the same
per-node files and nothing else; this command does the launcher's merge for them, so
both ways end with the same run folder.
"""

from __future__ import annotations

from pathlib import Path

from geomx.cluster import plan_job
from geomx.metrics.recorder import iter_events
from geomx.metrics.summary import Summary
from geomx.runtime.config import safe_name
from geomx.scenario import Scenario, load_scenario, scenario_to_toml


class CollectError(ValueError):
    """The folder is not a run folder of node files (or lacks its scenario)."""


def _job_seconds(nodes_dir: Path) -> float:
    """The job's length from the nodes' own clocks (seconds since the shared start epoch)."""
    last = 0.0
    for f in sorted(nodes_dir.glob("*.events.jsonl")):
        for ev in iter_events(f):
            t = float(ev.get("t", 0.0)) + float(ev.get("dur", 0.0) or 0.0)
            last = max(last, t)
    return last


def collect_run(run_dir: str | Path, scenario: Scenario | str | None = None) -> Summary:
    """Merge ``run_dir/nodes/*`` into the run folder's files; return the summary."""
    from geomx.experiment import finish_run_dir
    from geomx.runtime.launcher import collect_summary

    run_dir = Path(run_dir)
    nodes_dir = run_dir / "nodes"
    if not nodes_dir.is_dir() or not any(nodes_dir.glob("*.result.json")):
        raise CollectError(f"{run_dir}: no nodes/*.result.json; point at the --run-dir the "
                           f"nodes wrote to, after they have finished")
    if scenario is None:
        path = run_dir / "scenario.toml"
        if not path.exists():
            raise CollectError(f"{run_dir}: no scenario.toml; give the job's scenario with "
                               f"--scenario")
        scenario = load_scenario(path)
    elif not isinstance(scenario, Scenario):
        scenario = load_scenario(scenario)
    if not (run_dir / "scenario.toml").exists():
        (run_dir / "scenario.toml").write_text(scenario_to_toml(scenario))
    plan = plan_job(scenario, "real")
    have = {p.name[:-len(".result.json")] for p in nodes_dir.glob("*.result.json")}
    missing = sorted(n for n in plan.nodes if safe_name(n) not in have)
    summary = collect_summary(scenario, plan, run_dir, _job_seconds(nodes_dir))
    if missing:
        summary.extra["missing_nodes"] = missing
    finish_run_dir(scenario, run_dir, summary)
    return summary
