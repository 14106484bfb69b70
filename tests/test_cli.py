"""The geomx command line as a user runs it."""

import json
import os
import re
import subprocess
import sys

import pytest

from geomx.cli import main

from tests.helpers.paths import ROOT
from tests.helpers.procs import sigint_as_from_a_terminal


def test_help_explains_itself(capsys):
    try:
        main(["--help"])
    except SystemExit as e:
        assert e.code == 0
    out = capsys.readouterr().out
    for word in ("run", "validate", "scenario", "emulator", "--set"):
        assert word in out


def test_validate_prints_resolved_scenario(capsys):
    assert main(["validate", str(ROOT / "scenarios/quickstart.toml"), "--set", "training.lr=0.05"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^lr +\= 0\.05$", out, re.M) and "[[wan]]" in out


def test_bad_field_names_the_field_and_allowed_values(capsys):
    assert main(["validate", str(ROOT / "scenarios/quickstart.toml"),
                 "--set", "sync.algorithm=fastest"]) == 2
    err = capsys.readouterr().err
    assert "sync.algorithm" in err and "fsa" in err and "fastest" in err


def test_unknown_key_in_a_file(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text((ROOT / "scenarios/quickstart.toml").read_text().replace("batch_size", "batchsize"))
    assert main(["validate", str(bad)]) == 2
    assert "batch_size" in capsys.readouterr().err  # did-you-mean


def test_missing_file(capsys):
    assert main(["validate", "/nonexistent/x.toml"]) == 2
    assert "x.toml" in capsys.readouterr().err


def test_run_writes_a_run_folder(tmp_path, capsys):
    code = main(["run", str(ROOT / "scenarios/quickstart.toml"), "--out", str(tmp_path),
                 "--quiet", "--set", "run.iterations=10", "--set", "metrics.plot=false"])
    assert code == 0
    out = capsys.readouterr().out
    assert "run folder:" in out and "final accuracy" in out
    run_dir = next(tmp_path.iterdir())
    assert json.loads((run_dir / "summary.json").read_text())["iterations"] == 10


def test_console_script_entry_point():
    r = subprocess.run([sys.executable, "-m", "geomx", "--help"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "geomx" in r.stdout


def test_unreadable_scenario_files_get_one_line_errors(tmp_path, capsys):
    """Non-UTF-8 text, absurd nesting and a directory: exit 2 with a line naming the
    file and what is wrong, never a traceback."""
    latin = tmp_path / "latin.toml"
    latin.write_bytes('[run]\nname = "café"\n'.encode("latin-1"))
    utf16 = tmp_path / "utf16.toml"
    utf16.write_text('[run]\nname = "x"\n', encoding="utf-16")
    deep = tmp_path / "deep.toml"
    deep.write_text("a = " + "[" * 100_000 + "]" * 100_000 + "\n")
    cases = {latin: "not UTF-8 text (byte 0xe9", utf16: "not UTF-8 text",
             deep: "nested too deeply", tmp_path: "this is a directory"}
    for path, words in cases.items():
        assert main(["validate", str(path)]) == 2
        err = capsys.readouterr().err
        assert words in err and str(path) in err and "Traceback" not in err, err


def test_run_folder_under_a_regular_file_is_refused(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert main(["run", "scenarios/quickstart.toml", "--set", "run.iterations=1",
                 "--out", str(blocker / "runs"), "--quiet"]) == 2
    assert "cannot hold run folders" in capsys.readouterr().err


def test_a_target_that_can_never_be_checked_is_refused(capsys):
    assert main(["validate", "scenarios/quickstart.toml", "--set", "run.eval_every=0",
                 "--set", "run.target_accuracy=0.9"]) == 2
    assert "run.eval_every" in capsys.readouterr().err


@pytest.mark.slow
def test_ctrl_c_prints_one_line_and_exits_130(tmp_path):
    """SIGINT to `geomx run --runtime real`: one line, exit 130, no node left running."""
    import signal
    import time

    p = subprocess.Popen([sys.executable, "-m", "geomx", "run", "scenarios/quickstart.toml",
                          "--runtime", "real", "--quiet", "--out", str(tmp_path),
                          "--set", "run.iterations=100000", "--set", "run.target_accuracy=0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True,
                         preexec_fn=sigint_as_from_a_terminal)
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob("*/logs/*.log")) and time.monotonic() < deadline:
            time.sleep(0.2)  # the nodes are being started
        time.sleep(1.0)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:  # a launcher that ignored it must not train on after the test
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)  # its nodes then see stdin close
            p.wait()
    assert p.returncode == 130, err
    assert "geomx: interrupted" in err and "Traceback" not in err, err
    left = subprocess.run(["pgrep", "-f", f"geomx node .*{tmp_path}"], capture_output=True,
                          text=True).stdout.split()
    assert left == [], left
