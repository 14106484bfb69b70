"""Events -> Chrome trace event format (`trace.json`), for Perfetto or chrome://tracing.

Layout: one *process* per data centre (pid, named by a `process_name` metadata event)
and *threads* per node (tid, named by `thread_name`). An event with a `dur` field is a
span and becomes a complete event (`"ph": "X"`); everything else is an instant
(`"ph": "i"`). Transfer bytes are drawn as a cumulative `bytes` counter (`"ph": "C"`)
with a `wan` and a `lan` series on a separate "network" process.

Span timing: a span starts at its `t_start` field when it has one; otherwise the event
is taken to have been recorded when the span ended (that is when its duration is known)
and starts at `t - dur`. Timestamps are microseconds, rounded to the nanosecond.

Why lanes: the trace viewers require complete events on one thread to nest properly,
but a parameter server has many transfers in flight at once, which overlap without
nesting and would be dropped or drawn wrongly. Spans of each (node, kind) are therefore
packed greedily into as many lanes (extra threads, "w:a:0 xfer 2", ...) as needed for
no two spans in a lane to overlap. Events on a channel other than 0 (DGT's
low-priority bands, heartbeats on 7) get tracks of their own, "ls:a xfer ch9", so the
channels of one sender can be read apart; spans with an ``edge`` field (TSEngine's
overlay transfers) get a track per edge, "ls:a ts_xfer ->ls:b". A lane remembers only its earliest start and latest
end, so the conversion streams in constant memory per lane and works for events in any
order.

Format reference: "Trace Event Format" (Google, the catapult project's document).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any

from geomx.metrics.counters import ByteCounters, DcOf, dc_resolver
from geomx.metrics.recorder import Event, iter_events, to_jsonable

#: pid of the pseudo-process that carries the byte counters.
NETWORK_PID = 0

_NOT_ARGS = frozenset({"t", "node", "ev", "dur", "t_start"})


def _us(seconds: float) -> float:
    r = round(float(seconds) * 1e6, 3)
    return 0.0 if r == 0.0 else r


class _Tracks:
    """Assigns pids to DCs and tids to (node, lane), emitting metadata on first use."""

    def __init__(self, dc_of: Callable[[str], str]) -> None:
        self.dc_of = dc_of
        self.pids: dict[str, int] = {}
        self.node_index: dict[str, int] = {}
        self.node_tid: dict[str, int] = {}
        self.node_tracks: dict[str, int] = {}
        # (node, kind) -> list of lanes, each [tid, earliest_start_us, latest_end_us]
        self.lanes: dict[tuple[str, str], list[list[float]]] = {}
        self.next_tid = 1
        self.pending: list[dict[str, Any]] = []

    def pid(self, node: str) -> int:
        dc = self.dc_of(node)
        pid = self.pids.get(dc)
        if pid is None:
            pid = len(self.pids) + 1
            self.pids[dc] = pid
            self.pending.append(_meta("process_name", pid, 0, {"name": dc}))
            self.pending.append(_meta("process_sort_index", pid, 0, {"sort_index": pid}))
        return pid

    def _new_thread(self, node: str, pid: int, name: str) -> int:
        if node not in self.node_index:
            self.node_index[node] = len(self.node_index)
        sub = self.node_tracks.get(node, 0)
        self.node_tracks[node] = sub + 1
        tid = self.next_tid
        self.next_tid += 1
        self.pending.append(_meta("thread_name", pid, tid, {"name": name}))
        sort_index = self.node_index[node] * 1000 + sub
        self.pending.append(_meta("thread_sort_index", pid, tid, {"sort_index": sort_index}))
        return tid

    def main(self, node: str) -> tuple[int, int]:
        """(pid, tid) of the node's own track (instants)."""
        pid = self.pid(node)
        tid = self.node_tid.get(node)
        if tid is None:
            tid = self._new_thread(node, pid, node)
            self.node_tid[node] = tid
        return pid, tid

    def lane(self, node: str, kind: str, start_us: float, end_us: float) -> tuple[int, int]:
        """(pid, tid) of a lane of (node, kind) where [start, end] overlaps nothing."""
        pid = self.pid(node)
        lanes = self.lanes.setdefault((node, kind), [])
        for lane in lanes:
            if end_us <= lane[1] or start_us >= lane[2]:
                lane[1] = min(lane[1], start_us)
                lane[2] = max(lane[2], end_us)
                return pid, int(lane[0])
        n = len(lanes)
        name = f"{node} {kind}" if n == 0 else f"{node} {kind} {n + 1}"
        tid = self._new_thread(node, pid, name)
        lanes.append([tid, start_us, end_us])
        return pid, tid


def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "args": args}


def chrome_trace_events(
    events: Iterable[Event],
    dc_of: DcOf | None = None,
    *,
    byte_kinds: Collection[str] = ("xfer",),
    counters: bool = True,
) -> Iterator[dict[str, Any]]:
    """Yield Chrome trace events (metadata included, just before first use) for
    `events`, one by one."""
    resolve = dc_resolver(dc_of)
    tracks = _Tracks(resolve)
    totals = ByteCounters()
    byte_kinds = frozenset(byte_kinds)
    counter_named = False
    for event in events:
        kind = str(event.get("ev", "?"))
        node = str(event.get("node", "?"))
        t = float(event.get("t", 0.0))
        args = {k: v for k, v in event.items() if k not in _NOT_ARGS}
        name = kind if "msg" not in event else f"{kind} {event['msg']}"
        dur = event.get("dur")
        channel = event.get("channel")
        # a track per channel (DGT's bands, heartbeats): channel 0 stays on the node's own
        lane_kind = (f"{kind} ch{channel}" if isinstance(channel, int)
                     and not isinstance(channel, bool) and channel > 0 else kind)
        if isinstance(event.get("edge"), str):
            # a track per overlay edge (TSEngine's ts_xfer spans: "ls:a ts_xfer ->ls:b")
            lane_kind = f"{kind} {event['edge']}"
        if isinstance(dur, (int, float)) and not isinstance(dur, bool):
            start = event.get("t_start")
            start_s = float(start) if isinstance(start, (int, float)) else t - float(dur)
            ts = _us(start_s)
            dur_us = max(0.0, _us(float(dur)))
            pid, tid = tracks.lane(node, lane_kind, ts, ts + dur_us)
            out = {
                "ph": "X", "name": name, "cat": kind, "ts": ts, "dur": dur_us,
                "pid": pid, "tid": tid, "args": args,
            }  # fmt: skip
        elif lane_kind != kind:
            pid, tid = tracks.lane(node, lane_kind, _us(t), _us(t))
            out = {
                "ph": "i", "s": "t", "name": name, "cat": kind, "ts": _us(t),
                "pid": pid, "tid": tid, "args": args,
            }  # fmt: skip
        else:
            pid, tid = tracks.main(node)
            out = {
                "ph": "i", "s": "t", "name": name, "cat": kind, "ts": _us(t),
                "pid": pid, "tid": tid, "args": args,
            }  # fmt: skip
        yield from tracks.pending
        tracks.pending.clear()
        yield out
        if counters and kind in byte_kinds:
            totals.add_event(event, resolve)
            if not counter_named:
                counter_named = True
                yield _meta("process_name", NETWORK_PID, 0, {"name": "network"})
                yield _meta("process_sort_index", NETWORK_PID, 0, {"sort_index": -1})
            yield {
                "ph": "C", "name": "bytes", "pid": NETWORK_PID, "tid": 0, "ts": _us(t),
                "args": {"wan": totals.bytes_wan, "lan": totals.bytes_lan},
            }  # fmt: skip


def write_chrome_trace(
    events: Iterable[Event],
    out_path: str | os.PathLike[str],
    dc_of: DcOf | None = None,
    *,
    byte_kinds: Collection[str] = ("xfer",),
    counters: bool = True,
) -> int:
    """Stream `events` into a Chrome trace JSON file; returns trace events written."""
    out = os.fspath(out_path)
    parent = os.path.dirname(out)
    if parent:
        os.makedirs(parent, exist_ok=True)
    n = 0
    with open(out, "w", encoding="ascii", newline="\n") as f:
        f.write('{"displayTimeUnit":"ms","traceEvents":[\n')
        for trace_event in chrome_trace_events(
            events, dc_of, byte_kinds=byte_kinds, counters=counters
        ):
            if n:
                f.write(",\n")
            trace_event["args"] = to_jsonable(trace_event["args"], "args")
            f.write(
                json.dumps(trace_event, sort_keys=True, separators=(",", ":"), allow_nan=False)
            )
            n += 1
        f.write('\n],"otherData":{"generator":"geomx.metrics.chrome_trace"}}\n')
    return n


def convert_events_file(
    events_jsonl: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    dc_of: DcOf | None = None,
    *,
    byte_kinds: Collection[str] = ("xfer",),
    counters: bool = True,
) -> int:
    """`events.jsonl` -> `trace.json`, streaming (memory does not grow with the run)."""
    return write_chrome_trace(
        iter_events(events_jsonl), out_path, dc_of, byte_kinds=byte_kinds, counters=counters
    )
