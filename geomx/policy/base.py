"""The base of every policy class: a kind, a name, typed options, saved state.

Each kind's abstract class (:class:`geomx.policy.sync.SyncAlgorithm`,
:class:`geomx.policy.scheduling.TransferScheduler`,
:class:`geomx.policy.topology.Topology`; codecs follow
:class:`geomx.policy.codec.CodecPolicy`) derives from :class:`Policy`. A policy object
is built once per node from its options (``Options``, a frozen dataclass checked when
the scenario loads: :mod:`geomx.policy.options`), like a Flower ``Strategy`` a user
instantiates and hands to the server.

Checkpoints ask every policy for its state (:meth:`Policy.state_dict`) and a resumed or
taken-over node hands it back (:meth:`Policy.load_state_dict`), so a policy with memory
(HFA's milestone, SSP's clocks, a codec's residuals) survives a restart with the rest
of the job. State is a tree of dicts, lists, numbers, strings and numpy arrays.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

from geomx.policy.options import NoOptions, PolicyOptions

__all__ = ["Policy"]


class Policy(abc.ABC):
    """A named, configurable piece of behaviour a node runs (one per kind and node)."""

    #: ``"sync"``, ``"sched"`` or ``"topology"`` (set by each kind's base class)
    kind: ClassVar[str] = ""
    #: The name events and errors use; a built-in's is its scenario name.
    name: ClassVar[str] = ""
    #: The options dataclass ``[<kind>.options]`` is checked against.
    Options: ClassVar[type[PolicyOptions]] = NoOptions

    def __init__(self, options: PolicyOptions | None = None) -> None:
        self.options = options if options is not None else self.Options()

    def state_dict(self) -> Any:
        """What a checkpoint keeps of this policy (``None``: nothing)."""
        return None

    def load_state_dict(self, state: Any) -> None:
        """Take back what :meth:`state_dict` returned (resume, takeover)."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.options!r})"
