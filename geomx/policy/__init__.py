"""The public policy API: write a sync algorithm, transfer scheduler, topology or codec
of your own, name it in a scenario, and run it in the emulator and over sockets.

Every built-in policy (FSA, MixedSync, HFA, ESync; P3, DGT, TSEngine; HiPS, flat PS,
NETSTORM, MLNET, MXNET; the codecs) is a plug-in of this package like yours. The node
roles import only this package, never a concrete policy module (an import-linter
contract in pyproject.toml keeps it so). How to write each kind, its contract and a
testing helper: docs/extending.md.

* :mod:`geomx.policy.sync` -- :class:`SyncAlgorithm` and its three sides;
* :mod:`geomx.policy.scheduling` -- :class:`TransferScheduler` and its three sides
  (:mod:`geomx.policy.wire_keys`: :func:`slice_key`, the keys a sliced tensor travels as);
* :mod:`geomx.policy.topology` -- :class:`Topology`, and :class:`MeshTopology` for trees
  over a mesh of DCs (:mod:`geomx.policy.mesh_plan`: the :class:`MeshPlan` it returns);
* :mod:`geomx.policy.codec` -- :class:`Codec` (and :class:`CodecPolicy`);
* :mod:`geomx.policy.options` -- typed options, checked once at load;
* :mod:`geomx.policy.registry` -- how a scenario's name finds a class.
"""

from __future__ import annotations

from geomx.policy.base import Policy
from geomx.policy.codec import Codec, CodecError, CodecPolicy, CodecState, Encoded
from geomx.policy.context import NodeContext
from geomx.policy.layout import DCShape, NodeLayout
from geomx.policy.mesh_plan import Chunk, Link, MeshPlan, route_key
from geomx.policy.options import NoOptions, OptionsError, PolicyOptions, options_from_table
from geomx.policy.registry import KINDS, PolicyError, policy_class
from geomx.policy.scheduling import (SchedContext, SchedGlobalSide, SchedLocalSide,
                                     SchedWorkerSide, TransferScheduler)
from geomx.policy.sync import (GlobalContext, GlobalSide, LocalContext, LocalSide,
                               SyncAlgorithm, WorkerContext, WorkerSide)
from geomx.policy.topology import MeshTopology, MeshView, SendQueue, Topology
from geomx.policy.wire_keys import WireKeyError, slice_key, split_slice_key

__all__ = [
    "Policy", "PolicyOptions", "NoOptions", "OptionsError", "options_from_table",
    "PolicyError", "policy_class", "KINDS", "NodeContext",
    "SyncAlgorithm", "GlobalSide", "LocalSide", "WorkerSide", "GlobalContext",
    "LocalContext", "WorkerContext", "TransferScheduler", "SchedWorkerSide",
    "SchedLocalSide", "SchedGlobalSide", "SchedContext", "slice_key", "split_slice_key",
    "WireKeyError", "Topology", "MeshTopology",
    "MeshView", "SendQueue", "MeshPlan", "Link", "Chunk", "route_key", "DCShape", "NodeLayout",
    "Codec", "CodecPolicy", "CodecState", "CodecError", "Encoded",
]
