"""The geomx command line as a user runs it."""

import json
import re
import subprocess
import sys
from pathlib import Path

from geomx.cli import main

ROOT = Path(__file__).resolve().parent.parent


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
