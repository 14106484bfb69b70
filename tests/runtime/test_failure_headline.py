"""The real runtime's failure text leads with the node the failure started on, as the
emulator's does, not with the first process to exit (often a scheduler that relayed it)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from geomx.runtime.launcher import _failure_headline

_CAUSE = """\
2026-11-28 15:06:58,043 ERROR geomx.runtime.node_main: node w:a:1 failed
Traceback (most recent call last):
  File "/x/geomx/node/program.py", line 444, in run_user_program
    returned = await func(kv, ctx)
  File "/tmp/train.py", line 10, in main
    raise ValueError("boom at 3")
ValueError: boom at 3

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/x/geomx/node/program.py", line 456, in run_user_program
    raise ProgramError("...")
geomx.node.program.ProgramError: training program 'train.py' raised on node w:a:1: ValueError: boom at 3
geomx node w:a:1: failed: ProgramError: training program 'train.py' raised on node w:a:1: ValueError: boom at 3
"""


def _job(tmp_path: Path, logs: dict[str, str], codes: dict[str, int]) -> dict:
    (tmp_path / "logs").mkdir()
    for name, text in logs.items():
        (tmp_path / "logs" / f"{name.replace(':', '_')}.log").write_text(text)
    return {n: SimpleNamespace(returncode=c) for n, c in codes.items()}


def test_the_origin_leads_and_its_own_frame_is_shown(tmp_path):
    relayed = ("geomx node lh:a: failed: NodeFailure: node w:a:1 failed: ProgramError: "
               "boom (reported by w:a:1) (reported by ls:a)\n")
    procs = _job(tmp_path, {"lh:a": relayed, "w:a:1": _CAUSE, "gh": relayed.replace("lh:a", "gh")},
                 {"lh:a": 1, "gh": 1, "w:a:1": 1})
    text = _failure_headline(tmp_path, procs, "lh:a", "exited with code 1",
                             ["lh:a", "gh", "w:a:1"])
    head, *rest = text.splitlines()
    assert head == ("node w:a:1 failed: ProgramError: training program 'train.py' raised on "
                    "node w:a:1: ValueError: boom at 3")
    assert "first process to exit: lh:a, which exited with code 1" in rest[0]
    assert 'File "/tmp/train.py", line 10, in main' in text  # the user's frame, not geomx's
    assert "ProgramError(" not in text


def test_a_node_killed_from_outside_leads_even_when_others_exited_first(tmp_path):
    relayed = ("geomx node ls:a: failed: NodeFailure: node w:a:1 was killed by signal 9 "
               "(seen by the launcher)\n")
    procs = _job(tmp_path, {"ls:a": relayed, "w:a:1": "training...\n"},
                 {"ls:a": 1, "w:a:1": -9})
    text = _failure_headline(tmp_path, procs, "w:a:1", "was killed by signal 9",
                             ["w:a:1", "ls:a"])
    assert text.splitlines()[0] == "node w:a:1 was killed by signal 9"


def test_a_relayed_failure_whose_origin_left_no_log_line_still_names_it(tmp_path):
    relayed = ("geomx node gh: failed: NodeFailure: node w:a:0 failed: heartbeat lost "
               "(reported by lh:a)\n")
    procs = _job(tmp_path, {"gh": relayed}, {"gh": 1, "w:a:0": 0})
    text = _failure_headline(tmp_path, procs, "gh", "exited with code 1", ["gh", "w:a:0"])
    assert text.splitlines()[0] == ("node w:a:0 failed: heartbeat lost (reported by lh:a)")
    assert "first process to exit: gh, which exited with code 1" in text
