"""Start every node of a scenario as its own process on this host and supervise them.

``geomx run SCENARIO --runtime real`` lands here. The launcher picks the schedulers'
ports, starts ``python -m geomx node ...`` once per node (each process builds its own
node from the resolved scenario in the run folder), shows progress from the evaluator's
event file, and when one process fails stops all the others and names it. At the end it
merges the per-process event files and counters into the run folder's standard files, so
a real run leaves the same schema as an emulated one.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from geomx.cluster import plan_job
from geomx.metrics.counters import ByteCounters
from geomx.metrics.progress import ProgressBar, ProgressWriter, read_progress
from geomx.metrics.recorder import iter_events, merge_event_files
from geomx.metrics.summary import Summary, build_summary
from geomx.runtime.node_main import safe_name
from geomx.scenario import Scenario

#: Seconds the launcher waits for the job before declaring it hung (unless the scenario
#: sets run.max_wall_time, in which case that plus a grace period).
DEFAULT_JOB_TIMEOUT_S = 1800.0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def scheduler_book(s: Scenario, plan: Any) -> dict[str, str]:
    """Addresses of the schedulers: the rendezvous points every node is told up front."""
    hosts = {d.name: d.host for d in s.dcs}
    book = {}
    for name, role in plan.roles.items():
        if role in ("global_scheduler", "local_scheduler"):
            host = hosts[plan.job.dc_of[name]]
            book[name] = f"{host}:{free_port(host if host != 'localhost' else '127.0.0.1')}"
    return book


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def run_real(s: Scenario, run_dir: Path, *, progress: bool = True,
             timeout_s: float | None = None) -> Summary:
    """Run the scenario as one process per node on this host; return the run's summary."""
    from geomx.experiment import JobFailed

    plan = plan_job(s, "real")
    if s.training.model == "phantom":
        raise ValueError("training.model = 'phantom' has no data to send over real sockets; "
                         "use the emulator (--runtime emu) for phantom models")
    book = scheduler_book(s, plan)
    start_epoch = time.time()
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    procs: dict[str, subprocess.Popen] = {}
    files = []
    wall0 = time.perf_counter()
    # schedulers first (they own the fixed ports), then servers, then workers
    order = sorted(plan.nodes, key=lambda n: (0 if "scheduler" in plan.roles[n] else
                                              1 if "server" in plan.roles[n] else 2))
    for name in order:
        log_file = open(logs / f"{safe_name(name)}.log", "w")
        files.append(log_file)
        cmd = [sys.executable, "-m", "geomx", "node", "--scenario", str(run_dir / "scenario.toml"),
               "--name", name, "--run-dir", str(run_dir), "--book", json.dumps(book),
               "--start-epoch", repr(start_epoch)]
        procs[name] = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env,
                                       start_new_session=True)
    limit = timeout_s or (s.run.max_wall_time_s + 120 if s.run.max_wall_time_s > 0
                          else DEFAULT_JOB_TIMEOUT_S)
    evaluator_events = run_dir / "nodes" / f"{safe_name(plan.train.evaluator)}.events.jsonl"
    bar = ProgressBar(plan.train.iterations, enabled=progress, time_label="wall")
    seen = 0
    failure: str | None = None
    faults = sorted(s.faults, key=lambda f: f.at_s)
    # After a node dies, the others get this long to notice (heartbeats) and exit on their
    # own, non-zero, naming it; stragglers are then killed.
    hb = s.membership
    grace_s = (2 * hb.heartbeat_timeout_s + 10.0) if hb.heartbeat_interval_s > 0 else 5.0
    drain_deadline: float | None = None
    exit_seen: dict[str, float] = {}
    try:
        while True:
            now = time.perf_counter()
            while faults and now - wall0 >= faults[0].at_s:
                f = faults.pop(0)
                p = procs[f.node]
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
            running = {n: p for n, p in procs.items() if p.poll() is None}
            for n, p in procs.items():
                if p.returncode is not None and n not in exit_seen:
                    exit_seen[n] = now
            bad = [n for n, p in procs.items() if p.returncode not in (None, 0)]
            if bad and failure is None:
                # the first to die; among those seen at once, a killed one before the
                # ones that exited because they noticed it
                first = min(bad, key=lambda n: (exit_seen[n], procs[n].returncode >= 0))
                code = procs[first].returncode
                how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
                failure = f"node {first} {how}:\n{_tail(logs / f'{safe_name(first)}.log')}"
                drain_deadline = now + grace_s
            if not running:
                break
            if drain_deadline is not None and now > drain_deadline:
                break
            if drain_deadline is None and now - wall0 > limit:
                failure = (f"job did not finish within {limit:.0f} s; still running: "
                           f"{', '.join(sorted(running))}")
                break
            seen = _follow_progress(evaluator_events, seen, bar)
            time.sleep(0.1)
    except BaseException:
        failure = failure or "interrupted"
        _stop_all(procs)
        raise
    finally:
        if failure is not None:
            stragglers = [n for n, p in procs.items() if p.poll() is None]
            _stop_all(procs)
            codes = {n: p.returncode for n, p in procs.items()}
            failure += ("\nexit codes: " + ", ".join(f"{n}={c}" for n, c in codes.items()))
            if stragglers:
                failure += f"\nkilled after the grace period: {', '.join(stragglers)}"
        for f in files:
            f.close()
        bar.close()
    if failure is not None:
        raise JobFailed(failure)
    wall_s = time.perf_counter() - wall0
    return _collect(s, plan, run_dir, wall_s)


def _follow_progress(path: Path, seen: int, bar: ProgressBar) -> int:
    if not path.exists():
        return seen
    try:
        events = list(iter_events(path))
    except (OSError, ValueError):
        return seen
    for ev in events[seen:]:
        if ev.get("ev") in ("eval", "compute"):
            bar.on_event(ev)
    return len(events)


def _stop_all(procs: dict[str, subprocess.Popen], grace_s: float = 5.0) -> None:
    for p in procs.values():
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.time() + grace_s
    for p in procs.values():
        try:
            p.wait(max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def _collect(s: Scenario, plan: Any, run_dir: Path, wall_s: float) -> Summary:
    """Merge per-process files into events.jsonl, progress.csv and the summary."""
    nodes_dir = run_dir / "nodes"
    event_files = sorted(nodes_dir.glob("*.events.jsonl"))
    if s.metrics.events and event_files:
        merge_event_files(event_files, run_dir / "events.jsonl")
    counters = ByteCounters()
    results: dict[str, dict[str, Any]] = {}
    for f in sorted(nodes_dir.glob("*.result.json")):
        r = json.loads(f.read_text())
        results[r["name"]] = r
        counters.merge(ByteCounters.from_dict(r["counters"]))
    # progress.csv: evaluator's evals, with job-wide cumulative bytes at each eval time
    sends: list[tuple[float, int, bool]] = []
    evals: list[dict[str, Any]] = []
    if (run_dir / "events.jsonl").exists():
        dc = plan.job.dc_of
        for ev in iter_events(run_dir / "events.jsonl"):
            if ev["ev"] == "send":
                sends.append((ev["t"], int(ev.get("bytes", 0)),
                              dc.get(ev.get("src"), "?") != dc.get(ev.get("dst"), "?")))
            elif ev["ev"] == "eval" and ev["node"] == plan.train.evaluator:
                evals.append(ev)
    writer = ProgressWriter(run_dir / "progress.csv")
    i = lan = wan = 0
    for ev in evals:
        while i < len(sends) and sends[i][0] <= ev["t"]:
            if sends[i][2]:
                wan += sends[i][1]
            else:
                lan += sends[i][1]
            i += 1
        writer.write(ev.get("iteration", 0), ev["t"], ev.get("loss"), ev.get("accuracy"),
                     bytes_lan=lan, bytes_wan=wan, wall_s=ev["t"])
    writer.close()
    final = results.get(plan.train.evaluator, {}).get("result", {})
    iterations = max((r.get("iterations", 0) for n, r in results.items()
                      if plan.roles.get(n) == "worker"), default=0)
    summary = build_summary(counters, read_progress(run_dir / "progress.csv"), runtime="real",
                            scenario_name=s.run.name, seed=s.run.seed, iterations=iterations,
                            emulated_seconds=None, wall_seconds=wall_s,
                            target_accuracy=s.run.target_accuracy or None,
                            extra={"final_eval": final, "processes": len(results)})
    if final.get("accuracy") is not None:
        summary.final_accuracy = final["accuracy"]
        summary.final_loss = final.get("loss")
    return summary
