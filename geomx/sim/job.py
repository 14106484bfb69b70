"""An emulated job: every node of a scenario in this process, on a virtual-time loop.

The emulated counterpart of :mod:`geomx.runtime.launcher`: given a scenario and a run
folder, it builds the job (:func:`assemble_job`), runs it to its end
(:func:`run_job`) and says what happened (:func:`summarise`). It writes the run's
``events.jsonl`` and ``progress.csv`` as it goes; the rest of the run folder is the
caller's (:mod:`geomx.experiment`), the same for both runtimes. Same seed, same
scenario: the same event log, byte for byte (docs/architecture.md, "The two runtimes").
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from geomx.cluster import JobPlan, make_node, plan_job
from geomx.errors import JobFailed
from geomx.metrics.channel_tally import DgtTally
from geomx.metrics.progress import ProgressBar, ProgressWriter, read_progress
from geomx.metrics.recorder import EventRecorder
from geomx.metrics.summary import Summary, build_summary
from geomx.node.checkpoint import note_crash, read_manifest
from geomx.node.program import ProgramError
from geomx.node.restart import restart_mode, restart_node
from geomx.scenario import Scenario
from geomx.sim.job_network import (
    build_network, counters_from_network, schedule_link_faults, transfer_recorder,
)
from geomx.sim.cpu import ChargedFabric, NodeCpus
from geomx.sim.loop import EmulationDeadlock, VirtualTimeLoop, cancel_remaining, new_virtual_loop
from geomx.sim.network import Network
from geomx.sim.services import EmuServices
from geomx.sim.supervise import deadlock_hint, run_nodes
from geomx.sim.transport import SimFabric


@dataclass(slots=True)
class EmulatedJob:
    """Everything one emulated run is made of, built before its loop runs."""

    scenario: Scenario
    plan: JobPlan
    run_dir: Path
    start_s: float  # emulated time the run starts at (a resumed run: its checkpoint's)
    loop: VirtualTimeLoop
    network: Network
    recorder: EventRecorder
    writer: ProgressWriter
    bar: ProgressBar
    dgt_tally: DgtTally
    services: EmuServices
    fabric: SimFabric
    nodes: list[Any]  # in plan order; a restarted node replaces its crashed object
    wall0_s: float  # time.perf_counter() when the run's clocks started

    def restart(self, name: str) -> Any:
        """A crashed node started again, as ``geomx node --rejoin`` starts one
        (geomx/node/restart.py: a worker rejoins, a server is taken over)."""
        node = make_node(self.plan, name, self.fabric.transport(name), self.services)
        restart_node(node, self.plan.job, self.plan.roles[name])
        return node


def resume_time_s(s: Scenario) -> float:
    """The emulated time a resumed run starts at: its checkpoint's (0 for a fresh run)."""
    if not s.checkpoint.resume_from:
        return 0.0
    return float(read_manifest(Path(s.checkpoint.resume_from)).get("t", 0.0))


def run_emulated(s: Scenario, run_dir: Path, *, progress: bool = True,
                 inspect: Callable[[list[Any]], None] | None = None) -> Summary:
    """Run the whole job in one process on the virtual-time emulator.

    ``inspect``, if given, is called with the finished node objects (tests, notebooks).
    """
    job = assemble_job(s, run_dir, progress=progress)
    run_job(job)
    wall_s = time.perf_counter() - job.wall0_s
    if inspect is not None:
        inspect(job.nodes)
    return summarise(job, wall_s)


def assemble_job(s: Scenario, run_dir: Path, *, progress: bool) -> EmulatedJob:
    """The loop, the network, the run's event recording and every node, not yet running."""
    plan = plan_job(s, "emu")
    for f in s.faults:
        if f.kind == "crash" and f.duration_s > 0:
            # a restart the job cannot take is refused now, not when the loop restarts it
            restart_mode(plan.job, f.node, plan.roles[f.node])
    start_s = resume_time_s(s)
    if plan.job.checkpoint:
        plan.job.checkpoint["dir"] = str(run_dir / "checkpoints")
    loop = new_virtual_loop(start_time=start_s)
    network = build_network(s, plan)
    recorder = EventRecorder(run_dir / "events.jsonl", clock=loop.time,
                             enabled=s.metrics.events, dc_of=plan.job.dc_of.get)
    wall0_s = time.perf_counter()
    writer, bar, dgt_tally = _follow_events(s, plan, run_dir, recorder, network, wall0_s,
                                            progress)
    services = EmuServices(s.run.seed, recorder, None, plan.job.dc_of, clock=loop.time)
    fabric = _fabric(s, plan, network, loop)
    try:
        nodes = [make_node(plan, name, fabric.transport(name), services) for name in plan.nodes]
    except ProgramError as e:  # a program that does not load fails the job, naming the node
        recorder.close()
        raise JobFailed(str(e)) from e
    return EmulatedJob(s, plan, run_dir, start_s, loop, network, recorder, writer, bar,
                       dgt_tally, services, fabric, nodes, wall0_s)


def _fabric(s: Scenario, plan: JobPlan, network: Network, loop: VirtualTimeLoop) -> SimFabric:
    """The plain fabric, or with ``[host] profile`` one whose nodes pay the profile's CPU
    costs (geomx/sim/cpu.py, docs/calibration.md)."""
    if not s.host.profile:
        return SimFabric(network)
    from geomx.host_profile import load_profile

    cpus = NodeCpus(load_profile(s.host.profile), plan.roles, s.host.cores, plan.job.dc_of)
    return ChargedFabric(network, cpus, loop.time, loop.call_at_plain)


def _follow_events(s: Scenario, plan: JobPlan, run_dir: Path, recorder: EventRecorder,
                   network: Network, wall0_s: float, progress: bool
                   ) -> tuple[ProgressWriter, ProgressBar, DgtTally]:
    """Connect the recorder to what reads the event stream as it is written: the
    ``xfer`` events (or byte counters), ``progress.csv``, the progress bar and the DGT
    channel tally."""
    writer = ProgressWriter(run_dir / "progress.csv",
                            wall_clock=lambda: time.perf_counter() - wall0_s)
    if s.metrics.events:
        network.on_transfer = transfer_recorder(recorder)
    else:
        # no per-transfer events (much cheaper): refresh the byte counters from the
        # network's own totals just before each evaluation row is written
        def refresh(ev: dict[str, Any]) -> None:
            if ev["ev"] == "eval":
                recorder.counters = counters_from_network(network)

        recorder.add_listener(refresh)
    writer.follow(recorder, "eval", node=plan.train.evaluator)
    bar = ProgressBar(plan.train.iterations, enabled=progress, time_label="emu")
    evaluator = plan.train.evaluator

    def on_event(ev: dict[str, Any]) -> None:
        if ev["node"] == evaluator and ev["ev"] in ("eval", "compute"):
            bar.on_event(ev)

    recorder.add_listener(on_event)
    dgt_tally = DgtTally()
    recorder.add_listener(dgt_tally.on_event)
    return writer, bar, dgt_tally


def run_job(job: EmulatedJob) -> None:
    """Run every node to the end on the job's loop, then close the loop and the run's
    event files. Raises :class:`JobFailed` naming the failed node, or the deadlock."""
    s, loop = job.scenario, job.loop
    asyncio.set_event_loop(loop)
    schedule_link_faults(loop, s, job.network, job.recorder)
    try:
        # resuming: the clock goes on from the checkpoint; crashes before it are history
        # (a fresh run keeps a crash at 0 s: the node dies before it registers)
        faults = tuple(f for f in s.faults if f.kind != "crash" or f.at_s > job.start_s
                       or not s.checkpoint.resume_from)
        loop.run_until_complete(run_nodes(job.nodes, faults,
                                          on_crash=lambda n, t: note_crash(job.run_dir, n, t),
                                          restart=job.restart))
    except EmulationDeadlock as e:
        raise JobFailed(f"the emulated job deadlocked (every node is waiting)"
                        f"{deadlock_hint(s)}: {e}") from e
    finally:
        try:
            cancel_remaining(loop)  # a failed job leaves tasks behind: end them in virtual time
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()
        job.bar.close()
        job.recorder.close()
        job.writer.close()


def summarise(job: EmulatedJob, wall_s: float) -> Summary:
    """The run's summary from its finished nodes, the network's totals and the
    ``progress.csv`` written during the run."""
    s, network, evaluator = job.scenario, job.network, job.plan.train.evaluator
    emulated_s = job.loop.time()
    workers = [n for n in job.nodes if getattr(n, "role", "") == "worker" and not n.is_master]
    iterations = max((n.iteration for n in workers), default=0)
    final = next((n.result for n in workers if n.name == evaluator), None) or {}
    counters = job.recorder.counters if s.metrics.events else counters_from_network(network)
    summary = build_summary(
        counters, read_progress(job.run_dir / "progress.csv"), runtime="emu",
        scenario_name=s.run.name, seed=s.run.seed, iterations=iterations,
        emulated_seconds=emulated_s, wall_seconds=wall_s,
        target_accuracy=s.run.target_accuracy or None,
        extra={"messages_delivered": network.messages_delivered,
               "messages_dropped": network.messages_dropped,
               "rate_recomputations": network.rate_recomputations,
               # event-loop callbacks run (callbacks per message: the emulator's overhead)
               "loop_callbacks": job.loop.callbacks_run,
               "final_eval": final,
               "emulated_over_wall": emulated_s / wall_s if wall_s > 0 else None,
               "link_capacity_bps": {k: l.capacity_bps for k, l in network.links.items()},
               **({"dgt": job.dgt_tally.as_dict()} if job.dgt_tally.seen else {}),
               **({"host_cpu_busy_s": dict(sorted(job.fabric.cpus.busy_s.items()))}
                  if isinstance(job.fabric, ChargedFabric) else {}),
               },
    )
    if final.get("accuracy") is not None:
        summary.final_accuracy = final["accuracy"]
        summary.final_loss = final.get("loss")
    return summary
