"""summary.json and load_run: the run folder as notebooks see it."""

import json

import pytest

from geomx.metrics.counters import ByteCounters
from geomx.metrics.progress import ProgressRow, ProgressWriter
from geomx.metrics.recorder import EventRecorder
from geomx.metrics.summary import (
    SUMMARY_FIELDS,
    Summary,
    build_summary,
    load_run,
    read_summary,
    time_to_target,
    write_summary,
)

REQUIRED = {
    "final_accuracy", "final_loss", "iterations", "emulated_seconds", "wall_seconds",
    "bytes_wan", "bytes_lan", "bytes_per_link", "bytes_per_dc_pair",
    "wan_bytes_per_iteration", "messages", "runtime", "scenario_name", "seed",
    "time_to_target_s", "extra",
}  # fmt: skip


def _rows():
    return [
        ProgressRow(10, 5.0, 1.0, 1.2, 0.5, 100, 10),
        ProgressRow(20, 10.0, 2.0, 0.8, 0.8, 200, 20),
        ProgressRow(30, 15.0, 3.0, 0.6, 0.9, 300, 30),
    ]


def test_summary_has_the_documented_fields():
    assert REQUIRED <= set(SUMMARY_FIELDS)


def test_write_and_read_summary_round_trip_and_are_deterministic(tmp_path):
    s = Summary(final_accuracy=0.9, iterations=30, bytes_wan=30, runtime="emu",
                bytes_per_link={"b": 2, "a": 1}, extra={"note": "x"}, seed=1)
    write_summary(tmp_path / "1.json", s)
    write_summary(tmp_path / "2.json", **s.to_dict())
    assert (tmp_path / "1.json").read_bytes() == (tmp_path / "2.json").read_bytes()
    assert read_summary(tmp_path / "1.json") == s
    assert json.loads((tmp_path / "1.json").read_text())["emulated_seconds"] is None


def test_write_summary_rejects_unknown_fields_with_the_allowed_list(tmp_path):
    with pytest.raises(TypeError, match="extra"):
        write_summary(tmp_path / "s.json", accuracy=0.9)


def test_unknown_keys_from_a_newer_writer_land_in_extra():
    s = Summary.from_dict({"iterations": 3, "new_figure": 7, "extra": {"a": 1}})
    assert s.iterations == 3 and s.extra == {"new_figure": 7, "a": 1}


def test_time_to_target_is_first_time_accuracy_reaches_it():
    assert time_to_target(_rows(), 0.8) == 10.0
    assert time_to_target(_rows(), 0.95) is None


def test_build_summary_from_counters_and_progress():
    c = ByteCounters()
    c.add("a", "b", 300, ["wan"])
    c.add("a", "a", 50, ["lan"])
    s = build_summary(c, _rows(), runtime="emu", scenario_name="s", seed=4,
                      emulated_seconds=15.0, target_accuracy=0.85)
    assert (s.final_accuracy, s.final_loss, s.iterations) == (0.9, 0.6, 30)
    assert s.wan_bytes_per_iteration == 10.0
    assert s.messages == 2 and s.bytes_per_dc_pair == {"a->b": 300, "a->a": 50}
    assert s.time_to_target_s == 15.0
    assert build_summary(ByteCounters(), [], runtime="real").wan_bytes_per_iteration is None


def test_load_run_reads_summary_progress_and_streams_events(tmp_path):
    run_dir = tmp_path / "runs" / "demo-1"
    now = [0.0]
    with EventRecorder(run_dir / "events.jsonl", lambda: now[0]) as rec, \
            ProgressWriter(run_dir / "progress.csv") as pw:
        pw.follow(rec)
        for i in (1, 2):
            now[0] = float(i)
            rec.record("xfer", "ls:a", src="ls:a", dst="ls:b", bytes=10, link="wan:a-b")
            rec.record("eval", "w:a:0", iteration=i, loss=1.0 / i, accuracy=0.4 * i)
    build = build_summary(rec.counters, pw.rows, runtime="emu", scenario_name="demo")
    write_summary(run_dir / "summary.json", build)
    (run_dir / "scenario.toml").write_text('[run]\nname = "demo"\n')

    run = load_run(run_dir)
    assert run.name == "demo"
    assert run.summary.bytes_wan == 20 and run.summary.iterations == 2
    assert run.column("accuracy") == [0.4, 0.8]
    assert list(run.columns()["bytes_wan"]) == [10.0, 20.0]
    assert [e["ev"] for e in run.events()] == ["xfer", "eval", "xfer", "eval"]
    assert run.scenario_toml().startswith("[run]")
    with pytest.raises(KeyError, match="columns"):
        run.column("nope")


def test_load_run_tolerates_missing_files_and_rejects_missing_folder(tmp_path):
    run = load_run(tmp_path)
    assert run.summary is None and run.progress == [] and list(run.events()) == []
    assert run.name == tmp_path.name
    with pytest.raises(FileNotFoundError):
        load_run(tmp_path / "absent")
