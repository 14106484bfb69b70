"""Passive link awareness at a receiving server (docs/papers.md §1 (b) Step 4).

NETSTORM measures links from training traffic only, no probes: a data message of at
least ``report_bytes`` carries its sender's clock stamp from the moment it was handed to
the transport; the receiver turns ``arrival - stamp`` into a sample of the incoming link,
and every ``report_samples`` samples into an estimate ``sum bytes / sum seconds``. An
estimate that moved by more than ``report_rate`` (relative) since the last one reported is
returned, for a SPEED_REPORT to the controller.

One refinement over the repo (which needs idle links for honest samples): a message that
was stamped while the previous message on the same link was still arriving had to wait for
it, so its sample starts at that previous arrival (the packet-pair idea), not at its stamp.
The clock is the runtime's: emulated time in the emulator, seconds since the job's shared
start epoch over real sockets (one host, or hosts with synchronised clocks, as NETSTORM's
containers share their host's clock).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["LinkMeter"]


@dataclass
class _LinkState:
    bytes: int = 0
    seconds: float = 0.0
    samples: int = 0
    last_arrival_s: float = float("-inf")
    reported_bps: float | None = None
    estimates: list[float] = field(default_factory=list)


class LinkMeter:
    """Per incoming link ``(from_dc, to_dc)``: samples, estimates and what was reported."""

    def __init__(self, report_bytes: int, report_samples: int, report_rate: float) -> None:
        if report_samples < 1:
            raise ValueError(f"report_samples = {report_samples}; allowed: >= 1")
        self.report_bytes = report_bytes
        self.report_samples = report_samples
        self.report_rate = report_rate
        self.links: dict[tuple[str, str], _LinkState] = {}

    def observe(self, link: tuple[str, str], nbytes: int, sent_s: float,
                arrived_s: float) -> float | None:
        """Note one data message on ``link``; the new estimate (bit/s) when it is due for a
        report, else None."""
        st = self.links.setdefault(link, _LinkState())
        start = max(sent_s, st.last_arrival_s)
        st.last_arrival_s = max(st.last_arrival_s, arrived_s)
        if nbytes < self.report_bytes or arrived_s <= start:
            return None
        st.bytes += nbytes
        st.seconds += arrived_s - start
        st.samples += 1
        if st.samples < self.report_samples:
            return None
        est = st.bytes * 8.0 / st.seconds
        st.bytes, st.seconds, st.samples = 0, 0.0, 0
        st.estimates.append(est)
        last = st.reported_bps
        if last is not None and abs(est - last) <= self.report_rate * last:
            return None
        st.reported_bps = est
        return est
