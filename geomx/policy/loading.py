"""Building a policy object from what a scenario or a job spec says about it.

A node gets a policy as a name (``"netstorm"``, an absolute ``"/lab/ring.py:Ring"``) and
its options table (``[<kind>.options]``, or
:func:`~geomx.policy.options.options_to_table` of the object the job was planned with),
both plain values that travel to every node process. :func:`build_policy` turns them back
into the object: the class from :func:`~geomx.policy.registry.policy_class`, its options
checked by :func:`~geomx.policy.options.options_from_table`, so a node in the emulator and
one over sockets build the same object.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from geomx.policy.options import options_from_table
from geomx.policy.registry import describe_spec, policy_class

__all__ = ["build_policy"]


def build_policy(kind: str, spec: str, options: Mapping[str, Any] | None = None) -> Any:
    """The policy of ``kind`` that ``spec`` names, built from its options table; raises
    :class:`~geomx.policy.registry.PolicyError` or
    :class:`~geomx.policy.options.OptionsError` with one line naming the policy."""
    cls = policy_class(kind, spec)
    return cls(options_from_table(cls.Options, options, policy=describe_spec(kind, spec),
                                  where=f"{kind}.options"))
