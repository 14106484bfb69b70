"""TSEngine against the star (the same scenario with it off): emulated time per iteration,
time to a target accuracy, and whether exploration finds the faster edges.

Workloads (each pair in one run of this bench, TSEngine on vs off, nothing else changed;
FSA, so both train the same model and stop at the same iteration):

* ``scenarios/tsengine_incast.toml``: 8 party DCs, one worker each, every DC pair linked
  at 20 Mbps / 10 ms, the global server's NIC at 20 Mbps: the central DC's in-cast
  dominates (the star moves 8 pushes and 8 pulls of the model through that NIC per key
  and round). The inter-DC overlay merges pushes party to party and relays the model
  party to party, so the global server sends and receives a few copies instead of 8.
* ``scenarios/tsengine_hetero.toml``: 4 party DCs (2 workers each), central links of
  100, 100, 20 and 20 Mbps (5x apart), a 100 Mbps party mesh, the global server's NIC at
  40 Mbps, a 2048-wide MLP (2 MiB per round per DC). Run twice: as written (heterogeneity
  *and* in-cast) and with a 10 Gbps NIC (heterogeneity alone).
* ``scenarios/tsengine.toml`` (GeoMX's ``run_tsengine.sh``, quickstart shape, both
  overlays): a small, latency-bound model.

"Exploration finds the faster edges" comes from the hetero run's ``extra.tsengine``:
how often the global server's first relay of a round went to a party behind a fast
(100 Mbps) central link, in exploitation and in exploration (a uniform choice would give
50%), and the median measured throughput per edge next to the link's bandwidth.

What the papers report (docs/papers.md §2 (c)): the TSEngine paper (TNSM 2021) gives no
number the corpora returned; in NetStorm's figure TSEngine reaches ≈0.90 accuracy at
1500 min vs MXNET's (the star's) ≈0.845 on a static WAN (≈0.91 vs ≈0.86 dynamic) -- a
time-to-accuracy advantage of a tree-like overlay over the central PS, which is what the
in-cast rows measure.

    python bench/sched_tsengine.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from geomx.experiment import run_scenario
from geomx.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent
SCEN = ROOT / "scenarios"

#: NetStorm's figure (docs/papers.md §2 (c)): accuracy at 1500 min, static WAN.
PAPER = "NetStorm fig.: TSEngine ≈0.90 vs MXNET ≈0.845 at 1500 min (no TNSM number)"

#: (label, scenario, setting, extra overrides, iterations full / quick)
WORKLOADS: list[tuple[str, str, str, tuple[str, ...], tuple[int, int]]] = [
    ("8-DC in-cast", "tsengine_incast.toml",
     "8 parties, all links and the GS NIC 20 Mbps, mlp-512", (), (60, 20)),
    ("heterogeneous + in-cast", "tsengine_hetero.toml",
     "central links 100/100/20/20 Mbps, mesh 100, GS NIC 40 Mbps, mlp-2048", (), (40, 15)),
    ("heterogeneous, no in-cast", "tsengine_hetero.toml",
     "as above, GS NIC 10 Gbps", ("dc.0.lan_bandwidth=10Gbps",), (40, 15)),
    ("quickstart (tsengine.toml)", "tsengine.toml",
     "2 parties x 2 workers, WAN 100 Mbps / 30 ms, mlp-64, inter+intra", (), (120, 40)),
]

OFF = ("sched.tsengine_inter=false", "sched.tsengine_intra=false")
#: the workloads TSEngine loses on, whose one-way delays per round delay_cost counts
DELAY_COST = ("heterogeneous, no in-cast", "quickstart (tsengine.toml)")


def _run(name: str, overrides: list[str], out: Path) -> Any:
    s = load_scenario(SCEN / name, [*overrides, f"run.out_dir={out}", "run.progress=false",
                                    "metrics.trace=false", "metrics.plot=false"])
    return run_scenario(s).summary


#: the one-way WAN delay :func:`delay_cost` compares a scenario's own delays against
NEAR_ZERO_DELAY_S = 1e-4


def delay_cost(name: str, overrides: list[str], out: Path, star_s: float,
               ts_s: float) -> dict[str, float]:
    """Where TSEngine's time goes, from a second pair of runs with every WAN delay cut to
    0.1 ms (``star_s`` / ``ts_s``: s/iteration at the scenario's delays, all equal to d).

    A round costs ``a + b·d``: ``b`` counts the one-way WAN delays on its critical path.
    The star's is about 4 (push and its acknowledgement, pull and its reply); TSEngine's
    is larger by design: every merge and relay first waits for the coordinator's answer
    (a round trip to the global scheduler), the root takes merges one at a time, and a
    holder relays to one receiver at a time, waiting for each acknowledgement (docs/papers.md
    §2 (b)). Returns both ``b``, the extra one-way delays per round, what they cost at d,
    the ratio at 0.1 ms (what is left without latency), and the most merging could save:
    the star's in-cast at the root, every party's model into the global server's NIC."""
    s = load_scenario(SCEN / name, overrides)
    d = s.wans[0].latency_s
    if any(abs(w.latency_s - d) > 1e-12 for w in s.wans):
        raise ValueError(f"{name}: delay_cost needs one WAN delay; the links differ")
    near = [f"wan.{i}.latency={NEAR_ZERO_DELAY_S * 1e3:g}ms" for i in range(len(s.wans))]
    star0 = _run(name, [*overrides, *near, *OFF], out)
    ts0 = _run(name, [*overrides, *near], out)
    star0_s = star0.emulated_seconds / max(1, star0.iterations)
    ts0_s = ts0.emulated_seconds / max(1, ts0.iterations)
    b_star = (star_s - star0_s) / (d - NEAR_ZERO_DELAY_S)
    b_ts = (ts_s - ts0_s) / (d - NEAR_ZERO_DELAY_S)
    dims = (64, *s.training.hidden, 10)
    model_bytes = 4 * sum(a * b + b for a, b in zip(dims, dims[1:]))
    central = next(dc for dc in s.dcs if dc.central)
    parties = sum(1 for dc in s.dcs if not dc.central)
    return {"delay_s": d, "star_delays_per_round": b_star, "ts_delays_per_round": b_ts,
            "extra_delays_per_round": b_ts - b_star, "extra_s": (b_ts - b_star) * d,
            "speedup_near_zero_delay": star0_s / ts0_s,
            "root_incast_s": parties * model_bytes * 8 / central.lan_bandwidth_bps}


def fast_edge_share(extra: dict[str, Any], fast_mbps: float) -> dict[str, Any]:
    """The global servers' first relay of each round (where the broadcast starts): the
    share that went over a link of at least ``fast_mbps``, by mode; and measured vs link
    Mbps of each global-server edge."""
    inter = extra.get("inter", {})
    got = {"exploit": [0, 0], "explore": [0, 0]}
    for f in inter.get("root_first_hop", []):
        fast = (f["link_mbps"] or 0) >= fast_mbps
        for mode in got:
            got[mode][0] += f.get(mode, 0) * fast
            got[mode][1] += f.get(mode, 0)
    edges = [f"{e['dst'].split(':', 1)[1]} {e['measured_mbps'] or 0:.0f}/{e['link_mbps']:.0f} "
             f"Mbps x{e['chosen']}" for e in inter.get("edges", []) if e["src"].startswith("gs:")]
    share = {m: (a / b if b else None) for m, (a, b) in got.items()}
    return {"fast_share_exploit": share["exploit"], "fast_share_explore": share["explore"],
            "first_hops": (got["exploit"][1], got["explore"][1]), "gs_edges": "; ".join(edges)}


def root_load(inter: dict[str, Any]) -> dict[str, Any]:
    """Copies of a key's value the global servers received and sent per round (the star:
    one per party DC each way)."""
    rounds = sum(f.get("exploit", 0) + f.get("explore", 0)
                 for f in inter.get("root_first_hop", []))
    if not rounds:
        return {}
    received = inter["pairings"].get("root", 0)
    sent = sum(e["chosen"] for e in inter.get("edges", []) if e["src"].startswith("gs:"))
    return {"gs_in_per_round": received / rounds, "gs_out_per_round": sent / rounds}


def rows(quick: bool = False, out: Path | None = None) -> list[dict[str, Any]]:
    """TSEngine's figures: one dict per workload."""
    result: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        out = out or Path(tmp)
        for label, name, setting, extra, (n_full, n_quick) in WORKLOADS:
            n = n_quick if quick else n_full
            t0 = time.perf_counter()
            base = [*extra, f"run.iterations={n}"]
            off = _run(name, [*base, *OFF], out)
            on = _run(name, base, out)
            row: dict[str, Any] = {
                "scheduler": "tsengine", "workload": label, "setting": setting,
                "iterations": (off.iterations, on.iterations),
                "off_s_per_iter": off.emulated_seconds / max(1, off.iterations),
                "on_s_per_iter": on.emulated_seconds / max(1, on.iterations),
                "off_tta": off.time_to_target_s, "on_tta": on.time_to_target_s,
                "target": load_scenario(SCEN / name).run.target_accuracy,
                "acc_off": off.final_accuracy, "acc_on": on.final_accuracy,
                "wall_s": time.perf_counter() - t0}
            row["speedup"] = row["off_s_per_iter"] / row["on_s_per_iter"]
            ts = (on.extra or {}).get("tsengine", {})
            inter = ts.get("inter") or ts.get("intra") or {}
            row["exploit"] = inter.get("exploit")
            row["explore"] = inter.get("explore")
            row["pairings"] = inter.get("pairings")
            row.update(root_load(ts.get("inter", {})))
            if name == "tsengine_hetero.toml":
                row.update(fast_edge_share(ts, fast_mbps=100.0))
            if label in DELAY_COST:
                row["delay_cost"] = delay_cost(name, base, out, row["off_s_per_iter"],
                                               row["on_s_per_iter"])
            result.append(row)
            print(f"  {label}: {row['wall_s']:.1f} s wall", file=sys.stderr)
    return result


def _fmt(x: Any, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def table(rs: list[dict[str, Any]]) -> str:
    lines = ["| workload | setting | s/iter star | s/iter TSEngine | speed-up | "
             "s to target star | TSEngine | accuracy star / TS |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rs:
        lines.append(
            f"| {r['workload']} | {r['setting']} | {r['off_s_per_iter']:.3f} | "
            f"{r['on_s_per_iter']:.3f} | {r['speedup']:.2f}x | {_fmt(r['off_tta'], '.1f')} | "
            f"{_fmt(r['on_tta'], '.1f')} (to {r['target']:g}) | "
            f"{_fmt(r['acc_off'], '.3f')} / {_fmt(r['acc_on'], '.3f')} |")
    lines.append("")
    lines.append("Overlay decisions (TSEngine runs): broadcast exploit/explore, push pairings")
    for r in rs:
        lines.append(f"- {r['workload']}: exploit {r['exploit']}, explore {r['explore']}, "
                     f"pairings {r['pairings']}")
        if "gs_in_per_round" in r:
            lines.append(f"  global server per key and round: {r['gs_in_per_round']:.2f} merged "
                         f"pushes in, {r['gs_out_per_round']:.2f} relays out (star: one per "
                         "party DC each way)")
        if "delay_cost" in r:
            d = r["delay_cost"]
            lines.append(
                f"  one-way WAN delays per round (d = {d['delay_s'] * 1e3:g} ms): star "
                f"{d['star_delays_per_round']:.1f}, TSEngine {d['ts_delays_per_round']:.1f} "
                f"(+{d['extra_s']:.3f} s); at 0.1 ms {d['speedup_near_zero_delay']:.2f}x; "
                f"the star's in-cast at the root {d['root_incast_s'] * 1e3:.3f} ms")
        if "fast_share_exploit" in r:
            lines.append(
                f"  first hop of each round from the global server to a party behind a "
                f"100 Mbps link: {_fmt(r['fast_share_exploit'], '.0%')} of "
                f"{r['first_hops'][0]} exploiting, {_fmt(r['fast_share_explore'], '.0%')} of "
                f"{r['first_hops'][1]} exploring (uniform: 50%); GS edges measured/link "
                f"Mbps x times chosen: {r['gs_edges']}")
    lines.append(f"Paper: {PAPER}")
    lines += WHY
    return "\n".join(lines)


#: How to read the figures (the mechanisms behind them, checked against the event logs).
WHY = [
    "Why:",
    "- In-cast: the star moves one copy per party DC each way through the global server's",
    "  NIC per key and round; with the overlay the global server relays the model to a few",
    "  parties that relay it on, and part of the pushes arrive merged. Fewer copies through",
    "  the shared bottleneck is the whole gain; the accuracy is the star's (FSA).",
    "- Heterogeneous + in-cast: exploitation starts each broadcast on a fast central link",
    "  (measured throughput ranks the edges as the links do), the slow parties get the model",
    "  over the fast party mesh, and the NIC carries fewer copies.",
    "- Heterogeneous alone: the star's pushes and pulls run in parallel, each over its own",
    "  link once. The overlay's hops are serial, each costs a scheduler round trip and an",
    "  acknowledgement, a slow party that becomes ready last is paired with the root and",
    "  still pushes over its slow link (GeoMX's pairing rule: the root takes whoever is",
    "  queued next to it), and every 5 rounds measurements expire and slow edges are",
    "  explored again. So TSEngine pays off where the bottleneck is shared, not where each",
    "  DC simply has a slow link of its own.",
    "- Quickstart: a 19 KB model on 30 ms links is latency-bound. Measured by cutting every",
    "  WAN delay to 0.1 ms (delay_cost): a star round has 4.1 one-way delays on its critical",
    "  path, a TSEngine round 9.5, because every merge and relay first waits for the",
    "  coordinator's answer a WAN round trip away, the root takes merges one at a time and",
    "  a holder relays to one receiver at a time, acknowledgement in between. That is",
    "  TSEngine's design, not an extra round trip of ours; at 0.1 ms the overlay is 0.85x,",
    "  at 3 ms 0.61x, at 30 ms 0.46x, while merging could save at most the star's in-cast",
    "  at the root (two 19 KB pushes into a 10 Gbit/s NIC: microseconds).",
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer iterations per workload")
    ap.add_argument("--out", default=None, help="keep the run folders here (default: temp)")
    args = ap.parse_args(argv)
    rs = rows(quick=args.quick, out=Path(args.out) if args.out else None)
    print("TSEngine vs the star (emulated, deterministic)")
    print(table(rs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
