"""Per-channel figures of DGT for ``summary.json`` (``extra["dgt"]``).

The local servers record ``dgt_sender_totals`` and the global servers
``dgt_receiver_totals`` when they finish (geomx/sched/dgt.py); both runtimes' events go
through :class:`DgtTally`, so the summary has the same fields in each. Per band (0 =
the reliable channel, 1..C = the low-priority channels): blocks and bytes sent, blocks
received on time (before their round's end block) and late (added into the next round),
and dropped = sent - received (lost on an unreliable channel, or still in flight when
the run ended).
"""

from __future__ import annotations

from typing import Any


class DgtTally:
    """Sums DGT totals events into a per-band table."""

    def __init__(self) -> None:
        self.sent_blocks: list[int] = []
        self.sent_bytes: list[int] = []
        self.received: list[int] = []
        self.on_time: list[int] = []
        self.late: list[int] = []
        self.skipped = 0
        self.missing = 0
        self.unapplied = 0
        self.assemblies = 0
        self.seen = False

    def on_event(self, ev: dict[str, Any]) -> None:
        kind = ev.get("ev")
        if kind == "dgt_sender_totals":
            self.seen = True
            _add(self.sent_blocks, ev.get("blocks"))
            _add(self.sent_bytes, ev.get("bytes"))
            self.skipped += int(ev.get("skipped", 0))
        elif kind == "dgt_receiver_totals":
            self.seen = True
            _add(self.received, ev.get("received"))
            _add(self.on_time, ev.get("on_time"))
            _add(self.late, ev.get("late"))
            self.missing += int(ev.get("missing", 0))
            self.unapplied += int(ev.get("unapplied", 0))
            self.assemblies += int(ev.get("assemblies", 0))

    def as_dict(self) -> dict[str, Any]:
        n = max(len(self.sent_blocks), len(self.received))
        bands = []
        for b in range(n):
            sent = _at(self.sent_blocks, b)
            got = _at(self.received, b)
            bands.append({"band": b, "sent_blocks": sent, "sent_bytes": _at(self.sent_bytes, b),
                          "on_time": _at(self.on_time, b), "late": _at(self.late, b),
                          "dropped": max(0, sent - got)})
        return {"bands": bands, "skipped_blocks": self.skipped,
                "missing_at_assembly": self.missing, "late_unapplied_at_end": self.unapplied,
                "assemblies": self.assemblies}


def _add(acc: list[int], values: Any) -> None:
    if not isinstance(values, list):
        return
    while len(acc) < len(values):
        acc.append(0)
    for i, v in enumerate(values):
        acc[i] += int(v)


def _at(values: list[int], i: int) -> int:
    return values[i] if i < len(values) else 0
