"""Chrome trace conversion: valid JSON, metadata, span timing, lanes, counters."""

import json

from geomx.metrics.chrome_trace import chrome_trace_events, convert_events_file
from geomx.metrics.recorder import EventRecorder


def _run(tmp_path):
    now = [0.0]
    path = tmp_path / "events.jsonl"
    with EventRecorder(path, lambda: now[0]) as rec:
        now[0] = 0.5
        rec.record("compute", "w:a:0", dur=0.5)  # recorded at its end: starts at 0
        now[0] = 1.75
        rec.record("xfer", "w:a:0", src="w:a:0", dst="ls:a", bytes=1000, t_start=1.25,
                   dur=0.5, link="lan:a", msg="PUSH", key=3)
        now[0] = 1.8
        rec.record("xfer", "w:a:0", src="w:a:0", dst="gs:0", bytes=500, t_start=1.5,
                   dur=0.3, path=["wan:a-g"], msg="PUSH", key=4)  # overlaps the first
        rec.record("barrier", "ls:b", round=1)
    return path


def test_output_is_valid_json_with_process_and_thread_metadata(tmp_path):
    out = tmp_path / "trace.json"
    n = convert_events_file(_run(tmp_path), out)
    doc = json.loads(out.read_text())
    assert doc["displayTimeUnit"] == "ms"
    evs = doc["traceEvents"]
    assert len(evs) == n
    procs = {e["args"]["name"]: e["pid"] for e in evs if e["name"] == "process_name"}
    assert set(procs) == {"a", "b", "network"}
    threads = {e["args"]["name"] for e in evs if e["name"] == "thread_name"}
    assert {"w:a:0 compute", "w:a:0 xfer", "w:a:0 xfer 2", "ls:b"} <= threads


def test_known_span_has_microsecond_ts_and_dur_and_args(tmp_path):
    out = tmp_path / "trace.json"
    convert_events_file(_run(tmp_path), out)
    evs = json.loads(out.read_text())["traceEvents"]
    spans = [e for e in evs if e["ph"] == "X"]
    compute = next(e for e in spans if e["cat"] == "compute")
    assert (compute["ts"], compute["dur"]) == (0.0, 500000.0)
    first = next(e for e in spans if e["args"].get("key") == 3)
    assert first["name"] == "xfer PUSH"
    assert (first["ts"], first["dur"]) == (1250000.0, 500000.0)
    assert first["args"]["bytes"] == 1000 and "t" not in first["args"]
    second = next(e for e in spans if e["args"].get("key") == 4)
    assert second["tid"] != first["tid"]  # overlapping spans go to separate lanes
    assert second["pid"] == first["pid"] == compute["pid"]
    instant = next(e for e in evs if e["ph"] == "i")
    assert instant["name"] == "barrier" and instant["ts"] == 1800000.0


def test_byte_counter_is_cumulative_per_lan_and_wan(tmp_path):
    out = tmp_path / "trace.json"
    convert_events_file(_run(tmp_path), out)
    evs = json.loads(out.read_text())["traceEvents"]
    counters = [e for e in evs if e["ph"] == "C"]
    assert [c["args"] for c in counters] == [{"wan": 0, "lan": 1000}, {"wan": 500, "lan": 1000}]


def test_metadata_precedes_use_and_conversion_is_deterministic(tmp_path):
    path = _run(tmp_path)
    convert_events_file(path, tmp_path / "1.json")
    convert_events_file(path, tmp_path / "2.json")
    assert (tmp_path / "1.json").read_bytes() == (tmp_path / "2.json").read_bytes()
    named = set()
    for e in chrome_trace_events(iter(json.loads(l) for l in path.read_text().splitlines())):
        if e["ph"] == "M" and e["name"] == "thread_name":
            named.add((e["pid"], e["tid"]))
        elif e["ph"] in ("X", "i"):
            assert (e["pid"], e["tid"]) in named


def test_non_overlapping_spans_share_a_lane():
    events = [
        {"t": 1.0, "node": "n", "ev": "compute", "dur": 1.0},
        {"t": 2.0, "node": "n", "ev": "compute", "dur": 1.0},
        {"t": 0.5, "node": "n", "ev": "compute", "t_start": 3.0, "dur": 1.0},
    ]
    tids = {e["tid"] for e in chrome_trace_events(events) if e["ph"] == "X"}
    assert len(tids) == 1
