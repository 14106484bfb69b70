"""EventRecorder: canonical, byte-deterministic JSON Lines and in-memory aggregates."""

import enum
import json

import numpy as np
import pytest

from geomx.metrics.recorder import (
    EventRecorder,
    canonical_dumps,
    iter_events,
    merge_event_files,
    round_float,
)


class FakeClock:
    def __init__(self, t=0.0):
        self.t = t

    def __call__(self):
        return self.t


class Kind(enum.IntEnum):
    PUSH = 3


def _record_sample(rec, clock):
    clock.t = 0.1 + 0.2  # 0.30000000000000004
    rec.record("compute", "w:a:0", dur=1 / 3)
    clock.t = 1.5
    rec.record(
        "xfer", "w:a:0", src="w:a:0", dst="ls:a", bytes=np.int64(4096),
        t_start=np.float32(1.25), dur=0.25, link="lan:a", msg=Kind.PUSH, key=7,
        shape=(2, 3), tags={"z", "a"}, weights=np.arange(3, dtype=np.float64) / 7,
    )
    clock.t = 2.0
    rec.record("xfer", "ls:a", src="ls:a", dst="gs:0", bytes=100, path=["wan:a-g"])
    rec.record("eval", "w:a:0", iteration=10, loss=float("nan"), accuracy=0.5)


def test_same_records_give_identical_bytes(tmp_path):
    outputs = []
    for name in ("one.jsonl", "two.jsonl"):
        clock = FakeClock()
        with EventRecorder(tmp_path / name, clock) as rec:
            _record_sample(rec, clock)
        outputs.append((tmp_path / name).read_bytes())
    assert outputs[0] == outputs[1]
    assert outputs[0].endswith(b"\n") and outputs[0].count(b"\n") == 4


def test_lines_are_canonical_sorted_keys_rounded_floats(tmp_path):
    clock = FakeClock()
    with EventRecorder(tmp_path / "e.jsonl", clock) as rec:
        _record_sample(rec, clock)
    lines = (tmp_path / "e.jsonl").read_text().splitlines()
    assert lines[0] == '{"dur":0.333333333,"ev":"compute","node":"w:a:0","t":0.3}'
    xfer = json.loads(lines[1])
    assert list(xfer) == sorted(xfer)
    assert xfer["msg"] == 3 and xfer["bytes"] == 4096 and xfer["shape"] == [2, 3]
    assert xfer["tags"] == ["a", "z"]
    assert xfer["weights"] == [0.0, 0.142857143, 0.285714286]
    assert xfer["t_start"] == 1.25
    assert json.loads(lines[3])["loss"] is None  # NaN is not JSON: null
    for line in lines:
        assert " " not in line  # fixed separators
        assert "wall" not in line  # no wall-clock fields were added


def test_round_float_keeps_nine_significant_digits_and_folds_negative_zero():
    assert round_float(123456.7891234) == 123456.789
    assert round_float(1.0000000001e-7) == 1e-7
    assert repr(round_float(-0.0)) == "0.0"
    assert round_float(float("inf")) is None


def test_reserved_t_field_and_unserialisable_values_are_rejected(tmp_path):
    rec = EventRecorder(None, FakeClock())
    with pytest.raises(ValueError, match="record_at"):
        rec.record("x", "n", t=1.0)
    with pytest.raises(TypeError, match="x.blob"):
        rec.record("x", "n", blob=b"raw")
    with pytest.raises(ValueError, match="finite"):
        rec.record_at(float("nan"), "x", "n")


def test_aggregates_are_kept_when_writing_is_disabled(tmp_path):
    clock = FakeClock()
    path = tmp_path / "off.jsonl"
    rec = EventRecorder(path, clock, enabled=False)
    _record_sample(rec, clock)
    rec.close()
    assert not path.exists()
    assert rec.counts == {"compute": 1, "xfer": 2, "eval": 1}
    assert rec.counters.bytes_lan == 4096
    assert rec.counters.bytes_wan == 100
    assert rec.counters.bytes_per_link == {"lan:a": 4096, "wan:a-g": 100}
    assert rec.counters.bytes_per_dc_pair == {"a->a": 4096, "a->global": 100}
    assert rec.aggregates()["counts"]["xfer"] == 2


def test_dc_of_and_write_kinds_and_listeners(tmp_path):
    clock = FakeClock()
    seen = []
    rec = EventRecorder(
        tmp_path / "e.jsonl", clock, dc_of=lambda n: "a", write_kinds={"eval"}
    )
    rec.add_listener(seen.append)
    _record_sample(rec, clock)
    rec.close()
    assert rec.counters.bytes_wan == 0 and rec.counters.bytes_lan == 4196
    assert [e["ev"] for e in iter_events(tmp_path / "e.jsonl")] == ["eval"]
    assert [e["ev"] for e in seen] == ["compute", "xfer", "xfer", "eval"]
    assert rec.events_written == 1


def test_iter_events_skips_truncated_last_line_but_not_corrupt_middle(tmp_path):
    p = tmp_path / "e.jsonl"
    p.write_text('{"t":1,"node":"a","ev":"x"}\n{"t":2,"no')
    assert [e["t"] for e in iter_events(p)] == [1]
    p.write_text('{"t":1,"node":"a","ev":"x"}\nnot json\n{"t":3}\n')
    with pytest.raises(ValueError, match=":2:"):
        list(iter_events(p))


def _write(path, events):
    path.write_text("".join(canonical_dumps(e) + "\n" for e in events))


def test_merge_event_files_orders_by_time_node_then_original_order(tmp_path):
    a, b, out = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "events.jsonl"
    _write(a, [{"t": 1.0, "node": "w:a:0", "ev": "x", "i": 0},
               {"t": 2.0, "node": "w:a:0", "ev": "x", "i": 1},
               {"t": 2.0, "node": "w:a:0", "ev": "y", "i": 2}])
    _write(b, [{"t": 0.5, "node": "gs:0", "ev": "x", "i": 3},
               {"t": 2.0, "node": "gs:0", "ev": "x", "i": 4},
               {"t": 3.0, "node": "gs:0", "ev": "x", "i": 5}])
    seen = []
    assert merge_event_files([a, b], out, on_event=seen.append) == 6
    assert [e["i"] for e in iter_events(out)] == [3, 0, 4, 1, 2, 5]
    assert seen == list(iter_events(out))
    first = out.read_bytes()
    merge_event_files([a, b], out)
    assert out.read_bytes() == first


def test_merge_event_files_handles_unsorted_inputs_and_refuses_overwriting_input(tmp_path):
    a, out = tmp_path / "a.jsonl", tmp_path / "out.jsonl"
    _write(a, [{"t": 5.0, "node": "n", "ev": "x"}, {"t": 1.0, "node": "n", "ev": "y"}])
    merge_event_files([a], out)
    assert [e["ev"] for e in iter_events(out)] == ["y", "x"]
    with pytest.raises(ValueError, match="also an input"):
        merge_event_files([a], a)


def test_merge_event_files_rewrites_lines_that_are_not_canonical(tmp_path):
    a, b, out = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "out.jsonl"
    a.write_text('{"t": 1.0, "node": "n", "ev": "x"}\n'  # spaces, keys unsorted
                 '{"ev":"y","node":"n","t":2.0,"v":0.123456789012345}\n'  # unrounded float
                 '{"ev":"z","node":"n","t":3.0,"v":NaN}\n')
    # in order at first, then out of order: the streaming merge has begun when it finds out
    _write(b, [{"t": 0.5, "node": "m", "ev": "p"}, {"t": 2.5, "node": "m", "ev": "q"},
               {"t": 0.7, "node": "m", "ev": "r"}])
    seen = []
    assert merge_event_files([a, b], out, on_event=seen.append) == 6
    assert [e["ev"] for e in seen] == ["p", "r", "x", "y", "q", "z"]  # each once, in order
    assert out.read_text().splitlines() == [
        '{"ev":"p","node":"m","t":0.5}', '{"ev":"r","node":"m","t":0.7}',
        '{"ev":"x","node":"n","t":1.0}', '{"ev":"y","node":"n","t":2.0,"v":0.123456789}',
        '{"ev":"q","node":"m","t":2.5}', '{"ev":"z","node":"n","t":3.0,"v":null}']


def test_dc_of_table_places_the_global_tier(tmp_path):
    clock = FakeClock()
    rec = EventRecorder(None, clock, dc_of={"gs:0": "a"})
    _record_sample(rec, clock)
    assert rec.counters.bytes_wan == 0 and rec.counters.bytes_per_dc_pair == {"a->a": 4196}


def test_count_transfer_keeps_what_record_keeps_when_nothing_is_written(tmp_path):
    """The real runtime counts its sends with count_transfer when events are off."""
    dc = {"w:a:0": "a", "gs:0": "central"}
    full = EventRecorder(None, FakeClock(1.25), enabled=False, dc_of=dc, byte_kinds=("send",))
    fast = EventRecorder(None, FakeClock(1.25), enabled=False, dc_of=dc, byte_kinds=("send",))
    assert fast.keeps_only_aggregates("send")
    for src, dst, n in (("w:a:0", "gs:0", 4160), ("gs:0", "w:a:0", 64), ("w:a:0", "w:a:0", 7)):
        full.record("send", src, src=src, dst=dst, msg="PUSH", key=3, bytes=n, channel=0)
        fast.count_transfer("send", src, src, dst, n)
    assert (fast.counts, fast.last_t) == (full.counts, full.last_t)
    assert fast.counters.to_dict() == full.counters.to_dict()
    writing = EventRecorder(tmp_path / "e.jsonl", FakeClock(), byte_kinds=("send",))
    assert not writing.keeps_only_aggregates("send")
    assert EventRecorder(tmp_path / "f.jsonl", FakeClock(), write_kinds=("eval",)
                         ).keeps_only_aggregates("send")
    listened = EventRecorder(None, FakeClock())
    listened.add_listener(lambda ev: None)
    assert not listened.keeps_only_aggregates("send")
