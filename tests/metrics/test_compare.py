"""Run comparison (`geomx.metrics.compare`), its Table, and the timeline of one iteration."""

import json
import math
import sys
import types

import numpy as np
import pytest

from geomx.metrics import compare as cmp
from geomx.metrics.progress import ProgressWriter
from geomx.metrics.summary import Summary, write_summary
from geomx.metrics.table import Table
from geomx.metrics.timeline import build_timeline, plot_timeline

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run(path, name, scale=1.0, wan=300_000):
    path.mkdir(parents=True)
    with ProgressWriter(path / "progress.csv") as w:
        for i in range(1, 6):
            w.write(i * 10, i * scale, loss=1.0 / i, accuracy=min(1.0, 0.2 * i),
                    bytes_lan=i * 1_000_000, bytes_wan=i * wan, wall_s=i * 0.1)
    write_summary(path / "summary.json", Summary(
        scenario_name=name, emulated_seconds=5 * scale, wall_seconds=0.5, runtime="emu",
        iterations=50, final_accuracy=1.0, bytes_wan=5 * wan, target_accuracy=0.6,
        time_to_target_s=3 * scale,
        bytes_per_link={"a->c": 5 * wan, "c->a": 4 * wan, "w:a:0->sw:a": 9_000_000}))
    return path


def test_table_keeps_types_and_round_trips_csv(tmp_path):
    t = Table.from_rows([{"n": 1, "x": 0.5, "s": "a"}, {"n": 2, "x": None, "s": "b"}])
    assert t["n"].dtype == np.int64 and t["x"].dtype == np.float64 and t["s"].dtype == object
    assert math.isnan(t["x"][1])
    t.to_csv(tmp_path / "t.csv")
    back = Table.read_csv(tmp_path / "t.csv")
    assert list(back.rows()) == [{"n": 1, "x": 0.5, "s": "a"}, {"n": 2, "x": None, "s": "b"}]
    with pytest.raises(ValueError, match="3 values"):
        t["bad"] = [1, 2, 3]
    with pytest.raises(KeyError, match="columns: n, x, s"):
        t["nope"]
    assert "-" in t.to_text()  # a missing value shows as '-'


def test_compare_gives_figures_and_ratios_to_the_first_run(tmp_path):
    a = _run(tmp_path / "a", "fsa")
    b = _run(tmp_path / "b", "esync", scale=0.5, wan=150_000)
    t = cmp.compare_table([a, b])
    assert list(t["run"]) == ["fsa", "esync"]
    assert list(t["time_to_target_s"]) == [3.0, 1.5]
    assert list(t["bytes_wan_vs_first"]) == [1.0, 0.5]
    assert list(t["emulated_seconds_vs_first"]) == [1.0, 0.5]
    assert list(t["wall_seconds_vs_first"]) == [1.0, 1.0]
    # a target of our own is recomputed from progress.csv
    t = cmp.compare_table([a, b], target_accuracy=0.8)
    assert list(t["time_to_target_s"]) == [4.0, 2.0]
    text = cmp.format_comparison(t)
    assert text.splitlines()[0].split()[:3] == ["run", "accuracy", "to"]
    assert "0.500" in text  # the WAN ratio of the second run


def test_same_scenario_names_are_told_apart_by_folder(tmp_path):
    t = cmp.compare_table([_run(tmp_path / "x1", "q"), _run(tmp_path / "x2", "q")])
    assert list(t["run"]) == ["q (x1)", "q (x2)"]


def test_bad_sources_are_named(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty: not a run folder"):
        cmp.compare_table([tmp_path / "empty"])
    with pytest.raises(ValueError, match="nothing to compare"):
        cmp.compare_table([])
    with pytest.raises(ValueError, match="2 entries for 1 runs"):
        cmp.compare_table([_run(tmp_path / "a", "a")], labels=["x", "y"])


def test_compare_returns_a_dataframe_when_pandas_is_there(tmp_path, monkeypatch):
    a = _run(tmp_path / "a", "fsa")
    fake = types.ModuleType("pandas")
    fake.DataFrame = lambda columns: ("frame", dict(columns))
    monkeypatch.setitem(sys.modules, "pandas", fake)
    kind, columns = cmp.compare([a])
    assert kind == "frame" and list(columns["run"]) == ["fsa"]
    monkeypatch.setitem(sys.modules, "pandas", None)  # not installed
    assert isinstance(cmp.compare([a]), Table)


def test_comparison_plots(tmp_path):
    runs = [_run(tmp_path / "a", "fsa"), _run(tmp_path / "b", "hfa", scale=0.5)]
    figs = cmp.plot_comparison(runs, tmp_path / "out")
    assert sorted(figs) == ["compare_accuracy_time.png", "compare_accuracy_wan.png",
                            "compare_wan_links.png"]
    for name in figs:
        assert (tmp_path / "out" / name).read_bytes()[:8] == PNG_MAGIC
    labels = [line.get_label() for line in figs["compare_accuracy_time.png"].axes[0].get_lines()]
    assert labels == ["fsa", "hfa"]
    # only the WAN links are drawn per run
    ticks = [t.get_text() for t in figs["compare_wan_links.png"].axes[0].get_yticklabels()]
    assert ticks == ["a->c", "c->a"]


def _events(path):
    evs = []
    for it, t in ((1, 0.0), (2, 1.0), (3, 2.0)):
        evs.append({"ev": "compute", "node": "w:a:0", "iteration": it, "t": t + 0.1,
                    "t_start": t, "dur": 0.1})
        evs.append({"ev": "compute", "node": "w:a:1", "iteration": it, "t": t + 0.2,
                    "t_start": t, "dur": 0.2})
        evs.append({"ev": "xfer", "msg": "PUSH", "src": "w:a:0", "dst": "gs:0", "t": t + 0.1,
                    "dur": 0.5, "bytes": 100, "path": ["w:a:0->sw:a", "a->c", "sw:c->gs:0"]})
        evs.append({"ev": "xfer", "msg": "PULL_REPLY", "src": "gs:0", "dst": "w:a:0",
                    "t": t + 0.7, "dur": 0.6, "bytes": 100, "dropped": False,
                    "path": ["gs:0->sw:c", "c->a", "sw:a->w:a:0"]})
    path.write_text("".join(json.dumps(e) + "\n" for e in evs))
    return path


def test_timeline_of_one_iteration(tmp_path):
    events = _events(tmp_path / "events.jsonl")
    tl = build_timeline(events)
    assert (tl.node, tl.iteration, tl.t0, tl.t1) == ("w:a:0", 2, 1.0, 2.0)
    # the previous iteration's pull reply (0.7 .. 1.3 s) and this one's (1.7 .. 2.3 s),
    # both clipped to the window
    def spans(row):
        return [(round(a, 6), round(b, 6), kind) for a, b, kind in tl.rows[row]]

    assert spans("c->a") == [(1.0, 1.3, "PULL_REPLY"), (1.7, 2.0, "PULL_REPLY")]
    assert spans("a->c") == [(1.1, 1.6, "PUSH")]
    assert spans("compute w:a:1") == [(1.0, 1.2, "compute")]
    fig = plot_timeline(tl, tmp_path / "timeline.png")
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels[::-1][:2] == ["a->c", "c->a"]  # WAN links on top (ticks go bottom-up)
    assert labels[0] == "compute w:a:1"
    assert (tmp_path / "timeline.png").read_bytes()[:8] == PNG_MAGIC
    assert build_timeline(events, iteration=3, node="w:a:1").t1 == pytest.approx(2.2)
    with pytest.raises(ValueError, match="allowed: 1..3"):
        build_timeline(events, iteration=9)
    (tmp_path / "none.jsonl").write_text("")
    with pytest.raises(ValueError, match="no compute events"):
        build_timeline(tmp_path / "none.jsonl")


def test_timeline_of_a_real_run_shows_send_ticks_per_node(tmp_path):
    evs = []
    for it, t in ((1, 0.0), (2, 1.0), (3, 2.0)):
        evs.append({"ev": "compute", "node": "w:a:0", "iteration": it, "t": t + 0.1,
                    "t_start": t, "dur": 0.1})
        evs.append({"ev": "send", "node": "w:a:0", "src": "w:a:0", "dst": "ls:a",
                    "msg": "PUSH", "bytes": 10, "t": t + 0.1})
        evs.append({"ev": "send", "node": "ls:a", "src": "ls:a", "dst": "gs:0",
                    "msg": "PUSH", "bytes": 10, "t": t + 0.2})
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evs))
    tl = build_timeline(tmp_path)
    assert tl.rows["sends by ls:a"] == [(1.2, 1.2, "PUSH")]
    assert tl.rows["sends by w:a:0"] == [(1.1, 1.1, "PUSH")]
    fig = plot_timeline(tl)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()][::-1]
    assert labels == ["sends by ls:a", "sends by w:a:0", "compute w:a:0"]
