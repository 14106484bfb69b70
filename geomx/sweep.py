"""`geomx sweep`: a scenario over the cartesian product of overrides x seeds.

Why a runner of its own instead of a shell loop over `geomx run --set`: emulator runs
are independent single-process jobs, so they parallelise over cores (`jobs` processes);
a sweep is long, so it must survive an interruption (a finished point is never rerun);
and the result must be one table (`sweep.csv`, see geomx/metrics/sweep_results.py)
plus default plots, not a folder of folders to grep.

Layout of a sweep folder::

    sweep.json      the grid, seeds and base overrides (what was asked)
    sweep.csv       one row per point: index, run, status, swept values, seed, summary scalars
    sweep_<key>.png each metric against each swept key (mean +- std over seeds)
    runs/<point>/   the run folder of each point (the same as `geomx run` leaves)

A point's folder name is readable (`bandwidth=20Mbps_type=fp16_seed=42`) plus a hash
of the point's fully resolved scenario, so resuming reuses a run only when it was made
from exactly the same scenario: editing the scenario file, the base `--set`s or the
code's defaults gives new folders instead of silently mixing old results in. A run is
written to `.tmp/` and renamed into `runs/` when it has finished, so a folder in
`runs/` with a summary.json is a finished point.

Grid values are checked exactly like `--set` (the same parser and validation); an
error names the `--grid` entry, the field, the value and what is allowed, before
anything runs. Processes are started with "spawn": sweeps are also started from
Jupyter kernels, whose threads make `fork` unsafe.

With a cluster address (`cluster=`; `geomx sweep --cluster tcp://HOST:8786` or
`$GEOMX_CLUSTER`) the points run as tasks on a Dask distributed cluster instead
(geomx/sweep_cluster.py; recipes in docs/sweeps.md). When the workers share the sweep
folder's file system they write their runs in place as local processes do; otherwise the
scenario file and the small files it names travel with each task and the run folder's
files come back as bytes, which are written here. Either way the sweep folder is the one
a local sweep leaves.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from geomx.metrics.summary import SUMMARY_FILE
from geomx.metrics.sweep_results import (
    LEAD_COLUMNS,
    SWEEP_CSV,
    SWEEP_MANIFEST,
    plot_sweep,
    summary_scalars,
)
from geomx.metrics.table import Table
from geomx.scenario import ScenarioError, load_scenario, scenario_to_toml
from geomx.scenario.sweep import SweepConfig

if TYPE_CHECKING:
    from geomx.sweep_cluster import ClusterPool, ClusterTask, ScenarioFile

RUNS_DIR = "runs"
TMP_DIR = ".tmp"


class SweepError(ValueError):
    """A sweep that cannot run (bad --grid syntax, no points); says what to write."""


@dataclass(frozen=True)
class GridAxis:
    """One `--grid KEY=V1,V2,...`: a scenario path and the values it takes.

    KEY may join several paths with `+` (`wan.0.bandwidth+wan.1.bandwidth`): each value
    is set on all of them, e.g. to change every WAN link of a topology together.
    """

    key: str
    values: tuple[str, ...]

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.key.split("+"))

    def assignments(self, value: str) -> list[str]:
        return [f"{path}={value}" for path in self.paths]


def split_values(text: str) -> list[str]:
    """Split on commas outside brackets and quotes: `[64],[64,32]` is two values."""
    out: list[str] = []
    depth = 0
    quote = ""
    cur = []
    for ch in text:
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    out.append("".join(cur).strip())
    return out


def parse_grid(spec: str) -> GridAxis:
    """`KEY=V1,V2,...` -> GridAxis. Raises SweepError naming the entry."""
    key, sep, rest = spec.partition("=")
    key = key.strip()
    if not sep or not key:
        raise SweepError(f"--grid {spec!r}: expected KEY=V1,V2,..., e.g. "
                         f"wan.0.bandwidth=20Mbps,100Mbps or codec.type=none,fp16")
    values = split_values(rest)
    if any(v == "" for v in values):
        raise SweepError(f"--grid {spec!r}: empty value; give one or more values separated "
                         f"by commas")
    if len(set(values)) != len(values):
        raise SweepError(f"--grid {spec!r}: a value appears twice")
    if any(not p.strip() for p in key.split("+")):
        raise SweepError(f"--grid {spec!r}: empty path in {key!r}; join paths with '+', e.g. "
                         f"wan.0.bandwidth+wan.1.bandwidth=20Mbps,100Mbps")
    return GridAxis(key, tuple(values))


def parse_grids(specs: Sequence[str]) -> list[GridAxis]:
    axes = [parse_grid(s) for s in specs]
    keys = [a.key for a in axes]
    for k in keys:
        if keys.count(k) > 1:
            raise SweepError(f"--grid {k}: the key is given twice; put all its values in one --grid")
    return axes


@dataclass(frozen=True)
class SweepPoint:
    """One run of the sweep: grid values (key, value text) and a seed."""

    index: int
    values: tuple[tuple[str, str], ...]
    seed: int
    folder: str

    def overrides(self, base: Sequence[str] = ()) -> list[str]:
        grid = [f"{path.strip()}={v}" for k, v in self.values for path in k.split("+")]
        return [*base, *grid, f"run.seed={self.seed}"]

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.values) + f" seed={self.seed}"


def _slug(point_values: Sequence[tuple[str, str]], seed: int) -> str:
    parts = [f"{k.split('+')[0].rsplit('.', 1)[-1]}={v}" for k, v in point_values]
    parts.append(f"seed={seed}")
    text = "_".join(parts)
    safe = "".join(c if c.isalnum() or c in "=.-+" else "_" for c in text)
    return safe[:80]


def _reraise_as_grid(exc: ScenarioError, source: str) -> ScenarioError:
    return ScenarioError(exc.problem, path=exc.path, value=exc.value, allowed=exc.allowed,
                         source=source)


def plan_sweep(
    scenario_path: str | os.PathLike,
    axes: Sequence[GridAxis],
    seeds: int = 1,
    base_overrides: Sequence[str] = (),
) -> list[SweepPoint]:
    """Every point of the grid x seeds, each validated like `geomx run --set` would.

    Seeds are the scenario's `run.seed`, +1, ... (`seeds` of them). Raises
    ScenarioError (naming the `--grid` entry) or SweepError before anything runs.
    """
    if seeds < 1:
        raise SweepError(f"--seeds {seeds}: allowed: an integer >= 1")
    base = load_scenario(scenario_path, base_overrides)
    for axis in axes:
        for value in axis.values:
            try:
                load_scenario(scenario_path, [*base_overrides, *axis.assignments(value)])
            except ScenarioError as exc:
                raise _reraise_as_grid(exc, f"--grid {axis.key}={value}") from None
    seed_list = [base.run.seed + i for i in range(seeds)]
    points: list[SweepPoint] = []
    combos = list(product(*[[(a.key, v) for v in a.values] for a in axes]))
    for combo in combos:
        for seed in seed_list:
            p = SweepPoint(len(points), tuple(combo), seed, "")
            try:
                s = load_scenario(scenario_path, p.overrides(base_overrides))
            except ScenarioError as exc:
                raise _reraise_as_grid(exc, f"--grid point {p.label}") from None
            # where the points run ([sweep]) is not part of what a point computes
            digest = hashlib.sha256(scenario_to_toml(
                dataclasses.replace(s, sweep=SweepConfig())).encode()).hexdigest()[:10]
            points.append(SweepPoint(p.index, p.values, seed,
                                     f"{_slug(p.values, seed)}-{digest}"))
    return points


class RunsBar:
    """A progress bar over runs on stderr (a line per run when not a terminal): runs
    done, resumed and failed, and running when the runner says (`set_running`)."""

    def __init__(self, total: int, enabled: bool = True, stream: IO[str] | None = None) -> None:
        self.total = total
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.is_tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.monotonic()
        self.done = self.failed = self.resumed = 0
        self.running: int | None = None
        self._ran = 0
        self._label = ""

    def set_running(self, running: int) -> None:
        """How many runs are in progress now; redrawn at once on a terminal."""
        self.running = running
        if self.enabled and self.is_tty and self.done < self.total:
            self._draw(self._label, failed=False)

    def advance(self, label: str, failed: bool = False, resumed: bool = False) -> None:
        self.done += 1
        self.failed += failed
        self.resumed += resumed
        self._ran += not resumed
        if not self.enabled or (resumed and self.done < self.total):
            return  # resumed points are summed up in the next line drawn
        self._draw(label, failed)

    def _draw(self, label: str, failed: bool) -> None:
        self._label = label
        elapsed = time.monotonic() - self.start
        left = self.total - self.done
        eta = f", ~{elapsed / self._ran * left:.0f} s left" if self._ran and left else ""
        width = 24
        filled = int(width * self.done / max(self.total, 1))
        line = (f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} runs "
                f"({self.resumed} resumed, {self.failed} failed"
                f"{'' if self.running is None else f', {self.running} running'}) "
                f"{elapsed:.1f} s{eta} | "
                f"{'FAILED ' if failed else ''}{label}")
        if self.is_tty:
            self.stream.write("\r\x1b[2K" + line)
            if self.done == self.total:
                self.stream.write("\n")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def _limit_kernel_threads(threads: int | None) -> None:
    """Give this process's Numba kernels (and PyTorch, :func:`limit_kernel_threads`)
    `threads` threads.

    J sweep processes on C cores with C kernel threads each oversubscribe the CPU: the
    codecs' `parallel=True` kernels then wait for descheduled threads on every small
    tensor (measured: a quickstart fp16 run on a loaded 2-core machine took 13 s of wall
    time with 2 Numba threads and 0.6 s with 1). Each process gets its share instead.
    """
    if threads is None:
        return
    from geomx.sweep_cluster import limit_kernel_threads

    limit_kernel_threads(threads)


def _run_point(scenario_path: str, overrides: list[str], tmp_parent: str,
               final_dir: str, kernel_threads: int | None = None) -> dict[str, Any]:
    """Run one point (in a worker process or here) and move its folder into place."""
    from geomx.experiment import run_scenario

    try:
        _limit_kernel_threads(kernel_threads)
        s = load_scenario(scenario_path, [*overrides, "run.progress=false"])
        # emulator points only: real-runtime runs in parallel would share the cores
        # they are timed on (and the scenario may say runtime = "real")
        result = run_scenario(s, runtime="emu", out_dir=tmp_parent, progress=False)
        if os.path.exists(final_dir):
            shutil.rmtree(final_dir)
        os.replace(result.run_dir, final_dir)
        with open(os.path.join(final_dir, SUMMARY_FILE), encoding="utf-8") as fh:
            return {"status": "done", "summary": json.load(fh)}
    except Exception as exc:  # a failed point is reported in its row, the sweep goes on
        return {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}


def _raise_failed(outcome: dict[str, Any]) -> dict[str, Any]:
    from geomx.sweep_cluster import TaskError

    if outcome["status"] != "done":
        raise TaskError(outcome["error"])
    return outcome


def _run_point_in_place(scenario_path: str, overrides: list[str], tmp_parent: str,
                        final_dir: str) -> dict[str, Any]:
    """A cluster task on a worker that shares the sweep folder: `_run_point` as a local
    process runs it (geomx.sweep_cluster.run_checked has set its kernel threads); a
    failure raises, so that the point is retried elsewhere."""
    return _raise_failed(_run_point(scenario_path, overrides, tmp_parent, final_dir))


def _run_point_shipped(scenario_name: str, scenario_text: bytes, overrides: list[str],
                       shipped: list[tuple[str, str, str, bytes]]) -> dict[str, Any]:
    """A cluster task on a worker that does not see the sweep folder.

    The scenario file and the files it names that travel (`shipped`: field, value as
    resolved on the client, the file part of it, bytes) are written to a folder of this
    worker, each field is pointed at its copy, the point runs there, and the run
    folder's files come back as {relative path: bytes}.
    """
    import tempfile

    with tempfile.TemporaryDirectory(prefix="geomx-point-") as tmp:
        root = Path(tmp)
        scenario = root / scenario_name
        scenario.write_bytes(scenario_text)
        moved = []
        for i, (field_name, value, location, data) in enumerate(shipped):
            copy = root / "files" / f"{i}-{Path(location).name}"
            copy.parent.mkdir(exist_ok=True)
            copy.write_bytes(data)
            moved.append(f"{field_name}={str(copy) + value[len(location):]}")
        final = root / "run"
        outcome = _raise_failed(_run_point(str(scenario), [*overrides, *moved],
                                           str(root / "tmp"), str(final)))
        outcome["files"] = {f.relative_to(final).as_posix(): f.read_bytes()
                            for f in sorted(final.rglob("*")) if f.is_file()}
        return outcome


def _write_run_files(files: dict[str, bytes], tmp_parent: Path, final_dir: Path) -> None:
    """A shipped point's run folder, written beside the sweep and moved into place."""
    staging = tmp_parent / "run"
    shutil.rmtree(tmp_parent, ignore_errors=True)
    for rel, data in files.items():
        target = staging / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    if final_dir.exists():
        shutil.rmtree(final_dir)
    os.replace(staging, final_dir)


@dataclass
class SweepResult:
    """A finished (or partly failed) sweep."""

    path: Path
    table: Table
    ran: int = 0
    resumed: int = 0
    failed: int = 0
    plots: list[Path] = field(default_factory=list)


def _row(point: SweepPoint, axes: Sequence[GridAxis], outcome: dict[str, Any]) -> dict[str, Any]:
    from geomx.metrics.table import parse_cell

    row: dict[str, Any] = {"index": point.index, "run": f"{RUNS_DIR}/{point.folder}",
                           "status": outcome["status"]}
    values = dict(point.values)
    for axis in axes:
        row[axis.key] = parse_cell(values[axis.key])
    row["seed"] = point.seed
    if outcome["status"] == "done":
        row.update(summary_scalars(outcome["summary"]))
    else:
        row["error"] = outcome.get("error", "")
    return row


def _write_csv(path: Path, points: Sequence[SweepPoint], axes: Sequence[GridAxis],
               outcomes: dict[int, dict[str, Any]]) -> Table:
    rows = [_row(p, axes, outcomes[p.index]) for p in points if p.index in outcomes]
    names = [*LEAD_COLUMNS, *(a.key for a in axes), "seed"]
    for row in rows:
        names.extend(k for k in row if k not in names)
    table = Table.from_rows(rows, names)
    tmp = path.with_suffix(".csv.tmp")
    table.to_csv(tmp)
    os.replace(tmp, path)
    return table


def default_sweep_dir(scenario_path: str | os.PathLike, base_overrides: Sequence[str] = ()) -> Path:
    """`<run.out_dir>/sweep-<run.name>`: the same folder each time, so a rerun resumes."""
    s = load_scenario(scenario_path, base_overrides)
    return Path(s.run.out_dir) / f"sweep-{s.run.name}"


def run_sweep(
    scenario_path: str | os.PathLike,
    axes: Sequence[GridAxis],
    seeds: int = 1,
    *,
    jobs: int | None = None,
    out: str | os.PathLike | None = None,
    base_overrides: Sequence[str] = (),
    progress: bool = True,
    plots: bool = True,
    cluster: str | None = None,
    shared_fs: bool | None = None,
) -> SweepResult:
    """Plan, run (skipping finished points) and tabulate a sweep; see the module
    docstring. `jobs` processes (default: the core count; 1 runs here, in order).

    `cluster` is a Dask scheduler address (`geomx sweep` takes it from `--cluster` or
    `$GEOMX_CLUSTER`; None: the scenario's `[sweep] cluster`, if set): the points run on its workers and `jobs` is not used. `shared_fs` says whether the workers see the sweep
    folder at the same path (None: find out by having them read a file written here).
    A cluster that cannot run the sweep raises geomx.sweep_cluster.ClusterError.
    """
    scenario_path = given_path = os.fspath(scenario_path)
    points = plan_sweep(scenario_path, axes, seeds, base_overrides)
    if cluster is None:  # the scenario's own [sweep] cluster (--set sweep.cluster= clears it)
        cluster = load_scenario(scenario_path, base_overrides).sweep.cluster or None
    jobs = jobs or os.cpu_count() or 1
    if jobs < 1:
        raise SweepError(f"--jobs {jobs}: allowed: an integer >= 1")
    sweep_dir = Path(out) if out is not None else default_sweep_dir(scenario_path, base_overrides)
    runs_dir = sweep_dir / RUNS_DIR
    tmp_dir = sweep_dir / TMP_DIR
    pending = [p for p in points if not (runs_dir / p.folder / SUMMARY_FILE).exists()]
    pool = None
    address = cluster.strip() if cluster and pending else None
    if address:
        # workers run in folders of their own: every path they are given is absolute
        scenario_path = os.path.abspath(scenario_path)
        sweep_dir = Path(os.path.abspath(sweep_dir))
        pool, shared_fs = _open_cluster(address, scenario_path, pending, base_overrides,
                                        sweep_dir, shared_fs)
    try:
        return _run_sweep(scenario_path, given_path, axes, points, pending, sweep_dir, jobs,
                          base_overrides, progress, plots, pool, bool(shared_fs))
    finally:
        if pool is not None:
            pool.close()


def _point_files(scenario_path: str, p: SweepPoint,
                 base_overrides: Sequence[str]) -> list[ScenarioFile]:
    from geomx.sweep_cluster import scenario_files

    return scenario_files(load_scenario(scenario_path, p.overrides(base_overrides)))


def _open_cluster(address: str, scenario_path: str, pending: Sequence[SweepPoint],
                  base_overrides: Sequence[str], sweep_dir: Path,
                  shared_fs: bool | None) -> tuple[ClusterPool, bool]:
    """Connect to the cluster and check its workers (geomx, files, file system) before
    anything runs; returns the pool and whether the workers share the sweep folder."""
    from geomx.sweep_cluster import ClusterPool, ScenarioFile

    files = {f for p in pending for f in _point_files(scenario_path, p, base_overrides)}
    files.add(ScenarioFile("the scenario file", scenario_path, True))
    pool = ClusterPool(address)
    try:
        sweep_dir.mkdir(parents=True, exist_ok=True)
        marker = sweep_dir / f".cluster-probe-{os.getpid()}"
        shared = pool.check_workers(sorted(files, key=lambda f: (f.field, f.path)),
                                    marker=marker, shared=shared_fs)
    except BaseException:
        pool.close()
        raise
    return pool, shared


def _cluster_task(scenario_path: str, p: SweepPoint, base_overrides: Sequence[str],
                  tmp_dir: Path, runs_dir: Path, shared: bool) -> ClusterTask:
    """The task of point `p`: run in place on a shared file system, or shipped."""
    from geomx.sweep_cluster import ClusterTask

    overrides = p.overrides(base_overrides)
    name = f"point-{p.index}"
    if shared:
        return ClusterTask(name, _run_point_in_place,
                           (scenario_path, overrides, str(tmp_dir / f"p{p.index}"),
                            str(runs_dir / p.folder)))
    shipped = []
    pinned = []
    for f in _point_files(scenario_path, p, base_overrides):
        if f.travels and os.path.isfile(f.location):
            shipped.append((f.field, f.path, f.location, Path(f.location).read_bytes()))
        else:  # it must be on the worker at the path it has here
            pinned.append(f"{f.field}={f.path}")
    return ClusterTask(name, _run_point_shipped,
                       (Path(scenario_path).name, Path(scenario_path).read_bytes(),
                        [*overrides, *pinned], shipped))


def _run_sweep(scenario_path: str, given_path: str, axes: Sequence[GridAxis],
               points: list[SweepPoint],
               pending: list[SweepPoint], sweep_dir: Path, jobs: int,
               base_overrides: Sequence[str], progress: bool, plots: bool,
               pool: ClusterPool | None, shared: bool) -> SweepResult:
    runs_dir = sweep_dir / RUNS_DIR
    tmp_dir = sweep_dir / TMP_DIR
    runs_dir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(tmp_dir, ignore_errors=True)  # leftovers of an interrupted sweep
    tmp_dir.mkdir()
    manifest = {"scenario": given_path, "grid": {a.key: list(a.values) for a in axes},
                "seeds": sorted({p.seed for p in points}), "set": list(base_overrides),
                "points": len(points)}
    (sweep_dir / SWEEP_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")

    bar = RunsBar(len(points), enabled=progress)
    outcomes: dict[int, dict[str, Any]] = {}
    for p in points:
        if p not in pending:
            summary_path = runs_dir / p.folder / SUMMARY_FILE
            outcomes[p.index] = {"status": "done", "resumed": True,
                                 "summary": json.loads(summary_path.read_text())}
            bar.advance(p.label, resumed=True)
    csv_path = sweep_dir / SWEEP_CSV
    left = len(pending)

    def finish(p: SweepPoint, outcome: dict[str, Any]) -> None:
        nonlocal left
        left -= 1
        outcomes[p.index] = outcome
        if pool is None:
            bar.running = min(workers, left)
        bar.advance(p.label, failed=outcome["status"] != "done")
        _write_csv(csv_path, points, axes, outcomes)

    cores = os.cpu_count() or 1
    workers = min(jobs, len(pending)) or 1
    bar.running = min(workers, left)

    def args(p: SweepPoint) -> tuple:
        return (scenario_path, p.overrides(base_overrides), str(tmp_dir / f"p{p.index}"),
                str(runs_dir / p.folder), None if workers == 1 else max(1, cores // workers))

    try:
        _run_points(scenario_path, pending, base_overrides, tmp_dir, runs_dir, pool, shared,
                    workers, args, finish, bar.set_running)
    except BaseException:  # Ctrl-C: the table lists every point that finished
        for p in pending:
            summary_path = runs_dir / p.folder / SUMMARY_FILE
            if p.index not in outcomes and summary_path.exists():
                outcomes[p.index] = {"status": "done",
                                     "summary": json.loads(summary_path.read_text())}
        _write_csv(csv_path, points, axes, outcomes)
        raise
    table = _write_csv(csv_path, points, axes, outcomes)
    shutil.rmtree(tmp_dir, ignore_errors=True)
    result = SweepResult(sweep_dir, table,
                         ran=len(pending),
                         resumed=len(points) - len(pending),
                         failed=sum(o["status"] != "done" for o in outcomes.values()))
    if plots:
        for name in plot_sweep(table, sweep_dir):
            result.plots.append(sweep_dir / name)
    return result


def _run_points(scenario_path: str, pending: list[SweepPoint], base_overrides: Sequence[str],
                tmp_dir: Path, runs_dir: Path, pool: ClusterPool | None, shared: bool,
                workers: int, args: Callable[[SweepPoint], tuple],
                finish: Callable[[SweepPoint, dict[str, Any]], None],
                on_running: Callable[[int], None]) -> None:
    """Run the pending points on the cluster, in `workers` local processes, or here."""
    if pool is not None:
        by_name = {f"point-{p.index}": p for p in pending}

        def done(task: ClusterTask, result: Any, error: str | None) -> None:
            p = by_name[task.name]
            if error is not None:
                finish(p, {"status": "failed", "error": error})
                return
            files = result.pop("files", None)
            if files is not None:
                _write_run_files(files, tmp_dir / f"p{p.index}", runs_dir / p.folder)
            finish(p, result)

        pool.run([_cluster_task(scenario_path, p, base_overrides, tmp_dir, runs_dir, shared)
                  for p in pending], done, on_tick=on_running)
    elif workers == 1:
        for p in pending:
            finish(p, _run_point(*args(p)))
    else:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as processes:
            futures = {processes.submit(_run_point, *args(p)): p for p in pending}
            try:
                remaining = set(futures)
                while remaining:
                    finished, remaining = wait(remaining, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        finish(futures[fut], fut.result())
            except BaseException:
                processes.shutdown(wait=False, cancel_futures=True)
                raise
