"""``[run]``: identity of the run, which runtime executes it, and when it stops."""

from __future__ import annotations

from dataclasses import dataclass

from geomx.scenario.kinds import Choice, Duration, Flag, Fraction, Integer, Section, Text, setting


@dataclass(frozen=True)
class RunConfig(Section):
    """Identity of the run, which runtime executes it, and when it stops.

    The run stops at the first stop condition met. ``epochs > 0`` replaces the
    ``iterations`` limit. At least one stop condition must be set.
    """

    name: str = setting(Text(r"[A-Za-z0-9_.-]+", "letters, digits, '_', '.', '-'"), "geomx",
                        "Run name; the run directory is `<out_dir>/<name>-<time>`.")
    seed: int = setting(Integer(min=0), 0, "Seed for every random choice (data, init, jitter, traces).")
    runtime: str = setting(Choice("emu", "real"), "emu",
                           "`emu`: virtual-time WAN emulator in one process; `real`: sockets, one process per node.")
    iterations: int = setting(Integer(min=0, counts=True), 100,
                              "Per-worker training iterations to run; 0 = unlimited.")
    epochs: int = setting(Integer(min=0), 0,
                          "If > 0, stop after this many epochs of each worker's partition (instead of `iterations`).")
    target_accuracy: float = setting(Fraction(percent=False), 0.0,
                                     "If > 0, stop when test accuracy reaches it (checked at evaluations).")
    max_emulated_time_s: float = setting(Duration(), "0s", "If > 0, stop at this emulated time (emu only).",
                                         key="max_emulated_time")
    max_wall_time_s: float = setting(Duration(), "0s", "If > 0, stop after this much wall-clock time.",
                                     key="max_wall_time")
    eval_every: int = setting(Integer(min=0), 10,
                              "Evaluate test accuracy every N iterations (0 = only at the end).")
    out_dir: str = setting(Text(non_empty=True), "runs", "Directory that receives run directories.")
    progress: bool = setting(Flag(), True, "Show a progress bar on stderr.")

