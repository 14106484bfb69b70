"""The ``[sweep]`` section: where `geomx sweep` runs a scenario's points.

A study that outgrows one machine names its Dask scheduler once, in the scenario, instead
of on every command line (docs/sweeps.md). It says where points run, not what they
compute, so it is left out of a written scenario when unset and never enters a sweep
point's identity (geomx/sweep.py): moving a study to a cluster reruns nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from geomx.scenario.kinds import Section, Text, setting

#: A Dask scheduler address: tcp:// (or tls://) and host:port, or a bare host:port.
_SCHEDULER = r"((tcp|tls)://)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):[0-9]{1,5}"


@dataclass(frozen=True)
class SweepConfig(Section):
    """Sweeps: where `geomx sweep` runs the points (docs/sweeps.md). `--cluster` on the
    command line, then `$GEOMX_CLUSTER`, then this table; none of them: local processes."""

    #: left out of a written scenario when unset (it never changes what a run computes)
    omit_defaults = True

    cluster: str = setting(Text(rf"({_SCHEDULER})?", "'tcp://HOST:PORT' or empty"), "",
                           "Dask scheduler the sweep's points run on (`dask scheduler` prints "
                           "its address); \"\" = local processes (`--jobs`).")
