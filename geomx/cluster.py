"""From a validated scenario to the nodes of a job (the same plan on both runtimes).

``plan_job`` lays the nodes out with the planner ``[topology] kind`` names
(:mod:`geomx.topology`: node names, roles, who registers where; see
docs/architecture.md, "Naming of nodes"), then works out what each worker computes and
the per-worker compute profile;
``make_node`` builds one node object on a given transport and services. The emulator
calls ``make_node`` for every node in one process; the real runtime calls it once per
process with that process's node name.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any

from geomx.algorithms.data import GENERATED as GENERATED_TABLES
from geomx.algorithms.program import PROGRAM as ALGORITHM_PROGRAM
from geomx.algorithms.program import state_bytes as algorithm_state_bytes
from geomx.ml.flops import model_key_flops, preset_key_flops
from geomx.node.global_server import GlobalServer
from geomx.node.layered import normalised_shares
from geomx.node.local_server import LocalServer
from geomx.node.mesh_controller import MeshController
from geomx.node.mesh_server import MeshServer
from geomx.node.program import load_program_for, run_user_program
from geomx.node.scheduler import Scheduler
from geomx.node.spec import JobSpec
from geomx.node.sched_context import install_coordinators
from geomx.node.state_server import StateServer
from geomx.node.trainer import (TrainSpec, build_model, initial_params,
                                iterations_for_epochs, master_program, train_program)
from geomx.node.worker import Worker
from geomx.policy.options import options_from_table, options_to_table
from geomx.policy.registry import policy_class
from geomx.policy.scheduling import TransferScheduler
from geomx.policy.topology import MeshTopology, Topology
from geomx.scenario import Scenario, ScenarioError
from geomx.topology import STATE_SERVER, DCShape, make_topology, plan_nodes

__all__ = ["STATE_SERVER", "JobPlan", "plan_job", "make_node", "codec_config",
           "auto_request_timeout_s"]


@dataclass
class JobPlan:
    job: JobSpec
    train: TrainSpec
    compute_s: dict[str, float]     # worker -> emulated compute seconds per iteration
    roles: dict[str, str]           # node -> role
    compute_scale: dict[str, float] = dataclasses.field(default_factory=dict)  # heterogeneity x slowdown
    #: node -> ``(start_s, end_s, factor)`` periods of ``[[fault]] kind = "slow"``
    slow_periods: dict[str, tuple[tuple[float, float, float], ...]] = dataclasses.field(
        default_factory=dict)

    @property
    def nodes(self) -> list[str]:
        return self.job.all_nodes()


def _optimizer_config(name: str, lr: float, s: Scenario, which: str = "optimizer") -> dict[str, Any] | None:
    """``name`` is ``s.training.<which>``; the options come from ``<which>_options``."""
    extra: dict[str, Any] = {}
    if s.training.global_grad_scale == "sum":
        extra["rescale_grad"] = 1.0  # GeoMX: the sum of the workers' mean gradients
    if name.startswith("dcasgd"):
        extra["lamda"] = s.sync.dcasgd_lambda
    assert getattr(s.training, which) == name
    return s.training.optimizer_config(which, lr, extra)


def _phantom_sizes(s: Scenario) -> list[int]:
    from geomx.ml.phantom import phantom_layer_sizes

    t = s.training
    return list(phantom_layer_sizes(total_params=t.phantom_params or None,
                                    layers=list(t.phantom_layers) or None,
                                    preset=t.phantom_preset or None))


def codec_config(s: Scenario) -> dict[str, Any]:
    """The scenario's [codec] as a ``set_gradient_compression``-style dict, with only the
    parameters the chosen codec takes (fp16 has none, bsc/mpq take the threshold...),
    then ``[codec.options]``. A user codec's ``type`` is its resolved spec (an absolute
    ``file.py:Class``), so every node, in any process, builds the same class from it."""
    from geomx.codec import create_codec
    from geomx.scenario.policies import is_user_policy

    options = s.codec.options_table
    if is_user_policy("codec", s.codec.type):
        return {"type": s.codec.type, **options}
    params = {"threshold": s.codec.threshold, "size_lower_bound": s.codec.size_lower_bound}
    accepted = getattr(create_codec(s.codec.type), "params", ())
    return {"type": s.codec.type, **{k: v for k, v in params.items() if k in accepted}, **options}


def transfer_schedulers(s: Scenario) -> tuple[TransferScheduler, ...]:
    """The job's transfer schedulers, built once from ``[sched]`` (built-ins read their
    typed options from its fields), in the order their sides compose (P3, DGT, TSEngine,
    then the one ``[sched] policy`` names)."""
    q = s.sched
    out: list[TransferScheduler] = []
    if q.p3:
        cls = policy_class("sched", "p3")
        out.append(cls(cls.Options(slice_elements=q.p3_slice_elements)))
    if q.dgt != "off":
        cls = policy_class("sched", "dgt")
        out.append(cls(cls.Options(mode=q.dgt, block_bytes=q.dgt_block_bytes, k=q.dgt_k,
                                   k_min=q.dgt_k_min, adaptive_k=q.dgt_adaptive_k,
                                   channels=q.dgt_channels, alpha=q.dgt_alpha,
                                   codec=s.codec.type)))
    if q.tsengine_inter or q.tsengine_intra:
        mode = {(True, False): "inter", (False, True): "intra",
                (True, True): "both"}[(q.tsengine_inter, q.tsengine_intra)]
        cls = policy_class("sched", "tsengine")
        out.append(cls(cls.Options(mode, q.tsengine_max_greed_rate,
                                   q.tsengine_expiry_iterations)))
    if q.policy != "none":
        # a scheduler of the user's own ([sched] policy), after the built-ins
        cls = policy_class("sched", q.policy)
        out.append(cls(options_from_table(cls.Options, q.options_table,
                                          policy=f"sched policy {q.policy!r}",
                                          where="sched.options")))
    return tuple(out)


def plan_job(s: Scenario, runtime: str | None = None) -> JobPlan:
    """Name the nodes and describe the job. ``runtime`` ("emu"/"real", default the
    scenario's) only decides whether liveness timers run: in the emulator they are off
    unless ``membership.in_emulator`` (endless timers would hide a deadlock)."""
    central = s.central_dc
    parties = s.party_dcs
    algorithm = s.sync.resolved_algorithm
    topology = scenario_topology(s)
    layout = plan_nodes(topology, central.name,
                        [DCShape(d.name, d.workers) for d in parties],
                        global_servers=central.global_servers,
                        state_server=policy_class("sync", algorithm).needs_state_server)
    workers_of = layout.workers_of
    job = JobSpec(
        mode=layout.mode, central_dc=layout.central_dc, party_dcs=list(layout.party_dcs),
        global_scheduler=layout.global_scheduler, global_servers=list(layout.global_servers),
        master_worker=layout.master_worker, local_scheduler_of=dict(layout.local_scheduler_of),
        local_server_of=dict(layout.local_server_of), workers_of=workers_of, dc_of=layout.dc_of,
        bigarray_bound=s.sched.bigarray_bound, seed=s.run.seed,
        sync={"algorithm": algorithm, "auto": s.sync.algorithm == "auto",
              "staleness": s.sync.staleness, "k1": s.sync.k1,
              "k2": s.sync.k2, "esync_epsilon_s": s.sync.esync_epsilon_s,
              "esync_max_local_steps": s.sync.esync_max_local_steps,
              # a user algorithm's [sync.options], checked at load (geomx/scenario/policies.py)
              **({"options": s.sync.options_table} if s.sync.options else {})},
        codec=codec_config(s),
        transfer_schedulers=transfer_schedulers(s),
        state_server=layout.state_server,
    )
    c = s.checkpoint
    if c.enabled or c.resume_from:
        job.checkpoint = {"every_rounds": c.every.rounds, "every_s": c.every.seconds,
                          "keep": c.keep, "resume_from": c.resume_from}
    runtime = runtime or s.run.runtime
    m = s.membership
    job.on_worker_loss = m.on_worker_loss
    job.on_server_loss = m.on_server_loss
    job.server_loss_timeout_s = m.server_loss_timeout_s
    if runtime == "real" or m.in_emulator:
        job.heartbeat_interval_s = m.heartbeat_interval_s
        job.heartbeat_timeout_s = m.heartbeat_timeout_s if m.heartbeat_interval_s > 0 else 0.0
        job.register_timeout_s = m.register_timeout_s
    t = s.training
    model_kwargs: dict[str, Any] = {}
    if t.model == "mlp":
        model_kwargs["hidden"] = list(t.hidden)
    dataset_kwargs: dict[str, Any] = dict(t.dataset_options)
    if t.dataset in ("synthetic", *GENERATED_TABLES):
        dataset_kwargs = {"n_samples": t.synthetic_samples, "n_features": t.synthetic_features,
                          "n_classes": t.synthetic_classes}
    worker_lr = t.worker_lr or t.lr
    train = TrainSpec(
        model=t.model, model_kwargs=model_kwargs, dataset=t.dataset,
        data_path=t.data_path or None, dataset_kwargs=dataset_kwargs, partition=t.partition,
        dirichlet_alpha=t.dirichlet_alpha, batch_size=t.batch_size,
        # HFA / ESync: the global tier sums model deltas; local steps use worker_optimizer
        global_optimizer=(_optimizer_config(t.optimizer, t.lr, s)
                          if job.sync_algorithm.uses_global_optimizer else None),
        worker_optimizer=_optimizer_config(t.worker_optimizer, worker_lr, s, "worker_optimizer") or {"name": "sgd",
                                                                                  "lr": worker_lr},
        codec=dict(job.codec), iterations=s.run.iterations, eval_every=s.run.eval_every,
        target_accuracy=s.run.target_accuracy, max_emulated_s=s.run.max_emulated_time_s,
        max_wall_s=s.run.max_wall_time_s,
        phantom_sizes=_phantom_sizes(s) if t.model == "phantom" else [],
        evaluator=job.all_workers[0] if job.all_workers else "", seed=s.run.seed,
        sync=dict(job.sync), program=ALGORITHM_PROGRAM if t.algorithm else t.program,
        program_args=list(t.program_args), algorithm=t.algorithm,
    )
    if t.layer_compute != "off":
        train.layer_shares = layer_shares(s, train)
        train.backward_fraction = t.layer_backward_fraction
    if isinstance(topology, MeshTopology):
        job.mesh = mesh_config(s, train, topology)
    if s.run.epochs > 0 and t.model != "phantom":
        train.iterations = iterations_for_epochs(train, s.run.epochs, job.num_all_workers)
    compute_s: dict[str, float] = {}
    compute_scale: dict[str, float] = {}
    for d in parties:
        for i, w in enumerate(workers_of[d.name]):
            slow = d.worker_slowdown[i] if i < len(d.worker_slowdown) else 1.0
            compute_s[w] = d.compute_s_per_iter * d.heterogeneity * slow
            compute_scale[w] = d.heterogeneity * slow
    if runtime == "real" or m.in_emulator:
        job.request_timeout_s = (m.request_timeout_s if m.request_timeout_s is not None
                                 else auto_request_timeout_s(s, job, train, compute_s))
        if job.on_server_loss == "wait" and job.request_timeout_s > 0:
            # a request to a lost server is answered by its successor: the wait for it
            # (noticing the loss, then server_loss_timeout) must not fail the request first
            job.request_timeout_s += m.heartbeat_timeout_s + m.server_loss_timeout_s
    slow: dict[str, list[tuple[float, float, float]]] = {}
    for f in s.faults:
        if f.kind == "slow":
            end = f.at_s + f.duration_s if f.duration_s > 0 else float("inf")
            slow.setdefault(f.node, []).append((f.at_s, end, f.factor))
    return JobPlan(job=job, train=train, compute_s=compute_s, roles=dict(layout.roles),
                   compute_scale=compute_scale,
                   slow_periods={n: tuple(p) for n, p in slow.items()})


def layer_shares(s: Scenario, train: TrainSpec) -> list[float]:
    """Per-key compute shares of the per-layer compute model (``[training] layer_compute``):
    from FLOPs (phantom presets, numpy models) or the scenario's list, normalised."""
    t = s.training
    num_keys = len(train.phantom_sizes) if t.model == "phantom" else len(build_model(train).params)
    if t.layer_compute == "shares":
        weights = list(t.layer_compute_shares)
        if len(weights) != num_keys:
            raise ScenarioError(
                f"training.layer_compute_shares has {len(weights)} entries but the model has "
                f"{num_keys} parameter tensors; allowed: exactly one share per tensor",
                path="training.layer_compute_shares", value=len(weights),
                allowed=f"{num_keys} numbers")
    elif t.model == "phantom":
        weights = [float(f) for f in preset_key_flops(t.phantom_preset)]
    else:
        weights = [float(f) for f in model_key_flops(build_model(train))]
    return normalised_shares(weights, num_keys)


def scenario_topology(s: Scenario) -> Topology:
    """The job's topology object: ``[topology] kind`` with ``[topology.options]``, or a
    built-in's options from its existing section (``[netstorm]``)."""
    return make_topology(s.topology.kind, options=s.topology.options_table,
                         sections={"netstorm": s.netstorm})


def mesh_config(s: Scenario, train: TrainSpec, topology: MeshTopology) -> dict[str, Any]:
    """What a mesh job's controller and servers read (``JobSpec.mesh``): the topology (its
    name and options table, which every node builds its object from), the mechanics of
    ``[netstorm]`` (chunking, link timing, when to re-plan, the send window), the mesh's
    links (a, b, one-way delay) and the global optimizer the roots apply (installed at
    start, so no round can beat the master's ``set_optimizer``)."""
    n = s.netstorm
    return {"topology": s.topology.kind, "topology_options": options_to_table(topology.options),
            "seed": s.run.seed, "links": [[w.a, w.b, w.latency_s] for w in s.wans],
            "chunk_elements": n.chunk_elements,
            "report_bytes": report_bytes(s, topology), "report_samples": n.report_samples,
            "report_rate": n.report_rate, "check_period_s": n.check_period_s,
            "update_rate": n.update_rate, "send_window": n.send_window,
            "optimizer": train.global_optimizer}


#: ``[netstorm] report_bytes = "auto"``'s ceiling: NETSTORM's SIZE_MSG_REPORT.
REPORT_BYTES_CAP = 4_000_000


def report_bytes(s: Scenario, topology: MeshTopology) -> int:
    """The smallest data message a mesh server times as a link sample: ``[netstorm]
    report_bytes``, or for ``auto`` a full chunk's float32 bytes capped at
    :data:`REPORT_BYTES_CAP`. A topology that measures links refuses a value above a full
    chunk: no data message would reach it and the plans would never see a measured rate."""
    n = s.netstorm
    chunk_bytes = 4 * n.chunk_elements
    if n.report_bytes is None:
        return min(REPORT_BYTES_CAP, chunk_bytes)
    if topology.measures_links and n.report_bytes > chunk_bytes:
        raise ScenarioError(
            f"{n.report_bytes} B is more than a full chunk ({n.chunk_elements} elements = "
            f"{chunk_bytes} B), so topology {topology.name or type(topology).__name__!r}, "
            f"which measures links, would never measure one; allowed: at most {chunk_bytes} "
            "B, or 'auto'",
            path="netstorm.report_bytes", value=n.report_bytes,
            allowed=f"at most {chunk_bytes} B (a full chunk), or 'auto'")
    return n.report_bytes


#: Floor and safety factor of ``membership.request_timeout = "auto"``.
AUTO_REQUEST_TIMEOUT_FLOOR_S = 30.0
AUTO_REQUEST_TIMEOUT_FACTOR = 10.0


def _slowest_link_bps(s: Scenario) -> tuple[float, float]:
    """(lowest sustained rate in bit/s, longest RTT in s) over the scenario's links: WAN
    capacity in either direction, a trace's floor, the window/RTT cap and, on a lossy link,
    the Mathis et al. cap the network model applies to reliable channels."""
    from geomx.traces import CsvTrace

    rate = min(d.lan_bandwidth_bps for d in s.dcs)
    rtt_max = 4 * max(d.lan_latency_s for d in s.dcs)
    for w in s.wans:
        bw = min(w.bandwidth_bps, w.bandwidth_ba_bps or w.bandwidth_bps)
        if w.trace == "uniform":
            bw = min(bw, w.trace_low_bps)
        elif w.trace:
            bw = min([bw, *(r for r in CsvTrace(w.trace).rates_bps if r > 0)])
        rtt = 2 * (w.latency_s + w.jitter_s) + 4 * max(d.lan_latency_s for d in s.dcs)
        rtt_max = max(rtt_max, rtt)
        if rtt > 0:
            bw = min(bw, s.network.tcp_window_bytes * 8 / rtt)
            if w.loss > 0:
                bw = min(bw, s.network.mss_bytes * 8 * math.sqrt(1.5) / (rtt * math.sqrt(w.loss)))
        rate = min(rate, bw)
    return rate, rtt_max


def auto_request_timeout_s(s: Scenario, job: JobSpec, train: TrainSpec,
                           compute_s: dict[str, float]) -> float:
    """``membership.request_timeout = "auto"``: how long a reply may legitimately take.

    A reply can wait for a whole round of the slowest participant: its compute (times the
    local steps the sync algorithm takes between exchanges) plus moving the model through
    the slowest link as many times as the busiest server's fan-in, both ways. The timeout
    is ``AUTO_REQUEST_TIMEOUT_FACTOR`` times that, and never below
    ``AUTO_REQUEST_TIMEOUT_FLOOR_S`` (process start-up and a loaded machine add seconds
    that no scenario declares). It is a bound for lost replies, not a performance target.
    """
    steps = job.sync_algorithm.exchange_iterations()
    compute = max(compute_s.values(), default=0.0) * steps
    if train.algorithm:
        model_bytes = algorithm_state_bytes(train, job.num_all_workers)
    else:
        model_bytes = _model_bytes(train)
    fan_in = max([len(job.party_dcs), job.num_all_workers if job.mode == "flat_ps" else 0,
                  *(len(v) for v in job.workers_of.values())])
    rate_bps, rtt_s = _slowest_link_bps(s)
    transfer = 2 * fan_in * model_bytes * 8 / rate_bps + 4 * rtt_s
    return max(AUTO_REQUEST_TIMEOUT_FLOOR_S, AUTO_REQUEST_TIMEOUT_FACTOR * (compute + transfer))


#: The largest message a job whose tensors are not known up front (a training program,
#: which creates its keys as it runs) may send over the real runtime.
PROGRAM_MAX_MESSAGE_BYTES = 256 * 2**20


def max_message_bytes(plan: JobPlan) -> int:
    """The largest message a node of this job can legitimately receive (real runtime).

    A frame announcing more is a stranger's (or a bug's), so the transport refuses it
    before holding any of it (without this bound, 8 connections announcing 128 MiB frames
    grow a node by ~1 GB). Built-in models: twice the whole model (a message never carries more
    than the model and, with a codec, its residual-free encoding) plus 16 MiB for headers
    and small keys; training programs create keys as they run, so they get
    :data:`PROGRAM_MAX_MESSAGE_BYTES`.
    """
    train = plan.train
    if train.program:
        return PROGRAM_MAX_MESSAGE_BYTES
    return 2 * _model_bytes(train) + 16 * 2**20


def _model_bytes(train: TrainSpec) -> int:
    """Bytes of the whole model (a phantom model's float32 tensors without building them)."""
    if train.phantom:
        return 4 * sum(train.phantom_sizes)
    return sum(int(getattr(p, "nbytes", 0)) for p in initial_params(train))


def make_node(plan: JobPlan, name: str, transport: Any, services: Any) -> Any:
    """Build node ``name`` of the plan on ``transport``/``services``."""
    job, role = plan.job, plan.roles.get(name)
    if role is None:
        raise KeyError(f"no node named {name!r} in this scenario; nodes: {', '.join(plan.nodes)}")
    node = _make_node(plan, name, role, transport, services)
    node.heartbeat_interval_s = job.heartbeat_interval_s
    node.heartbeat_timeout_s = job.heartbeat_timeout_s
    node.register_timeout_s = job.register_timeout_s
    node.request_timeout_s = job.request_timeout_s
    node.slow_periods = plan.slow_periods.get(name, ())
    if job.on_server_loss == "wait" and role == "worker":
        node.replaceable_peers = {job.local_server_of[job.dc_of[name]]}
    elif role in ("local_server", "master_worker"):
        node.replaceable_peers = job.replaceable_servers() & set(job.global_servers)
    return node


def _make_node(plan: JobPlan, name: str, role: str, transport: Any, services: Any) -> Any:
    job = plan.job
    dc = job.dc_of[name]
    if role == "global_scheduler" and job.mode == "netstorm":
        return MeshController(name, dc, transport, services, job.scheduler_members(name), job,
                              heartbeat_timeout_s=job.heartbeat_timeout_s,
                              register_timeout_s=job.register_timeout_s)
    if role in ("global_scheduler", "local_scheduler"):
        sch = Scheduler(name, dc, transport, services, job.scheduler_members(name),
                        heartbeat_timeout_s=job.heartbeat_timeout_s,
                        register_timeout_s=job.register_timeout_s,
                        losable=(set(job.all_workers) if job.on_worker_loss == "continue"
                                 else set()),
                        replaceable=job.replaceable_servers(),
                        replace_timeout_s=job.server_loss_timeout_s)
        install_coordinators(sch, job)  # TSEngine's overlays, when on
        return sch
    if role == "mesh_server":
        return MeshServer(name, dc, transport, services, job)
    if role == "global_server":
        return GlobalServer(name, dc, transport, services, job)
    if role == "state_server":
        return StateServer(name, dc, transport, services, job)
    if role == "local_server":
        return LocalServer(name, dc, transport, services, job)
    user = plan.train.program
    # loaded here, before the node registers (its import must not hold up heartbeats)
    main = load_program_for(name, user) if user else None
    if role == "master_worker":
        program = (functools.partial(run_user_program, spec=plan.train, program=user,
                                     args=plan.train.program_args, main=main) if user
                   else functools.partial(master_program, spec=plan.train))
        return Worker(name, dc, transport, services, job, program, is_master=True)
    rank = job.workers_of[dc].index(name)
    program = (functools.partial(run_user_program, spec=plan.train, program=user,
                                 args=plan.train.program_args, main=main,
                                 compute_scale=plan.compute_scale.get(name, 1.0)) if user
               else functools.partial(train_program, spec=plan.train))
    return Worker(name, dc, transport, services, job, program, rank=rank,
                  compute_s_per_iter=plan.compute_s[name])
