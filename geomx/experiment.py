"""Run a scenario on a runtime and leave a run folder behind.

``run_scenario`` is what ``geomx run`` calls. The emulator path builds every node of the
job in this process on a :class:`~geomx.sim.network.Network` and a virtual-time loop;
the real path (``geomx/runtime/launcher.py``) starts one process per node. Both write
the same run-folder schema (docs/architecture.md): ``scenario.toml`` (resolved),
``events.jsonl``, ``progress.csv``, ``summary.json``, ``trace.json`` and plots.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from geomx.cluster import JobPlan, make_node, plan_job
from geomx.node.checkpoint import injected_crashes, note_crash
from geomx.errors import JobFailed  # re-exported: users catch geomx.experiment.JobFailed
from geomx.metrics.channel_tally import DgtTally
from geomx.metrics.chrome_trace import convert_events_file
from geomx.metrics.progress import ProgressBar, ProgressWriter, read_progress
from geomx.metrics.recorder import EventRecorder
from geomx.metrics.summary import Summary, build_summary, write_summary
from geomx.scenario import Scenario, link_faults, scenario_to_toml
from geomx.topology.link_faults import link_timeline
from geomx.traces import wan_traces
from geomx.transport import BaseServices

log = logging.getLogger(__name__)


@dataclass
class RunResult:
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
    while path.exists():
        n += 1
        path = base / f"{name}-{stamp}-{n}"
    path.mkdir()
    return path


class EmuServices(BaseServices):
    """Node services inside the emulator: compute is virtual time; bytes are counted by
    the network model (per physical link), not here."""

    def __init__(self, *args: Any, clock: Callable[[], float] | None = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        if clock is not None:
            # the virtual clock itself, not asyncio.get_running_loop().time(): that makes a
            # getpid() system call per read
            self.now = clock  # type: ignore[method-assign]

    async def compute(self, declared_s: float, measured_s: float) -> None:
        if declared_s > 0:
            await asyncio.sleep(declared_s)

    def count_bytes(self, msg: Any) -> None:  # the network's transfer hook counts
        return None


def build_network(s: Scenario, plan: JobPlan):
    """The emulated topology: one host per node, a switch per DC, the scenario's WAN."""
    from geomx.sim.network import Network

    net = Network(seed=s.run.seed, tcp_window_bytes=s.network.tcp_window_bytes,
                  mss_bytes=s.network.mss_bytes)
    for d in s.dcs:
        net.add_dc(d.name, lan_delay_s=d.lan_latency_s)
    by_name = {d.name: d for d in s.dcs}
    for node in plan.nodes:
        d = by_name[plan.job.dc_of[node]]
        net.add_host(node, d.name, nic_bandwidth_bps=d.lan_bandwidth_bps)
    traces = wan_traces(s.wans, s.run.seed)
    for w in s.wans:
        trace_ab, trace_ba = traces.get((w.a, w.b)), traces.get((w.b, w.a))
        net.add_wan(w.a, w.b, bandwidth_bps=w.bandwidth_bps, delay_s=w.latency_s, loss=w.loss,
                    jitter_s=w.jitter_s, trace_ab=trace_ab, trace_ba=trace_ba,
                    bandwidth_ba_bps=w.bandwidth_ba_bps)
    return net


def _transfer_recorder(recorder: EventRecorder, dc_of: dict[str, str]):
    def on_transfer(msg: Any, t_start: float, t_end: float, path: tuple[str, ...] | list[str],
                    dropped: bool) -> None:
        recorder.record_at(t_start, "xfer", msg.src, src=msg.src, dst=msg.dst,
                           msg=msg.kind.name, key=msg.key, part=msg.part, bytes=msg.nbytes,
                           channel=msg.channel, dur=t_end - t_start, path=list(path),
                           dropped=bool(dropped))
    return on_transfer


def counters_from_network(network: Any) -> Any:
    """Job-wide byte counters from the network's own per-link and per-DC-pair totals
    (used when per-transfer events are not recorded, which is much cheaper)."""
    from geomx.metrics.counters import ByteCounters

    st = network.stats()
    c = ByteCounters()
    for (a, b), n in sorted(st.dc_bytes.items()):
        key = f"{a}->{b}"
        c.bytes_per_dc_pair[key] = n
        if a == b:
            c.bytes_lan += n
        else:
            c.bytes_wan += n
    c.bytes_per_link = dict(sorted(st.link_bytes.items()))
    c.messages = st.messages_sent
    c.bytes_dropped = getattr(st, "bytes_dropped", 0)
    return c


async def _run_nodes(nodes: list[Any], faults: tuple[Any, ...] = (),
                     on_crash: Callable[[str, float], None] | None = None,
                     restart: Callable[[str], Any] | None = None) -> None:
    """Run every node; the first failure cancels the rest and is raised with its name.

    Faults (``[[fault]]``) crash a node at an emulated time: its task is cancelled and
    its transport closed, so messages to it are dropped, as when a process is killed.
    """
    tasks = {asyncio.ensure_future(n.run()): n for n in nodes}
    by_name = {n.name: t for t, n in tasks.items()}
    crashed: list[str] = []

    # a crash with a duration restarts the node (``--rejoin``) that much later: the job
    # waits for the restarted node through a stand-in future
    stand_in: dict[str, asyncio.Future[Any]] = {}

    def start_again(name: str) -> None:
        assert restart is not None
        node = restart(name)
        task = asyncio.ensure_future(node.run())
        tasks[task] = node
        by_name[name] = task
        nodes[[n.name for n in nodes].index(name)] = node
        fut = stand_in[name]

        def settle(t: asyncio.Task[Any]) -> None:
            if fut.done():
                return
            if t.cancelled():
                fut.cancel()
            elif t.exception() is not None:
                fut.set_exception(t.exception())  # type: ignore[arg-type]
            else:
                fut.set_result(None)
        task.add_done_callback(settle)

    def crash(name: str, at_s: float, restart_after_s: float = 0.0) -> None:
        task = by_name[name]
        if task.done() and name in stand_in and not stand_in[name].done():
            stand_in[name].set_result(None)  # it finished first: nothing to restart
        if not task.done():
            crashed.append(name)
            if on_crash is not None:
                on_crash(name, at_s)
            if name in stand_in:
                loop.call_at(at_s + restart_after_s, start_again, name)
            tasks[task].record("crash", fault="crash")
            task.cancel()
            asyncio.ensure_future(tasks[task].transport.close())

    loop = asyncio.get_running_loop()
    for f in faults:
        if f.kind == "crash":
            if f.duration_s > 0 and restart is not None and f.node not in stand_in:
                stand_in[f.node] = loop.create_future()
                tasks[stand_in[f.node]] = tasks[by_name[f.node]]  # (names a failure)
            loop.call_at(f.at_s, crash, f.node, f.at_s, f.duration_s)
    pending = set(tasks)
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
        failed = [t for t in done if not t.cancelled() and t.exception() is not None]
        if failed:
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            from geomx.node.base import NodeFailure

            order = {n.name: i for i, n in enumerate(nodes)}
            # deterministic: a root cause (not "another node failed") first, in plan order
            first = min(failed, key=lambda t: (isinstance(t.exception(), NodeFailure),
                                               order[tasks[t].name]))
            node = tasks[first]
            exc = first.exception()
            raise JobFailed(f"node {node.name} failed: {type(exc).__name__}: {exc}") from exc


def _set_link_state(network: Any, recorder: EventRecorder, state: Any) -> None:
    """A step of the ``link_down`` / ``partition`` faults' timeline: links fail, routes
    converge, links return."""
    network.set_link_state(state.down, state.rerouted)
    recorder.record("link_state", "network", down=sorted("-".join(sorted(e)) for e in state.down),
                    rerouted=sorted("-".join(sorted(e)) for e in state.rerouted))


def _deadlock_hint(s: Scenario) -> str:
    crashes = [f.node for f in s.faults if f.kind == "crash"]
    links = ["-".join(f.link) for f in s.faults if f.kind == "link_down"]
    cut = [", ".join(f.dcs) for f in s.faults if f.kind == "partition"]
    hint = []
    if crashes:
        hint.append(f"the injected crash of {', '.join(crashes)} (turn on "
                    "membership.in_emulator to detect it by heartbeats)")
    if links:
        hint.append(f"the failed WAN link {', '.join(links)} (do the other links still "
                    "connect every DC?)")
    if cut:
        hint.append(f"the partition cutting off {'; '.join(cut)} (it never healed: give it a "
                    "duration)")
    return " after " + " and ".join(hint) if hint else ""


def resume_time_s(s: Scenario) -> float:
    """The emulated time a resumed run starts at: its checkpoint's (0 for a fresh run)."""
    if not s.checkpoint.resume_from:
        return 0.0
    from geomx.node.checkpoint import read_manifest

    return float(read_manifest(Path(s.checkpoint.resume_from)).get("t", 0.0))


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


def run_emulated(s: Scenario, run_dir: Path, *, progress: bool = True,
                 inspect: Callable[[list[Any]], None] | None = None) -> Summary:
    """Run the whole job in one process on the virtual-time emulator.

    ``inspect``, if given, is called with the finished node objects (tests, notebooks).
    """
    from geomx.sim.loop import EmulationDeadlock, new_virtual_loop
    from geomx.sim.transport import SimFabric

    plan = plan_job(s, "emu")
    start_s = resume_time_s(s)
    if plan.job.checkpoint:
        plan.job.checkpoint["dir"] = str(run_dir / "checkpoints")
    loop = new_virtual_loop(start_time=start_s)
    network = build_network(s, plan)
    recorder = EventRecorder(run_dir / "events.jsonl", clock=loop.time,
                             enabled=s.metrics.events, dc_of=plan.job.dc_of.get)
    wall0 = time.perf_counter()
    writer = ProgressWriter(run_dir / "progress.csv",
                            wall_clock=lambda: time.perf_counter() - wall0)
    if s.metrics.events:
        network.on_transfer = _transfer_recorder(recorder, plan.job.dc_of)
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
    services = EmuServices(s.run.seed, recorder, None, plan.job.dc_of, clock=loop.time)
    fabric = SimFabric(network)
    nodes = [make_node(plan, name, fabric.transport(name), services) for name in plan.nodes]

    def restart(name: str) -> Any:
        """A crashed worker started again, as ``geomx node --rejoin`` does (a local server:
        a new process taking over its name, [membership] on_server_loss = "wait")."""
        node = make_node(plan, name, fabric.transport(name), services)
        if plan.roles.get(name) in ("local_server", "global_server"):
            node.taking_over = True
        else:
            node.rejoining = True
        return node
    asyncio.set_event_loop(loop)
    for state in link_timeline(link_faults(s.faults, s.wans)):
        loop.call_at(state.t_s, _set_link_state, network, recorder, state)
    try:
        # resuming: the clock goes on from the checkpoint; crashes before it are history
        # (a fresh run keeps a crash at 0 s: the node dies before it registers)
        faults = tuple(f for f in s.faults if f.kind != "crash" or f.at_s > start_s
                       or not s.checkpoint.resume_from)
        loop.run_until_complete(_run_nodes(nodes, faults,
                                           on_crash=lambda n, t: note_crash(run_dir, n, t),
                                           restart=restart))
    except EmulationDeadlock as e:
        raise JobFailed(f"the emulated job deadlocked (every node is waiting)"
                        f"{_deadlock_hint(s)}: {e}") from e
    finally:
        from geomx.sim.loop import _cancel_remaining

        try:
            _cancel_remaining(loop)  # a failed job leaves tasks behind: end them in virtual time
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()
        bar.close()
        recorder.close()
        writer.close()
    wall_s = time.perf_counter() - wall0
    emulated_s = loop.time()
    if inspect is not None:
        inspect(nodes)
    workers = [n for n in nodes if getattr(n, "role", "") == "worker" and not n.is_master]
    iterations = max((n.iteration for n in workers), default=0)
    final = next((n.result for n in workers if n.name == evaluator), None) or {}
    counters = recorder.counters if s.metrics.events else counters_from_network(network)
    summary = build_summary(
        counters, read_progress(run_dir / "progress.csv"), runtime="emu",
        scenario_name=s.run.name, seed=s.run.seed, iterations=iterations,
        emulated_seconds=emulated_s, wall_seconds=wall_s,
        target_accuracy=s.run.target_accuracy or None,
        extra={"messages_delivered": network.messages_delivered,
               "messages_dropped": network.messages_dropped,
               "rate_recomputations": network.rate_recomputations,
               # event-loop callbacks run (callbacks per message: the emulator's overhead)
               "loop_callbacks": loop.callbacks_run,
               "final_eval": final,
               "emulated_over_wall": emulated_s / wall_s if wall_s > 0 else None,
               "link_capacity_bps": {k: l.capacity_bps for k, l in network.links.items()},
               **({"dgt": dgt_tally.as_dict()} if dgt_tally.seen else {}),
               },
    )
    if final.get("accuracy") is not None:
        summary.final_accuracy = final["accuracy"]
        summary.final_loss = final.get("loss")
    return summary


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
    write_summary(run_dir / "summary.json", summary)
    if s.metrics.trace and s.metrics.events and (run_dir / "events.jsonl").exists():
        convert_events_file(run_dir / "events.jsonl", run_dir / "trace.json")
    if s.metrics.plot:
        from geomx.metrics.plots import write_run_plots  # matplotlib: ~0.3 s, only for plots

        caps = summary.extra.get("link_capacity_bps") if summary.extra else None
        write_run_plots(run_dir, caps)
        if s.topology.kind in ("netstorm", "mlnet") and s.metrics.events:
            from geomx.metrics.netstorm_plots import write_netstorm_plots

            write_netstorm_plots(run_dir, [(w.a, w.b) for w in s.wans], true_rate_bps(s))


def true_rate_bps(s: Scenario) -> Callable[[str, str, float], float]:
    """``rate(a, b, t)``: the scenario's rate of WAN direction a -> b at time t (its trace,
    drawn with the seeds build_network uses, or its constant capacity)."""
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
    if runtime == "emu" and _loop_running_here():
        # A Jupyter kernel (ipykernel) runs an asyncio loop in this thread, and the
        # emulator needs a loop of its own: run it in a thread (virtual time, so the
        # events are the same).
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1, thread_name_prefix="geomx-emulator") as pool:
            summary = pool.submit(run_emulated, s, run_dir, progress=show,
                                  inspect=inspect).result()
    elif runtime == "emu":
        summary = run_emulated(s, run_dir, progress=show, inspect=inspect)
    else:
        from geomx.runtime.launcher import run_real

        summary = run_real(s, run_dir, progress=show)
    finish_run_dir(s, run_dir, summary)
    return RunResult(run_dir, summary)
