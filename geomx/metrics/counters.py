"""Byte accounting: how many bytes crossed which link, and between which data centres.

Why a separate, mergeable class: in the emulator one process sees every transfer, but in
the real runtime every node is its own process and can only count what *it* sent. Each
process keeps a `ByteCounters`, ships `to_dict()` to the launcher at exit, and the
launcher `merge`s them. Both runtimes therefore produce the same summary fields.

A transfer between two nodes in the same DC is LAN traffic; between different DCs it is
WAN traffic (GeoMX's whole point is to shrink the second number). Bytes are counted from
the sender's side: a datagram that the network later drops was still put on the wire,
so it counts in `bytes_wan`/`bytes_lan` and additionally in `bytes_dropped`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

#: Where a node lives: a function of the node name, or a mapping (the topology's
#: node -> DC table); names a mapping lacks fall back to `dc_from_node_name`.
DcOf = Union[Callable[[str], str], Mapping[str, str]]

#: DC name given to nodes of the global tier (`gh`, `gs:{r}`, `mw`) when no topology is
#: at hand to say where they live. Experiments should pass the topology's `host_dc`.
GLOBAL_DC = "global"


def dc_from_node_name(node: str) -> str:
    """Best-effort DC of a node from the naming convention of docs/architecture.md.

    `w:{d}:{i}`, `ls:{d}` and `lh:{d}` name their DC; the global tier (`gh`, `gs:{r}`,
    `mw`) is placed by the topology, which this function does not know, so it answers
    `GLOBAL_DC`. Pass a real `dc_of` (the topology's `host_dc`) wherever one exists.
    """
    parts = node.split(":")
    if len(parts) >= 2 and parts[0] in ("w", "ls", "lh") and parts[1]:
        return parts[1]
    return GLOBAL_DC


def dc_resolver(dc_of: DcOf | None) -> Callable[[str], str]:
    """A node -> DC function from a `DcOf` (None: the naming convention)."""
    if dc_of is None:
        return dc_from_node_name
    if isinstance(dc_of, Mapping):
        table = dc_of
        return lambda node: table.get(node) or dc_from_node_name(node)
    return dc_of


def dc_pair_key(src_dc: str, dst_dc: str) -> str:
    """Key of `bytes_per_dc_pair`: `"a->b"` (directional)."""
    return f"{src_dc}->{dst_dc}"


def event_link_names(event: Mapping[str, Any]) -> list[str] | None:
    """Links an `xfer`-like event crossed: its `path` (list of link names) or `link`."""
    path = event.get("path")
    if isinstance(path, (list, tuple)):
        return [str(p) for p in path]
    link = event.get("link")
    if link is None:
        return None
    if isinstance(link, (list, tuple)):
        return [str(p) for p in link]
    return [str(link)]


def event_dcs(event: Mapping[str, Any], dc_of: DcOf | None = None) -> tuple[str, str]:
    """(src_dc, dst_dc) of a transfer event: explicit `src_dc`/`dst_dc` fields win,
    then `dc_of(src)`, then the naming convention."""
    resolve = dc_resolver(dc_of)
    src_dc = event.get("src_dc")
    dst_dc = event.get("dst_dc")
    if src_dc is None:
        src_dc = resolve(str(event.get("src", event.get("node", "?"))))
    if dst_dc is None:
        dst_dc = resolve(str(event.get("dst", "?")))
    return str(src_dc), str(dst_dc)


@dataclass
class ByteCounters:
    """Totals of bytes sent, split LAN/WAN, per link and per (src_dc, dst_dc)."""

    bytes_wan: int = 0
    bytes_lan: int = 0
    bytes_dropped: int = 0
    messages: int = 0
    messages_wan: int = 0
    bytes_per_link: dict[str, int] = field(default_factory=dict)
    bytes_per_dc_pair: dict[str, int] = field(default_factory=dict)

    def add(
        self,
        src_dc: str,
        dst_dc: str,
        nbytes: int,
        link_names: Iterable[str] | None = None,
        *,
        dropped: bool = False,
    ) -> None:
        """Count one message of `nbytes` sent from `src_dc` to `dst_dc` over `link_names`."""
        nbytes = int(nbytes)
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        self.messages += 1
        if src_dc == dst_dc:
            self.bytes_lan += nbytes
        else:
            self.bytes_wan += nbytes
            self.messages_wan += 1
        if dropped:
            self.bytes_dropped += nbytes
        pair = dc_pair_key(src_dc, dst_dc)
        self.bytes_per_dc_pair[pair] = self.bytes_per_dc_pair.get(pair, 0) + nbytes
        if link_names:
            per_link = self.bytes_per_link
            for name in link_names:
                per_link[name] = per_link.get(name, 0) + nbytes

    def add_event(self, event: Mapping[str, Any], dc_of: DcOf | None = None) -> None:
        """Count a transfer event (`src`, `dst`, `bytes`, `link`/`path`, `dropped`)."""
        src_dc, dst_dc = event_dcs(event, dc_of)
        self.add(
            src_dc,
            dst_dc,
            int(event.get("bytes", 0) or 0),
            event_link_names(event),
            dropped=bool(event.get("dropped", False)),
        )

    @property
    def bytes_total(self) -> int:
        return self.bytes_wan + self.bytes_lan

    def merge(self, other: ByteCounters) -> ByteCounters:
        """Add `other`'s counts into this one (in place) and return self."""
        self.bytes_wan += other.bytes_wan
        self.bytes_lan += other.bytes_lan
        self.bytes_dropped += other.bytes_dropped
        self.messages += other.messages
        self.messages_wan += other.messages_wan
        for mine, theirs in (
            (self.bytes_per_link, other.bytes_per_link),
            (self.bytes_per_dc_pair, other.bytes_per_dc_pair),
        ):
            for k, v in theirs.items():
                mine[k] = mine.get(k, 0) + v
        return self

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form with sorted maps (so it serialises identically every time)."""
        return {
            "bytes_wan": self.bytes_wan,
            "bytes_lan": self.bytes_lan,
            "bytes_dropped": self.bytes_dropped,
            "messages": self.messages,
            "messages_wan": self.messages_wan,
            "bytes_per_link": dict(sorted(self.bytes_per_link.items())),
            "bytes_per_dc_pair": dict(sorted(self.bytes_per_dc_pair.items())),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ByteCounters:
        unknown = set(data) - _COUNTER_FIELDS
        if unknown:
            raise ValueError(
                f"ByteCounters.from_dict: unknown field(s) {sorted(unknown)}; "
                f"allowed: {sorted(_COUNTER_FIELDS)}"
            )
        return cls(
            bytes_wan=int(data.get("bytes_wan", 0)),
            bytes_lan=int(data.get("bytes_lan", 0)),
            bytes_dropped=int(data.get("bytes_dropped", 0)),
            messages=int(data.get("messages", 0)),
            messages_wan=int(data.get("messages_wan", 0)),
            bytes_per_link={str(k): int(v) for k, v in data.get("bytes_per_link", {}).items()},
            bytes_per_dc_pair={
                str(k): int(v) for k, v in data.get("bytes_per_dc_pair", {}).items()
            },
        )

    @classmethod
    def from_events(
        cls,
        events: Iterable[Mapping[str, Any]],
        kinds: Iterable[str] = ("xfer",),
        dc_of: DcOf | None = None,
    ) -> ByteCounters:
        """Rebuild counters from an event stream (e.g. a merged events.jsonl)."""
        wanted = frozenset(kinds)
        counters = cls()
        for event in events:
            if event.get("ev") in wanted:
                counters.add_event(event, dc_of)
        return counters


_COUNTER_FIELDS = frozenset(
    {
        "bytes_wan",
        "bytes_lan",
        "bytes_dropped",
        "messages",
        "messages_wan",
        "bytes_per_link",
        "bytes_per_dc_pair",
    }
)
