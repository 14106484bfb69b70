#!/usr/bin/env python3
"""Feature pairs: common settings applied two at a time to the quickstart, each pair run
in the emulator and judged from its event log.

    python tools/feature_pairs.py [--only NAME,...] [--jobs N] [--json PATH]

Every setting of :data:`SETTINGS` is a list of ``--set`` overrides (geomx/scenario/
overrides.py) on ``scenarios/quickstart.toml``, shortened by :data:`BASE` to a run of
about half a second of CPU. Each pair of settings that change different keys is loaded
with ``load_scenario`` and run with ``run_scenario`` (the public run API, as
tests/test_golden_event_logs.py does) in a child process of its own, and ends as one of:

* ``refused``: loading raised ``ScenarioError``; its one-line reason is kept;
* ``error``: the job raised (a deadlock the emulator found, a node's failure) or ran past
  :data:`TIMEOUT_S`;
* ``inactive``: it ran, but the event log shows no sign of one of the two settings
  (each setting's ``active`` check says what it looks for);
* ``untrained``: both were active, but the final test accuracy is below
  :data:`MIN_ACCURACY`;
* ``not_resumed``: a combination with checkpoints, stopped part way and resumed with
  ``resume_scenario`` (what ``geomx run --resume`` does), did not end as its uninterrupted
  run did (see :func:`check_resume`);
* ``ok``: both active and trained (and, with checkpoints, resumed).

Each setting alone is run first, so a pair's failure can be told from its settings'. Every
run is a child forked from this process, which never runs one itself: a codec's parallel
kernels leave an OpenMP pool behind that a forked child aborts on (geomx/runtime/forked.py).
docs/scenario.md lists what each setting means; tests/test_feature_pairs.py holds the
set of pairs that are still refused.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "scenarios" / "quickstart.toml"
PROGRAM = ROOT / "tools" / "pair_program.py"

#: Overrides of every run: 30 iterations evaluated every 10 (the quickstart reaches 0.92
#: in 30), no stop at a target, nothing drawn.
BASE = ("run.iterations=30", "run.eval_every=10", "run.target_accuracy=0",
        "run.progress=false", "metrics.plot=false", "metrics.trace=false")

#: The digits test set has ten near-balanced classes, so a model that did not learn scores
#: about 0.10 (HFA with examples/cnn.py ended at 0.097); every setting alone reaches 0.83
#: or more in 30 iterations. 0.5 is far from both: a pair below it did not train.
MIN_ACCURACY = 0.5

#: Wall seconds a pair may run before it counts as hung (a pair takes 1-3 s on 2 cores).
TIMEOUT_S = 120.0

Events = list[dict[str, Any]]


# --------------------------------------------------------------------------------------
# what each setting leaves in the event log


def _any(kind: str) -> Callable[[Events], bool]:
    def check(events: Events) -> bool:
        return any(e.get("ev") == kind for e in events)
    check.__doc__ = f"an {kind!r} event"
    return check


def _pushes(events: Events) -> Events:
    return [e for e in events if e.get("ev") == "xfer" and e.get("msg") == "PUSH"]


def _mixed_active(events: Events) -> bool:
    """The global servers applied more versions than one per key and round: each DC's
    push is a global step of its own (docs/geomx-behaviour.md §3.3)."""
    keys: dict[str, set] = {}
    for e in events:
        if e.get("ev") == "init" and str(e.get("node", "")).startswith("gs:"):
            keys.setdefault(e["node"], set()).add((e.get("key"), e.get("part")))
    versions = sum(int(e.get("versions", 0)) for e in events
                   if e.get("ev") == "server_done" and str(e.get("node", "")).startswith("gs:"))
    rounds = max((int(e.get("iterations", 0)) for e in events if e.get("ev") == "worker_done"),
                 default=0)
    return versions > sum(len(k) for k in keys.values()) * rounds


def _codec_active(events: Events) -> bool:
    """Some push carried fewer than 3/4 of its key's dense bytes (those of its INIT)."""
    dense: dict[tuple, int] = {}
    for e in events:
        if e.get("ev") == "xfer" and e.get("msg") == "INIT":
            k = (e.get("key"), e.get("part"))
            dense[k] = max(dense.get(k, 0), int(e.get("bytes", 0)))
    return any(int(e.get("bytes", 0)) < 0.75 * dense.get((e.get("key"), e.get("part")), 0)
               for e in _pushes(events))


def _program_active(events: Events) -> bool:
    """Workers finished, and no built-in master published the model (``master_ready``
    is the built-in trainer's)."""
    return (any(e.get("ev") == "worker_done" for e in events)
            and not any(e.get("ev") == "master_ready" for e in events))


def _two_global_servers(events: Events) -> bool:
    """Pushes reached both gs:0 and gs:1."""
    return {e.get("dst") for e in _pushes(events)} >= {"gs:0", "gs:1"}


def _flat_active(events: Events) -> bool:
    """Workers pushed to global servers directly, and no local server took part."""
    pushes = _pushes(events)
    return (any(str(e.get("src", "")).startswith("w:") and str(e.get("dst", "")).startswith("gs:")
                for e in pushes)
            and not any(str(e.get("node", "")).startswith("ls:") for e in events))


def _worker_loss_active(events: Events) -> bool:
    """A worker was declared lost, and the others still finished."""
    return _any("worker_lost")(events) and sum(e.get("ev") == "worker_done" for e in events) >= 3


@dataclass(frozen=True)
class Setting:
    """One feature as overrides, the key they own, and how its event log shows it ran."""

    name: str
    overrides: tuple[str, ...]
    #: settings with the same group set the same key and are not paired
    group: str
    active: Callable[[Events], bool]
    what: str


_LOSS = ("membership.in_emulator=true", "membership.heartbeat_timeout=3s", "fault.0.at=0.5s")

SETTINGS: tuple[Setting, ...] = (
    Setting("mixed", ("sync.algorithm=mixed",), "sync", _mixed_active, "MixedSync"),
    # local steps need a faster optimizer than SGD at lr 0.005 to learn in 30 iterations;
    # k1 = k2 = 2 makes 7 global syncs in 30 iterations (checkpoints every 5 fit in)
    Setting("hfa", ("sync.algorithm=hfa", "sync.k1=2", "sync.k2=2",
                    "training.worker_optimizer=adam"), "sync", _any("global_sync"), "HFA"),
    Setting("esync", ("sync.algorithm=esync", "training.worker_optimizer=adam"), "sync",
            _any("esync_round"), "ESync"),
    # the quickstart's tensors are small: compress every one of them
    Setting("bsc", ("codec.type=bsc", "codec.size_lower_bound=1000"), "codec", _codec_active,
            "Bi-Sparse compression"),
    Setting("fp16", ("codec.type=fp16", "codec.size_lower_bound=1000"), "codec", _codec_active,
            "half precision"),
    Setting("mpq", ("codec.type=mpq", "codec.size_lower_bound=1000"), "codec", _codec_active,
            "mixed-precision quantisation"),
    Setting("p3", ("sched.p3=true", "sched.p3_slice_elements=1000"), "p3", _any("p3_slice"),
            "P3 slices"),
    Setting("dgt", ('sched.dgt="udp"',), "dgt", _any("dgt_push"), "DGT over UDP"),
    Setting("tsengine", ("sched.tsengine_inter=true",), "tsengine", _any("ts_xfer"),
            "TSEngine across DCs"),
    Setting("layer", ('training.layer_compute="flops"',), "layer", _any("forward"),
            "per-layer compute"),
    Setting("checkpoint", ("checkpoint.every=5",), "checkpoint", _any("checkpoint"),
            "checkpoint every 5 rounds"),
    Setting("worker_loss", ("membership.on_worker_loss=continue", *_LOSS,
                            "fault.0.node=w:party-a:1"), "fault", _worker_loss_active,
            "a worker crashes, its DC continues"),
    Setting("server_loss", ("membership.on_server_loss=wait", *_LOSS, "fault.0.node=ls:party-a",
                            "fault.0.duration=1s"), "fault", _any("server_takeover"),
            "a local server crashes and is taken over"),
    Setting("program", (f"training.program={PROGRAM}",), "program", _program_active,
            "a training program (tools/pair_program.py)"),
    Setting("two_gs", ("dc.central.global_servers=2",), "gs", _two_global_servers,
            "two global servers"),
    Setting("flat", ("topology.kind=flat",), "topology", _flat_active, "flat PS"),
)

BY_NAME = {s.name: s for s in SETTINGS}


def pairs_of(settings: Sequence[Setting]) -> list[tuple[Setting, Setting]]:
    """Every pair of ``settings`` that change different keys, in table order."""
    return [(a, b) for a, b in itertools.combinations(settings, 2) if a.group != b.group]


# --------------------------------------------------------------------------------------
# running one combination


@dataclass
class Outcome:
    """How one combination of settings ended."""

    settings: list[str]
    status: str                      # refused | error | inactive | untrained | ok
    reason: str = ""
    accuracy: float | None = None
    inactive: list[str] = field(default_factory=list)
    cpu_s: float = 0.0
    #: with checkpoints: ``bit-exact`` (the resumed run's model is the uninterrupted
    #: run's, bit for bit) or ``trained`` (a fault pair: see :func:`check_resume`)
    resumed: str = ""

    @property
    def name(self) -> str:
        return " + ".join(self.settings)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


#: Settings whose fault a resumed job does not replay: ``resume_scenario`` drops the
#: crashes that happened before the checkpoint and restarts every process, so a worker
#: lost before it comes back. Such a pair is held to resuming and training, not to the
#: uninterrupted run's bits.
FAULT_GROUP = "fault"


#: Where the first half of a resumed pair stops: a checkpoint round for every setting
#: (every 5 rounds; HFA's k1 = k2 = 2 makes iteration 20 its fifth global sync).
RESUME_STOP_ITERATION = 20


def _model_state(into: dict[str, list[Any]]) -> Callable[[list[Any]], None]:
    """``inspect`` hook: every global server's arrays and every worker's parameters."""
    import numpy as np

    def grab(nodes: list[Any]) -> None:
        for n in nodes:
            if n.name.startswith("gs:"):
                into[n.name] = [np.array(sl.store) for _, sl in sorted(n.slots.items())]
            elif n.name.startswith("w:") and getattr(n, "params", None) is not None:
                into[n.name] = [np.array(p) for p in n.params]
    return grab


def _same_bits(a: dict[str, list[Any]], b: dict[str, list[Any]]) -> bool:
    import numpy as np

    return a.keys() == b.keys() and bool(a) and all(
        len(a[n]) == len(b[n]) and all(np.array_equal(x, y) for x, y in zip(a[n], b[n]))
        for n in a)


def check_resume(settings: Sequence[Setting], out_dir: str | os.PathLike[str],
                 uninterrupted: dict[str, list[Any]]) -> tuple[str, str]:
    """Stop ``settings`` at :data:`RESUME_STOP_ITERATION`, resume it from its last checkpoint to
    the end, and compare: ``("bit-exact" | "trained", "")`` or ``("", why not)``."""
    from geomx.experiment import resume_scenario, run_scenario
    from geomx.scenario import load_scenario

    end = int(next(o for o in BASE if o.startswith("run.iterations=")).split("=")[1])
    overrides = [*BASE, *(o for s in settings for o in s.overrides),
                 f"run.iterations={RESUME_STOP_ITERATION}"]
    first = run_scenario(load_scenario(QUICKSTART, overrides), runtime="emu",
                         out_dir=out_dir, progress=False)
    resumed: dict[str, list[Any]] = {}
    second = run_scenario(resume_scenario(first.run_dir, [f"run.iterations={end}"]),
                          runtime="emu", out_dir=out_dir, progress=False,
                          inspect=_model_state(resumed))
    for d in (first.run_dir, second.run_dir):
        shutil.rmtree(d, ignore_errors=True)
    accuracy = second.summary.final_accuracy
    if second.summary.iterations != end:
        return "", f"resumed run ended at iteration {second.summary.iterations}, not {end}"
    if any(s.group == FAULT_GROUP for s in settings):
        if accuracy is None or accuracy < MIN_ACCURACY:
            return "", f"resumed run's final accuracy {accuracy} < {MIN_ACCURACY}"
        return "trained", ""
    if not _same_bits(uninterrupted, resumed):
        return "", "stopped and resumed, the model differs from the uninterrupted run's"
    return "bit-exact", ""


def run_combination(settings: Sequence[Setting], out_dir: str | os.PathLike[str]) -> Outcome:
    """Load and run the quickstart with ``settings`` in this process; judge the log."""
    from geomx.experiment import run_scenario
    from geomx.metrics import load_run
    from geomx.scenario import ScenarioError, load_scenario

    names = [s.name for s in settings]
    overrides = [*BASE, *(o for s in settings for o in s.overrides)]
    cpu0 = time.process_time()
    try:
        scenario = load_scenario(QUICKSTART, overrides)
    except ScenarioError as exc:
        return Outcome(names, "refused", str(exc).strip().splitlines()[0])
    run_dir = None
    final: dict[str, list[Any]] = {}
    try:
        result = run_scenario(scenario, runtime="emu", out_dir=out_dir, progress=False,
                              inspect=_model_state(final))
        run_dir = result.run_dir
        events = list(load_run(run_dir).events())
        accuracy = result.summary.final_accuracy
    except Exception as exc:  # the job's failure is what is measured here
        return Outcome(names, "error", _one_line(exc), cpu_s=time.process_time() - cpu0)
    finally:
        if run_dir is not None:
            shutil.rmtree(run_dir, ignore_errors=True)
    cpu_s = time.process_time() - cpu0
    inactive = [s.name for s in settings if not s.active(events)]
    if inactive:
        return Outcome(names, "inactive", "no sign in the event log of "
                       + ", ".join(BY_NAME[n].what for n in inactive),
                       accuracy, inactive, cpu_s)
    if accuracy is None or accuracy < MIN_ACCURACY:
        return Outcome(names, "untrained", f"final accuracy {accuracy} < {MIN_ACCURACY}",
                       accuracy, cpu_s=cpu_s)
    resumed = ""
    if any(s.name == "checkpoint" for s in settings):
        try:
            resumed, why = check_resume(settings, out_dir, final)
        except Exception as exc:  # a resume that fails is what is measured here
            resumed, why = "", f"resuming: {_one_line(exc)}"
        cpu_s = time.process_time() - cpu0
        if not resumed:
            return Outcome(names, "not_resumed", why, accuracy, cpu_s=cpu_s)
    return Outcome(names, "ok", "", accuracy, cpu_s=cpu_s, resumed=resumed)


def _child(names: list[str], out_dir: str, conn: Any) -> None:
    try:
        outcome = run_combination([BY_NAME[n] for n in names], out_dir)
    except BaseException as exc:  # report, never leave the parent waiting
        outcome = Outcome(names, "error", _one_line(exc))
    conn.send(asdict(outcome))
    conn.close()


def run_forked(combos: Iterable[Sequence[Setting]], *, jobs: int = 1,
               timeout_s: float = TIMEOUT_S, out_dir: str | None = None,
               on_done: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Run each combination in a forked child (at most ``jobs`` at once); one that has not
    answered after ``timeout_s`` is killed and counted as an error. Results in input order."""
    ctx = multiprocessing.get_context("fork")
    todo = list(enumerate([list(s.name for s in c) for c in combos]))
    results: dict[int, Outcome] = {}
    live: dict[Any, tuple[int, Any, float, list[str]]] = {}
    base = out_dir or tempfile.mkdtemp(prefix="feature-pairs-")
    try:
        while todo or live:
            while todo and len(live) < max(1, jobs):
                i, names = todo.pop(0)
                parent, child = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_child, args=(names, base, child), daemon=True)
                proc.start()
                child.close()
                live[parent] = (i, proc, time.monotonic(), names)
            ready = wait(list(live), timeout=1.0)
            now = time.monotonic()
            for conn in list(live):
                i, proc, t0, names = live[conn]
                outcome = None
                if conn in ready:
                    try:
                        outcome = Outcome(**conn.recv())
                    except EOFError:
                        proc.join(5)
                        outcome = Outcome(names, "error",
                                          f"the run's process died (exit code {proc.exitcode})")
                elif now - t0 > timeout_s:
                    outcome = Outcome(names, "error", f"no result after {timeout_s:g} s (hung)")
                if outcome is None:
                    continue
                if proc.is_alive():
                    proc.join(5)
                    if proc.is_alive():
                        proc.kill()
                        proc.join()
                conn.close()
                del live[conn]
                results[i] = outcome
                if on_done is not None:
                    on_done(outcome)
    finally:
        for conn, (_, proc, _, _) in live.items():
            proc.kill()
            proc.join()
        if out_dir is None:
            shutil.rmtree(base, ignore_errors=True)
    return [results[i] for i in sorted(results)]


# --------------------------------------------------------------------------------------
# the report


def summary_line(outcomes: Sequence[Outcome]) -> str:
    count = {s: sum(o.status == s for o in outcomes)
             for s in ("refused", "error", "inactive", "untrained", "not_resumed", "ok")}
    line = (f"{len(outcomes)} pairs: {count['refused']} refused, {count['error']} "
            f"deadlock/error, {count['untrained']} did not train, {count['ok']} ok")
    if count["not_resumed"]:
        line += f", {count['not_resumed']} not resumed as uninterrupted"
    exact = sum(o.resumed == "bit-exact" for o in outcomes)
    if exact:
        line += f" ({exact} with checkpoints resumed bit for bit)"
    if count["inactive"]:
        line += f", {count['inactive']} with a feature inactive"
    return line


def table(outcomes: Sequence[Outcome]) -> str:
    width = max((len(o.name) for o in outcomes), default=10)
    rows = [f"{'settings':<{width}}  {'status':<11}  {'acc':>5}  {'cpu_s':>5}  "
            f"{'resumed':<9}  reason"]
    for o in outcomes:
        acc = "" if o.accuracy is None else f"{o.accuracy:.2f}"
        rows.append(f"{o.name:<{width}}  {o.status:<11}  {acc:>5}  {o.cpu_s:5.1f}  "
                    f"{o.resumed:<9}  {o.reason}")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="", help="comma-separated setting names (default: all)")
    p.add_argument("--jobs", type=int, default=1, help="pairs run at once (default 1)")
    p.add_argument("--no-singles", action="store_true", help="skip each setting alone")
    p.add_argument("--json", metavar="PATH", help="write every outcome as JSON")
    args = p.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or [s.name for s in SETTINGS]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        p.error(f"unknown setting {unknown[0]!r}; allowed: {', '.join(BY_NAME)}")
    chosen = [BY_NAME[n] for n in names]
    os.environ.pop("GEOMX_RUNTIME", None)
    singles: list[Outcome] = []
    t0 = time.monotonic()
    if not args.no_singles:
        singles = run_forked([[s] for s in chosen], jobs=args.jobs)
        print(table(singles))
        print()
    outcomes = run_forked(pairs_of(chosen), jobs=args.jobs)
    print(table(outcomes))
    print()
    print(summary_line(outcomes), f"({time.monotonic() - t0:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"singles": [asdict(o) for o in singles], "pairs": [asdict(o) for o in outcomes],
             "summary": summary_line(outcomes), "base": list(BASE),
             "settings": {s.name: list(s.overrides) for s in chosen}}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
