"""The event log: one JSON object per line (`events.jsonl`), byte-for-byte reproducible.

Nodes call `recorder.record(ev, node, **fields)`; the runtime owns the clock (virtual
seconds in the emulator, wall seconds since job start over sockets), so node code never
reads time itself. Every event is a flat object `{"t", "node", "ev", ...fields}`.

Why so strict about bytes: the emulator promises "same seed, same scenario, the same
event log, byte for byte". That only holds if serialisation is canonical, so:

* keys are sorted, separators are fixed (`,` and `:`), output is ASCII;
* floats are rounded to `FLOAT_SIGNIFICANT_DIGITS` significant digits and written with
  Python's shortest round-trip `repr` (platform independent since Python 3.1);
  NaN and infinities, which JSON cannot carry, become `null`;
* numpy scalars/arrays, enums, tuples and sets are normalised to plain JSON values
  (sets are sorted) so the same data never serialises two ways;
* nothing the caller did not pass is added (in particular no wall-clock stamps).

Aggregates (event counts per kind, `ByteCounters`) are kept in memory whether or not
the log is written, because the summary needs them even when a 1000-node run records
nothing to disk.

The real runtime writes one file per process; `merge_event_files` interleaves them by
(t, node, original order) into the run's single `events.jsonl`.
"""

from __future__ import annotations

import enum
import heapq
import json
import math
import os
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import IO, Any

from geomx.metrics.counters import ByteCounters, DcOf, dc_resolver

#: Significant decimal digits kept for every float in the event log.
FLOAT_SIGNIFICANT_DIGITS = 9
_FLOAT_FORMAT = f".{FLOAT_SIGNIFICANT_DIGITS}g"

#: Keys every event has; callers cannot pass them as fields.
RESERVED_KEYS = ("t", "node", "ev")

# Values that are already canonical JSON (bool is listed for speed; it is an int).
_PLAIN_TYPES = frozenset({str, int, bool, type(None)})
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False)

Event = dict[str, Any]
Listener = Callable[[Event], None]


def round_float(x: float) -> float | None:
    """`x` rounded to `FLOAT_SIGNIFICANT_DIGITS` significant digits; None if not finite."""
    if not math.isfinite(x):
        return None
    r = float(format(x, _FLOAT_FORMAT))
    return 0.0 if r == 0.0 else r  # fold -0.0 into 0.0


def to_jsonable(value: Any, where: str = "value") -> Any:
    """Normalise `value` to plain JSON types with canonical floats.

    Raises TypeError naming `where` (the field) for values with no JSON meaning.
    """
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, enum.Enum):
        return to_jsonable(value.value, where)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return round_float(value)
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, (set, frozenset)):
        items = [to_jsonable(v, f"{where}{{}}") for v in value]
        return sorted(items, key=lambda v: json.dumps(v, sort_keys=True))
    # numpy without importing it: scalars have .item(), arrays have .tolist().
    if hasattr(value, "dtype"):
        if hasattr(value, "tolist") and getattr(value, "ndim", 0) > 0:
            return to_jsonable(value.tolist(), where)
        if hasattr(value, "item"):
            return to_jsonable(value.item(), where)
    raise TypeError(
        f"{where}: {type(value).__name__} is not JSON-able; pass str, int, float, bool, "
        "None, list, tuple, dict, set or a numpy scalar/array"
    )


def canonical_dumps(obj: Any, *, indent: int | None = None) -> str:
    """Canonical JSON text of `obj` (sorted keys, canonical floats, ASCII)."""
    clean = to_jsonable(obj)
    if indent is None:
        return _ENCODER.encode(clean)
    return json.dumps(clean, sort_keys=True, indent=indent, allow_nan=False)


class EventRecorder:
    """Records events to a JSON Lines file and keeps the aggregates the summary needs.

    Args:
        path: the `.jsonl` file to write, or None to keep aggregates only.
        clock: returns the current time in seconds (the runtime's clock).
        enabled: False writes nothing (aggregates are still kept).
        dc_of: node name -> DC name (a function or a mapping), used to split transfer
            bytes into LAN/WAN. Defaults to the naming convention
            (`counters.dc_from_node_name`); pass the topology's table so the global tier
            is placed correctly.
        byte_kinds: event kinds whose `bytes` are counted in `counters` (default
            `("xfer",)`, the emulator's network transfers; the real runtime, which sees
            only its own sends, uses its send event kind).
        write_kinds: if given, only these kinds are written to the file (all are still
            counted) -- for runs too large to log every transfer.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        clock: Callable[[], float],
        enabled: bool = True,
        *,
        dc_of: DcOf | None = None,
        byte_kinds: Collection[str] = ("xfer",),
        write_kinds: Collection[str] | None = None,
    ) -> None:
        self.path = None if path is None else os.fspath(path)
        self.clock = clock
        self.enabled = enabled
        self.dc_of = dc_of
        self._resolve_dc = dc_resolver(dc_of)
        self.byte_kinds = frozenset(byte_kinds)
        self.write_kinds = None if write_kinds is None else frozenset(write_kinds)
        self.counts: dict[str, int] = {}
        self.counters = ByteCounters()
        self.events_written = 0
        #: the clock at the last event, as given (``last_t`` rounds it when read)
        self._last_clock: float | None = None
        self._listeners: list[Listener] = []
        self._dc_cache: dict[str, str] = {}
        #: (src, dst) -> their DCs, for count_transfer
        self._pair_cache: dict[tuple[str, str], tuple[str, str]] = {}
        self._file: IO[str] | None = None
        if self.path is not None and enabled:
            parent = os.path.dirname(self.path)
            if parent:
                os.makedirs(parent, exist_ok=True)
            self._file = open(self.path, "w", encoding="ascii", newline="\n")

    # -- recording ---------------------------------------------------------------------

    def record(self, ev: str, node: str, **fields: Any) -> Event:
        """Record event `ev` at node `node` at the clock's current time.

        Returns the normalised event (what was, or would have been, written).
        """
        if "t" in fields:
            raise ValueError(
                f"record({ev!r}, {node!r}): 't' is supplied by the runtime clock; "
                "use record_at(t, ...) to record at an explicit time"
            )
        return self.record_at(self.clock(), ev, node, **fields)

    def record_at(self, t: float, ev: str, node: str, **fields: Any) -> Event:
        """Record event `ev` at node `node` at explicit time `t` (seconds)."""
        event: Event = {"t": t, "node": str(node), "ev": str(ev)}
        for key, value in fields.items():
            tp = type(value)
            if tp is float:
                value = round_float(value)
            elif tp not in _PLAIN_TYPES:
                value = to_jsonable(value, f"{ev}.{key}")
            event[key] = value
        rt = round_float(float(t))
        if rt is None:
            raise ValueError(f"record_at({ev!r}, {node!r}): t must be finite, got {t!r}")
        event["t"] = rt
        self._last_clock = rt
        self.counts[ev] = self.counts.get(ev, 0) + 1
        if ev in self.byte_kinds:
            self.counters.add_event(event, self._dc_cached)
        if self._file is not None and (self.write_kinds is None or ev in self.write_kinds):
            self._file.write(_ENCODER.encode(event))
            self._file.write("\n")
            self.events_written += 1
        for listener in self._listeners:
            listener(event)
        return event

    def keeps_only_aggregates(self, ev: str) -> bool:
        """True when recording ``ev`` would write nothing and notify nobody, so
        :meth:`count_transfer` may stand in for :meth:`record`."""
        return not self._listeners and (self._file is None or (
            self.write_kinds is not None and ev not in self.write_kinds))

    def count_transfer(self, ev: str, node: str, src: str, dst: str, nbytes: int) -> None:
        """What ``record(ev, node, src=src, dst=dst, bytes=nbytes, ...)`` keeps when the
        event is not written (:meth:`keeps_only_aggregates`): the count of ``ev``, the
        clock's time and, for a byte kind, the bytes by DC pair; without building and
        normalising the event (a real node counts every message it sends this way)."""
        t = float(self.clock())
        if not math.isfinite(t):
            raise ValueError(f"count_transfer({ev!r}, {node!r}): the clock is not finite")
        self._last_clock = t  # rounded when read: a real node counts every message
        self.counts[ev] = self.counts.get(ev, 0) + 1
        if ev in self.byte_kinds:
            dcs = self._pair_cache.get((src, dst))
            if dcs is None:
                dc = self._dc_cached
                dcs = self._pair_cache[(src, dst)] = (dc(str(src)), dc(str(dst)))
            self.counters.add(dcs[0], dcs[1], nbytes)

    @property
    def last_t(self) -> float | None:
        """The time of the last event recorded or counted (rounded as events are)."""
        t = self._last_clock
        return None if t is None else round_float(t)

    def add_listener(self, listener: Listener) -> None:
        """Call `listener(event)` after every recorded event (e.g. a ProgressWriter)."""
        self._listeners.append(listener)

    def _dc_cached(self, node: str) -> str:
        # A node's DC never changes during a run; resolving it once per node keeps
        # record() cheap for runs with millions of transfers.
        dc = self._dc_cache.get(node)
        if dc is None:
            dc = self._dc_cache[node] = self._resolve_dc(node)
        return dc

    # -- aggregates --------------------------------------------------------------------

    def aggregates(self) -> dict[str, Any]:
        """Counts per kind and byte counters, JSON-able (what a process ships to the
        launcher in the real runtime)."""
        return {
            "counts": dict(sorted(self.counts.items())),
            "bytes": self.counters.to_dict(),
        }

    # -- file lifecycle ----------------------------------------------------------------

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    @property
    def closed(self) -> bool:
        return self._file is None

    def __enter__(self) -> EventRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_events(path: str | os.PathLike[str]) -> Iterator[Event]:
    """Stream the events of a JSON Lines file without loading it whole.

    A last line without its newline that does not parse is the trace of a process that
    died mid-write; it is skipped. Any other malformed line raises ValueError naming the
    file and line.
    """
    for event, _ in _events_and_lines(path):
        yield event


def _events_and_lines(path: str | os.PathLike[str]) -> Iterator[tuple[Event, str]]:
    """:func:`iter_events`, each event with its line's text (without the newline)."""
    with open(path, encoding="utf-8") as f:
        lineno = 0
        for line in f:
            lineno += 1
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError as e:
                if not line.endswith("\n"):
                    return  # truncated final line
                raise ValueError(f"{os.fspath(path)}:{lineno}: not a JSON object: {e}") from e
            if not isinstance(event, dict):
                raise ValueError(f"{os.fspath(path)}:{lineno}: expected a JSON object")
            yield event, line.rstrip("\n")


def _sort_key(event: Event, where: str) -> tuple[float, str]:
    t = event.get("t")
    if not isinstance(t, (int, float)) or isinstance(t, bool):
        raise ValueError(f"{where}: event has no numeric 't' field: {event!r}")
    return float(t), str(event.get("node", ""))


class _OutOfOrder(Exception):
    """A file's events are not in (t, node) order: it cannot be merged streaming."""


def _keyed(path: str, file_index: int, *, in_order: bool = False
           ) -> Iterator[tuple[float, str, int, int, Event, str]]:
    """``(t, node, file_index, line_index, event, line)`` per event; with ``in_order``,
    raises :class:`_OutOfOrder` at the first event that sorts before the one before it."""
    prev = (-math.inf, "")
    for line_index, (event, line) in enumerate(_events_and_lines(path)):
        t, node = _sort_key(event, f"{path} event {line_index}")
        if in_order:
            if (t, node) < prev:
                raise _OutOfOrder(path)
            prev = (t, node)
        yield t, node, file_index, line_index, event, line


#: A run of digits and points longer than this may be a float with more significant
#: digits than the log keeps (9 digits and a point: 10 characters).
_LONG_NUMBER = re.compile(r"[0-9.]{%d,}" % (FLOAT_SIGNIFICANT_DIGITS + 2))


def _canonical_line(event: Event, line: str) -> str:
    """The canonical text of a parsed ``event``: its own ``line`` when that already is
    (what :class:`EventRecorder` writes: same keys order and separators on re-encoding,
    no number long enough to carry an unrounded float), else :func:`canonical_dumps`."""
    if _LONG_NUMBER.search(line) is None:
        try:
            if _ENCODER.encode(event) == line:
                return line
        except ValueError:  # NaN or an infinity: canonical_dumps writes null
            pass
    return canonical_dumps(event)


def merge_event_files(
    paths: Iterable[str | os.PathLike[str]], out_path: str | os.PathLike[str],
    on_event: Listener | None = None,
) -> int:
    """Merge per-process event files into one, ordered by (t, node, original order).

    "Original order" is (position of the file in `paths`, line in that file), so the
    output is deterministic for given inputs. Files whose events are already in
    (t, node) order -- the normal case, since each process stamps its own clock -- are
    merged streaming, each line read once; when one turns out not to be, everything is
    sorted in memory instead. Lines are written canonically (a line the recorder wrote
    is copied as it is). Returns the number of events written. ``on_event`` (optional)
    is called with each event in the merged order once the order is known, which saves
    the caller reading the merged file again.
    """
    files = [os.fspath(p) for p in paths]
    out = os.fspath(out_path)
    if any(os.path.abspath(p) == os.path.abspath(out) for p in files):
        raise ValueError(f"merge_event_files: out_path {out!r} is also an input")
    parent = os.path.dirname(out)
    if parent:
        os.makedirs(parent, exist_ok=True)
    seen: list[Event] | None = None if on_event is None else []
    try:
        n = _write_merged(out, heapq.merge(*(_keyed(path, i, in_order=True)
                                             for i, path in enumerate(files)),
                                           key=lambda r: r[:4]), seen)
    except _OutOfOrder:
        pass
    else:
        for event in seen or ():  # held back until no file could turn out unsorted
            on_event(event)  # type: ignore[misc]
        return n
    return _write_merged(out, sorted((r for i, path in enumerate(files) for r in _keyed(path, i)),
                                     key=lambda r: r[:4]), on_event)


def _write_merged(out: str, merged: Iterable[tuple[float, str, int, int, Event, str]],
                  on_event: list[Event] | Listener | None) -> int:
    n = 0
    call = on_event.append if isinstance(on_event, list) else on_event
    with open(out, "w", encoding="ascii", newline="\n") as f:
        for *_, event, line in merged:
            f.write(_canonical_line(event, line))
            f.write("\n")
            if call is not None:
                call(event)
            n += 1
    return n
