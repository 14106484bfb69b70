"""Whole-scenario checks: rules that need more than one section.

Each check takes a parsed :class:`Scenario` and raises :class:`ScenarioError` naming the
field to change. They run in registration order after every section has parsed (so a
later check may rely on an earlier one: the fault check relies on exactly one central DC).
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable

from geomx.scenario.errors import ScenarioError, did_you_mean, quote_list
from geomx.scenario.model import Scenario
from geomx.scenario.training import MODELS, SERVER_OPTIMIZERS, WORKER_OPTIMIZERS
from geomx.policy.options import OptionsError
from geomx.policy.registry import PolicyError, policy_class
from geomx.topology import (DCShape, aggregates_over_trees, is_mesh, make_topology,
                            plan_nodes)

__all__ = ["SCENARIO_CHECKS", "scenario_check"]


SCENARIO_CHECKS: list[Callable[[Scenario], None]] = []
"""Checks that need more than one section; each raises :class:`ScenarioError`. Other
modules may append their own (e.g. a [security] section's)."""


def scenario_check(fn: Callable[[Scenario], None]) -> Callable[[Scenario], None]:
    SCENARIO_CHECKS.append(fn)
    return fn


@scenario_check
def _check_topology(s: Scenario) -> None:
    """The topology class loads and its options fit its ``Options`` (before any check
    that asks the class what it lays out)."""
    try:
        make_topology(s.topology.kind, options=s.topology.options_table,
                      sections={"netstorm": s.netstorm})
    except OptionsError as e:
        raise ScenarioError(str(e), path="topology.options") from None
    except PolicyError as e:
        raise ScenarioError(str(e), path="topology.kind", value=s.topology.kind) from None


@scenario_check
def _check_dcs(s: Scenario) -> None:
    if not s.dcs:
        raise ScenarioError("no [[dc]] given; allowed: one central DC and at least one party DC", path="dc")
    seen: dict[str, int] = {}
    for i, dc in enumerate(s.dcs):
        if dc.name in seen:
            raise ScenarioError(f"duplicate DC name {dc.name!r} (also dc[{seen[dc.name]}]); "
                                f"allowed: unique names", path=f"dc[{i}].name", value=dc.name)
        seen[dc.name] = i
    central = [i for i, dc in enumerate(s.dcs) if dc.central]
    names = quote_list(dc.name for dc in s.dcs)
    if is_mesh(s.topology.kind):
        _check_mesh_dcs(s, central)
        return
    if not central:
        raise ScenarioError(f"no central DC among {names}; allowed: exactly one DC with central = true",
                            path="dc", allowed="exactly one DC with central = true")
    if len(central) > 1:
        first, second = central[:2]
        raise ScenarioError(
            f"two central DCs, {s.dcs[first].name!r} (dc[{first}]) and {s.dcs[second].name!r} "
            f"(dc[{second}]); allowed: exactly one DC with central = true",
            path=f"dc[{second}].central", value=True, allowed="exactly one DC with central = true")
    if not s.party_dcs:
        raise ScenarioError("only the central DC is given; allowed: at least one non-central DC with workers",
                            path="dc")
    for i, dc in enumerate(s.dcs):
        if dc.central and dc.workers != 0:
            raise ScenarioError(f"the central DC {dc.name!r} has {dc.workers} workers; allowed: 0 "
                                f"(workers in the central DC are not supported yet)",
                                path=f"dc[{i}].workers", value=dc.workers, allowed="0")
        if not dc.central and dc.workers < 1:
            raise ScenarioError(f"party DC {dc.name!r} has no workers; allowed: an integer >= 1",
                                path=f"dc[{i}].workers", value=dc.workers, allowed="an integer >= 1")
        if not dc.central and dc.global_servers != 1:
            raise ScenarioError(f"only the central DC hosts global servers; set global_servers on "
                                f"{s.central_dc.name!r} instead; allowed: 1 (the default) on party DCs",
                                path=f"dc[{i}].global_servers", value=dc.global_servers, allowed="1")


def _check_mesh_dcs(s: Scenario, central: list[int]) -> None:
    """NETSTORM, MLNET and MXNET run over a mesh: one server and at least one worker in
    every DC, no central DC (the controller sits in the first DC)."""
    kind = s.topology.kind
    if central:
        i = central[0]
        raise ScenarioError(f"topology.kind = {kind!r} has no central DC (every DC hosts a "
                            f"server and workers; the controller sits in the first DC); "
                            f"allowed: central = false", path=f"dc[{i}].central", value=True,
                            allowed="false")
    for i, dc in enumerate(s.dcs):
        if dc.workers < 1:
            raise ScenarioError(f"DC {dc.name!r} has no workers; allowed with topology.kind = "
                                f"{kind!r}: an integer >= 1", path=f"dc[{i}].workers",
                                value=dc.workers, allowed="an integer >= 1")
        if dc.global_servers != 1:
            raise ScenarioError(f"topology.kind = {kind!r} runs one server per DC; allowed: 1",
                                path=f"dc[{i}].global_servers", value=dc.global_servers,
                                allowed="1")


@scenario_check
def _check_mesh(s: Scenario) -> None:
    """What the tree-aggregating servers do not implement: codecs, DGT, and sync
    algorithms other than FSA (they aggregate every round over the trees)."""
    kind = s.topology.kind
    if not aggregates_over_trees(kind):
        return
    if s.sync.resolved_algorithm != "fsa":
        raise ScenarioError(f"topology.kind = {kind!r} aggregates every round over its trees; "
                            f"allowed: sync.algorithm = 'fsa' (or 'auto')", path="sync.algorithm",
                            value=s.sync.algorithm, allowed="'fsa', 'auto'")
    if s.codec.type != "none":
        raise ScenarioError(f"topology.kind = {kind!r} relays dense chunks; allowed: codec.type "
                            f"= 'none'", path="codec.type", value=s.codec.type, allowed="'none'")
    if s.sched.dgt != "off":
        raise ScenarioError(f"topology.kind = {kind!r} has no local -> global pushes for DGT; "
                            f"allowed: 'off'", path="sched.dgt", value=s.sched.dgt,
                            allowed="'off'")
    n = len(s.dcs)
    if s.netstorm.roots > n:
        raise ScenarioError(f"roots = {s.netstorm.roots} but the mesh has {n} DCs; allowed: 0 "
                            f"(all) .. {n}", path="netstorm.roots", value=s.netstorm.roots,
                            allowed=f"0 .. {n}")


@scenario_check
def _check_wans(s: Scenario) -> None:
    names = [dc.name for dc in s.dcs]
    pairs: dict[frozenset, int] = {}
    for i, wan in enumerate(s.wans):
        for end in ("a", "b"):
            name = getattr(wan, end)
            if name not in names:
                raise ScenarioError(
                    f"unknown DC {name!r}{did_you_mean(name, names)}; allowed: {quote_list(names)}",
                    path=f"wan[{i}].{end}", value=name, allowed=quote_list(names))
        pair = frozenset((wan.a, wan.b))
        if pair in pairs:
            raise ScenarioError(f"a second link between {wan.a!r} and {wan.b!r} (also wan[{pairs[pair]}]); "
                                f"allowed: one [[wan]] per pair (use bandwidth_ba for asymmetric links)",
                                path=f"wan[{i}]")
        pairs[pair] = i
        if wan.trace not in ("", "uniform") and not os.path.isfile(wan.trace):
            raise ScenarioError(f"trace file {wan.trace!r} not found; allowed: \"\", \"uniform\" "
                                f"or the path of a CSV file of time_s,bandwidth rows",
                                path=f"wan[{i}].trace", value=wan.trace)
    # Every DC must reach the central one over WAN links (possibly through other DCs).
    neighbours: dict[str, set[str]] = {n: set() for n in names}
    for wan in s.wans:
        neighbours[wan.a].add(wan.b)
        neighbours[wan.b].add(wan.a)
    centre = s.central_dc.name
    reached, frontier = {centre}, [centre]
    while frontier:
        for nxt in neighbours[frontier.pop()] - reached:
            reached.add(nxt)
            frontier.append(nxt)
    cut = [n for n in names if n not in reached]
    if cut:
        raise ScenarioError(
            f"DC {cut[0]!r} is not connected to the central DC {centre!r}; add a [[wan]] with "
            f"a = {cut[0]!r}, b = {centre!r}; allowed: a WAN graph that joins every DC to the central one",
            path="wan", value=cut[0])


@scenario_check
def _check_run(s: Scenario) -> None:
    r = s.run
    if r.target_accuracy > 0 and r.eval_every == 0:
        raise ScenarioError(
            f"run.target_accuracy = {r.target_accuracy:g} is checked at evaluations, and "
            "eval_every = 0 evaluates only at the end, so the target could never stop the run; "
            "allowed: eval_every >= 1 with a target (or target_accuracy = 0)",
            path="run.eval_every", value=0)
    limits = [r.iterations, r.epochs, r.target_accuracy, r.max_wall_time_s]
    if r.runtime == "emu":
        limits.append(r.max_emulated_time_s)
    if not any(limits):
        raise ScenarioError(
            "no stop condition: the run would never end; allowed: set one of iterations, epochs, "
            "target_accuracy, max_wall_time" + (", max_emulated_time" if r.runtime == "emu" else ""),
            path="run.iterations", value=r.iterations)
    if r.runtime == "real" and s.training.model == "phantom":
        raise ScenarioError("the real runtime cannot run phantom models (they have no data); "
                            f"allowed with runtime = 'real': {quote_list(m for m in MODELS if m != 'phantom')}",
                            path="training.model", value="phantom")


@scenario_check
def _check_faults(s: Scenario) -> None:
    if not s.faults:
        return
    # The same planner the job is built with names the nodes (geomx.topology), so a
    # fault can only name a node the job will have.
    central = s.central_dc
    nodes = plan_nodes(make_topology(s.topology.kind, options=s.topology.options_table,
                                     sections={"netstorm": s.netstorm}), central.name,
                       [DCShape(d.name, d.workers) for d in s.party_dcs],
                       global_servers=central.global_servers,
                       state_server=policy_class("sync", s.sync.resolved_algorithm)
                       .needs_state_server).nodes
    wans = {frozenset(w.endpoints): f"{w.a}-{w.b}" for w in s.wans}
    for i, f in enumerate(s.faults):
        if f.kind == "link_down":
            _check_link_fault(i, f, wans)
            continue
        if f.kind == "partition":
            _check_partition(i, f, s)
            continue
        if f.dcs:
            raise ScenarioError(f"a {f.kind} fault names a node, not DCs; to cut DCs off write "
                                "kind = 'partition'", path=f"fault[{i}].dcs", value=list(f.dcs))
        if f.link:
            raise ScenarioError(f"a {f.kind} fault names a node, not a link; for a WAN link failure "
                                "write kind = 'link_down'", path=f"fault[{i}].link",
                                value=list(f.link))
        allowed = nodes if f.kind == "crash" else [n for n in nodes if n.startswith("w:")]
        if f.node not in allowed:
            what = "node" if f.kind == "crash" else "worker (only workers compute)"
            if f.node.startswith("ls:") and not any(n.startswith("ls:") for n in nodes):
                # a local server named under a layout that has none (a flat PS)
                raise ScenarioError(
                    f"unknown node {f.node!r}: topology.kind = {s.topology.kind!r} has no "
                    f"local servers; allowed: {quote_list(allowed)}", path=f"fault[{i}].node",
                    value=f.node, allowed=quote_list(allowed))
            raise ScenarioError(f"unknown {what} {f.node!r}{did_you_mean(f.node, allowed)}; "
                                f"allowed: {quote_list(allowed)}", path=f"fault[{i}].node",
                                value=f.node, allowed=quote_list(allowed))


def _check_partition(i: int, f, s: Scenario) -> None:
    names = [d.name for d in s.dcs]
    if f.node or f.link:
        field = "node" if f.node else "link"
        raise ScenarioError("a partition fault names the DCs it cuts off (dcs = [...]), not a "
                            f"{field}", path=f"fault[{i}].{field}",
                            value=f.node or list(f.link))
    unknown = [d for d in f.dcs if d not in names]
    if not f.dcs or unknown:
        bad = unknown[0] if unknown else ""
        raise ScenarioError(f"partition DCs {list(f.dcs)!r}: "
                            + (f"unknown DC {bad!r}{did_you_mean(bad, names)}; " if unknown
                               else "name at least one DC; ")
                            + f"allowed: some of {quote_list(names)}, not all",
                            path=f"fault[{i}].dcs", value=list(f.dcs), allowed=quote_list(names))
    if set(f.dcs) >= set(names):
        raise ScenarioError("a partition must leave some DCs on the other side; allowed: a "
                            f"proper subset of {quote_list(names)}", path=f"fault[{i}].dcs",
                            value=list(f.dcs))
    if not any((w.a in f.dcs) != (w.b in f.dcs) for w in s.wans):
        raise ScenarioError(f"no [[wan]] link joins {list(f.dcs)!r} to the other DCs, so "
                            "nothing would be cut", path=f"fault[{i}].dcs", value=list(f.dcs))


def _check_link_fault(i: int, f, wans: dict[frozenset[str], str]) -> None:
    allowed = quote_list(wans.values()) if wans else "none (this scenario has no [[wan]] link)"
    if f.node:
        raise ScenarioError("a link_down fault names a link (link = [dc_a, dc_b]), not a node",
                            path=f"fault[{i}].node", value=f.node)
    if len(f.link) != 2 or frozenset(f.link) not in wans:
        raise ScenarioError(f"link {list(f.link)!r} is not a [[wan]] link of this scenario; "
                            f"allowed: the two DC names of one of {allowed}",
                            path=f"fault[{i}].link", value=list(f.link), allowed=allowed)


@scenario_check
def _check_membership(s: Scenario) -> None:
    m = s.membership
    if m.heartbeat_interval_s > 0 and m.heartbeat_timeout_s <= m.heartbeat_interval_s:
        raise ScenarioError(
            f"heartbeat_timeout ({m.heartbeat_timeout_s:g}s) must exceed heartbeat_interval "
            f"({m.heartbeat_interval_s:g}s); allowed: a timeout of several intervals",
            path="membership.heartbeat_timeout", value=m.heartbeat_timeout_s)


@scenario_check
def _check_sync(s: Scenario) -> None:
    if (s.topology.kind in ("flat", "mxnet")
            and policy_class("sync", s.sync.resolved_algorithm).needs_local_tier):
        allowed = "'fsa', 'mixed', or a sync policy of your own whose needs_local_tier is False"
        raise ScenarioError(
            f"{s.sync.algorithm!r} needs local servers, which topology.kind = "
            f"{s.topology.kind!r} does not have; allowed with {s.topology.kind}: {allowed}",
            path="sync.algorithm", value=s.sync.algorithm, allowed=allowed)
    if s.sync.algorithm == "mixed" and s.training.optimizer == "none":
        # GeoMX hits a check failure mid-run here (docs/geomx-behaviour.md §6, bug 12)
        allowed = quote_list(o for o in SERVER_OPTIMIZERS if o != "none")
        raise ScenarioError(
            "sync.algorithm = 'mixed' applies each DC's push as its own global step and needs a "
            f"global optimizer, got 'none'; allowed: {allowed}",
            path="training.optimizer", value="none", allowed=allowed)
    if s.sync.algorithm in ("hfa", "esync") and s.training.worker_optimizer == "none":
        allowed = quote_list(o for o in WORKER_OPTIMIZERS if o != "none")
        raise ScenarioError(
            f"sync.algorithm = {s.sync.algorithm!r} takes local steps on the workers, which need "
            f"an optimizer, got 'none'; allowed: {allowed}",
            path="training.worker_optimizer", value="none", allowed=allowed)
    algorithm = s.sync.resolved_algorithm
    if s.training.layer_compute != "off" and algorithm not in ("fsa", "mixed"):
        raise ScenarioError(
            f"training.layer_compute = {s.training.layer_compute!r} models gradients pushed as "
            f"backward produces them, but sync.algorithm = {algorithm!r} takes local steps "
            "and pushes models; allowed with layer_compute: 'fsa', 'mixed' (or layer_compute = 'off')",
            path="training.layer_compute", value=s.training.layer_compute, allowed="'off'")


@scenario_check
def _check_layer_compute(s: Scenario) -> None:
    t = s.training
    if t.layer_compute == "shares" and (not t.layer_compute_shares or sum(t.layer_compute_shares) <= 0):
        raise ScenarioError(
            "training.layer_compute = 'shares' needs layer_compute_shares: one non-negative number "
            "per parameter tensor, not all zero",
            path="training.layer_compute_shares", value=list(t.layer_compute_shares),
            allowed="a non-empty array of numbers >= 0 with a positive sum")
    if t.layer_compute_shares and t.layer_compute != "shares":
        raise ScenarioError(
            f"training.layer_compute_shares is set but layer_compute = {t.layer_compute!r}; "
            "allowed: set layer_compute = 'shares' to use them, or remove them",
            path="training.layer_compute_shares", value=list(t.layer_compute_shares),
            allowed="[] unless layer_compute = 'shares'")
    if t.layer_compute == "flops" and t.model == "phantom" and not t.phantom_preset:
        raise ScenarioError(
            "training.layer_compute = 'flops' needs an architecture to count FLOPs from; a phantom "
            "model given by phantom_params / phantom_layers has none; allowed: a phantom_preset, "
            "or layer_compute = 'shares'",
            path="training.layer_compute", value="flops", allowed="'off', 'shares'")
    if t.layer_compute != "off" and t.program:
        raise ScenarioError(
            f"training.layer_compute = {t.layer_compute!r} drives the built-in trainer's layers; "
            "a training program pushes and pulls when it decides; allowed with a program: 'off'",
            path="training.layer_compute", value=t.layer_compute, allowed="'off'")


@scenario_check
def _check_dgt(s: Scenario) -> None:
    if s.sched.dgt == "off":
        return
    if s.topology.kind in ("flat", "mxnet"):
        raise ScenarioError(
            f"sched.dgt = {s.sched.dgt!r} acts on local -> global server pushes, which "
            "topology.kind = 'flat' does not have; allowed with flat: 'off'",
            path="sched.dgt", value=s.sched.dgt, allowed="'off'")
    if s.training.model == "phantom":
        raise ScenarioError(
            f"sched.dgt = {s.sched.dgt!r} ranks blocks by their gradient values, which a phantom "
            "model does not have; allowed with DGT: a real model", path="training.model",
            value="phantom", allowed="'softmax', 'mlp', 'cnn'")
    if s.codec.type in DGT_BLOCK_CODECS and s.sched.dgt == "quant":
        # each block is already encoded by the codec; a 4-bit copy of it is a second codec
        raise ScenarioError(
            f"sched.dgt = 'quant' quantises the band blocks to 4 bits, and codec.type = "
            f"{s.codec.type!r} already encodes every DGT block on its own; allowed with "
            f"{s.codec.type!r}: 'udp', 'tcp'", path="sched.dgt", value="quant",
            allowed="'off', 'udp', 'tcp'")
    if s.codec.type in ("bsc", "mpq"):
        # Bi-Sparse keeps floor(values * threshold) of a block: at least one
        r = float(s.codec.options_table.get("threshold", s.codec.threshold))
        values = s.sched.dgt_block_bytes // 4
        if int(values * r) < 1:
            need = 4 * math.ceil(1 / r)
            raise ScenarioError(
                f"sched.dgt_block_size = {s.sched.dgt_block_bytes} B is {values} float32 values, "
                f"of which codec.threshold = {r:g} keeps none per block; allowed: at least "
                f"{need} B", path="sched.dgt_block_size", value=s.sched.dgt_block_bytes,
                allowed=f">= {need}")


#: Codecs that encode a whole tensor as one selection (sparse, 1-bit): with DGT each block
#: is encoded on its own (geomx/sched/dgt_codec.py).
DGT_BLOCK_CODECS = ("bsc", "mpq", "onebit")


#: Sync algorithms whose rounds TSEngine's overlays can merge: every pusher pushes each
#: round once (FSA, HFA's global syncs, ESync's delta averages); MixedSync's DCs are in
#: step only inside a DC, so it takes the intra-DC overlay only.
TSENGINE_ALGORITHMS = ("fsa", "hfa", "esync", "mixed")


@scenario_check
def _check_tsengine(s: Scenario) -> None:
    """TSEngine's overlays merge and relay the values of a synchronous round
    (geomx/sched/tsengine.py): what they cannot run with is refused here, by field. Any
    codec composes (a relay decodes, adds and encodes again with its own error feedback:
    geomx/sched/ts_merge_codec.py), so does P3 (the overlay's unit is P3's slice, sent
    at P3's priority: geomx/sched/ts_overlay.py), and so does DGT (every merge across DCs
    travels as DGT's blocks, reassembled and ranked again at each relay:
    geomx/sched/ts_dgt.py)."""
    q = s.sched
    if not (q.tsengine_inter or q.tsengine_intra):
        return
    field = "sched.tsengine_inter" if q.tsengine_inter else "sched.tsengine_intra"
    if s.topology.kind == "flat":
        raise ScenarioError(
            f"{field} = true builds overlays between local and global servers, which "
            "topology.kind = 'flat' does not have; allowed with flat: false",
            path=field, value=True, allowed="false")
    algorithm = s.sync.resolved_algorithm
    if algorithm == "mixed" and q.tsengine_inter:
        # the overlay's merge tree sums every DC's push of a round into one
        raise ScenarioError(
            "sched.tsengine_inter = true merges every DC's push of a round into one, which "
            "makes the DCs synchronous; sync.algorithm = 'mixed' applies each DC's push on "
            "its own; allowed with MixedSync: sched.tsengine_intra (the overlay inside a DC)",
            path="sched.tsengine_inter", value=True, allowed="false")
    if algorithm not in TSENGINE_ALGORITHMS:
        raise ScenarioError(
            f"{field} = true merges one synchronous round's pushes and broadcasts its model; "
            f"sync.algorithm = {s.sync.algorithm!r} is a user policy not known to have such "
            f"rounds; allowed with TSEngine: {quote_list(TSENGINE_ALGORITHMS)} (or 'auto')",
            path="sync.algorithm", value=s.sync.algorithm,
            allowed=quote_list(TSENGINE_ALGORITHMS))
    if q.dgt != "off" and q.tsengine_intra and q.dgt_adaptive_k:
        # the local server sees one merged push per round, not each worker's loss
        raise ScenarioError(
            f"sched.dgt_adaptive_k = true adapts K to the losses the workers' pushes carry to "
            "their local server; sched.tsengine_intra = true merges those pushes on the way, "
            "so the local server has no worker's loss to adapt K from; allowed with the "
            "intra-DC overlay: sched.dgt_adaptive_k = false",
            path="sched.dgt_adaptive_k", value=True, allowed="false with sched.tsengine_intra")


@scenario_check
def _check_real(s: Scenario) -> None:
    r = s.real
    central_i = next((i for i, d in enumerate(s.dcs) if d.central), 0)
    central = s.dcs[central_i]
    if r.global_scheduler and central.scheduler_port:
        port = int(r.global_scheduler.rpartition(":")[2])
        if port != central.scheduler_port:
            raise ScenarioError(
                f"real.global_scheduler = {r.global_scheduler!r} disagrees with the central DC's "
                f"scheduler_port = {central.scheduler_port} (the central DC's scheduler is the global "
                "one); allowed: set only one of them, or the same port",
                path=f"dc[{central_i}].scheduler_port", value=central.scheduler_port)
    if r.global_scheduler and not 0 < int(r.global_scheduler.rpartition(":")[2]) < 65536:
        raise ScenarioError("port out of range; allowed: 'host:port' with a port in 1..65535",
                            path="real.global_scheduler", value=r.global_scheduler)
    if 0 < r.dead_connection_timeout_s < 1.0:
        # the kernel's user timeout would fire on a healthy path's round trip and queues
        raise ScenarioError("too short to tell a dead connection from a slow one; allowed: "
                            "0 (the kernel's defaults) or at least 1s",
                            path="real.dead_connection_timeout",
                            value=r.dead_connection_timeout_s)
    if r.port_base and r.port_base + len(s.dcs) > 65535:
        raise ScenarioError(f"port_base + {len(s.dcs)} DCs passes 65535; allowed: a lower port_base",
                            path="real.port_base", value=r.port_base)
    seen: dict[tuple[str, int], int] = {}
    for i, d in enumerate(s.dcs):
        if not d.scheduler_port:
            continue
        key = (d.host, d.scheduler_port)
        if key in seen:
            raise ScenarioError(
                f"port {d.scheduler_port} on host {d.host!r} is also dc[{seen[key]}]'s scheduler port; "
                "allowed: one scheduler per host and port", path=f"dc[{i}].scheduler_port",
                value=d.scheduler_port)
        seen[key] = i


@scenario_check
def _check_checkpoint(s: Scenario) -> None:
    c = s.checkpoint
    if not c.enabled and not c.resume_from:
        return
    algorithm = s.sync.resolved_algorithm
    field = "checkpoint.every" if c.enabled else "checkpoint.resume_from"
    value = (units_text(c.every.seconds) if c.every.seconds else c.every.rounds) \
        if c.enabled else c.resume_from
    sync_class = policy_class("sync", algorithm)
    problems = [
        (not sync_class.checkpoint_cuts, "sync.algorithm", algorithm,
         f"sync.algorithm = {algorithm!r}: {sync_class.__name__}.checkpoint_cuts is False "
         "(its checkpoint rounds are not declared cuts of the job; docs/extending.md, "
         "\"Checkpoints\")",
         "'fsa', 'hfa', 'esync', 'mixed', or a policy of your own whose checkpoint_cuts is "
         "True"),
        (s.topology.kind not in ("hips", "flat"), "topology.kind", s.topology.kind,
         f"topology.kind = {s.topology.kind!r} keeps per-chunk relay state",
         "'hips', 'flat'"),
        (bool(s.training.algorithm), "training.algorithm", s.training.algorithm,
         "an algorithm's pass over its data is not saved", '"" (a model)'),
        (s.training.model == "phantom", "training.model", "phantom",
         "a phantom model has no values to save", "a real model"),
        (s.sched.tsengine_inter and s.sched.dgt != "off", "sched.dgt", s.sched.dgt,
         "with sched.tsengine_inter every local server ranks DGT's blocks of what it "
         "relays and holds the late blocks it took, which a checkpoint does not save yet",
         "'off' (or sched.tsengine_inter = false)"),
        (s.sched.tsengine_inter and len(s.party_dcs) > 2, "sched.tsengine_inter", True,
         f"with {len(s.party_dcs)} party DCs the overlay sums their values in the order they "
         "become ready, which a resumed run does not replay (the model differs in the last "
         "bit)", "false (or at most 2 party DCs)"),
    ]
    for bad, path, got, why, allowed in problems:
        if bad:
            raise ScenarioError(f"{field} = {value!r}: {why}; allowed with checkpoints: "
                                f"{path} = {allowed}", path=path, value=got, allowed=allowed)
    if c.every.seconds > 0 and sum(d.global_servers for d in s.dcs if d.central) > 1:
        raise ScenarioError(
            "checkpoint.every as a duration needs one global server to pick the round; "
            "allowed with several global servers: a number of rounds",
            path="checkpoint.every", value=units_text(c.every.seconds), allowed="an integer")


def units_text(seconds: float) -> str:
    from geomx.units import format_seconds

    return format_seconds(seconds)


@scenario_check
def _check_worker_loss(s: Scenario) -> None:
    if s.membership.on_worker_loss != "continue":
        return
    problems = [
        (s.membership.heartbeat_interval_s <= 0, "membership.heartbeat_interval", "0s",
         "a loss is found by missed heartbeats", "a duration > 0"),
        (s.topology.kind != "hips", "topology.kind", s.topology.kind,
         "a local server stands in for its DC", "'hips'"),
        # (the inter-DC overlay's members are the local servers, which a worker's loss
        # leaves in place: its DC's sum is complete once the loss is declared)
        (s.sched.tsengine_intra, "sched.tsengine_intra", True,
         "TSEngine's intra-DC merge tree passes workers' sums through other workers, so a "
         "lost one takes the gradients merged into it, and rebuilding a round's tree "
         "without them is not built yet", "false (sched.tsengine_inter composes)"),
    ]
    _refuse_first("membership.on_worker_loss = 'continue'", problems)


def _server_loss_schedulers(s: Scenario) -> list[tuple[bool, str, Any, str, str]]:
    """The schedulers whose in-flight state a server's successor cannot rebuild.

    TSEngine's overlay across DCs plans again what went through a replaced local server
    (geomx/sched/tsengine.py, ``Coordinator.replace``): its successor sends the DC's
    sum again, and the round's broadcast goes again to whoever it had to relay to. That
    needs the lost process to hold no other DC's sum, which with two party DCs it never
    does (each tree is a star of two members around its global server); the intra-DC
    tree passes workers' gradients to their local server, which dies with them; a
    global server's successor (with checkpoints) would lose the round's merged sums."""
    return [
        (s.sched.tsengine_intra, "sched.tsengine_intra", True,
         "TSEngine's intra-DC merge tree sends the workers' gradients to their local "
         "server, whose successor has not got them, and asking them again is not built "
         "yet", "false (sched.tsengine_inter composes)"),
        (s.sched.tsengine_inter and len(s.party_dcs) > 2, "sched.tsengine_inter", True,
         f"with {len(s.party_dcs)} party DCs a local server may hold another DC's sum "
         "merged into it, which dies with it", "false (or at most 2 party DCs)"),
        (s.sched.tsengine_inter and s.checkpoint.enabled, "sched.tsengine_inter", True,
         "with checkpoints a global server may be taken over, and its successor has not "
         "got the sums merged into it", "false with checkpoint.every"),
    ]


def _refuse_first(setting: str, problems: list[tuple[bool, str, Any, str, str]]) -> None:
    """Raise for the first ``(bad, path, value, why, allowed)`` that is bad: ``setting``
    cannot work with it."""
    for bad, path, got, why, allowed in problems:
        if bad:
            raise ScenarioError(f"{setting}: {why}; allowed: {path} = {allowed}", path=path,
                                value=got, allowed=allowed)


#: Sync algorithms whose global side tells a resent push from a new one and whose local
#: servers' state comes back from the global tier (``GlobalSide.resent_push``; HFA's
#: global side keeps the milestone for a successor, geomx/sync/hfa.py).
TAKEOVER_ALGORITHMS = ("fsa", "mixed", "esync", "hfa")
TAKEOVER_REFUSALS: dict[str, str] = {}


@scenario_check
def _check_server_loss(s: Scenario) -> None:
    """``on_server_loss = "wait"``: a restarted local server re-pulls the model and drops
    resent pushes by FSA round (geomx/node/local_server.py); what it cannot rebuild is
    refused here, naming the field."""
    if s.membership.on_server_loss != "wait":
        return
    problems = [
        (s.membership.heartbeat_interval_s <= 0, "membership.heartbeat_interval", "0s",
         "a lost server is found by missed heartbeats", "a duration > 0"),
        (s.sync.resolved_algorithm not in TAKEOVER_ALGORITHMS, "sync.algorithm",
         s.sync.resolved_algorithm, TAKEOVER_REFUSALS.get(
             s.sync.resolved_algorithm, "a user sync policy's resent pushes are not known "
             "to be told apart"), quote_list(TAKEOVER_ALGORITHMS)),
        (s.topology.kind != "hips", "topology.kind", s.topology.kind,
         "a local server takes over its DC", "'hips'"),
        (s.sync.resolved_algorithm == "hfa" and s.codec.type != "none", "codec.type",
         s.codec.type, "under HFA a local server's successor takes the DCs' milestone "
         "from the global tier's uncompressed sums, which the local servers' decoded ones "
         "would differ from", "'none' with HFA"),
        *_server_loss_schedulers(s),
    ]
    _refuse_first("membership.on_server_loss = 'wait'", problems)


@scenario_check
def _check_restart(s: Scenario) -> None:
    for i, f in enumerate(s.faults):
        if f.kind != "crash" or f.duration_s <= 0:
            continue
        if f.node.startswith(("ls:", "gs:")):
            if s.membership.on_server_loss != "wait":
                raise ScenarioError(
                    f"a crash with a duration restarts {f.node!r}, but the job does not wait "
                    "for it: membership.on_server_loss is fail; allowed: duration = 0s, or "
                    "on_server_loss = 'wait'",
                    path=f"fault[{i}].duration", value=units_text(f.duration_s), allowed="0s")
            if f.node.startswith("gs:") and not s.checkpoint.enabled:
                raise ScenarioError(
                    f"a crash with a duration restarts {f.node!r}, but a global server's "
                    "successor takes its optimizer from its last checkpoint, and checkpoints "
                    "are off; allowed: checkpoint.every = a number of rounds or a duration",
                    path="checkpoint.every", value="0", allowed="> 0")
        elif s.membership.on_worker_loss != "continue" or not f.node.startswith("w:"):
            raise ScenarioError(
                f"a crash with a duration restarts a lost worker or local server, but "
                f"{f.node!r} "
                f"{'is neither' if not f.node.startswith('w:') else 'is not lost: membership.on_worker_loss is fail'}"
                "; allowed: duration = 0s, a worker with on_worker_loss = 'continue', or a "
                "local server with on_server_loss = 'wait'",
                path=f"fault[{i}].duration", value=units_text(f.duration_s), allowed="0s")
        if s.run.runtime == "real" and not f.node.startswith(("ls:", "gs:")):
            raise ScenarioError(
                "the real launcher restarts crashed servers only; allowed: duration "
                "= 0s (restart the worker yourself with geomx node --rejoin)",
                path=f"fault[{i}].duration", value=units_text(f.duration_s), allowed="0s")


@scenario_check
def _check_algorithm(s: Scenario) -> None:
    """``[training] algorithm``: a sync algorithm it supports, iterations not epochs."""
    name = s.training.algorithm
    if not name:
        return
    from geomx.algorithms.registry import info_of

    info = info_of(name)
    sync = s.sync.algorithm
    if sync != "auto" and sync not in info.syncs:
        raise ScenarioError(
            f"training.algorithm = {name!r} runs under {quote_list(info.syncs)} only, not "
            f"{sync!r}; allowed: {quote_list(('auto', *info.syncs))}",
            path="sync.algorithm", value=sync, allowed=quote_list(("auto", *info.syncs)))
    if s.run.epochs > 0:
        raise ScenarioError(
            f"run.epochs is for models; training.algorithm = {name!r} counts "
            f"{info.iteration}s in run.iterations; allowed: epochs = 0",
            path="run.epochs", value=s.run.epochs, allowed="0")


@scenario_check
def _check_host_profile(s: Scenario) -> None:
    """``[host] profile``: the file exists and is a profile this geomx reads."""
    if not s.host.profile:
        return
    from geomx.host_profile import ProfileError, load_profile

    try:
        load_profile(s.host.profile)
    except ProfileError as e:
        raise ScenarioError(f"{e}; allowed: \"\" or a file written by `geomx calibrate --out "
                            "FILE`", path="host.profile", value=s.host.profile) from None
