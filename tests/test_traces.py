"""Bandwidth traces: step functions that say when they change next."""

from __future__ import annotations

import math

import pytest

from geomx.traces import (
    BandwidthTrace, ConstantTrace, CsvTrace, StepTrace, TraceError, UniformRandomTrace,
)


def test_constant_trace_never_changes():
    t = ConstantTrace(100e6)
    assert isinstance(t, BandwidthTrace)
    assert t.rate_at(0.0) == t.rate_at(1e9) == 100e6
    assert t.next_change_after(5.0) == math.inf
    with pytest.raises(TraceError):
        ConstantTrace(-1)


def test_step_trace_holds_each_rate_until_the_next_point():
    t = StepTrace([(1.0, 10.0), (4.0, 20.0), (6.0, 20.0), (9.0, 5.0)])
    assert t.times_s == [1.0, 4.0, 9.0]  # the repeated 20 is merged
    assert [t.rate_at(x) for x in (0.0, 1.0, 3.999, 4.0, 8.0, 9.0, 1e6)] == \
        [10.0, 10.0, 10.0, 20.0, 20.0, 5.0, 5.0]
    assert [t.next_change_after(x) for x in (0.0, 1.0, 4.0, 8.5, 9.0)] == \
        [4.0, 4.0, 9.0, 9.0, math.inf]


def test_step_trace_rejects_times_that_go_backwards():
    with pytest.raises(TraceError, match="strictly increasing"):
        StepTrace([(0.0, 1.0), (2.0, 1.0), (2.0, 3.0)])


def test_csv_trace_with_header_in_base_units(tmp_path):
    p = tmp_path / "wan.csv"
    p.write_text("time_s,bandwidth_bps\n0,100000000\n4,50000000\n")
    t = CsvTrace(p)
    assert t.rate_at(3.9) == 100e6 and t.rate_at(4.0) == 50e6
    assert t.next_change_after(0.0) == 4.0


def test_csv_trace_units_from_header_and_cells(tmp_path):
    p = tmp_path / "wan.csv"
    p.write_text("# measured on 2023-05-01\n"
                 "time_ms,bandwidth_mbps\n"
                 "0,100\n"
                 "\n"
                 "1500,20.5\n"
                 "3s,1Gbps\n")
    t = CsvTrace(p)
    assert t.times_s == [0.0, 1.5, 3.0]
    assert t.rates_bps == [100e6, 20.5e6, 1e9]


def test_csv_trace_without_header(tmp_path):
    p = tmp_path / "wan.csv"
    p.write_text("0, 1e8\n10, 2e8\n")
    assert CsvTrace(p).rate_at(10) == 2e8


@pytest.mark.parametrize("body, line, reason", [
    ("time_s,bandwidth_bps\n0,1e8\n5,1e8\n3,2e8\n", 4, "strictly increasing"),
    ("time_s,bandwidth_bps\n0,fast\n", 2, "cannot read bandwidth"),
    ("time_s,bandwidth_bps\n0,100Mbit\n", 2, "unknown bandwidth unit"),
    ("time_s,bandwidth_bps\n0,-5\n", 2, "cannot read bandwidth|>= 0"),
    ("time_s\n", 1, "two columns"),
    ("when,how_fast\n0,1\n", 1, "unknown header"),
])
def test_csv_trace_errors_name_file_and_line(tmp_path, body, line, reason):
    p = tmp_path / "bad.csv"
    p.write_text(body)
    with pytest.raises(TraceError, match=rf"bad\.csv:{line}: .*({reason})"):
        CsvTrace(p)


def test_csv_trace_missing_or_empty_file(tmp_path):
    with pytest.raises(TraceError, match="nope.csv: cannot read"):
        CsvTrace(tmp_path / "nope.csv")
    p = tmp_path / "empty.csv"
    p.write_text("time_s,bandwidth_bps\n")
    with pytest.raises(TraceError, match="no data rows"):
        CsvTrace(p)


def test_uniform_random_trace_is_deterministic_and_within_bounds():
    a = UniformRandomTrace(20e6, 155e6, period_s=180.0, seed=11)
    b = UniformRandomTrace(20e6, 155e6, period_s=180.0, seed=11)
    c = UniformRandomTrace(20e6, 155e6, period_s=180.0, seed=12)
    times = [k * 180.0 + 1.0 for k in range(600)]
    ra = [a.rate_at(t) for t in times]
    # query b in reverse order: the value of a step must not depend on query order
    rb = [b.rate_at(t) for t in reversed(times)][::-1]
    assert ra == rb
    assert ra != [c.rate_at(t) for t in times]
    assert all(20e6 <= r <= 155e6 for r in ra)
    assert len(set(ra)) > 590  # actually random
    assert abs(sum(ra) / len(ra) - 87.5e6) < 5e6


def test_uniform_random_trace_steps_every_period():
    t = UniformRandomTrace(1.0, 2.0, period_s=0.1, seed=0)
    assert t.rate_at(0.0) == t.rate_at(0.0999)
    assert t.next_change_after(0.0) == pytest.approx(0.1)
    for k in range(1, 200):
        boundary = t.next_change_after((k - 1) * 0.1 + 0.05)
        assert boundary == k * 0.1
        assert t.next_change_after(boundary) > boundary  # strictly after
        assert t.rate_at(boundary) == t.rate_at(boundary + 0.01)


def test_uniform_random_trace_validates_arguments():
    with pytest.raises(TraceError, match="high"):
        UniformRandomTrace(10.0, 5.0, period_s=1.0)
    with pytest.raises(TraceError, match="period_s"):
        UniformRandomTrace(1.0, 5.0, period_s=0.0)
