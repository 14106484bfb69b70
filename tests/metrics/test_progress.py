"""progress.csv writing/reading and the stderr progress bar."""

import io

from geomx.metrics.progress import (
    PROGRESS_COLUMNS,
    ProgressBar,
    ProgressWriter,
    format_duration,
    read_progress,
)
from geomx.metrics.recorder import EventRecorder


def test_progress_csv_has_the_documented_columns_and_round_trips(tmp_path):
    p = tmp_path / "progress.csv"
    with ProgressWriter(p) as w:
        w.write(10, 1.5, loss=0.7, accuracy=0.25, bytes_lan=100, bytes_wan=20, wall_s=0.1)
        w.write(20, 3.0, loss=float("nan"), accuracy=None, bytes_lan=200, bytes_wan=40)
    lines = p.read_text().splitlines()
    assert lines[0] == ",".join(PROGRESS_COLUMNS)
    assert lines[1] == "10,1.5,0.1,0.7,0.25,100,20"
    assert lines[2] == "20,3.0,,nan,,200,40"
    rows = read_progress(p)
    assert rows[0].accuracy == 0.25 and rows[0].bytes_wan == 20
    assert rows[1].accuracy is None and rows[1].wall_s is None
    assert rows[1].loss != rows[1].loss  # NaN survives


def test_wall_clock_fills_wall_s(tmp_path):
    with ProgressWriter(tmp_path / "p.csv", wall_clock=lambda: 42.0) as w:
        row = w.write(1, 0.5)
    assert row.wall_s == 42.0


def test_follow_writes_a_row_per_eval_event_with_bytes_so_far(tmp_path):
    now = [0.0]
    rec = EventRecorder(None, lambda: now[0])
    w = ProgressWriter(tmp_path / "p.csv")
    w.follow(rec)
    rec.record("xfer", "w:a:0", src="w:a:0", dst="ls:b", bytes=64)
    now[0] = 2.5
    rec.record("eval", "w:a:0", iteration=5, loss=1.0, accuracy=0.4)
    rec.record("compute", "w:a:0", dur=0.1)
    w.close()
    rows = read_progress(tmp_path / "p.csv")
    assert len(rows) == 1
    assert (rows[0].iteration, rows[0].t, rows[0].bytes_wan, rows[0].accuracy) == (5, 2.5, 64, 0.4)


def test_bar_is_silent_off_a_terminal_except_for_a_final_line():
    out = io.StringIO()
    bar = ProgressBar(100, stream=out, is_tty=False, now=lambda: 1.0)
    for i in range(1, 101):
        bar.update(i, accuracy=0.5, t=12.0)
    assert out.getvalue() == ""
    bar.close()
    bar.close()
    text = out.getvalue()
    assert text.count("\n") == 1 and "\r" not in text
    assert "100/100" in text and "acc 0.5000" in text and "t 12.0s emu" in text


def test_bar_redraws_in_place_on_a_terminal_with_throttling():
    out = io.StringIO()
    clock = [0.0]
    bar = ProgressBar(10, stream=out, is_tty=True, now=lambda: clock[0], min_interval_s=1.0)
    bar.update(1)
    bar.update(2)  # within the interval: no redraw
    clock[0] = 2.0
    bar.update(3, accuracy=0.9)
    bar.update(10)  # completion is always drawn
    assert out.getvalue().count("\r") == 3
    bar.close()
    assert out.getvalue().endswith("\n")
    assert "[" + "#" * 10 in out.getvalue()


def test_disabled_bar_prints_nothing():
    out = io.StringIO()
    with ProgressBar(5, enabled=False, stream=out, is_tty=True) as bar:
        bar.update(5)
    assert out.getvalue() == ""


def test_bar_follows_eval_events_and_fits_the_width():
    bar = ProgressBar(None, stream=io.StringIO(), is_tty=False, now=lambda: 0.0)
    bar.on_event({"ev": "eval", "t": 3.0, "iteration": 7, "accuracy": 0.75, "loss": 0.3})
    text = bar.render(width=200)
    assert text.startswith("7 it") and "acc 0.7500" in text and "loss 0.3" in text
    assert len(bar.render(width=20)) <= 19


def test_format_duration():
    assert format_duration(5.0) == "5.0s"
    assert format_duration(125) == "2m05s"
    assert format_duration(7500) == "2h05m"
