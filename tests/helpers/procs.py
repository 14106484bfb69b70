"""Finding a test's child processes through /proc, and killing and restarting one node
of a real job (tests that kill nodes or their sockets)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

from tests.helpers.paths import ROOT


def sigint_as_from_a_terminal() -> None:
    """``preexec_fn`` for a child a test interrupts with SIGINT: the default disposition,
    as a terminal's foreground job has. A suite run as a background job of a
    non-interactive shell has SIGINT ignored, children inherit that, and the interrupt
    would then never arrive."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children, ...), read from /proc."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def command_lines() -> Iterator[tuple[int, list[bytes]]]:
    """``(pid, argv)`` of every live process, read from /proc. A node the launcher forked
    shows its command line as one string (setproctitle): that is split at spaces here, so
    both kinds read alike."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            raw = (d / "cmdline").read_bytes()
        except OSError:
            continue
        args = raw.rstrip(b"\0").split(b"\0")
        if len(args) == 1:
            args = args[0].split(b" ")
        yield int(d.name), args


def pid_of(node: str, marker: str) -> int | None:
    """The pid of the live ``node`` process whose command line mentions ``marker`` (a
    run folder), not counting one restarted with ``--rejoin``."""
    for pid, cmd in command_lines():
        if node.encode() in cmd and any(marker.encode() in c for c in cmd) \
                and b"--rejoin" not in cmd:
            return pid
    return None


def launch_and_kill(tmp_path: Path, scenario: Path, sets: list[str], node: str, *,
                    watch: str, steps: int, rejoin_log: str | None = None) -> tuple[Path, Path]:
    """``geomx launch`` ``scenario`` over real sockets; once worker ``watch`` (a file name
    stem, e.g. ``w_party-a_0``) has computed ``steps`` times, SIGKILL ``node``, and, with a
    ``rejoin_log``, start its command again with ``--rejoin`` (its output in that file);
    every process started must exit 0. The run folder and the launch log."""
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "PYTHONUNBUFFERED": "1"}
    out = tmp_path / "real"
    log = tmp_path / "launch.log"
    p = subprocess.Popen([sys.executable, "-m", "geomx", "launch", str(scenario), "--quiet",
                          "--out", str(out), *[a for s in sets for a in ("--set", s)]],
                         env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                         start_new_session=True)
    back = None
    try:
        deadline = time.monotonic() + 120
        victim = run_dir = None
        while victim is None and time.monotonic() < deadline and p.poll() is None:
            for f in out.glob(f"*/nodes/{watch}.events.jsonl"):
                if f.read_text().count('"ev":"compute"') >= steps:
                    run_dir = f.parent.parent
                    victim = pid_of(node, str(run_dir))
            time.sleep(0.05)
        assert victim is not None, log.read_text()[-3000:]
        os.kill(victim, signal.SIGKILL)
        if rejoin_log is not None:
            cmd = json.loads((run_dir / "launch.json").read_text())["commands"][node]
            args = [a for a in shlex.split(cmd) if a != "--watch-stdin"] + ["--rejoin"]
            back = subprocess.Popen(args, env=env, stdout=(tmp_path / rejoin_log).open("w"),
                                    stderr=subprocess.STDOUT, start_new_session=True)
        assert p.wait(timeout=240) == 0, log.read_text()[-3000:]
        if back is not None:
            assert back.wait(timeout=60) == 0, (tmp_path / rejoin_log).read_text()[-3000:]
    finally:
        for q in (p, back):
            if q is not None and q.poll() is None:
                os.killpg(q.pid, signal.SIGKILL)
                q.wait()
    return run_dir, log


def launch_kill_rejoin(tmp_path: Path, scenario: Path, sets: list[str], node: str, *,
                       watch: str, steps: int, rejoin_log: str) -> tuple[Path, Path]:
    """:func:`launch_and_kill` with ``node`` restarted with ``--rejoin``."""
    return launch_and_kill(tmp_path, scenario, sets, node, watch=watch, steps=steps,
                           rejoin_log=rejoin_log)
