"""DGT against the same scenario without it: emulated time to a target accuracy.

Runs ``scenarios/dgt_incast.toml`` (four parties, 20 Mbps / 30 ms WAN links into a
40 Mbps central NIC: in-cast) in the emulator at several WAN loss rates, each once with
DGT off and once per DGT variant (UDP bands with adaptive K, UDP with fixed K = 0.8,
deprioritised TCP bands, 4-bit quantised TCP bands), and prints per row: emulated time
to the target accuracy and its gain against DGT off measured in the same run (next to
the paper's band), emulated seconds per iteration, the accuracy when the target was
reached, and the accuracy after a fixed number of iterations with its difference from
DGT off in percentage points (the "accuracy within 1 pp" check).

The DGT paper (Zhou et al., FGCS 2021) reports 19.4% / 34.4% / 36.5% less training time
(GoogLeNet / AlexNet / VGG-11, 6 GPUs, 1 Gbps). Emulated times are deterministic, so the
table is the same on every machine.

    python bench/sched_dgt.py [--loss 0% 1% 3% 5%] [--set PATH=VALUE ...]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from geomx.experiment import run_scenario
from geomx.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "dgt_incast.toml"

#: The paper's reduction of training time (fraction), GoogLeNet .. VGG-11.
PAPER_BAND = (0.194, 0.365)

VARIANTS: list[tuple[str, tuple[str, ...]]] = [
    ("off", ("sched.dgt=off",)),
    ("udp, adaptive K", ("sched.dgt=udp", "sched.dgt_adaptive_k=true")),
    ("udp, fixed K=0.8", ("sched.dgt=udp", "sched.dgt_adaptive_k=false")),
    ("tcp, adaptive K", ("sched.dgt=tcp", "sched.dgt_adaptive_k=true")),
    ("quant, adaptive K", ("sched.dgt=quant", "sched.dgt_adaptive_k=true")),
]


#: Iterations of the second run of each row, whose final accuracy is compared at equal
#: iterations (the first run stops at the target, so its accuracy is ~ the target).
FIXED_ITERATIONS = 100


def _one(loss: str, overrides: tuple[str, ...], extra: list[str], out: str) -> dict[str, Any]:
    sets = [f"wan.{i}.loss={loss}" for i in range(4)]
    common = [f"run.out_dir={out}", "run.progress=false", "metrics.plot=false",
              "metrics.events=false", "metrics.trace=false", *sets, *overrides]
    t0 = time.perf_counter()
    r = run_scenario(load_scenario(SCENARIO, [*common, *extra])).summary
    fixed = run_scenario(load_scenario(SCENARIO, [*common, "run.target_accuracy=0",
                                                  f"run.iterations={FIXED_ITERATIONS}",
                                                  *extra])).summary
    dgt = r.extra.get("dgt") or {}
    bands = dgt.get("bands", [])
    low_sent = sum(b["sent_blocks"] for b in bands[1:])
    return {
        "time_to_target_s": r.time_to_target_s,
        "s_per_iteration": (r.emulated_seconds or 0) / max(1, r.iterations),
        "iterations": r.iterations,
        "accuracy": r.final_accuracy,
        "accuracy_fixed": fixed.final_accuracy,
        "wan_mb": r.bytes_wan / 1e6,
        "low_blocks_dropped": sum(b["dropped"] for b in bands[1:]),
        "low_blocks_late": sum(b["late"] for b in bands[1:]),
        "low_blocks_sent": low_sent,
        "wall_s": time.perf_counter() - t0,
    }


def rows(losses: tuple[str, ...] = ("0%", "1%", "3%", "5%"), extra: list[str] | None = None
         ) -> list[dict[str, Any]]:
    """One row per (loss, variant); ``gain`` = 1 - time_to_target / DGT-off's."""
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="geomx-bench-dgt-") as tmp:
        for loss in losses:
            base = None
            for label, overrides in VARIANTS:
                r = _one(loss, overrides, list(extra or []), tmp)
                r.update({"bench": "dgt", "loss": loss, "variant": label})
                if base is None:
                    base = r
                t, b = r["time_to_target_s"], base["time_to_target_s"]
                r["gain"] = (1 - t / b) if (t is not None and b) else None
                r["accuracy_delta_pp"] = ((r["accuracy_fixed"] - base["accuracy_fixed"]) * 100
                                          if r["accuracy_fixed"] is not None
                                          and base["accuracy_fixed"] is not None else None)
                r["paper_band"] = PAPER_BAND
                out.append(r)
    return out


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_table(table: list[dict[str, Any]]) -> None:
    print(f"DGT on {SCENARIO.name} (emulator): time to target accuracy vs DGT off, same run")
    print(f"paper: {PAPER_BAND[0]:.1%} .. {PAPER_BAND[1]:.1%} less training time "
          "(GoogLeNet/AlexNet/VGG-11, 6 GPUs, 1 Gbps)")
    head = (f"{'loss':>5} {'variant':<18} {'to target s':>11} {'s/iter':>7} {'iters':>5} "
            f"{'acc':>6} {'acc@' + str(FIXED_ITERATIONS):>7} {'d pp':>6} {'gain':>7} {'WAN MB':>7} {'low drop/late/sent':>19}"
            f" {'wall s':>6}")
    print(head)
    print("-" * len(head))
    for r in table:
        dl = f"{r['low_blocks_dropped']}/{r['low_blocks_late']}/{r['low_blocks_sent']}"
        print(f"{r['loss']:>5} {r['variant']:<18} {_fmt(r['time_to_target_s'], '11.2f')} "
              f"{r['s_per_iteration']:7.3f} {r['iterations']:5d} {_fmt(r['accuracy'], '6.3f')} "
              f"{_fmt(r['accuracy_fixed'], '7.3f')} {_fmt(r['accuracy_delta_pp'], '+6.2f')} {_fmt(r['gain'], '+7.1%')} "
              f"{r['wan_mb']:7.1f} {dl:>19} {r['wall_s']:6.1f}")


NOTES = """\
Why ours differs from the paper's band:
* DGT thins only the local -> global server push; the pull of the new model is whole, on
  channel 0. Moving (1 - K) of the push off the round's critical path therefore saves at
  most about half of the round's WAN time: ~25% with adaptive K (K falls to k_min = 0.2 as
  the loss falls), ~8% with fixed K = 0.8. The paper's DGT thins worker -> server pushes
  of larger CNNs on a 1 Gbps cluster.
* Under loss the emulator caps every reliable flow at the Mathis rate (~2.4 / 1.4 / 1.1
  Mbps at 1 / 3 / 5% loss and a 60 ms RTT) while UDP bands are never capped, only
  dropped. The round is dominated by the capped channel-0 push and pull, so the gain
  grows only slowly with loss. In tcp mode each band is its own TCP connection with its
  own Mathis cap (as over real sockets, one connection per channel), so tcp ~ udp here;
  GeoMX's mode 2 shares one TCP connection, where bands would also compete with channel 0.
* At 0% loss the 40 Mbps central NIC (in-cast) is the bottleneck: strict priority makes
  every band block a round late, iterations get faster (s/iter) but convergence needs
  more of them, so time to target gains little; 4-bit bands are small enough to arrive in
  time (no late blocks) and keep most of the per-iteration gain.
"""


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--loss", nargs="+", default=["0%", "1%", "3%", "5%"])
    ap.add_argument("--set", action="append", default=[], dest="sets", metavar="PATH=VALUE")
    a = ap.parse_args(argv)
    print_table(rows(tuple(a.loss), a.sets))
    print()
    print(NOTES)


if __name__ == "__main__":
    main()
