"""The user-facing training API, shaped like MXNet/GeoMX's kvstore.

The calls follow GeoMX's (docs/geomx-behaviour.md §2.1).

``import geomx.kv`` then ``kv = geomx.kv.create("dist_sync")`` from code a geomx worker
runs (a training program, or a notebook cell through ``geomx run``). The store is
implemented in :mod:`geomx.node.kvstore`, beside the worker node it talks to; this module
is the stable public name, so user programs never import from ``geomx.node``.

A synchronous program (``def main(kv, ctx)``) gets a :class:`SyncKVStore`, whose calls
block where MXNet's do (:mod:`geomx.node.sync_program`); :func:`in_sync_program` tells
library code which kind of program it runs in, and :func:`run_blocking` /
:func:`run_on_loop` let it reach the node from such a program's thread (docs/guide.md,
"Synchronous programs").
"""

from geomx.node.kvstore import (KV_TYPES, STRING_KEY_BASE, KVStore, KVStoreError,
                                check_kvstore_type, current_node, optimizer,
                                optimizer_config)
from geomx.node.program_thread import SyncCallError, in_sync_program, run_blocking, run_on_loop
from geomx.node.sync_program import SyncKVStore, create

__all__ = ["KV_TYPES", "STRING_KEY_BASE", "KVStore", "KVStoreError", "SyncCallError",
           "SyncKVStore", "check_kvstore_type", "create", "current_node", "in_sync_program",
           "optimizer", "optimizer_config", "run_blocking", "run_on_loop"]
