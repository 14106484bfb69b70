"""Run a scenario on a runtime and leave a run folder behind.

``run_scenario`` is what ``geomx run`` calls. It makes the run folder, writes the
resolved ``scenario.toml`` and hands the job to a runtime: the emulator
(:func:`geomx.sim.job.run_emulated`, every node in this process on a virtual-time loop)
or the real one (:func:`geomx.runtime.launcher.run_real`, one process per node). Each
runtime writes ``events.jsonl`` and ``progress.csv`` and returns the run's summary; this
module then writes the rest of the run-folder schema (docs/architecture.md), the same
for both: ``summary.json``, ``trace.json`` and plots.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from geomx.cluster import plan_job
from geomx.errors import JobFailed  # re-exported: users catch geomx.experiment.JobFailed
from geomx.metrics.chrome_trace import convert_events_file
from geomx.metrics.summary import Summary, write_summary
from geomx.node.checkpoint import injected_crashes
from geomx.provenance import provenance
from geomx.scenario import Scenario, scenario_to_toml
from geomx.topology import aggregates_over_trees
from geomx.traces import wan_traces

def __getattr__(name: str) -> Any:
    """The emulated job's parts, also importable from here (tests and benches build
    emulated nodes with them), loaded from :mod:`geomx.sim` on first use so that a real
    run, or reading a run folder, does not import the emulator."""
    if name in ("run_emulated", "resume_time_s"):
        from geomx.sim import job as module
    elif name in ("build_network", "counters_from_network"):
        from geomx.sim import job_network as module
    elif name == "EmuServices":
        from geomx.sim import services as module
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(module, name)


@dataclass
class RunResult:
    """What :func:`run_scenario` returns: the run folder and the run's summary."""

    run_dir: Path
    summary: Summary


def make_run_dir(out_dir: str | os.PathLike, name: str) -> Path:
    """``runs/<name>-<YYYYmmdd-HHMMSS>[-n]``: never overwrites an earlier run."""
    base = Path(out_dir)
    try:
        base.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ValueError(f"run.out_dir = {os.fspath(out_dir)!r}: cannot hold run folders (it, "
                         "or a folder above it, is a regular file); allowed: a directory path"
                         ) from None
    except PermissionError:
        raise ValueError(f"run.out_dir = {os.fspath(out_dir)!r}: no permission to create it; "
                         "allowed: a directory you can write") from None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = base / f"{name}-{stamp}"
    n = 1
    while True:  # mkdir claims the name: of two runs started in one second, the second gets -2
        try:
            path.mkdir()
            return path
        except FileExistsError:
            n += 1
            path = base / f"{name}-{stamp}-{n}"


def resume_scenario(run_dir: str | os.PathLike, overrides: list[str] | tuple[str, ...] = ()
                    ) -> Scenario:
    """The scenario that continues run folder ``run_dir``: its resolved ``scenario.toml``
    (plus ``overrides``, e.g. a higher ``run.iterations``) starting from its latest complete
    checkpoint -- or, for a resumed run that stopped before its first checkpoint, from
    the checkpoint it had resumed from. Raises ValueError naming what is missing."""
    import dataclasses

    from geomx.node.checkpoint import complete_rounds, latest_checkpoint
    from geomx.scenario import load_scenario

    folder = Path(run_dir)
    if not (folder / "scenario.toml").is_file():
        raise ValueError(f"--resume {run_dir}: not a run folder (no scenario.toml)")
    s = load_scenario(folder / "scenario.toml", overrides)
    ckpt = latest_checkpoint(folder)
    if ckpt is None and s.checkpoint.resume_from:
        earlier = Path(s.checkpoint.resume_from)
        if int(earlier.name) in complete_rounds(earlier.parent):
            ckpt = earlier
    if ckpt is None:
        every = "off" if not s.checkpoint.enabled else "on"
        raise ValueError(f"--resume {run_dir}: no complete checkpoint in "
                         f"{folder / 'checkpoints'} (checkpoint.every is {every}; a checkpoint "
                         "is complete once every server and worker wrote its file)")
    # crashes the interrupted run already injected are history, not part of the rest
    done = injected_crashes(folder)
    faults = tuple(f for f in s.faults if f.kind != "crash" or (f.node, f.at_s) not in done)
    return dataclasses.replace(s, faults=faults, checkpoint=dataclasses.replace(
        s.checkpoint, resume_from=str(ckpt.resolve())))


def finish_run_dir(s: Scenario, run_dir: Path, summary: Summary) -> None:
    """Write summary.json, trace.json and plots."""
    if s.checkpoint.resume_from:
        # a resumed run's folder records the continuation; this links it to the old one
        summary.extra = {**(summary.extra or {}), "resumed_from": {
            "checkpoint": s.checkpoint.resume_from,
            "run_dir": str(Path(s.checkpoint.resume_from).parent.parent)}}
    if s.sched.p3 and s.metrics.events and (run_dir / "events.jsonl").exists():
        from geomx.metrics.p3_stats import p3_stats
        from geomx.metrics.recorder import iter_events

        stats = p3_stats(iter_events(run_dir / "events.jsonl"))
        if stats is not None:
            summary.extra["p3"] = stats
    if (s.sched.tsengine_inter or s.sched.tsengine_intra) and s.metrics.events \
            and (run_dir / "events.jsonl").exists():
        from geomx.metrics.recorder import iter_events
        from geomx.metrics.ts_stats import ts_stats

        stats = ts_stats(iter_events(run_dir / "events.jsonl"), _edge_bandwidth(s))
        if stats is not None:
            summary.extra["tsengine"] = stats
    charged = s.host.profile if summary.runtime == "emu" and s.host.profile else None
    write_summary(run_dir / "summary.json", summary, provenance=provenance(host_profile=charged))
    if s.metrics.trace and s.metrics.events and (run_dir / "events.jsonl").exists():
        convert_events_file(run_dir / "events.jsonl", run_dir / "trace.json")
    if s.metrics.plot:
        from geomx.metrics.plots import write_run_plots  # matplotlib: ~0.3 s, only for plots

        caps = summary.extra.get("link_capacity_bps") if summary.extra else None
        write_run_plots(run_dir, caps)
        if aggregates_over_trees(s.topology.kind) and s.metrics.events:
            from geomx.metrics.netstorm_plots import write_netstorm_plots

            write_netstorm_plots(run_dir, [(w.a, w.b) for w in s.wans], true_rate_bps(s))


def true_rate_bps(s: Scenario) -> Callable[[str, str, float], float]:
    """``rate(a, b, t)``: the scenario's rate of WAN direction a -> b at time t (its trace,
    drawn with the seeds :func:`geomx.sim.job_network.build_network` uses, or its
    constant capacity)."""
    rates: dict[tuple[str, str], Any] = {}
    traces = wan_traces(s.wans, s.run.seed)
    for w in s.wans:
        for src, dst in ((w.a, w.b), (w.b, w.a)):
            rates[(src, dst)] = traces.get((src, dst), w.capacity_bps(src, dst))

    def rate(a: str, b: str, t: float) -> float:
        r = rates[(a, b)]
        return float(r) if isinstance(r, (int, float)) else float(r.rate_at(t))

    return rate


def _edge_bandwidth(s: Scenario) -> Callable[[str, str], float | None]:
    """Bandwidth of the link between two nodes' DCs (the WAN link's, in its direction, or
    the DC's NIC capacity inside one DC); None when no single link joins them."""
    dc_of = plan_job(s).job.dc_of
    lan = {d.name: d.lan_bandwidth_bps for d in s.dcs}
    wan: dict[tuple[str, str], float] = {}
    for w in s.wans:
        wan[(w.a, w.b)] = w.bandwidth_bps
        wan[(w.b, w.a)] = w.bandwidth_ba_bps or w.bandwidth_bps

    def bw(src: str, dst: str) -> float | None:
        a, b = dc_of.get(src), dc_of.get(dst)
        if a is None or b is None:
            return None
        return lan.get(a) if a == b else wan.get((a, b))
    return bw


def _run_emulated(s: Scenario, run_dir: Path, progress: bool,
                  inspect: Callable[[list[Any]], None] | None) -> Summary:
    """The emulator, on this thread, or on a thread of its own where an asyncio loop
    already runs here."""
    from geomx.sim.job import run_emulated

    if not _loop_running_here():
        return run_emulated(s, run_dir, progress=progress, inspect=inspect)
    # A Jupyter kernel (ipykernel) runs an asyncio loop in this thread, and the emulator
    # needs a loop of its own: run it in a thread (virtual time, so the events are the
    # same).
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1, thread_name_prefix="geomx-emulator") as pool:
        return pool.submit(run_emulated, s, run_dir, progress=progress,
                           inspect=inspect).result()


def _loop_running_here() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def run_scenario(s: Scenario, *, runtime: str | None = None, out_dir: str | os.PathLike | None = None,
                 progress: bool | None = None,
                 inspect: Callable[[list[Any]], None] | None = None) -> RunResult:
    """Run scenario ``s`` and return its run folder and summary."""
    runtime = runtime or s.run.runtime
    if runtime not in ("emu", "real"):
        raise ValueError(f"runtime = {runtime!r}; allowed: emu, real")
    run_dir = make_run_dir(out_dir or s.run.out_dir, s.run.name)
    (run_dir / "scenario.toml").write_text(scenario_to_toml(s))
    show = s.run.progress if progress is None else progress
    if runtime == "emu":
        summary = _run_emulated(s, run_dir, show, inspect)
    else:
        from geomx.runtime.launcher import run_real

        summary = run_real(s, run_dir, progress=show)
    finish_run_dir(s, run_dir, summary)
    return RunResult(run_dir, summary)
