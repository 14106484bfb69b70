"""Training progress: `progress.csv` (one row per evaluation) and a terminal progress bar.

`progress.csv` is what the accuracy/bytes plots and notebooks read; its columns are
`PROGRESS_COLUMNS`. `t` is the runtime's clock (emulated seconds in the emulator, wall
seconds since job start over sockets), `wall_s` is real elapsed time in both, so that
an emulated run can say both "reached 90 % after 310 emulated s" and "took 40 s to run".
Missing values are empty cells; a diverged loss is written as `nan`.

`ProgressBar` is a small, dependency-free bar on stderr in the spirit of tqdm: it
redraws in place at most every `min_interval_s` when stderr is a terminal, and when it
is not (CI logs, pipes) it stays silent until `close()` prints one final line, so logs
are not flooded with carriage returns.
"""

from __future__ import annotations

import csv
import math
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

from geomx.metrics.recorder import Event, EventRecorder, round_float

PROGRESS_COLUMNS = ("iteration", "t", "wall_s", "loss", "accuracy", "bytes_lan", "bytes_wan")


@dataclass(frozen=True)
class ProgressRow:
    iteration: int
    t: float | None
    wall_s: float | None
    loss: float | None
    accuracy: float | None
    bytes_lan: int
    bytes_wan: int


def _fmt_float(x: float | None) -> str:
    if x is None:
        return ""
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return repr(round_float(x))


def _parse_float(cell: str) -> float | None:
    return None if cell == "" else float(cell)


class ProgressWriter:
    """Writes `progress.csv`, flushing after each row so a notebook can watch it live.

    Args:
        path: the CSV file.
        wall_clock: seconds of real time since the run started, used for `wall_s` when
            a row does not give it. None leaves `wall_s` empty unless given.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        wall_clock: Callable[[], float] | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self.wall_clock = wall_clock
        self.rows: list[ProgressRow] = []
        parent = os.path.dirname(self.path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        self._file: IO[str] | None = open(self.path, "w", encoding="ascii", newline="")
        self._csv = csv.writer(self._file, lineterminator="\n")
        self._csv.writerow(PROGRESS_COLUMNS)
        self._file.flush()

    def write(
        self,
        iteration: int,
        t: float | None,
        loss: float | None = None,
        accuracy: float | None = None,
        bytes_lan: int = 0,
        bytes_wan: int = 0,
        wall_s: float | None = None,
    ) -> ProgressRow:
        """Append one evaluation row."""
        if self._file is None:
            raise ValueError(f"ProgressWriter({self.path!r}) is closed")
        if wall_s is None and self.wall_clock is not None:
            wall_s = self.wall_clock()
        row = ProgressRow(
            iteration=int(iteration),
            t=None if t is None else float(t),
            wall_s=None if wall_s is None else float(wall_s),
            loss=None if loss is None else float(loss),
            accuracy=None if accuracy is None else float(accuracy),
            bytes_lan=int(bytes_lan),
            bytes_wan=int(bytes_wan),
        )
        self._csv.writerow(
            (
                str(row.iteration),
                _fmt_float(row.t),
                _fmt_float(row.wall_s),
                _fmt_float(row.loss),
                _fmt_float(row.accuracy),
                str(row.bytes_lan),
                str(row.bytes_wan),
            )
        )
        self._file.flush()
        self.rows.append(row)
        return row

    def follow(
        self, recorder: EventRecorder, kind: str = "eval", node: str | None = None
    ) -> None:
        """Write a row for every `kind` event the recorder sees (from `node` if given),
        taking `iteration`, `loss`, `accuracy` from the event, `t` from its time and the
        LAN/WAN bytes from the recorder's counters at that moment."""

        def on_event(event: Event) -> None:
            if event["ev"] != kind or (node is not None and event["node"] != node):
                return
            self.write(
                iteration=int(event.get("iteration", len(self.rows))),
                t=event["t"],
                loss=event.get("loss"),
                accuracy=event.get("accuracy"),
                bytes_lan=recorder.counters.bytes_lan,
                bytes_wan=recorder.counters.bytes_wan,
            )

        recorder.add_listener(on_event)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> ProgressWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_progress(path: str | os.PathLike[str]) -> list[ProgressRow]:
    """Rows of a `progress.csv` (empty cells become None)."""
    rows: list[ProgressRow] = []
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        missing = set(PROGRESS_COLUMNS) - set(reader.fieldnames or ())
        if missing:
            raise ValueError(
                f"{os.fspath(path)}: missing column(s) {sorted(missing)}; "
                f"expected {', '.join(PROGRESS_COLUMNS)}"
            )
        for rec in reader:
            rows.append(
                ProgressRow(
                    iteration=int(rec["iteration"]),
                    t=_parse_float(rec["t"]),
                    wall_s=_parse_float(rec["wall_s"]),
                    loss=_parse_float(rec["loss"]),
                    accuracy=_parse_float(rec["accuracy"]),
                    bytes_lan=int(rec["bytes_lan"] or 0),
                    bytes_wan=int(rec["bytes_wan"] or 0),
                )
            )
    return rows


def format_duration(seconds: float) -> str:
    """Short human duration: `12.3s`, `4m05s`, `2h03m`."""
    if not math.isfinite(seconds):
        return "?"
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        m, s = divmod(int(seconds), 60)
        return f"{m}m{s:02d}s"
    h, rem = divmod(int(seconds), 3600)
    return f"{h}h{rem // 60:02d}m"


class ProgressBar:
    """A one-line progress bar on stderr: iterations, accuracy, loss, runtime clock.

    Args:
        total: iterations expected (None or 0 when unknown: no bar, only the count).
        enabled: False makes every method a no-op.
        stream: where to draw (default: sys.stderr at construction time).
        time_label: what the runtime clock is ("emu" or "wall"), shown after `t`.
        min_interval_s: least real time between two redraws on a terminal.
        is_tty: override terminal detection (tests).
        now: monotonic clock for throttling and the rate display (tests).
    """

    def __init__(
        self,
        total: int | None,
        enabled: bool = True,
        *,
        stream: IO[str] | None = None,
        time_label: str = "emu",
        min_interval_s: float = 0.1,
        is_tty: bool | None = None,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = total or None
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.time_label = time_label
        self.min_interval_s = min_interval_s
        if is_tty is None:
            isatty = getattr(self.stream, "isatty", None)
            is_tty = bool(isatty and isatty())
        self.is_tty = is_tty
        self._now = now
        self._start = now()
        self._last_draw: float | None = None
        self._closed = False
        self.iteration = 0
        self.accuracy: float | None = None
        self.loss: float | None = None
        self.t: float | None = None

    def update(
        self,
        iteration: int,
        accuracy: float | None = None,
        t: float | None = None,
        loss: float | None = None,
    ) -> None:
        """Set the current iteration (absolute, not a delta) and the latest figures."""
        if not self.enabled or self._closed:
            return
        self.iteration = int(iteration)
        if accuracy is not None:
            self.accuracy = accuracy
        if loss is not None:
            self.loss = loss
        if t is not None:
            self.t = t
        if not self.is_tty:
            return
        now = self._now()
        done = self.total is not None and self.iteration >= self.total
        if done or self._last_draw is None or now - self._last_draw >= self.min_interval_s:
            self._draw("\r", "")
            self._last_draw = now

    def on_event(self, event: Event) -> None:
        """Recorder listener: follows `eval` events (`iteration`, `accuracy`, `loss`)."""
        if event.get("ev") == "eval":
            self.update(
                int(event.get("iteration", self.iteration)),
                accuracy=event.get("accuracy"),
                t=event.get("t"),
                loss=event.get("loss"),
            )

    def render(self, width: int | None = None) -> str:
        """The bar's text for the current state, fitted into `width` columns."""
        if width is None:
            width = shutil.get_terminal_size((80, 20)).columns
        elapsed = self._now() - self._start
        parts = []
        if self.total:
            parts.append(f"{self.iteration}/{self.total} {100.0 * self.iteration / self.total:3.0f}%")
        else:
            parts.append(f"{self.iteration} it")
        if self.accuracy is not None:
            parts.append(f"acc {self.accuracy:.4f}")
        if self.loss is not None:
            parts.append(f"loss {self.loss:.4g}")
        if self.t is not None:
            parts.append(f"t {format_duration(self.t)} {self.time_label}")
        if elapsed > 0 and self.iteration > 0:
            parts.append(f"{self.iteration / elapsed:.3g} it/s")
        parts.append(f"wall {format_duration(elapsed)}")
        text = " | ".join(parts)
        if self.total:
            bar_width = max(10, min(30, width - len(text) - 4))
            frac = min(1.0, max(0.0, self.iteration / self.total))
            filled = int(round(frac * bar_width))
            text = "[" + "#" * filled + "-" * (bar_width - filled) + "] " + text
        return text[: max(1, width - 1)]

    def _draw(self, prefix: str, end: str) -> None:
        width = shutil.get_terminal_size((80, 20)).columns
        line = self.render(width)
        pad = " " * max(0, width - 1 - len(line)) if self.is_tty else ""
        self.stream.write(prefix + line + pad + end)
        self.stream.flush()

    def close(self) -> None:
        """Draw the final state and end the line (once)."""
        if not self.enabled or self._closed:
            return
        self._closed = True
        self._draw("\r" if self.is_tty else "", "\n")

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
