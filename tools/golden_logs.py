#!/usr/bin/env python3
"""Golden event logs: the sha256 of every emulated scenario's ``events.jsonl``, recorded at
a named commit, so that a refactor can prove the emulator still does exactly the same.

    python tools/golden_logs.py record [--at REF] [--keep [DIR]] [--logs-only]
    python tools/golden_logs.py check  [--keep [DIR]] [--logs DIR]

``record`` runs every scenario file under ``scenarios/`` and ``examples/`` (sub-folders
included) with ``geomx run --runtime emu`` and writes ``tests/golden/event_logs.json``:
the commit, the Python/numpy/numba/machine it ran on, and per scenario its overrides,
event count and hash. ``--at REF`` runs REF's scenarios with REF's geomx from a temporary
``git worktree`` instead of the working tree, so a refactor's base can be recorded on the
machine that checks the refactor. ``check`` runs the working tree and compares;
``tests/test_golden_event_logs.py`` does the same in the test suite, through ``hashes``
(every scenario in one child process). Every run computes as :data:`REFERENCE_CPU`, so
a log does not depend on which instructions the machine offers.

The logs themselves stay out of git (about 120 MB). ``--keep`` keeps them, by default in
``runs/golden-logs/<commit>/``, where ``check`` and the test look for the recorded ones to
show the first line that differs. docs/golden-logs.md says when to re-record.

This is a developer script, not part of the geomx package: it imports the standard library
(numpy and numba only to name their versions), and geomx only in the child processes it
starts.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GOLDEN_FILE = ROOT / "tests" / "golden" / "event_logs.json"
#: folders (relative to the repository root) whose ``*.toml`` files, at any depth, are
#: scenarios the golden file must account for
SCENARIO_DIRS = ("scenarios", "examples")
#: where ``--keep`` puts a recording's logs by default, one folder per commit
KEEP_ROOT = ROOT / "runs" / "golden-logs"
THIS_SCRIPT = "tools/golden_logs.py"

#: Overrides that shrink a scenario too long for the test suite's budget (about 120 s of
#: CPU for all scenarios together), with why each is enough. The CPU seconds are those of
#: the whole scenario under ``geomx run`` on a 2-core machine. The same overrides are
#: stored in the golden file and applied by record, check and the test alike.
SHRINK: dict[str, tuple[tuple[str, ...], str]] = {
    "scenarios/dgt_incast.toml": (
        ("run.iterations=10",),
        "reaches its target after 31 iterations (11 s of CPU); 10 still evaluate twice"),
    "scenarios/netstorm_9dc.toml": (
        ("run.iterations=4",),
        "14 s of CPU for 10 iterations; 4 re-plan NETSTORM's routes 3 times"),
    "scenarios/netstorm_9dc_dynamic.toml": (
        ("run.iterations=12",),
        "47 s of CPU for 40 iterations; the links are redrawn at 180 s, during iteration "
        "11, so 12 iterations re-plan on the redrawn links"),
    "scenarios/quickstart_bsc.toml": (
        ("run.iterations=30",),
        "reaches its target after 221 iterations (36 s of CPU); 30 evaluate 3 times"),
    "scenarios/resnet50_phantom.toml": (
        ("run.iterations=5",),
        "with its events on, 20 iterations log 100 MB (16 s of CPU); 5 log a quarter"),
    "scenarios/scale_1024.toml": (
        ("run.iterations=2", 'training.phantom_preset=""',
         "training.phantom_layers=[6400000,6400000,6400000,6400000]"),
        "with its events on, one iteration of ResNet-50's 161 tensors logs a million "
        "transfers (224 MB, 35 s of CPU); 4 tensors of the same total size keep the 1,024 "
        "workers and their WAN shape at 53,000 events for 2 iterations"),
    **{f"examples/{name}.toml": (("run.iterations=20",),
                                 f"120 iterations take {cpu_s} s of CPU; 20 evaluate twice")
       for name, cpu_s in (("cnn", 5), ("cnn_bsc", 20), ("cnn_fp16", 20), ("cnn_hfa", 6),
                           ("cnn_mpq", 26))},
}

#: Overrides of every golden run: the Chrome trace and the plots are drawn from the finished
#: events.jsonl (and matplotlib costs seconds a run), so they add nothing to compare.
EVERY_RUN = ("metrics.plot=false", "metrics.trace=false")

#: The override that turns on the events of a scenario whose file turns them off (a bench
#: that measures time only): without it there is no log to compare.
EVENTS_ON = "metrics.events=true"

#: Scenario files that cannot run under the ``test`` extra, with the reason. A file that
#: is not a scenario at all (a fidelity suite) is recognised by its contents instead.
NOT_RUNNABLE: dict[str, str] = {
    "examples/cnn_torch.toml": "its program imports torch, which only the optional 'torch' "
                               "extra installs (the test extra leaves it out)",
    "examples/resnet_torch.toml": "its losses and accuracies come from torch's CPU kernels, "
                                  "whose float rounding differs between CPUs and torch "
                                  "builds: its log could not be byte-identical everywhere",
}

#: Environment variables that ``geomx run`` turns into scenario overrides or that switch
#: kernels (GeoMX's switches, ``GEOMX_*``, ``DMLC_*``, ps-lite's ``PS_*``): cleared for every
#: run so that a developer's shell cannot change a golden log.
SCRUBBED_PREFIXES = ("GEOMX_", "DMLC_", "MXNET_", "PS_")
SCRUBBED_NAMES = ("ENABLE_INTER_TS", "ENABLE_INTRA_TS", "MAX_GREED_RATE_TS")


# --------------------------------------------------------------------------------------
# what there is to run, and the golden file


def scenario_files(root: Path = ROOT) -> list[str]:
    """Every ``*.toml`` under :data:`SCENARIO_DIRS` of ``root``, as sorted posix paths
    relative to ``root``."""
    found: list[str] = []
    for folder in SCENARIO_DIRS:
        found += [p.relative_to(root).as_posix() for p in (root / folder).rglob("*.toml")]
    return sorted(found)


def _read_toml(root: Path, path: str) -> dict[str, Any]:
    with open(root / path, "rb") as fh:
        return tomllib.load(fh)


def why_not_run(root: Path, path: str) -> str | None:
    """Why the file ``path`` (relative to ``root``) gets no golden log, or None if it is a
    scenario to run."""
    if path in NOT_RUNNABLE:
        return NOT_RUNNABLE[path]
    raw = _read_toml(root, path)
    if "case" in raw and "run" not in raw:
        return ("a fidelity suite, not a scenario: its [[case]]s run the scenario files it "
                "names, which have golden logs of their own")
    return None


def overrides_for(root: Path, path: str) -> tuple[list[str], str]:
    """The overrides a golden run of scenario ``path`` applies, and why (empty: none)."""
    overrides = list(EVERY_RUN)
    reasons: list[str] = []
    if _read_toml(root, path).get("metrics", {}).get("events", True) is False:
        overrides.append(EVENTS_ON)
        reasons.append("the file turns its events off")
    shrink, why = SHRINK.get(path, ((), ""))
    overrides += shrink
    reasons += [why] if why else []
    return overrides, "; ".join(reasons)


def plan(root: Path = ROOT) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """What a recording at ``root`` runs: ``[{path, overrides, why}]`` and the files it
    leaves out, ``[{path, reason}]``."""
    runs: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    for path in scenario_files(root):
        reason = why_not_run(root, path)
        if reason is None:
            overrides, why = overrides_for(root, path)
            runs.append({"path": path, "overrides": overrides, "why": why})
        else:
            skipped.append({"path": path, "reason": reason})
    return runs, skipped


def load_golden(path: Path = GOLDEN_FILE) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def runtime_versions() -> dict[str, str]:
    """The Python, numpy and numba of this interpreter and the machine: what an event log
    can depend on besides the code (floating-point kernels, numba's code generation)."""
    import numba
    import numpy

    return {"python": platform.python_version(), "numpy": numpy.__version__,
            "numba": numba.__version__, "machine": platform.machine(),
            "system": platform.system()}


def scrubbed_environ(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) without the variables of :data:`SCRUBBED_PREFIXES`
    and :data:`SCRUBBED_NAMES`."""
    env = dict(os.environ if env is None else env)
    return {k: v for k, v in env.items()
            if not k.startswith(SCRUBBED_PREFIXES) and k not in SCRUBBED_NAMES}


def scrubbed_names(env: Mapping[str, str] | None = None) -> list[str]:
    """The names :func:`scrubbed_environ` would drop from ``env``."""
    env = os.environ if env is None else env
    return [k for k in env if k.startswith(SCRUBBED_PREFIXES) or k in SCRUBBED_NAMES]


# --------------------------------------------------------------------------------------
# comparing logs


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def count_lines(path: Path) -> int:
    with open(path, "rb") as fh:
        return sum(1 for _ in fh)


def _clip(line: bytes, limit: int = 400) -> str:
    text = line.decode("utf-8", "replace").rstrip("\n")
    return text if len(text) <= limit else text[:limit] + f" ... ({len(text)} chars)"


def first_difference(recorded: Path, current: Path) -> str | None:
    """The first line where two event logs differ, as indented text; None if they are the
    same."""
    with open(recorded, "rb") as a, open(current, "rb") as b:
        for number, (la, lb) in enumerate(zip_longest(a, b), 1):
            if la != lb:
                return (f"first difference at line {number}:\n"
                        f"    recorded: {_clip(la) if la is not None else '(log ended)'}\n"
                        f"    current:  {_clip(lb) if lb is not None else '(log ended)'}")
    return None


def keep_dir(commit_sha: str) -> Path:
    """Where ``--keep`` without a folder puts the logs recorded at ``commit_sha``."""
    return KEEP_ROOT / commit_sha[:12]


def kept_log(logs_dir: Path, path: str) -> Path:
    """The kept ``events.jsonl`` of scenario ``path`` in a ``--keep`` folder."""
    return logs_dir / Path(path).with_suffix("") / "events.jsonl"


def rerecord_advice(golden: Mapping[str, Any]) -> str:
    """How to bring the golden file up to date, for a failure message."""
    sha = golden["commit"]["sha"]
    return (f"If the events were meant to change, record them at the new code: "
            f"python {THIS_SCRIPT} record\n"
            f"If the code was not meant to change them but this machine (Python, numpy, numba) "
            f"differs from the one that recorded them, record the recorded commit here, then "
            f"check again: python {THIS_SCRIPT} record --at {sha}")


def difference_report(path: str, recorded_sha: str, current_sha: str, current_log: Path | None,
                      golden: Mapping[str, Any], logs_dir: Path | None = None) -> str:
    """What a failed comparison says: the scenario, both hashes, the first differing line
    where the recorded log is at hand, and how to re-record."""
    commit = golden["commit"]
    logs_dir = logs_dir or keep_dir(commit["sha"])
    subject = commit.get("subject", "")
    subject = subject if len(subject) <= 72 else subject[:69] + "..."
    lines = [f"{path}: events.jsonl differs from its golden log",
             f"  recorded sha256 {recorded_sha} (commit {commit['sha'][:12]} {subject!r})",
             f"  current  sha256 {current_sha}"]
    recorded_log = kept_log(logs_dir, path)
    if current_log is not None and recorded_log.is_file():
        diff = first_difference(recorded_log, current_log)
        lines.append("  " + (diff or "the kept log has the current hash, not the recorded one: "
                             f"{recorded_log} is stale"))
    else:
        lines.append(f"  the recorded log is not kept here ({recorded_log}); to see the first "
                     f"differing line, run the recorded commit's scenarios into that folder, "
                     f"then this again: python {THIS_SCRIPT} record --at {commit['sha']} "
                     "--logs-only")
    now = runtime_versions()
    then = golden.get("recorded_with", {})
    changed = [f"{k} {then.get(k)} -> {now[k]}" for k in now if then.get(k) != now[k]]
    if changed:
        lines.append("  this machine differs from the recording one: " + ", ".join(changed))
    lines.append(rerecord_advice(golden))
    return "\n".join(lines)


# --------------------------------------------------------------------------------------
# running scenarios


@dataclass
class Run:
    """One scenario run: its log and what it cost."""

    path: str
    overrides: list[str]
    events_log: Path | None
    cpu_s: float
    wall_s: float
    error: str | None = None


def run_scenario_file(tree: Path, path: str, overrides: Sequence[str], out_dir: Path,
                      env: Mapping[str, str]) -> Run:
    """``geomx run`` of ``tree/path`` on the emulator, in a child process whose geomx is
    whatever ``env`` imports; the run folder goes under ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "geomx", "run", str(tree / path), "--runtime", "emu",
           "--quiet", "--out", str(out_dir)]
    for o in overrides:
        cmd += ["--set", o]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=tree, env=dict(env), capture_output=True, text=True)
    wall_s = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    logs = sorted(out_dir.glob("*/events.jsonl"))
    if proc.returncode != 0 or len(logs) != 1:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-15:]
        why = (f"exit status {proc.returncode}" if proc.returncode != 0
               else f"{len(logs)} events.jsonl files under {out_dir}, expected 1")
        return Run(path, list(overrides), None, cpu_s, wall_s,
                   error=why + "\n" + "\n".join("    " + t for t in tail))
    return Run(path, list(overrides), logs[0], cpu_s, wall_s)


def _git(*args: str, cwd: Path = ROOT, strip: bool = True) -> str:
    out = subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                         text=True).stdout
    return out.strip() if strip else out


def commit_info(ref: str, cwd: Path = ROOT) -> dict[str, Any]:
    try:
        sha = _git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", cwd=cwd)
    except subprocess.CalledProcessError:
        raise SystemExit(f"golden_logs: {ref!r} names no commit here") from None
    return {"sha": sha,
            "describe": _git("describe", "--always", "--tags", sha, cwd=cwd),
            "subject": _git("log", "-1", "--format=%s", sha, cwd=cwd)}


def uncommitted(cwd: Path = ROOT) -> list[str]:
    """Changed or new files in what a run imports or reads (geomx/ and the scenarios)."""
    # porcelain lines are "XY path": the status columns may be blank, so never strip them
    out = _git("status", "--porcelain", "--", "geomx", *SCENARIO_DIRS, cwd=cwd, strip=False)
    return [line[3:] for line in out.splitlines() if line.strip()]


@contextmanager
def worktree_at(sha: str) -> Iterator[Path]:
    """A temporary detached ``git worktree`` at ``sha``, removed on the way out whatever
    happens (an error, Ctrl-C, or SIGTERM, which :func:`main` turns into a Ctrl-C)."""
    parent = Path(tempfile.mkdtemp(prefix="geomx-golden-"))
    tree = parent / "tree"
    try:
        _git("worktree", "add", "--detach", str(tree), sha)
        yield tree
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT,
                       capture_output=True)
        shutil.rmtree(parent, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], cwd=ROOT, capture_output=True)


#: The CPU every golden run computes as, whatever the machine: numpy's AVX-512 loops,
#: OpenBLAS's kernel choice and Numba's code generation all pick instructions by the CPU
#: they find, and float results differ in the last bits between those choices (an AVX-512
#: EPYC and an AVX2 Xeon gave different logs for 23 of 35 scenarios). Pinned to the x86-64
#: v3 level (AVX2, Haswell), which every machine that runs the suite has, the logs are the
#: same everywhere. Only the golden runs use it: a user's run takes the fastest kernels.
REFERENCE_CPU = {"NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",
                 "OPENBLAS_CORETYPE": "Haswell", "NUMBA_CPU_NAME": "haswell"}


def env_for(tree: Path) -> dict[str, str]:
    """A scrubbed environment with :data:`REFERENCE_CPU` whose ``import geomx`` finds
    ``tree``'s package first."""
    env = scrubbed_environ()
    env.update(REFERENCE_CPU)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [env.get("PYTHONPATH")])])
    return env


def cmd_hashes(args: argparse.Namespace) -> int:
    """Run the golden file's scenarios in this process through the public run API (as a
    user's script would) and print one JSON line per scenario: path, sha256, log. The
    test suite starts this with :func:`env_for`, so the runs compute as
    :data:`REFERENCE_CPU` whatever the machine."""
    missing = [k for k, v in REFERENCE_CPU.items() if os.environ.get(k) != v]
    if missing:
        raise SystemExit(f"golden_logs hashes: run with the reference CPU environment "
                         f"(missing {', '.join(missing)}); the test suite does")
    from geomx.experiment import run_scenario
    from geomx.scenario import load_scenario

    out = Path(args.out).resolve()
    wanted = set(args.only or ())
    for i, entry in enumerate(load_golden()["scenarios"]):
        if wanted and entry["path"] not in wanted:
            continue
        row: dict[str, Any] = {"path": entry["path"]}
        try:
            scenario = load_scenario(ROOT / entry["path"], entry["overrides"])
            result = run_scenario(scenario, runtime="emu", out_dir=out / str(i), progress=False)
            log = result.run_dir / "events.jsonl"
            row.update(sha256=sha256_of(log) if log.is_file() else None, log=str(log))
        except Exception as e:  # reported by the test for this scenario, not for all
            row.update(sha256=None, error=f"{type(e).__name__}: {e}")
        print(json.dumps(row), flush=True)
    return 0


def check_imports_from(tree: Path, env: Mapping[str, str]) -> None:
    """Fail unless a child with ``env`` imports geomx from ``tree`` (an installed copy that
    shadowed it would record the wrong code)."""
    where = subprocess.run([sys.executable, "-c", "import geomx; print(geomx.__file__)"],
                           cwd=tree, env=dict(env), check=True, capture_output=True,
                           text=True).stdout.strip()
    if not Path(where).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"golden_logs: geomx imports from {where}, not from {tree}")


def run_all(tree: Path, entries: Sequence[Mapping[str, Any]], out_root: Path,
            keep: Path | None) -> list[Run]:
    """Run every entry of ``entries`` from ``tree``, printing one line each; with ``keep``,
    each run folder is moved to ``keep/<scenario path without .toml>/``."""
    env = env_for(tree)
    check_imports_from(tree, env)
    dropped = scrubbed_names()
    if dropped:
        print(f"not passed to the runs: {', '.join(sorted(dropped))}")
    runs = []
    for i, entry in enumerate(entries):
        print(f"[{i + 1}/{len(entries)}] {entry['path']} "
              f"{' '.join('--set ' + o for o in entry['overrides'])}".rstrip(), flush=True)
        run = run_scenario_file(tree, entry["path"], entry["overrides"], out_root / str(i), env)
        if run.error is None and keep is not None:
            dest = kept_log(keep, entry["path"]).parent
            shutil.rmtree(dest, ignore_errors=True)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(run.events_log.parent), dest)
            run.events_log = dest / "events.jsonl"
        runs.append(run)
    return runs


def _timing_table(runs: Sequence[Run]) -> str:
    rows = [f"{'scenario':<40} {'cpu s':>7} {'wall s':>7}"]
    rows += [f"{r.path:<40} {r.cpu_s:7.1f} {r.wall_s:7.1f}" for r in runs]
    rows.append(f"{'total':<40} {sum(r.cpu_s for r in runs):7.1f} "
                f"{sum(r.wall_s for r in runs):7.1f}")
    return "\n".join(rows)


# --------------------------------------------------------------------------------------
# commands


def cmd_record(args: argparse.Namespace) -> int:
    if args.at is not None:
        commit = commit_info(args.at)
        dirty: list[str] = []
    else:
        commit = commit_info("HEAD")
        dirty = uncommitted()
        if dirty:
            print(f"warning: recording the working tree, which differs from {commit['sha'][:12]}"
                  f" in: {', '.join(dirty)}")
    keep = _keep_arg("" if args.logs_only and args.keep is None else args.keep, commit["sha"])
    with tempfile.TemporaryDirectory(prefix="geomx-golden-runs-") as out, \
            (worktree_at(commit["sha"]) if args.at is not None else _here()) as tree:
        entries, skipped = plan(tree)
        runs = run_all(tree, entries, Path(out), keep)
        # read while the logs exist: without --keep they live in the temporary folder
        measured = [(count_lines(r.events_log), sha256_of(r.events_log)) if not r.error
                    else (0, "") for r in runs]
    failed = [r for r in runs if r.error]
    for r in failed:
        print(f"FAILED {r.path}: {r.error}")
    if failed:
        print("nothing written (a scenario that cannot run under the test extra goes in "
              f"NOT_RUNNABLE in {THIS_SCRIPT}, with the reason)")
        return 1
    if args.logs_only:
        print(_timing_table(runs))
        print(f"logs of {commit['sha'][:12]} ({commit['describe']}) kept in {keep}; "
              f"{GOLDEN_FILE.relative_to(ROOT)} left as it was")
        return 0
    golden = {
        "about": "sha256 of each emulated scenario's events.jsonl at one commit; written by "
                 f"`python {THIS_SCRIPT} record`, checked by tests/test_golden_event_logs.py "
                 f"and `python {THIS_SCRIPT} check` (docs/golden-logs.md)",
        "commit": commit | ({"uncommitted_changes": dirty} if dirty else {}),
        "recorded_with": runtime_versions(),
        "scenarios": [{"path": r.path, "overrides": r.overrides,
                       **({"why_overrides": e["why"]} if e["why"] else {}),
                       "events": events, "sha256": sha256}
                      for e, r, (events, sha256) in zip(entries, runs, measured)],
        "not_run": skipped,
    }
    GOLDEN_FILE.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN_FILE.write_text(json.dumps(golden, indent=2) + "\n", encoding="utf-8")
    print(_timing_table(runs))
    print(f"wrote {GOLDEN_FILE.relative_to(ROOT)}: {len(runs)} scenarios at "
          f"{commit['sha'][:12]} ({commit['describe']}), {len(skipped)} files not run"
          + (f"; logs kept in {keep}" if keep else ""))
    return 0


@contextmanager
def _here() -> Iterator[Path]:
    yield ROOT


def _keep_arg(value: str | None, sha: str) -> Path | None:
    if value is None:
        return None
    return keep_dir(sha) if value == "" else Path(value).resolve()


def cmd_check(args: argparse.Namespace) -> int:
    golden = load_golden()
    entries = golden["scenarios"]
    keep = _keep_arg(args.keep, "working-tree")
    logs_dir = Path(args.logs).resolve() if args.logs else keep_dir(golden["commit"]["sha"])
    with tempfile.TemporaryDirectory(prefix="geomx-golden-runs-") as out:
        runs = run_all(ROOT, entries, Path(out), keep)
        reports: list[str] = []
        rows = [f"{'scenario':<40} {'recorded':<16} {'current':<16} {'result':<9} "
                f"{'cpu s':>6} {'wall s':>6}"]
        for entry, run in zip(entries, runs):
            current = "(failed)" if run.error else sha256_of(run.events_log)
            same = current == entry["sha256"]
            rows.append(f"{entry['path']:<40} {entry['sha256'][:16]:<16} {current[:16]:<16} "
                        f"{'OK' if same else 'DIFFERENT':<9} {run.cpu_s:6.1f} {run.wall_s:6.1f}")
            if run.error:
                reports.append(f"{entry['path']}: the run failed: {run.error}")
            elif not same:
                reports.append(difference_report(entry["path"], entry["sha256"], current,
                                                  run.events_log, golden, logs_dir))
    rows.append(f"{'total':<84} {sum(r.cpu_s for r in runs):6.1f} "
                f"{sum(r.wall_s for r in runs):6.1f}")
    print("\n".join(rows))
    for text in reports:
        print("\n" + text)
    problems = len(reports) + _report_plan_changes(golden)
    print(f"\n{len(entries) - len(reports)} of {len(entries)} event logs as recorded at "
          f"{golden['commit']['sha'][:12]}" + (f"; problems: {problems}" if problems else ""))
    return 1 if problems else 0


def _report_plan_changes(golden: Mapping[str, Any]) -> int:
    """Print where the golden file no longer matches what ``record`` would run now (a new
    scenario file, one gone, other overrides); return how many such places there are."""
    planned, skipped = plan(ROOT)
    now = {e["path"]: e["overrides"] for e in planned}
    then = {e["path"]: e["overrides"] for e in golden["scenarios"]}
    notes = [f"no golden log for {p}" for p in sorted(set(now) - set(then))]
    notes += [f"a golden log for {p}, which record would not run now" for p in
              sorted(set(then) - set(now))]
    notes += [f"{p}: recorded with {then[p]}, record would apply {now[p]}" for p in
              sorted(set(now) & set(then)) if now[p] != then[p]]
    recorded_skips = {e["path"] for e in golden.get("not_run", [])}
    notes += [f"{p} is not run now, and the golden file does not say so" for p in
              sorted({e["path"] for e in skipped} - recorded_skips)]
    if notes:
        print("\nthe golden file is out of date with the scenario files or this script:\n  "
              + "\n  ".join(notes) + f"\nre-record: python {THIS_SCRIPT} record (for other "
              f"overrides alone, at the recorded commit: --at {golden['commit']['sha']})")
    return len(notes)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=THIS_SCRIPT, description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    keep_help = (f"keep the run folders (events.jsonl) in DIR, one sub-folder per scenario "
                 f"(default DIR: {KEEP_ROOT.relative_to(ROOT)}/<commit>)")
    rec = sub.add_parser("record", help=f"run every scenario and write "
                                        f"{GOLDEN_FILE.relative_to(ROOT)}")
    rec.add_argument("--at", metavar="REF", default=None,
                     help="record commit REF (its geomx and scenarios, from a temporary git "
                          "worktree) instead of the working tree")
    rec.add_argument("--keep", metavar="DIR", nargs="?", const="", default=None, help=keep_help)
    rec.add_argument("--logs-only", action="store_true",
                     help="only run and keep the logs (--keep's folder), leaving the golden "
                          "file as it is: the recorded logs that check and the test compare "
                          "line by line")
    rec.set_defaults(handler=cmd_record)
    chk = sub.add_parser("check", help="run the working tree's code on the recorded scenarios "
                                       "and compare; exit status 1 on any difference")
    chk.add_argument("--keep", metavar="DIR", nargs="?", const="", default=None,
                     help=keep_help.replace("<commit>", "working-tree"))
    chk.add_argument("--logs", metavar="DIR", default=None,
                     help="the recorded logs, as `record --keep DIR` left them, to show the "
                          "first differing line (default: the default --keep folder of the "
                          "recorded commit)")
    chk.set_defaults(handler=cmd_check)
    hsh = sub.add_parser("hashes", help="(for the test suite) run the recorded scenarios in "
                                         "this process, print their hashes as JSON lines")
    hsh.add_argument("--out", required=True, help="folder for the run folders")
    hsh.add_argument("--only", nargs="*", help="these scenario paths only")
    hsh.set_defaults(handler=cmd_hashes)
    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the temporary worktree and run folders go either way
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
