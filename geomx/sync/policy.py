"""When a global server aggregates and replies: the sync-policy layer.

``fsa`` (fully synchronous, GeoMX ``dist_sync``): collect one push from every contributor,
run one global step on the sum, answer everybody (geomx-behaviour.md §3.2).
``mixed`` (MixedSync, ``dist_async`` across DCs): apply each DC's push on arrival and
answer at once (§3.3); it requires a global optimizer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from geomx.wire import Message

if TYPE_CHECKING:  # pragma: no cover
    from geomx.node.global_server import GlobalServer, Slot
    from geomx.node.spec import JobSpec
    from geomx.node.values import Value

SYNC_ALGORITHMS = ("fsa", "mixed", "hfa", "esync")


class GlobalSyncPolicy(Protocol):
    def on_push(self, gs: "GlobalServer", msg: Message, slot: "Slot", value: "Value") -> None: ...


class FullySync:
    """FSA: one global step per key per round, after every contributor has pushed."""

    name = "fsa"

    def on_push(self, gs: "GlobalServer", msg: Message, slot: "Slot", value: "Value") -> None:
        if msg.src in slot.contributors:
            gs.reply_error(msg, f"{msg.src} pushed key {msg.key} twice in round {slot.version}")
            return
        slot.contributors.add(msg.src)
        gs.accumulate(slot, value)
        slot.waiting_pushes.append(msg)
        if slot.count < len(gs.pushers):
            return
        merged, slot.merged = slot.merged, None
        slot.count = 0
        slot.contributors.clear()
        gs.apply_update(msg.key, slot, merged)
        waiting, slot.waiting_pushes = slot.waiting_pushes, []
        for req in waiting:
            gs.reply_push(req, slot)


class AsyncAcrossDCs:
    """MixedSync: each push is a global step of its own (requires an optimizer)."""

    name = "mixed"

    def on_push(self, gs: "GlobalServer", msg: Message, slot: "Slot", value: "Value") -> None:
        if gs.optimizer is None:
            gs.reply_error(msg, "MixedSync needs a global optimizer (training.optimizer)")
            return
        gs.apply_update(msg.key, slot, value, sender=msg.src)
        gs.reply_push(msg, slot)


def make_global_policy(job: "JobSpec") -> GlobalSyncPolicy:
    algo = str(job.sync.get("algorithm", "fsa"))
    if algo in ("fsa", "hfa", "esync"):
        return FullySync()
    if algo == "mixed":
        return AsyncAcrossDCs()
    raise ValueError(f"sync.algorithm = {algo!r}; allowed: {', '.join(SYNC_ALGORITHMS)}")


def describe(policy: Any) -> str:
    return getattr(policy, "name", type(policy).__name__)
