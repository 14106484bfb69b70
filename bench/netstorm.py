"""NETSTORM against MXNET and MLNET on the repo's 9-DC mesh, plus its ablations.

Runs ``scenarios/netstorm_9dc.toml`` (static link table) and
``scenarios/netstorm_9dc_dynamic.toml`` (every link direction redrawn in [20, 155] Mbit/s
every 180 s) in the emulator with the phantom ResNet-50, and prints per system the
emulated seconds per iteration (steady state: the second half of the iterations in the
static network; every iteration after the first in the dynamic one), its speed-up against MXNET measured in the same run next to the paper's band, and
the link that bounds it (busiest directed WAN link over the whole run, model
initialisation included: seconds at its capacity per iteration on the static mesh, MB per
iteration on the dynamic one).

Ablations (docs/papers.md §1 (c), the paper's summary): a random first plan kept forever
(``awareness = false``, no multipath), passive awareness alone (+20% in the paper), and
multipath on top (+65% more). Then the planner's wall seconds per replan on random meshes
of 9, 50 and 200 DCs (average degree 3, rates uniform in [20, 155] Mbit/s), and the
awareness accuracy: the controller's estimate against the true rate of every link measured
after the first few static iterations.

Reading the static figures from the link table: its 500 Mbit/s links (1-2, 2-3, 2-5,
4-5, 5-7, 6-7, 7-8, 8-9) form a spanning tree, so once measured every root's FAPT is that
tree and each of its links carries the whole model each way per iteration: NETSTORM's
bound is 25.6M x 32 bit / 500 Mbit/s = 1.64 s per iteration, MXNET's is its busiest
100 Mbit/s link on the fewest-hop all-to-all paths (printed). Any auxiliary route must
leave that tree, i.e. cross a 100 Mbit/s link: the authors' queue-length rule loses time
here (a chunk moved off a short 500 Mbit/s queue onto a 100 Mbit/s hop arrives later),
and the idle links add at most a fifth to the capacity of the leaf DCs the round waits on
(:func:`idle_capacity_bound`), so multipath over idle links (geomx's rule,
geomx/topology/netstorm_multipath.py) gains little and loses nothing. Where the trees
leave a comparable path idle (``scenarios/netstorm_idle_paths.toml``), it gains the
paper's +65% (:func:`idle_paths_table`).

TSEngine is GeoMX's HiPS with ``[sched] tsengine_inter`` (MAX_GREED_RATE 0.9, the paper's
setting) on the same mesh: HiPS needs a central DC without workers, so dc5 (three
500 Mbit/s links) hosts the global server and gives up its worker (8 workers, not 9).
Then: a tree link (dc5-dc7) failing mid-run, and the emulated time to a test accuracy with
a real 4.3M-parameter MLP on digits (static and dynamic), for every system.

    python bench/netstorm.py [--static-iterations 12] [--dynamic-iterations 24] [--quick]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import networkx as nx

from geomx.experiment import run_scenario
from geomx.metrics.progress import read_progress
from geomx.scenario import load_scenario
from geomx.topology.netstorm_plan import Link, plan_netstorm

ROOT = Path(__file__).resolve().parent.parent
STATIC = ROOT / "scenarios" / "netstorm_9dc.toml"
DYNAMIC = ROOT / "scenarios" / "netstorm_9dc_dynamic.toml"
IDLE_PATHS = ROOT / "scenarios" / "netstorm_idle_paths.toml"

#: NETSTORM vs MXNET: arXiv abstract 6.5-9.2x (repo README 7.5-9.2x).
PAPER_SPEEDUP = (6.5, 9.2)
#: passive awareness vs a random first plan; multipath on top of awareness.
PAPER_AWARENESS_GAIN = 0.20
PAPER_MULTIPATH_GAIN = 0.65

#: GeoMX's HiPS on the same mesh needs a central DC without workers: dc5, the best
#: connected (three 500 Mbit/s links), hosts the global server and gives up its worker.
HIPS_ON_MESH = ("topology.kind=hips", "dc.dc5.central=true", "dc.dc5.workers=0")

#: the authors' multipath (their queue-length rule over any interior-disjoint path, and no
#: probes: passive measurement only), for comparison with geomx's
AUTHORS_RULE = ("netstorm.aux_rule=queue", "netstorm.probe_after=0")

SYSTEMS: list[tuple[str, tuple[str, ...]]] = [
    ("mxnet", ("topology.kind=mxnet",)),
    ("mlnet", ("topology.kind=mlnet",)),
    ("hips", HIPS_ON_MESH),
    ("tsengine", (*HIPS_ON_MESH, "sched.tsengine_inter=true",
                  "sched.tsengine_max_greed_rate=0.9")),
    ("random plan", ("netstorm.awareness=false", "netstorm.multipath=false")),
    ("awareness", ("netstorm.multipath=false",)),
    ("netstorm", ()),
]


def _run(path: Path, out: str, sets: tuple[str, ...], extra: list[str],
         inspect: Any = None) -> tuple[Any, list[Any]]:
    common = [f"run.out_dir={out}", "run.progress=false", "metrics.plot=false",
              "metrics.events=false", "metrics.trace=false", "run.eval_every=1", *sets, *extra]
    r = run_scenario(load_scenario(path, common), inspect=inspect)
    return r.summary, read_progress(r.run_dir / "progress.csv")


def _bottleneck(summary: Any, iterations: int, *, by_time: bool) -> tuple[str, float]:
    """The busiest directed WAN link over the whole run (model init included), per
    iteration: seconds at its configured capacity (``by_time``; static links) or MB."""
    caps = summary.extra["link_capacity_bps"]
    best, busy = "", 0.0
    for link, n in summary.bytes_per_link.items():
        cap = caps.get(link)
        if cap and "sw:" not in link:
            v = (n * 8 / cap if by_time else n / 1e6) / max(1, iterations)
            if v > busy:
                best, busy = link, v
    return best, busy


def static_table(out: str, iterations: int, extra: list[str]) -> dict[str, float]:
    print(f"\n== static 9-DC mesh (netstorm_9dc.toml), {iterations} iterations, "
          f"s/iteration over the last {iterations - iterations // 2} ==")
    per_iter: dict[str, float] = {}
    for name, sets in SYSTEMS:
        n = iterations if name != "mlnet" else max(4, iterations // 2)
        t0 = time.perf_counter()
        summary, rows = _run(STATIC, out, sets, [f"run.iterations={n}", *extra])
        k = n // 2
        per_iter[name] = (rows[-1].t - rows[k - 1].t) / (n - k)
        link, busy = _bottleneck(summary, n, by_time=True)
        print(f"{name:12s} {per_iter[name]:8.2f} s/it   busiest link {link:10s} "
              f"{busy:6.2f} s/it busy   (wall {time.perf_counter() - t0:5.1f} s)")
    _ratios(per_iter)
    return per_iter


def dynamic_table(out: str, iterations: int, extra: list[str]) -> dict[str, float]:
    """Fixed iteration counts (NETSTORM variants ``iterations``, the slower baselines half
    as many) so that the runs span about the same stretch of the seeded trace (a few
    180 s redraws); a time limit would let flat-PS workers stop at different iterations."""
    print(f"\n== dynamic 9-DC mesh (netstorm_9dc_dynamic.toml), s/iteration after the first ==")
    per_iter: dict[str, float] = {}
    for name, sets in SYSTEMS:
        n = iterations if name not in ("mxnet", "mlnet", "hips", "tsengine") \
            else max(6, iterations // 2)
        t0 = time.perf_counter()
        summary, rows = _run(DYNAMIC, out, sets, [f"run.iterations={n}", *extra])
        per_iter[name] = (rows[-1].t - rows[0].t) / (len(rows) - 1)
        link, busy = _bottleneck(summary, len(rows), by_time=False)
        print(f"{name:12s} {per_iter[name]:8.2f} s/it over {len(rows):3d} iterations "
              f"({rows[-1].t:6.0f} emulated s)   busiest link {link:10s} {busy:6.0f} MB/it   "
              f"(wall {time.perf_counter() - t0:5.1f} s)")
    _ratios(per_iter)
    return per_iter


def idle_capacity_bound(path: Path) -> float:
    """How much faster multipath over idle links could make a link-bound round, at most:
    every DC sends and receives about the whole model per iteration, so a round takes at
    least the model over the smallest capacity any DC has; the trees alone give a DC only
    its busy tree links, multipath adds the rest. Returns ``min_dc(all links) / min_dc(tree
    links) - 1``, with the trees NETSTORM plans from the nominal rates."""
    s = load_scenario(path)
    links = [Link(w.a, w.b, w.latency_s) for w in s.wans]
    rates = {}
    for w in s.wans:
        rates[(w.a, w.b)] = rates[(w.b, w.a)] = w.bandwidth_bps
    dcs = [d.name for d in s.dcs]
    plan = plan_netstorm(dcs, links, rates, roots=s.netstorm.roots)
    used = {(j, p) for tree in plan.parent.values() for j, p in tree.items()}
    used |= {(p, j) for j, p in used}
    every = min(sum(bw for (u, _), bw in rates.items() if u == d) for d in dcs)
    trees = min(sum(bw for (u, v), bw in rates.items() if u == d and (u, v) in used)
                for d in dcs)
    return every / trees - 1


def idle_paths_table(out: str, extra: list[str]) -> dict[str, float]:
    """Multipath where the trees leave a path idle (netstorm_idle_paths.toml): off, the
    authors' queue rule, geomx's rule; s/iteration over the second half."""
    print("\n== idle parallel path (netstorm_idle_paths.toml), s/iteration over the last 6 of "
          f"12; capacity bound +{idle_capacity_bound(IDLE_PATHS):.0%} ==")
    per_iter: dict[str, float] = {}
    for name, sets in (("no multipath", ("netstorm.multipath=false",)),
                       ("authors' queue rule", AUTHORS_RULE),
                       ("idle links, arrival", ())):
        _, rows = _run(IDLE_PATHS, out, sets, list(extra))
        k = len(rows) // 2
        per_iter[name] = (rows[-1].t - rows[k - 1].t) / (len(rows) - k)
        gain = per_iter["no multipath"] / per_iter[name] - 1
        print(f"{name:20s} {per_iter[name]:6.3f} s/it   {gain:+.0%}   (paper "
              f"{PAPER_MULTIPATH_GAIN:+.0%})")
    return per_iter


def _ratios(t: dict[str, float]) -> None:
    if "mxnet" in t and "netstorm" in t:
        lo, hi = PAPER_SPEEDUP
        print(f"  NETSTORM vs MXNET: {t['mxnet'] / t['netstorm']:.2f}x   (paper {lo}-{hi}x)")
    if "mlnet" in t and "netstorm" in t:
        print(f"  NETSTORM vs MLNET: {t['mlnet'] / t['netstorm']:.2f}x   (paper: NETSTORM faster)")
    if "tsengine" in t and "netstorm" in t:
        print(f"  NETSTORM vs TSEngine: {t['tsengine'] / t['netstorm']:.2f}x   (paper: NETSTORM "
              f"faster; TSEngine vs HiPS on this mesh {t['hips'] / t['tsengine']:.2f}x)")
    if "random plan" in t and "awareness" in t:
        print(f"  awareness vs random first plan: {t['random plan'] / t['awareness'] - 1:+.0%}"
              f"   (paper {PAPER_AWARENESS_GAIN:+.0%})")
    if "awareness" in t and "netstorm" in t:
        print(f"  multipath on top of awareness: {t['awareness'] / t['netstorm'] - 1:+.0%}"
              f"   (paper {PAPER_MULTIPATH_GAIN:+.0%}; the idle links bound it at "
              f"+{idle_capacity_bound(STATIC):.0%} here)")


#: A real model whose transfers matter (4.3M parameters, 17 MB) on the 9-DC mesh.
TTA_MODEL = ("training.model=mlp", "training.hidden=[2048, 2048]", "training.dataset=digits",
             "training.optimizer=adam", "training.lr=0.0005", "training.batch_size=32",
             "run.eval_every=5", "run.iterations=400")


def tta_table(path: Path, out: str, target: float, extra: list[str]) -> None:
    """Emulated time to a test accuracy with a real model (the paper's accuracy-vs-time
    figure reduced to one point per system)."""
    print(f"\n== time to {target:.2f} test accuracy, MLP 64-2048-2048-10 on digits "
          f"({path.name}) ==")
    tta: dict[str, float] = {}
    for name, sets in SYSTEMS:
        if name in ("random plan", "awareness", "hips"):
            continue
        t0 = time.perf_counter()
        summary, rows = _run(path, out, sets, [*TTA_MODEL, f"run.target_accuracy={target}",
                                                *extra])
        if summary.time_to_target_s is None:
            print(f"{name:12s} did not reach {target} in {summary.iterations} iterations")
            continue
        tta[name] = summary.time_to_target_s
        print(f"{name:12s} {tta[name]:8.1f} emulated s to {target} ({summary.iterations} "
              f"iterations, final {summary.final_accuracy:.3f})   "
              f"(wall {time.perf_counter() - t0:5.1f} s)")
    for other in ("mxnet", "mlnet", "tsengine"):
        if other in tta and "netstorm" in tta:
            print(f"  NETSTORM vs {other.upper()}: {tta[other] / tta['netstorm']:.2f}x faster "
                  "to the target")


def link_failure(out: str, extra: list[str], *, fail_at_s: float = 30.0,
                 iterations: int = 16) -> None:
    """A tree link (dc5-dc7, 500 Mbit/s) fails for good at ``fail_at_s`` (routing converges
    1 s later): s/iteration before and after, for the systems that plan (NETSTORM) and
    those that do not (MLNET's static tree, MXNET's all-to-all: the network reroutes)."""
    print(f"\n== link dc5-dc7 down at {fail_at_s:g} s (static mesh): s/iteration before -> "
          "after ==")
    fault = ["fault.0.kind=link_down", 'fault.0.link=["dc5", "dc7"]', f"fault.0.at={fail_at_s}s",
             "fault.0.converge=1s"]
    for name, sets in SYSTEMS:
        if name not in ("mxnet", "mlnet", "netstorm"):
            continue
        n = iterations if name == "netstorm" else max(6, iterations // 3)
        at = fail_at_s if name == "netstorm" else 3 * fail_at_s
        fault[2] = f"fault.0.at={at}s"
        _, rows = _run(STATIC, out, sets, [f"run.iterations={n}", *fault, *extra])
        before = [r for r in rows if r.t < at]
        after = [r for r in rows if r.t > at]
        b = (before[-1].t - before[len(before) // 2 - 1].t) / (len(before) - len(before) // 2) \
            if len(before) >= 2 else float("nan")
        # steady state after the failure: the last third of the iterations after it
        k = max(1, len(after) // 3)
        a = (after[-1].t - after[-k - 1].t) / k if len(after) > k else float("nan")
        print(f"{name:12s} {b:8.2f} -> {a:8.2f} s/it  (failed at {at:g} s, {len(after)} "
              f"iterations after)")


def random_mesh(n: int, *, seed: int, degree: float = 3.0) -> nx.Graph:
    """A connected random mesh of ``n`` DCs with average degree ``degree``: a random
    spanning tree (each DC joins a random earlier one) plus random extra links. (A plain
    G(n, m) graph of degree 3 is almost never connected at 200 nodes.)"""
    rng = random.Random(seed)
    g = nx.Graph()
    g.add_nodes_from(range(n))
    order = list(range(n))
    rng.shuffle(order)
    for i in range(1, n):
        g.add_edge(order[i], order[rng.randrange(i)])
    want = round(degree * n / 2)
    while g.number_of_edges() < want:
        a, b = rng.sample(range(n), 2)
        g.add_edge(a, b)
    return g


def planner_timings(sizes: tuple[int, ...] = (9, 50, 200), repeats: int = 3) -> None:
    print("\n== planner wall seconds per replan (random mesh, average degree 3, all roots) ==")
    for n in sizes:
        g = random_mesh(n, seed=n)
        rng = random.Random(n)
        dcs = [str(v) for v in g.nodes]
        links = [Link(str(a), str(b), 0.01) for a, b in g.edges]
        rates = {}
        for a, b in g.edges:
            rates[(str(a), str(b))] = rng.uniform(20e6, 155e6)
            rates[(str(b), str(a))] = rng.uniform(20e6, 155e6)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            plan = plan_netstorm(dcs, links, rates)
            times.append(time.perf_counter() - t0)
        print(f"  {n:4d} DCs, {len(links):4d} links: {statistics.median(times):.3f} s "
              f"(median of {repeats}; {len(plan.routes)} routed tree edges)")


def awareness_accuracy(out: str, iterations: int, extra: list[str]) -> None:
    print(f"\n== awareness accuracy after {iterations} static iterations (controller's "
          "estimate vs true rate, per measured link direction) ==")
    nodes: dict[str, Any] = {}
    s = load_scenario(STATIC)
    true = {}
    for w in s.wans:
        true[(w.a, w.b)] = w.capacity_bps(w.a, w.b)
        true[(w.b, w.a)] = w.capacity_bps(w.b, w.a)
    _run(STATIC, out, (), [f"run.iterations={iterations}", *extra],
         inspect=lambda ns: nodes.update({n.name: n for n in ns}))
    gh = nodes["gh"]
    measured = set()
    for name, node in nodes.items():
        if name.startswith("ns:"):
            measured |= {link for link, st in node.meter.links.items() if st.estimates}
    errs = []
    for link in sorted(measured):
        est = gh.rates[link]
        err = abs(est - true[link]) / true[link]
        errs.append(err)
        print(f"  {link[0]}->{link[1]}: true {true[link] / 1e6:6.1f} Mbit/s, estimate "
              f"{est / 1e6:6.1f}, error {err:6.1%}")
    if errs:
        print(f"  {len(errs)} of {len(true)} link directions measured; median error "
              f"{statistics.median(errs):.1%}, worst {max(errs):.1%}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--static-iterations", type=int, default=12)
    ap.add_argument("--dynamic-iterations", type=int, default=24,
                    help="iterations of each NETSTORM variant on the dynamic mesh")
    ap.add_argument("--quick", action="store_true", help="6 static, 20 dynamic iterations")
    ap.add_argument("--set", action="append", default=[], metavar="PATH=VALUE")
    ap.add_argument("--skip-dynamic", action="store_true")
    ap.add_argument("--skip-static", action="store_true",
                    help="only the dynamic table and the planner timings")
    ap.add_argument("--skip-tta", action="store_true", help="no time-to-accuracy runs")
    ap.add_argument("--target", type=float, default=0.95,
                    help="test accuracy for the time-to-accuracy table (default 0.95)")
    args = ap.parse_args()
    if args.quick:
        args.static_iterations, args.dynamic_iterations = 6, 12
    with tempfile.TemporaryDirectory() as out:
        if not args.skip_static:
            static_table(out, args.static_iterations, args.set)
            idle_paths_table(out, args.set)
        if not args.skip_dynamic:
            dynamic_table(out, args.dynamic_iterations, args.set)
        if not args.skip_static:
            awareness_accuracy(out, 4, args.set)
            link_failure(out, args.set)
        if not args.skip_tta:
            tta_table(STATIC, out, args.target, args.set)
            if not args.skip_dynamic:
                tta_table(DYNAMIC, out, args.target, args.set)
    planner_timings()


if __name__ == "__main__":
    main()
