"""Scenario fuzz: hundreds of generated bad scenario files, each either refused
with one clear line (exit 2) or accepted with a resolved scenario that loads again; never
a traceback, never a hang.

The files are generated from the quickstart: every field set to values people get wrong
(non-finite numbers, absurd units, wrong types, empty strings, huge strings, negative
counts), and whole files that are not what they claim (other encodings, binary, truncated
TOML, 100,000-deep nesting, a directory). ``geomx validate`` runs in-process on each
with an alarm as the hang detector. The tally is printed (figures for the issue note).
"""

from __future__ import annotations

import contextlib
import copy
import io
import signal
import tomllib
from pathlib import Path

import pytest
import tomli_w

from geomx.cli import main

from tests.helpers.paths import ROOT

HANG_S = 10

#: Values people write by mistake, tried in every field below.
BAD_VALUES = ["1e999s", "1e999Mbps", "NaN", "-1", "", "1e999MiB", "x" * 5000, "-inf",
              True, [1, 2], {"a": 1}, -1, 10**30, 1e308, float("nan"), float("inf")]

#: Fields of the quickstart (section, index for arrays of tables, key).
FIELDS = [("run", None, "iterations"), ("run", None, "seed"), ("run", None, "target_accuracy"),
          ("run", None, "eval_every"), ("run", None, "max_emulated_time"),
          ("run", None, "name"),
          ("dc", 0, "name"), ("dc", 0, "global_servers"), ("dc", 1, "workers"),
          ("dc", 1, "compute_per_iter"), ("dc", 1, "lan_bandwidth"), ("dc", 1, "lan_latency"),
          ("wan", 0, "bandwidth"), ("wan", 0, "latency"), ("wan", 0, "loss"),
          ("wan", 0, "jitter"), ("wan", 1, "a"), ("wan", 0, "trace"),
          ("training", None, "lr"), ("training", None, "batch_size"),
          ("training", None, "hidden"), ("training", None, "dataset"),
          ("training", None, "optimizer"), ("network", None, "tcp_window"),
          ("network", None, "mss"), ("codec", None, "type"), ("codec", None, "threshold"),
          ("sched", None, "p3_slice_elements"), ("membership", None, "heartbeat_timeout"),
          ("real", None, "connect_timeout")]


def _quickstart() -> dict:
    return tomllib.loads((ROOT / "scenarios/quickstart.toml").read_text())


def _field_cases() -> list[tuple[str, bytes]]:
    base = _quickstart()
    cases = []
    for section, index, key in FIELDS:
        for value in BAD_VALUES:
            raw = copy.deepcopy(base)
            table = raw.setdefault(section, {} if index is None else [{}])
            if index is not None:
                table = table[index]
            table[key] = value
            try:
                text = tomli_w.dumps(raw).encode()
            except (ValueError, TypeError):  # TOML cannot hold it (nan key etc.): write by hand
                continue
            cases.append((f"{section}{'' if index is None else f'[{index}]'}.{key}={value!r:.30}",
                          text))
    return cases


def _file_cases(tmp: Path) -> list[tuple[str, bytes | Path]]:
    text = (ROOT / "scenarios/quickstart.toml").read_text()
    latin = text.replace("# GeoMX's demo", "# Démo GeoMX") + '\n# café\n'
    (tmp / "a_dir").mkdir(exist_ok=True)
    return [
        ("latin-1", latin.encode("latin-1")),
        ("utf-16", text.encode("utf-16")),
        ("binary", bytes(range(256)) * 8),
        ("truncated", text[: len(text) // 2].encode() + b"\n[[dc]\n"),
        ("deep array", b"x = " + b"[" * 100_000 + b"]" * 100_000 + b"\n"),
        ("deep table", b"x = " + b"{a = " * 5000 + b"1" + b"}" * 5000 + b"\n"),
        ("unknown section", text.encode() + b"\n[nonsense]\na = 1\n"),
        ("unknown key", text.encode() + b"\n[codec]\ntypo_key = 1\n"),
        ("dc is a number", b"dc = 3\n"),
        ("wan to nowhere", text.encode() + b'\n[[wan]]\na = "party-a"\nb = "mars"\n'),
        ("duplicate dc", text.encode() + b'\n[[dc]]\nname = "party-a"\n'),
        ("two central", text.encode() + b'\n[[dc]]\nname = "x"\ncentral = true\n'),
        ("target never checked", text.replace("eval_every = 10", "eval_every = 0")
         .replace("iterations = 300", "iterations = 0").encode()),
        ("nul bytes", b"\x00" * 100),
        ("a directory", tmp / "a_dir"),
        ("missing file", tmp / "does_not_exist.toml"),
    ]


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang()


def _validate(path: Path) -> tuple[str, int, str, str]:
    """('valid' | 'error' | 'traceback' | 'hang', exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(HANG_S)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["validate", str(path)])
    except _Hang:
        return "hang", -1, out.getvalue(), err.getvalue()
    except BaseException as e:  # noqa: BLE001 - what escapes main() is a traceback for a user
        return "traceback", -1, out.getvalue(), f"{type(e).__name__}: {e}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return ("valid" if code == 0 else "error"), code, out.getvalue(), err.getvalue()


@pytest.mark.slow
def test_generated_bad_scenarios_get_one_clear_line_or_load_again(tmp_path):
    cases: list[tuple[str, bytes | Path]] = [*_field_cases(), *_file_cases(tmp_path)]
    assert len(cases) >= 100
    tally = {"valid": 0, "error": 0, "traceback": 0, "hang": 0}
    problems = []
    for i, (label, content) in enumerate(cases):
        if isinstance(content, Path):
            path = content
        else:
            path = tmp_path / f"case{i}.toml"
            path.write_bytes(content)
        kind, code, out, err = _validate(path)
        tally[kind] += 1
        if kind in ("hang", "traceback"):
            problems.append(f"{label}: {kind}: {err[-300:]}")
        elif kind == "error":
            lines = [ln for ln in err.splitlines() if ln.strip()]
            if code != 2 or len(lines) != 1 or not lines[0].startswith("geomx"):
                problems.append(f"{label}: exit {code}, stderr {err[-300:]!r}")
        else:
            # accepted: the fully resolved scenario it prints must load again, unchanged
            again = tmp_path / f"case{i}.resolved.toml"
            again.write_text(out)
            kind2, code2, out2, err2 = _validate(again)
            if kind2 != "valid" or out2.splitlines()[2:] != out.splitlines()[2:]:
                problems.append(f"{label}: accepted, but its resolved form does not load "
                                f"again: {err2[-300:]!r}")
    print(f"\nscenario fuzz: {len(cases)} files: {tally['error']} clear errors, "
          f"{tally['valid']} accepted (and re-loaded), {tally['traceback']} tracebacks, "
          f"{tally['hang']} hangs")
    assert not problems, "\n".join(problems[:20])
    assert tally["traceback"] == tally["hang"] == 0
    assert tally["error"] >= 0.8 * len(cases)


@pytest.mark.parametrize("value", ["1e999s", "NaN", "-inf"])
def test_non_finite_durations_name_the_field(tmp_path, value, capsys):
    raw = _quickstart()
    raw["wan"][0]["latency"] = value
    path = tmp_path / "s.toml"
    path.write_text(tomli_w.dumps(raw))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "wan[0].latency" in err or "wan.0.latency" in err


@pytest.mark.parametrize("section, index, key, value", [
    ("dc", 1, "workers", 10**30), ("wan", 0, "latency", 1e308), ("wan", 0, "bandwidth", "1e20Gbps"),
    ("network", None, "tcp_window", "2GiB"), ("run", None, "iterations", 2**60),
])
def test_absurdly_large_values_are_refused_naming_the_field(tmp_path, capsys, section, index,
                                                            key, value):
    raw = _quickstart()
    table = raw.setdefault(section, {})
    (table[index] if index is not None else table)[key] = value
    path = tmp_path / "s.toml"
    path.write_text(tomli_w.dumps(raw))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    where = f"{section}[{index}].{key}" if index is not None else f"{section}.{key}"
    assert where in err and ("absurdly large" in err or "out of range" in err), err
