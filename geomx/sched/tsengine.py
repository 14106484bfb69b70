"""TSEngine's coordinator decisions as a pure policy (no messages, no clock, no node).

TSEngine (docs/papers.md §2, docs/geomx-behaviour.md §4.5) replaces the star between a server
and its senders by an overlay the *coordinator* (a scheduler) builds transfer by
transfer:

* **aggregation**: ready nodes queue (ASKPUSH); whenever two are queued the head pair
  (a, b) is popped; if one is the server (the overlay's root) the other sends to it,
  otherwise a sends to b when the measured throughput A[a][b] > A[b][a] (else b sends to
  a, so with no measurement the later-queued node sends to the earlier one). The receiver
  adds the incoming sum into its own and queues again: a pairwise merge tree, built in
  the order nodes become ready.
* **broadcast**: every holder of the new model asks (ASKPULL) for a receiver, sends, and
  reports the throughput it measured; the coordinator answers with an ε-greedy choice
  among the nodes that do not have it yet, until none is left.
* **replacement** (``[membership] on_server_loss = "wait"``, docs/reliability.md): when
  a new process takes over a member, :meth:`Coordinator.replace` plans again what went
  through the old one: a root that waited for its merge is queued again (the successor
  sends its sum again), and the round being broadcast goes again to it and to the
  members it was chosen to relay to. GeoMX has no such case (a lost node ends its job).

What this module fixes relative to GeoMX (docs/geomx-behaviour.md §4.5, docs/papers.md
§2 (b)):
``p_greedy = min(known / (known + unknown), max_greed_rate)`` in floating point (GeoMX
divides integers, so it is 0 until every candidate is measured, then 100 %); the random
draw comes from a generator seeded once from the scenario seed (GeoMX reseeds from
``time(0)`` on every decision); a measurement expires ``expiry_iterations`` rounds after
it was taken (GeoMX records a ``lifetime`` matrix it never reads); state is per
(key, part), so several keys are in flight and each global server shard is the root of
its own tree (GeoMX has one queue per scheduler and hard-codes global server id 8).

The node side (messages, measuring on the context's clock) and the transfer scheduler
(:class:`geomx.sched.ts_overlay.TsEngine`) are ``geomx/sched/ts_overlay.py``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from geomx.policy.options import PolicyOptions
from geomx.policy.scheduling import MERGED_FROM_META

#: The two overlays (GeoMX's ENABLE_INTER_TS: local <-> global servers across DCs,
#: coordinated by the global scheduler; ENABLE_INTRA_TS: workers <-> local server inside
#: a DC, coordinated by the DC's local scheduler).
OVERLAYS = ("inter", "intra")
#: ``[sched] tsengine`` values and the overlays each turns on.
MODES = {"off": (), "inter": ("inter",), "intra": ("intra",), "both": ("inter", "intra")}

#: message meta: which overlay a TSEngine message belongs to
TS_META = "ts"
#: meta of a merged push: how many original contributions it carries, and whose
TS_COUNT = "ts_n"
TS_FROM = MERGED_FROM_META


class TsEngineError(ValueError):
    """A TSEngine setting or a combination TSEngine cannot run with."""


@dataclass(frozen=True)
class TsSettings(PolicyOptions):
    """TSEngine's options (built once by geomx/cluster.py from ``[sched]``)."""

    mode: str = "off"
    max_greed_rate: float = 0.9
    expiry_iterations: int = 5

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise TsEngineError(f"tsengine = {self.mode!r}; allowed: {', '.join(MODES)}")
        if not 0.0 <= self.max_greed_rate <= 1.0:
            raise TsEngineError(f"tsengine_max_greed_rate = {self.max_greed_rate!r}; "
                                "allowed: 0 .. 1")
        if self.expiry_iterations < 1:
            raise TsEngineError(f"tsengine_expiry_iterations = {self.expiry_iterations!r}; "
                                "allowed: >= 1")

    @property
    def inter(self) -> bool:
        return "inter" in MODES[self.mode]

    @property
    def intra(self) -> bool:
        return "intra" in MODES[self.mode]

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "max_greed_rate": self.max_greed_rate,
                "expiry_iterations": self.expiry_iterations}


class Uniform(Protocol):
    """The part of ``numpy.random.Generator`` the policy uses."""

    def random(self) -> float: ...

    def integers(self, low: int, high: int) -> Any: ...


class ThroughputTable:
    """A[s][r]: the last throughput measured from s to r (bytes/s) and the round it was
    measured in; an entry older than ``expiry`` rounds reads as unknown (docs/papers.md
    §2 (b) step 3: expiry forces re-exploration of links that may have changed)."""

    def __init__(self, expiry: int):
        self.expiry = expiry
        self._a: dict[tuple[str, str], tuple[float, int]] = {}

    def record(self, src: str, dst: str, throughput: float, round_: int) -> None:
        if throughput > 0:
            self._a[(src, dst)] = (float(throughput), int(round_))

    def get(self, src: str, dst: str, round_: int) -> float | None:
        """The measurement, or None when unknown or expired at ``round_``."""
        e = self._a.get((src, dst))
        if e is None or round_ - e[1] >= self.expiry:
            return None
        return e[0]

    def items(self) -> list[tuple[tuple[str, str], tuple[float, int]]]:
        return sorted(self._a.items())


@dataclass(frozen=True)
class Pairing:
    """An aggregation decision: ``sender`` sends its merge buffer to ``receiver``."""

    sender: str
    receiver: str
    rule: str      # "root": one of them is the server; "throughput"; "fifo" (no measurement)
    a_sr: float | None = None
    a_rs: float | None = None


@dataclass(frozen=True)
class Choice:
    """A broadcast decision for one ASKPULL: ``receiver`` (None = done) and why."""

    receiver: str | None
    mode: str          # "exploit", "explore", "done"
    p_greedy: float = 0.0
    known: int = 0
    unknown: int = 0
    throughput: float | None = None   # A[asker][receiver] when known


@dataclass
class _KeyState:
    table: ThroughputTable
    queue: deque[str] = field(default_factory=deque)
    root: str | None = None
    got: set[str] = field(default_factory=set)
    #: the last round whose broadcast has reached every member
    done_round: int = 0
    #: the round being broadcast (got belongs to it)
    round: int = 0
    #: aggregation: receiver -> (the sender it waits for, the other members' sums that
    #: sender carries); an entry ends when the receiver asks again (it has the data)
    awaiting: dict[str, tuple[str, frozenset[str]]] = field(default_factory=dict)
    #: aggregation: the other members' sums a node holds or is being sent
    holds: dict[str, frozenset[str]] = field(default_factory=dict)
    #: broadcast: receiver -> the node chosen to send it the round
    chooser: dict[str, str] = field(default_factory=dict)
    #: broadcast: members taken out of ``got`` when a member was replaced
    redone: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Replaced:
    """What a member's replacement changed for one (key, part): the receivers that
    waited for the lost process's merge (the root is put back in the queue, a member
    must ask again: ``reask``), the pairings now due, and the members the round
    ``round`` must be broadcast to again (the lost process may not have relayed it to
    them)."""

    key: int
    part: int
    requeued: tuple[str, ...]
    reask: tuple[str, ...]
    pairings: tuple[Pairing, ...]
    round: int
    rebroadcast: tuple[str, ...]


class Coordinator:
    """One overlay's coordinator state (a scheduler owns one per overlay it runs).

    ``members`` are the non-root nodes (local servers for ``inter``, a DC's workers for
    ``intra``), in a fixed order that breaks ties; the root of each (key, part) names
    itself in its ASKPUSH."""

    def __init__(self, settings: TsSettings, members: list[str], rng: Uniform):
        self.settings = settings
        self.members = list(members)
        self.rng = rng
        self._keys: dict[tuple[int, int], _KeyState] = {}

    def _state(self, key: int, part: int) -> _KeyState:
        st = self._keys.get((key, part))
        if st is None:
            st = self._keys[(key, part)] = _KeyState(
                ThroughputTable(self.settings.expiry_iterations))
        return st

    def table(self, key: int, part: int) -> ThroughputTable:
        """A[s][r] of (key, part). Kept per key: bytes / transfer time of a 40-byte bias
        is all latency, of a megabyte weight mostly bandwidth, so one table for tensors of
        different sizes would rank edges by whichever key measured them last."""
        return self._state(key, part).table

    # ------------------------------------------------------------------ aggregation
    def ask_push(self, key: int, part: int, node: str, *, root: bool = False,
                 round_: int = 0) -> list[Pairing]:
        """``node`` is ready to send (or, as the root, to receive); the pairings now due."""
        st = self._state(key, part)
        if root:
            st.root = node
        st.awaiting.pop(node, None)  # a receiver asks again once the data arrived
        if node in st.queue:
            return []  # already waiting (GeoMX ignores a repeated ask)
        st.queue.append(node)
        return self._pairs_due(st, round_)

    def _pairs_due(self, st: _KeyState, round_: int) -> list[Pairing]:
        out = []
        while len(st.queue) >= 2:
            a = st.queue.popleft()
            b = st.queue.popleft()
            p = self._pair(st, a, b, round_)
            carried = st.holds.pop(p.sender, frozenset())
            st.awaiting[p.receiver] = (p.sender, carried)
            if p.receiver != st.root:
                st.holds[p.receiver] = st.holds.get(p.receiver, frozenset()) | carried | \
                    {p.sender}
            out.append(p)
        return out

    def _pair(self, st: _KeyState, a: str, b: str, round_: int) -> Pairing:
        if a == st.root:
            return Pairing(b, a, "root")
        if b == st.root:
            return Pairing(a, b, "root")
        ab = st.table.get(a, b, round_)
        ba = st.table.get(b, a, round_)
        if ab is None and ba is None:
            return Pairing(b, a, "fifo")
        if (ab if ab is not None else -1.0) > (ba if ba is not None else -1.0):
            return Pairing(a, b, "throughput", ab, ba)
        return Pairing(b, a, "throughput", ba, ab)

    # ------------------------------------------------------------------ broadcast
    def ask_pull(self, key: int, part: int, node: str, round_: int, *,
                 last: str | None = None, throughput: float = -1.0) -> Choice:
        """``node`` holds round ``round_`` of (key, part) and reports its last transfer
        (to ``last``, at ``throughput`` bytes/s, -1 = none); the next receiver."""
        st = self._state(key, part)
        if last is not None and throughput > 0:
            st.table.record(node, last, throughput, round_)
        if round_ <= st.done_round or round_ < st.round:
            return Choice(None, "done")  # (an older round: asked again after a replacement)
        if round_ != st.round:
            # the first ask of a new round (rounds of one key are sequential: a round
            # cannot start before every member holds the previous one)
            st.round = round_
            st.got = set()
            st.chooser = {}
            st.redone = set()
        if node in st.redone:
            st.got.add(node)  # it had the round from the lost process after all
        if node in self.members and node not in st.got:
            raise TsEngineError(f"{node} asks to relay round {round_} of key {key} part "
                                f"{part}, which it was not sent")
        st.got.add(node)
        cands = [m for m in self.members if m not in st.got]
        if not cands:
            st.done_round = round_
            return Choice(None, "done")
        known, unknown = [], []
        for c in cands:
            thr = st.table.get(node, c, round_)
            (known if thr is not None else unknown).append((c, thr))
        p = min(len(known) / len(cands), self.settings.max_greed_rate)
        draw = float(self.rng.random())
        if known and draw < p:
            best = max(known, key=lambda ct: ct[1])  # first of equals: member order
            choice = Choice(best[0], "exploit", p, len(known), len(unknown), best[1])
        else:
            pool = unknown or known
            c, thr = pool[int(self.rng.integers(0, len(pool)))]
            choice = Choice(c, "explore", p, len(known), len(unknown), thr)
        st.got.add(choice.receiver)  # type: ignore[arg-type]
        st.chooser[choice.receiver] = node  # type: ignore[index]
        if len(st.got & set(self.members)) == len(self.members):
            st.done_round = round_
        return choice

    # ------------------------------------------------------------------ replacement
    def replace(self, member: str) -> list[Replaced]:
        """A new process took over ``member`` (``[membership] on_server_loss = "wait"``):
        the old one's asks, merge buffer and relays are gone. Per (key, part):

        * it leaves the queue, and a receiver paired with it as the sender goes back in
          the queue (the successor sends the DC's sum again: it pushes again every round
          the global tier does not have);
        * the round being broadcast goes again to it and to every member it was chosen
          to relay to (those that had the round from it are taken back, as ``redone``).

        A lost process that held other members' sums (merged into it, or on their way
        to or from it) took them with it; that raises :class:`TsEngineError`, as no member
        keeps a copy of its own sum to send again."""
        out = []
        for (key, part), st in sorted(self._keys.items()):
            lost = st.holds.pop(member, frozenset())
            lost |= frozenset().union(*(c for s, c in st.awaiting.values() if s == member))
            if lost:
                raise TsEngineError(
                    f"{member} was replaced holding the merged sums of {sorted(lost)} for "
                    f"key {key} part {part}; the overlay cannot ask them again")
            if member in st.queue:
                st.queue.remove(member)
            st.awaiting.pop(member, None)
            waiting = [r for r, (s, _) in st.awaiting.items() if s == member]
            for r in waiting:
                del st.awaiting[r]
            # the root takes data without an answer to its ask; a member sends its buffer
            # when paired, which needs its own ask
            requeued = tuple(r for r in waiting if r == st.root and r not in st.queue)
            reask = tuple(r for r in waiting if r != st.root)
            st.queue.extend(requeued)
            pairings = tuple(self._pairs_due(st, st.round)) if requeued else ()
            redo = ({member} | {r for r, c in st.chooser.items() if c == member}) & st.got
            redo.discard(st.root)  # type: ignore[arg-type]
            if redo:
                st.got -= redo
                st.redone |= redo
                for r in redo:
                    st.chooser.pop(r, None)
                st.done_round = min(st.done_round, st.round - 1)
            if waiting or redo:
                out.append(Replaced(key, part, requeued, reask, pairings, st.round,
                                    tuple(sorted(redo))))
        return out

    def root_of(self, key: int, part: int) -> str | None:
        """The root that named itself for (key, part), if any yet."""
        st = self._keys.get((key, part))
        return None if st is None else st.root
