"""The mesh controller: the job's scheduler that also asks the topology for trees.

docs/papers.md §1 (b) (the reference system's Route_Manager, speed reports and
ROUTE_RELEASE handling). Besides registration, barriers and liveness (it *is* a
:class:`~geomx.node.scheduler.Scheduler`), it keeps the directed rate matrix
``rates[(u, v)]`` in bit/s:

* before any measurement, seeded pseudo-random values (the reference's [0, 100) MB/s,
  :func:`geomx.policy.mesh_plan.initial_rates`), so a rate-driven first plan is
  effectively random; when the topology does not measure links it is never replaced;
* SPEED_REPORTs from receiving servers overwrite entries;
* a link direction no SPEED_REPORT covered for the topology's ``probe_after_s`` (the plans
  stopped using it, or it failed and was planned around) is probed: at the next check the
  controller asks the sending end's server for a PROBE (a few measurement-sized messages
  over that link alone), so that a link that recovered is measured, and used, again;
* a dead link (a SPEED_REPORT of 0 bit/s, or ``link_down`` below) reads 0 until a positive
  report revives it.

The plans come from the job's topology object
(:meth:`geomx.policy.topology.MeshTopology.plan_trees`, given a
:class:`~geomx.policy.topology.MeshView` of the DCs, links and rates); each is checked
(:meth:`~geomx.policy.mesh_plan.MeshPlan.problem`) before a server sees it.
ROUTE_RELEASE is a barrier per iteration over all servers. When the last server of
iteration v arrives, the controller decides: if ``check_period`` has passed since the
last check and the mean relative change of the entries that changed since the last plan
exceeds ``update_rate`` (or a link died), it asks for a new plan and answers every server
with it; otherwise with "keep". Checking at the barrier instead of on a free-running timer
keeps the emulation finite and deterministic, and a plan can only take effect at a
boundary anyway.
"""

from __future__ import annotations

from typing import Any

from geomx.node.scheduler import Scheduler
from geomx.node.spec import JobSpec
from geomx.policy.loading import build_policy
from geomx.policy.mesh_plan import Link, MeshPlan, initial_rates
from geomx.policy.topology import MeshTopology, MeshView
from geomx.wire import Kind, Message

__all__ = ["MeshController"]


class MeshController(Scheduler):
    role = "mesh_controller"

    def __init__(self, name: str, dc: str, transport: Any, services: Any, members: list[str],
                 job: JobSpec, **kw: Any):
        super().__init__(name, dc, transport, services, members, **kw)
        cfg = job.mesh
        self.job = job
        self.cfg = cfg
        topology = build_policy("topology", str(cfg["topology"]), cfg.get("topology_options"))
        if not isinstance(topology, MeshTopology):
            raise ValueError(f"topology {cfg['topology']!r} does not plan trees; a mesh job "
                             "needs a geomx.policy.MeshTopology")
        self.topology = topology
        self.dcs = list(job.party_dcs)
        self.servers = [job.local_server_of[d] for d in self.dcs]
        self.links = [Link(str(a), str(b), float(d)) for a, b, d in cfg.get("links", [])]
        self.linked = {(ln.a, ln.b) for ln in self.links} | {(ln.b, ln.a) for ln in self.links}
        self.awareness = topology.measures_links
        self.chunk_bytes = 4.0 * int(cfg.get("chunk_elements", 1_000_000))
        self.check_period_s = float(cfg.get("check_period_s", 2.0))
        self.update_rate = float(cfg.get("update_rate", 0.0))
        self.rates: dict[tuple[str, str], float] = initial_rates(self.links,
                                                                  int(cfg.get("seed", 0)))
        self.dead: set[frozenset[str]] = set()
        self._plan_rates = dict(self.rates)
        self._dead_at_plan: set[frozenset[str]] = set()
        self._last_check_s = 0.0
        self.probe_after_s = topology.probe_after_s if self.awareness else 0.0
        self._measured_s: dict[tuple[str, str], float] = {}  # last report or probe request
        self._releases: dict[int, list[Message]] = {}
        self._sent_plan_id = -1
        self.plans: list[MeshPlan] = []
        self.plan = self._make_plan(0)
        self.on(Kind.ROUTE_RELEASE, self._on_release)
        self.on(Kind.SPEED_REPORT, self._on_speed)

    # ------------------------------------------------------------------ planning
    def _live_rates(self) -> dict[tuple[str, str], float]:
        return {e: (0.0 if frozenset(e) in self.dead else bw) for e, bw in self.rates.items()}

    def _make_plan(self, plan_id: int) -> MeshPlan:
        """The topology's plan for the current view; a plan the servers could not run
        fails the controller with the topology's name and the reason."""
        view = MeshView(plan_id=plan_id, dcs=tuple(self.dcs), links=tuple(self.links),
                        rates_bps=self._live_rates(), chunk_bytes=self.chunk_bytes)
        plan = self.topology.plan_trees(view)
        name = self.topology.name or type(self.topology).__name__
        if not isinstance(plan, MeshPlan):
            raise TypeError(f"topology {name}: plan_trees returned {type(plan).__name__}, "
                            "not a geomx.policy.MeshPlan")
        if not plan.kind:
            plan.kind = name
        problem = plan.problem(self.links)
        if plan.plan_id != plan_id or list(plan.dcs) != self.dcs:
            problem = problem or (f"plan {plan.plan_id} over {plan.dcs}; expected plan "
                                  f"{plan_id} over {self.dcs}")
        if problem:
            raise RuntimeError(f"topology {name}: {problem}")
        self.plans.append(plan)
        return plan

    def _changed(self) -> float:
        """Mean relative change of the entries that changed since the last plan."""
        diffs = [abs(bw - self._plan_rates[e]) / self._plan_rates[e]
                 for e, bw in self.rates.items()
                 if bw != self._plan_rates.get(e) and self._plan_rates.get(e, 0) > 0]
        return sum(diffs) / len(diffs) if diffs else 0.0

    def _decide(self, version: int) -> None:
        now = self.now()
        links_died = self.dead != self._dead_at_plan
        due = self.awareness and now - self._last_check_s >= self.check_period_s
        if not (due or links_died):
            return
        if due:
            self._last_check_s = now
            self._probe_stale(now)
        change = self._changed()
        if not links_died and not change > max(self.update_rate, 1e-9):  # not float noise
            return
        try:
            plan = self._make_plan(self.plan.plan_id + 1)
        except ValueError as e:  # the live links no longer connect the DCs: keep going
            self.record("plan_failed", iteration=version, reason=str(e))
            return
        self.plan = plan
        self._plan_rates = dict(self.rates)
        self._dead_at_plan = set(self.dead)
        self.record("plan_switch", plan=plan.plan_id, iteration=version, change=change,
                    dead=sorted("-".join(sorted(d)) for d in self.dead))

    def _probe_stale(self, now: float) -> None:
        """Ask for a PROBE of every link direction nothing measured for ``probe_after_s``."""
        if self.probe_after_s <= 0:
            return
        for ln in self.links:
            for u, v in ((ln.a, ln.b), (ln.b, ln.a)):
                if now - self._measured_s.get((u, v), 0.0) < self.probe_after_s:
                    continue
                self._measured_s[(u, v)] = now
                self.record("probe", link=[u, v])
                self.post(Message(Kind.PROBE, self.name, self.job.local_server_of[u],
                                  meta={"to": v}))

    # ------------------------------------------------------------------ messages
    def _on_release(self, msg: Message) -> None:
        if msg.src not in self.servers:
            self.reply_error(msg, f"{msg.src} is not a server of this job")
            return
        waiting = self._releases.setdefault(msg.version, [])
        if any(m.src == msg.src for m in waiting):
            self.reply_error(msg, f"{msg.src} already released iteration {msg.version}")
            return
        waiting.append(msg)
        if len(waiting) < len(self.servers):
            return
        del self._releases[msg.version]
        if self._sent_plan_id >= 0:
            self._decide(msg.version)
        new = self.plan.plan_id != self._sent_plan_id
        if new:
            self._sent_plan_id = self.plan.plan_id
            self.record("plan", plan=self.plan.plan_id, iteration=msg.version,
                        kind=self.plan.kind, shares=self.plan.shares(),
                        parent=self.plan.parent)
        meta = {"plan_id": self.plan.plan_id, "plan": self.plan.to_json() if new else None}
        for req in waiting:
            self.post(req.reply(Kind.ROUTE_PLAN, meta=meta))

    def _on_speed(self, msg: Message) -> None:
        link, bps = msg.meta.get("link"), msg.meta.get("bps")
        if msg.src not in self.servers or not isinstance(link, list) or len(link) != 2 \
                or tuple(link) not in self.linked or not isinstance(bps, (int, float)) \
                or bps < 0:
            self.record("reject", src=msg.src, msg=msg.kind.name, reason="malformed SPEED_REPORT")
            return
        e = (str(link[0]), str(link[1]))
        self._measured_s[e] = self.now()
        if bps == 0:
            self.dead.add(frozenset(e))
        else:
            self.rates[e] = float(bps)
            self.dead.discard(frozenset(e))
        self.record("speed_report", link=list(e), bps=float(bps))

    def link_down(self, a: str, b: str) -> None:
        """A WAN link failed (a ``[[fault]] kind = "link_down"``): plan around it at the next
        iteration boundary."""
        self.dead.add(frozenset((a, b)))
        self.record("link_down", link=[a, b])
