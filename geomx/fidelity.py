"""Does the shaped real runtime take the time the emulator says? Per-iteration figures.

The emulator is the reference: it charges compute from the scenario's profile and the
network from the flow model. The real runtime reproduces the same WAN with its own
shaper and pads compute to the same profile, so an iteration should take about as long
in wall seconds as it does in emulated seconds. What remains is what the emulator does
not model: the processes' own CPU time per message (encode, decode, the event loop),
waking up on a shared machine, and the operating system's scheduling.

Both figures come from the evaluator's events, excluding start-up:

* ``window_s_per_iter`` -- time between the evaluator's first and last ``eval`` events
  divided by the iterations between them (the headline figure);
* ``median_s_per_iter`` -- the median gap between consecutive ``compute`` events of the
  evaluator: the same quantity, robust to a few iterations slowed by a busy machine.

With ``--host PROFILE`` (``geomx calibrate``, docs/calibration.md) each case also runs on
the emulator charging that host profile -- the CPU and wake-up costs listed above, as
measured on this host -- and the report gains a calibrated column and the real runs'
error against it. ``--repeat N`` runs every case N times, the cases taking turns, and
reports medians.

``python -m geomx.fidelity SCENARIO [--set ...]`` runs the scenario on both
runtimes and prints them; ``geomx fidelity SCENARIO_OR_SUITE... [--shaper
userspace,kernel]`` runs many (``scenarios/fidelity/suite.toml``: the suite's topology shapes)
and writes a report (``fidelity.md``, ``fidelity.json``, ``fidelity.png``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from geomx.provenance import provenance, provenance_line


@dataclass
class IterationTimes:
    window_s_per_iter: float
    median_s_per_iter: float
    iterations: int            # iterations in the eval window

    def as_dict(self) -> dict[str, float]:
        return {"window_s_per_iter": self.window_s_per_iter,
                "median_s_per_iter": self.median_s_per_iter, "iterations": self.iterations}


def iteration_times(run_dir: str | os.PathLike, evaluator: str) -> IterationTimes:
    """Per-iteration seconds of a finished run from its ``events.jsonl``."""
    evals: list[tuple[int, float]] = []
    computes: list[float] = []
    with open(Path(run_dir) / "events.jsonl") as fh:
        for line in fh:
            ev = json.loads(line)
            if ev.get("node") != evaluator:
                continue
            if ev["ev"] == "eval":
                evals.append((int(ev["iteration"]), float(ev["t"])))
            elif ev["ev"] == "compute":
                computes.append(float(ev["t"]))
    evals = sorted(dict(evals).items())  # the final eval may repeat the last periodic one
    if len(evals) < 2:
        raise ValueError(f"{run_dir}: need at least two evaluations by {evaluator} "
                         "(set run.eval_every)")
    (i0, t0), (i1, t1) = evals[0], evals[-1]
    computes.sort()
    gaps = [b - a for a, b in zip(computes, computes[1:])]
    skip = max(1, len(gaps) // 10)  # the first iterations include connection set-up
    return IterationTimes(window_s_per_iter=(t1 - t0) / (i1 - i0),
                          median_s_per_iter=statistics.median(gaps[skip:] or gaps),
                          iterations=i1 - i0)


def compare(scenario_path: str, overrides: Sequence[str] = (), *, out_dir: str | None = None,
            shapers: Sequence[str] = ("userspace",),
            host_profile: str | None = None) -> dict[str, dict[str, float]]:
    """Run ``scenario_path`` in the emulator and over sockets with each of ``shapers``
    (``"userspace"``: the transport's own shaper; ``"kernel"``: network namespaces and
    ``tc``, ``[real] shaper = "kernel"``); both figures for each, and real / emulated.
    With ``host_profile`` (``geomx calibrate``, docs/calibration.md) the emulator runs a
    second time charging that profile, its nodes sharing the cores the profile recorded
    (``[host] cores``, unless the case sets it): ``emu_calibrated`` and real / calibrated."""
    from geomx.cluster import plan_job
    from geomx.experiment import run_scenario
    from geomx.scenario import load_scenario

    common = [*overrides, "run.progress=false", "metrics.plot=false", "metrics.trace=false"]
    common += [f"run.out_dir={out_dir}"] if out_dir else []
    s = load_scenario(scenario_path, common)
    evaluator = plan_job(s).train.evaluator
    out: dict[str, dict[str, float]] = {}
    r = run_scenario(s, runtime="emu")
    out["emu"] = iteration_times(r.run_dir, evaluator).as_dict()
    if host_profile:
        # the real runs' nodes all share this host: its cores, as the profile recorded them
        from geomx.host_profile import load_profile

        cores = int(load_profile(host_profile).provenance.get("cores", 0) or 0)
        sc = load_scenario(scenario_path, [f"host.cores={cores}", *common,
                                           f"host.profile={host_profile}"])
        r = run_scenario(sc, runtime="emu")
        out["emu_calibrated"] = iteration_times(r.run_dir, evaluator).as_dict()
    for shaper in shapers:
        if shaper not in SHAPERS:
            raise ValueError(f"unknown shaper {shaper!r}; allowed: {', '.join(SHAPERS)}")
        sk = load_scenario(scenario_path, [*common, f"real.shaper={shaper}"])
        if shaper == "kernel":
            from geomx.runtime.kernel_wan import kernel_mode_problem

            problem = kernel_mode_problem(sk)
            if problem is not None:
                out[f"real_{shaper}_skipped"] = {"reason": problem}  # type: ignore[dict-item]
                continue
        r = run_scenario(sk, runtime="real")
        key = "real" if shaper == "userspace" else f"real_{shaper}"
        out[key] = iteration_times(r.run_dir, evaluator).as_dict()
        out[f"{key}_over_emu"] = {k: out[key][k] / out["emu"][k]
                                  for k in ("window_s_per_iter", "median_s_per_iter")}
        if host_profile:
            out[f"{key}_over_emu_calibrated"] = {
                k: out[key][k] / out["emu_calibrated"][k]
                for k in ("window_s_per_iter", "median_s_per_iter")}
    return out


#: The ways the real runtime can reproduce the WAN (``[real] shaper``).
SHAPERS = ("userspace", "kernel")


@dataclass
class Case:
    """One row of a fidelity report: a scenario and its overrides."""

    name: str
    scenario: str
    overrides: tuple[str, ...] = ()


def load_cases(paths: Sequence[str], overrides: Sequence[str] = ()) -> list[Case]:
    """Scenario files are one case each; a suite file (a TOML file of ``[[case]]`` tables
    with ``name``, ``scenario`` relative to it and optional ``set``) gives its cases.
    ``overrides`` apply to every case, after the case's own."""
    import tomllib

    cases: list[Case] = []
    for path in paths:
        p = Path(path)
        try:
            raw = tomllib.loads(p.read_text(encoding="utf-8"))
        except OSError as e:
            raise ValueError(f"{path}: cannot read ({e.strerror})") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}: not a TOML file ({e})") from None
        if "case" not in raw:
            cases.append(Case(p.stem, str(p), tuple(overrides)))
            continue
        for i, c in enumerate(raw["case"]):
            where = f"{path}: case[{i}]"
            if not isinstance(c, dict) or not isinstance(c.get("scenario"), str):
                raise ValueError(f"{where}: needs scenario = \"FILE.toml\"")
            sets = c.get("set", [])
            if not isinstance(sets, list) or not all(isinstance(x, str) for x in sets):
                raise ValueError(f"{where}.set: a list of \"key=value\" strings")
            cases.append(Case(str(c.get("name", Path(c["scenario"]).stem)),
                              str(p.parent / c["scenario"]), (*sets, *overrides)))
    return cases


def run_report(cases: Sequence[Case], *, shapers: Sequence[str] = ("userspace",),
               out_dir: str | os.PathLike = "runs/fidelity",
               progress: Callable[[str], None] | None = print,
               host_profile: str | None = None, repeat: int = 1) -> list[dict]:
    """Every case in the emulator and over sockets with each shaper; writes
    ``fidelity.md`` (the table), ``fidelity.json`` (``{"provenance": ..., "cases": rows}``,
    geomx/provenance.py) and ``fidelity.png`` into ``out_dir``.

    ``host_profile``: also the emulator charging that profile (a calibrated column and
    its error). ``repeat``: every case that many times, the cases taking turns (so load
    from elsewhere hits them alike); each figure is the median over the repeats."""
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    extra = {"host_profile": host_profile} if host_profile else {}
    results: list[list[dict]] = [[] for _ in cases]
    loads: list[list[float]] = [[] for _ in cases]
    for rep in range(repeat):
        for i, case in enumerate(cases):
            t0 = time.perf_counter()
            results[i].append(compare(case.scenario, case.overrides, out_dir=str(out / "runs"),
                                      shapers=shapers, **extra))
            if hasattr(os, "getloadavg"):
                loads[i].append(os.getloadavg()[0])
            if progress is not None and rep == repeat - 1:
                row = _report_row(case, results[i], loads[i], shapers)
                progress(_row_text(row, shapers) + f"   ({time.perf_counter() - t0:.0f} s)")
    rows = [_report_row(case, results[i], loads[i], shapers) for i, case in enumerate(cases)]
    made_by = provenance(host_profile=host_profile)
    (out / "fidelity.json").write_text(json.dumps({"provenance": made_by, "cases": rows},
                                                  indent=1))
    (out / "fidelity.md").write_text(report_table(rows, shapers) + "\n" + provenance_line(made_by)
                                     + "\n")
    plot_report(rows, shapers, out / "fidelity.png")
    return rows


def _report_row(case: Case, results: Sequence[dict], loads: Sequence[float],
                shapers: Sequence[str]) -> dict:
    """One case's row: medians over its repeats (``results``: what :func:`compare` gave)."""
    def median_of(key: str) -> float:
        return statistics.median(r[key]["window_s_per_iter"] for r in results)

    emu = median_of("emu")
    row: dict[str, Any] = {"case": case.name, "scenario": case.scenario,
                           "set": list(case.overrides), "emu_s_per_iter": emu,
                           "load_average": statistics.median(loads) if loads else None}
    calibrated = "emu_calibrated" in results[0]
    if calibrated:
        row["emu_calibrated_s_per_iter"] = median_of("emu_calibrated")
    if len(results) > 1:
        row["repeats"] = len(results)
        row["load_averages"] = list(loads)
    for shaper in shapers:
        key = "real" if shaper == "userspace" else f"real_{shaper}"
        if key not in results[0]:  # this shaper cannot reproduce the case (the reason is kept)
            row[f"{shaper}_s_per_iter"] = row[f"{shaper}_error"] = None
            row[f"{shaper}_skipped"] = results[0][f"{key}_skipped"]["reason"]
            continue
        real = median_of(key)
        row[f"{shaper}_s_per_iter"] = real
        row[f"{shaper}_error"] = real / emu - 1
        if len(results) > 1:
            row[f"{shaper}_runs_s_per_iter"] = [r[key]["window_s_per_iter"] for r in results]
        if calibrated:
            row[f"{shaper}_error_calibrated"] = real / row["emu_calibrated_s_per_iter"] - 1
    return row


def _calibrated(rows: Sequence[dict]) -> bool:
    return any(r.get("emu_calibrated_s_per_iter") is not None for r in rows)


def _row_text(row: dict, shapers: Sequence[str]) -> str:
    cal = _calibrated([row])
    cells = [f"{row['emu_s_per_iter']:.3f}"]
    if cal:
        cells.append(f"{row['emu_calibrated_s_per_iter']:.3f}")
    for sh in shapers:
        if row[f"{sh}_s_per_iter"] is None:
            cells += ["n/a"] * (3 if cal else 2)
            continue
        cells += [f"{row[f'{sh}_s_per_iter']:.3f}", f"{row[f'{sh}_error']:+.1%}"]
        if cal:
            cells.append(f"{row[f'{sh}_error_calibrated']:+.1%}")
    return f"{row['case'][:60]:60s} " + " ".join(f"{c:>9s}" for c in cells)


def report_table(rows: Sequence[dict], shapers: Sequence[str]) -> str:
    """The report as a Markdown table (seconds per iteration, relative error); with a host
    profile, the calibrated emulator's column and the real runs' error against it."""
    cal = _calibrated(rows)
    head = "| case | emulated s/iter |" + (" calibrated s/iter |" if cal else "")
    rule = "|---|---:|" + ("---:|" if cal else "")
    for sh in shapers:
        head += f" real ({sh}) s/iter | error |" + (" error (calibrated) |" if cal else "")
        rule += "---:|---:|" + ("---:|" if cal else "")
    lines = [head, rule]
    for r in rows:
        line = f"| {r['case']} | {r['emu_s_per_iter']:.3f} |"
        if cal:
            line += f" {r['emu_calibrated_s_per_iter']:.3f} |"
        for sh in shapers:
            if r[f"{sh}_s_per_iter"] is None:
                line += f" n/a | {r.get(f'{sh}_skipped', '')} |" + (" n/a |" if cal else "")
                continue
            line += f" {r[f'{sh}_s_per_iter']:.3f} | {r[f'{sh}_error']:+.1%} |"
            if cal:
                line += f" {r[f'{sh}_error_calibrated']:+.1%} |"
        lines.append(line)
    loads = [r["load_average"] for r in rows if r.get("load_average") is not None]
    if loads:
        lines.append("")
        lines.append(f"Load average during the runs: {min(loads):.2f}-{max(loads):.2f} on "
                     f"{os.cpu_count()} CPUs (real time is wall time: a busy machine slows it).")
    repeats = max((r.get("repeats", 1) for r in rows), default=1)
    if repeats > 1:
        lines.append(f"Each real figure is the median of {repeats} runs, the cases taking turns.")
    return "\n".join(lines) + "\n"


def plot_report(rows: Sequence[dict], shapers: Sequence[str], path: str | os.PathLike) -> None:
    """Two panels: seconds per iteration (emulated and real, per case) and the real runs'
    relative error against the emulator, with the +-10% band the real runtime is held to."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cal = _calibrated(rows)
    series = [("emulated", "emu_s_per_iter")]
    series += [("emulated, calibrated", "emu_calibrated_s_per_iter")] if cal else []
    series += [(f"real ({sh})", f"{sh}_s_per_iter") for sh in shapers]
    labels = [r["case"].split(":")[0][:22] for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(6.0, 1.1 * len(rows) + 2), 6.4),
                                      sharex=True)
    width = 0.8 / len(series)
    for i, (label, key) in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(rows))]
        top.bar(xs, [r[key] or 0.0 for r in rows], width, label=label)
    top.set_yscale("log")
    top.set_ylabel("seconds per iteration")
    top.set_title("Real runtime vs emulator, per iteration")
    top.legend(fontsize=8)
    errors = [(f"real ({sh})", f"{sh}_error") for sh in shapers]
    errors += [(f"real ({sh}) vs calibrated", f"{sh}_error_calibrated")
               for sh in shapers] if cal else []
    width = 0.8 / len(errors)
    for i, (label, key) in enumerate(errors):
        xs = [j + (i - (len(errors) - 1) / 2) * width for j in range(len(rows))]
        bottom.bar(xs, [100 * (r.get(key) or 0.0) for r in rows], width,
                   label=label, color=f"C{i + 1}")
    bottom.axhspan(-10, 10, color="0.9", zorder=0)
    bottom.axhline(0, color="0.3", lw=0.8)
    bottom.set_ylabel("real / emulated - 1 (%)")
    if len(errors) > 1:
        bottom.legend(fontsize=8)
    bottom.set_xticks(range(len(rows)))
    bottom.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


FIDELITY_EPILOG = """\
examples:
  geomx fidelity scenarios/quickstart.toml --set run.iterations=60 --set run.target_accuracy=0
  geomx fidelity scenarios/fidelity/suite.toml                     # the suite: every WAN shape
  geomx fidelity scenarios/netstorm_4dc.toml --host host.toml --repeat 5   # with a calibrated column
  sudo geomx fidelity scenarios/fidelity/asym3.toml --shaper userspace,kernel
"""


def add_parser(sub: Any, add_scenario_args: Callable[[Any], None] | None = None) -> None:
    """Register ``geomx fidelity`` on the main parser's subparsers."""
    import argparse

    p = sub.add_parser(
        "fidelity", help="run scenarios in the emulator and over sockets: s/iter side by side",
        description="Run each scenario (or each case of a suite file) in the emulator and "
                    "over real sockets; print seconds per iteration side by side with the "
                    "relative error; write fidelity.md, fidelity.json and fidelity.png.",
        epilog=FIDELITY_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenarios", nargs="+", metavar="SCENARIO_OR_SUITE")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override for every case (after a suite's own)")
    p.add_argument("--shaper", default="userspace",
                   help="comma-separated: userspace, kernel (kernel needs root; default userspace)")
    p.add_argument("--out", default="runs/fidelity", help="report folder (default runs/fidelity)")
    p.add_argument("--host", default=None, metavar="PROFILE",
                   help="host profile from `geomx calibrate`: adds the emulator charging it "
                        "(a calibrated column and the real runs' error against it)")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="run every case N times, the cases taking turns; report medians")
    p.set_defaults(handler=_cli)


def _cli(args: Any) -> int:
    shapers = [x.strip() for x in args.shaper.split(",") if x.strip()]
    bad = [x for x in shapers if x not in SHAPERS]
    if bad or not shapers:
        print(f"geomx fidelity: --shaper {args.shaper!r}: allowed: {', '.join(SHAPERS)}",
              file=sys.stderr)
        return 2
    if args.repeat < 1:
        print(f"geomx fidelity: --repeat {args.repeat}: allowed: an integer >= 1",
              file=sys.stderr)
        return 2
    from geomx.scenario import ScenarioError, load_scenario

    host = os.path.abspath(args.host) if args.host else None
    try:
        if host:
            from geomx.host_profile import ProfileError, load_profile

            try:
                load_profile(host)
            except ProfileError as e:
                raise ValueError(f"--host {e}") from None
        cases = load_cases(args.scenarios, args.overrides)
        for case in cases:  # refuse a bad case before hours of runs, not after
            load_scenario(case.scenario, list(case.overrides))
    except (ValueError, ScenarioError, FileNotFoundError) as e:
        print(f"geomx fidelity: {e}", file=sys.stderr)
        return 2
    head = f"{'case':60s} {'emu':>9s}" + (f" {'emu cal':>9s}" if host else "")
    head += "".join(f" {sh[:9]:>9s} {'error':>9s}" + (f" {'err cal':>9s}" if host else "")
                    for sh in shapers)
    print(head)
    run_report(cases, shapers=shapers, out_dir=args.out, host_profile=host, repeat=args.repeat)
    print(f"report: {Path(args.out) / 'fidelity.md'} (and fidelity.json, fidelity.png)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m geomx.fidelity",
                                description="Per-iteration time: emulator vs shaped real runtime.")
    p.add_argument("scenario")
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    res = compare(args.scenario, args.overrides, out_dir=args.out)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{'':10s} {'window s/iter':>14s} {'median s/iter':>14s}")
    for k in ("emu", "real"):
        print(f"{k:10s} {res[k]['window_s_per_iter']:14.4f} {res[k]['median_s_per_iter']:14.4f}")
    r = res["real_over_emu"]
    print(f"{'real/emu':10s} {r['window_s_per_iter']:14.3f} {r['median_s_per_iter']:14.3f}"
          f"   (load average {load:.2f} on {os.cpu_count()} CPUs)")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
