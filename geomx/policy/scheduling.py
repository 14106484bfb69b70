"""Transfer scheduling: how a value moves on each hop, in which order and by which path.

A :class:`TransferScheduler` decides what P3, DGT and TSEngine decide in GeoMX
(docs/geomx-behaviour.md §4.2, §4.4, §4.5): how a key is sliced and which slice leaves
first, which channel a block takes, whether a push is merged along an overlay tree
and whether the reply to a push already carries the new value. The node roles hand
each transfer to the job's schedulers through the hooks below, in the style of
ps-lite's ``KVWorker::set_slicer`` and ``KVServer::set_request_handle``: the transport
stays fixed, the application plugs behaviour into it.

Name one in a scenario as ``[sched] policy = "file.py:Class"`` with its options in
``[sched.options]`` (docs/extending.md).
"""

from __future__ import annotations

from typing import ClassVar

from geomx.policy.base import Policy

__all__ = ["TransferScheduler"]


class TransferScheduler(Policy):
    """The job's transfer scheduling on every hop (worker, local and global servers)."""

    kind: ClassVar[str] = "sched"
