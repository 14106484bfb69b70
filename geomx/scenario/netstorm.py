"""``[netstorm]``: the NETSTORM controller and servers (docs/papers.md §1, the demo's env).

Only read when ``[topology] kind`` is ``netstorm`` (and ``mlnet`` for ``mlnet_fan_in``).
Defaults are the authors' demo (``scripts/demo/muti_server_resnet.sh``): R = all roots,
1,000,000-element chunks, 4 MB measurement samples, 4 samples per estimate, report and
update thresholds 0, a 2 s check period, multipath on, awareness on.
"""

from __future__ import annotations

from dataclasses import dataclass

from geomx.scenario.kinds import (Choice, Duration, Flag, Integer, Real, Section, Size,
                                  setting)

COSTS = ("bandwidth", "latency")


@dataclass(frozen=True)
class NetstormConfig(Section):
    """NETSTORM's planning, awareness and multipath settings (and MLNET's fan-in)."""

    roots: int = setting(Integer(min=0, max=100000), 0,
                         "R: how many of the best roots own parameters (NUM_ENABLE_SERVER); "
                         "0 = every DC (the demo's R = N).")
    chunk_elements: int = setting(Integer(min=1, counts=True), 1000000,
                                  "Chunk size in elements; chunks are what roots own and what "
                                  "travels (MXNET_KVSTORE_BIGARRAY_BOUND).")
    report_bytes: int = setting(Size(), 4000000,
                                "A data message of at least this many bytes is a throughput "
                                "sample (SIZE_MSG_REPORT).")
    report_samples: int = setting(Integer(min=1, max=1000), 4,
                                  "Samples per link estimate (NUM_MSG_REPORT).")
    report_rate: float = setting(Real(min=0), 0.0,
                                 "Relative change of a link estimate that triggers a "
                                 "SPEED_REPORT to the controller (REPORT_RATE; 0 = every estimate).")
    check_period_s: float = setting(Duration(), "2s",
                                    "How often the controller considers replanning "
                                    "(CHECK_PERIOD), checked at iteration boundaries; 0 = at "
                                    "every boundary.",
                                    key="check_period")
    update_rate: float = setting(Real(min=0), 0.0,
                                 "Mean relative change of the rate matrix since the last plan "
                                 "above which the controller replans (UPDATE_RATE).")
    multipath: bool = setting(Flag(), True,
                              "Auxiliary routes for chunks whose main first-hop queue is busy "
                              "(ENABLE_MUTI_TRACE).")
    awareness: bool = setting(Flag(), True,
                              "Passive network awareness; off = keep the random first plan "
                              "(the ablation's baseline).")
    cost: str = setting(Choice(*COSTS), "bandwidth",
                        "`bandwidth`: path cost sum 1/bw (NETSTORM); `latency`: sum "
                        "(delay + chunk bytes/bw).")
    dynamic_roots: bool = setting(Flag(), False,
                                  "Let the planner choose R (lowest busiest-link load) instead "
                                  "of `roots`.")
    send_window: int = setting(Integer(min=1, max=64), 2,
                               "Unacknowledged data messages in flight per neighbour; the rest "
                               "wait in that neighbour's FIFO queue (what multipath looks at).")
    mlnet_fan_in: int = setting(Integer(min=1, max=1000), 5,
                                "MLNET baseline: fan-in of its static tree (the demo's IN_DEGREE).")
