"""NETSTORM's planner policy (geomx.topology.netstorm_plan; docs/papers.md §1 Steps 1-2,
§6.6): routes, per-root FAPT and its aggregate-forward metric, root shares, chunks."""

import math

import networkx as nx
import pytest

from geomx.topology.netstorm_plan import (Link, MeshPlan, chunk_table, initial_rates,
                                          plan_mlnet, plan_netstorm)

TABLE = [(1, 2, 500), (1, 3, 100), (2, 3, 500), (2, 5, 500), (3, 4, 100), (4, 5, 500),
         (4, 6, 100), (5, 7, 500), (6, 7, 500), (6, 8, 100), (6, 9, 100), (7, 8, 500),
         (8, 9, 500)]
DCS = [str(i) for i in range(1, 10)]
LINKS = [Link(str(a), str(b), 0.01) for a, b, _ in TABLE]


def rates(table=TABLE):
    out = {}
    for a, b, m in table:
        out[(str(a), str(b))] = out[(str(b), str(a))] = m * 1e6
    return out


def test_parent_is_next_hop_of_cheapest_path_to_the_root():
    plan = plan_netstorm(DCS, LINKS, rates())
    g = nx.DiGraph()
    for (u, v), bw in rates().items():
        g.add_edge(u, v, weight=1 / bw)
    for r in plan.roots:
        for j, p in plan.parent[r].items():
            cost = nx.dijkstra_path_length(g, j, r)
            assert math.isclose(1 / rates()[(j, p)] + nx.dijkstra_path_length(g, p, r), cost)
    # every tree edge is a 500 Mbit/s link on this table: the 100 Mbit/s ones are avoided
    for r in plan.roots:
        assert all(rates()[(j, p)] == 500e6 for j, p in plan.parent[r].items())


def test_aggregate_forward_metric_sums_the_slowest_edge_per_depth():
    # a star at r: depth 1 edges 100 and 50 Mbit/s -> T = 1/50e6; a chain below b adds 1/10e6
    links = [Link("r", "a"), Link("r", "b"), Link("b", "c")]
    bw = {("r", "a"): 100e6, ("a", "r"): 100e6, ("r", "b"): 50e6, ("b", "r"): 50e6,
          ("b", "c"): 10e6, ("c", "b"): 10e6}
    plan = plan_netstorm(["r", "a", "b", "c"], links, bw, roots=0)
    t_r = 1 / 50e6 + 1 / 10e6  # not the sum of all edges, not the max
    assert math.isclose(plan.perf["r"], 1 / t_r)
    # b as root: depth 1 {b-r 50, b-c 10}, depth 2 {r-a 100}
    assert math.isclose(plan.perf["b"], 1 / (1 / 10e6 + 1 / 100e6))
    assert plan.perf["b"] > plan.perf["r"]


def test_r_best_roots_keep_a_share_the_others_none():
    plan = plan_netstorm(DCS, LINKS, rates(), roots=3)
    assert len(plan.roots) == 3 and set(plan.parent) == set(plan.roots)
    best = sorted(plan_netstorm(DCS, LINKS, rates()).perf.items(), key=lambda kv: -kv[1])[:3]
    assert {r for r, _ in best} == set(plan.roots)
    assert math.isclose(sum(plan.shares().values()), 1.0)


def test_auxiliary_routes_are_interior_disjoint_and_ordered_by_cost():
    plan = plan_netstorm(DCS, LINKS, rates())
    for key, routes in plan.routes.items():
        src, dst = key.split(">")
        assert routes[0] == nx.dijkstra_path(
            nx.DiGraph([(u, v, {"weight": 1 / b}) for (u, v), b in rates().items()]), src, dst)
        seen: set[str] = set()
        for r in routes:
            assert r[0] == src and r[-1] == dst and len(set(r)) == len(r)
            assert not (set(r[1:-1]) & seen)
            seen |= set(r[1:-1])
        costs = [sum(1 / rates()[(u, v)] for u, v in zip(r, r[1:])) for r in routes]
        assert costs == sorted(costs)
    assert any(len(r) > 1 for r in plan.routes.values())
    single = plan_netstorm(DCS, LINKS, rates(), multipath=False)
    assert all(len(r) == 1 for r in single.routes.values())


def test_dead_link_is_planned_around():
    bw = rates()
    bw[("5", "7")] = bw[("7", "5")] = 0.0
    plan = plan_netstorm(DCS, LINKS, bw)
    for r in plan.roots:
        assert ("5", "7") not in plan.tree_edges(r) and ("7", "5") not in plan.tree_edges(r)
    assert all("5>7" != k and "7>5" != k for k in plan.routes)


def test_disconnected_mesh_is_an_error():
    with pytest.raises(ValueError, match="do not connect"):
        plan_netstorm(["a", "b", "c"], [Link("a", "b")], {("a", "b"): 1e6, ("b", "a"): 1e6})


def test_latency_cost_prefers_short_paths_for_small_chunks():
    links = [Link("s", "d", 0.2), Link("s", "x", 0.001), Link("x", "d", 0.001)]
    bw = {(u, v): b for (u, v), b in {("s", "d"): 100e6, ("s", "x"): 50e6, ("x", "d"): 50e6}.items()}
    bw.update({(v, u): b for (u, v), b in list(bw.items())})
    by_bw = plan_netstorm(["s", "x", "d"], links, bw)
    by_lat = plan_netstorm(["s", "x", "d"], links, bw, cost="latency", chunk_bytes=1000)
    # bandwidth cost: 1/100e6 < 2/50e6 -> d joins s directly; latency: 0.2 s > 2 ms -> via x
    assert by_bw.parent["s"]["d"] == "s" and by_lat.parent["s"]["d"] == "x"


def test_dynamic_roots_picks_a_count_between_one_and_all():
    plan = plan_netstorm(DCS, LINKS, rates(), dynamic_roots=True)
    assert 1 <= len(plan.roots) <= len(DCS)


def test_chunks_follow_perf_shares_and_cover_every_key():
    perf = {"a": 3.0, "b": 1.0, "c": 0.0}
    chunks = chunk_table({0: 10_000, 1: 7, 5: 2_000}, 1000, perf)
    by_key = {}
    for c in chunks:
        by_key.setdefault(c.key, []).append(c)
        assert c.hi - c.lo <= 1000 and c.root in ("a", "b")
    for k, n in {0: 10_000, 1: 7, 5: 2_000}.items():
        cs = by_key[k]
        assert cs[0].lo == 0 and cs[-1].hi == n
        assert all(x.hi == y.lo for x, y in zip(cs, cs[1:]))
    owned = {r: sum(c.hi - c.lo for c in chunks if c.root == r) for r in "ab"}
    # quotas ceil(share * total); a root passes its quota by less than one chunk
    assert owned["b"] <= math.ceil(0.25 * 12_007) + 1000
    assert owned["a"] <= math.ceil(0.75 * 12_007) + 1000 and owned["a"] > 2 * owned["b"]


def test_mlnet_trees_have_bounded_fan_in_and_equal_shares():
    plan = plan_mlnet(DCS, LINKS, fan_in=2)
    assert plan.roots == DCS and len(set(plan.shares().values())) == 1
    for r in DCS:
        assert len(plan.parent[r]) == 8 and r not in plan.parent[r]
        for dc in DCS:
            assert len(plan.children(r, dc)) <= 2
    mesh = {frozenset((str(a), str(b))) for a, b, _ in TABLE}
    for key, (route,) in plan.routes.items():
        assert all(frozenset(e) in mesh for e in zip(route, route[1:]))
    # not network-aware: the same trees whatever the rates
    assert plan_mlnet(DCS, LINKS, fan_in=2).parent == plan.parent


def test_plan_survives_json():
    plan = plan_netstorm(DCS, LINKS, rates(), plan_id=4)
    again = MeshPlan.from_json(plan.to_json())
    assert again.to_json() == plan.to_json() and again.children("5", "5") == plan.children("5", "5")


def test_initial_rates_are_seeded_symmetric_and_positive():
    a, b = initial_rates(LINKS, 1), initial_rates(LINKS, 1)
    assert a == b and a != initial_rates(LINKS, 2)
    assert all(a[(u, v)] == a[(v, u)] > 0 for u, v in a)
