"""DGT's ranked blocks on TSEngine's merges across DCs: reassemble, add, rank again.

With ``sched.tsengine_inter`` a local server's push does not go to the global server
directly: the global scheduler pairs it with another local server, which adds it into
its own merge buffer and sends the sum on (docs/geomx-behaviour.md §4.5). With DGT
(docs/geomx-behaviour.md §4.4, docs/papers.md §3) every hop of that tree is a DGT push:

* **sender** (every member, once per (key, part) and round): its whole merge buffer --
  its own DC's sum, the merges it took, and the late blocks it holds (below) -- goes
  through a :class:`geomx.sched.dgt.DgtSender` of its own, so the blocks are ranked
  afresh by the contribution EWMA of *what this node sends*: the top K on channel 0, the
  rest in bands on the channels that may drop them (``udp``) or on lower-priority
  reliable ones (``tcp``, ``quant``), the end block last on channel 0 as a request. The
  first push of each (key, part) goes whole (DGT's initialisation). Every block is marked
  as the overlay's merge (``meta["ts"]``), the end block also carries whose
  contributions the merge holds (``ts_n``, ``ts_from``).
* **receiver** (a relay local server, or the global server at the root):
  :class:`BlockMerges` reassembles the sender's blocks of the round and, when the end
  block arrives, hands the overlay the merge's value: a block that did not come is
  zeros, as at DGT's global server (:class:`geomx.sched.dgt.DgtReceiver`). The relay
  adds it into its buffer like any merge.
* **late blocks**: a block that arrives after its round's end block (a ``tcp`` band
  behind the end block; a datagram overtaken) is added, once, into this node's next
  round of the same (key, part) -- the next merge a relay sends, or the next merge the
  root takes -- rather than into the same sender's next merge to this node as DGT's
  global server does: the tree may pair that sender with another node next round, and
  its late blocks would wait here unapplied.

Nothing is kept between rounds but each sender's DGT state (contributions, K, 4-bit
residuals, per-block codec states) and each receiver's late blocks; both belong to the
overlay peer of the node (:class:`geomx.sched.ts_overlay.OverlayPeer`). Checkpoints do
not save them (the scenario refuses checkpoints with this pair,
geomx/scenario/checks.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from geomx.policy.codec import Codec
from geomx.policy.scheduling import SchedContext, Value
from geomx.sched.dgt import (DGT_META, SENT_META, Dgt, DgtSender, DgtSettings,
                             ReceiverTotals, block_header, decode_block)
from geomx.wire import Message, Payload

__all__ = ["BlockMerges", "dgt_of"]


def dgt_of(job: Any) -> DgtSettings | None:
    """The job's DGT settings when it runs DGT (None: it does not)."""
    for s in getattr(job, "transfer_schedulers", ()):
        if isinstance(s, Dgt) and s.options.enabled:
            return s.options
    return None


class _Marked:
    """The node as the overlay's DGT sender sees it: every message it sends carries
    ``mark`` (the overlay's merge meta), and the bytes it sends are counted."""

    def __init__(self, ctx: SchedContext, mark: dict[str, Any]):
        self.ctx = ctx
        self.mark = mark
        self.nbytes = 0
        self.node_name = ctx.node_name

    def _marked(self, msg: Message) -> Message:
        out = replace(msg, meta={**msg.meta, **self.mark})
        self.nbytes += out.nbytes
        return out

    def post(self, msg: Message) -> None:
        self.ctx.post(self._marked(msg))

    async def request(self, msg: Message) -> Message:
        return await self.ctx.request(self._marked(msg))

    def record(self, event: str, **fields: Any) -> None:
        self.ctx.record(event, **fields)

    def codec_for(self, num_elements: int, *, tier: str) -> Codec | None:
        return self.ctx.codec_for(num_elements, tier=tier)

    def encode_push(self, key: int, value: Value, *,
                    tier: str) -> tuple[list[Payload], dict[str, Any]]:
        return self.ctx.encode_push(key, value, tier=tier)


@dataclass
class _Assembly:
    """One sender's blocks of one round, before its end block."""

    blocks: dict[int, np.ndarray]
    on_time: int = 0


class BlockMerges:
    """One node's DGT on one overlay: the sender of its merges and the reassembly of the
    merges it receives (one per :class:`geomx.sched.ts_overlay.OverlayPeer`)."""

    def __init__(self, ctx: SchedContext, settings: DgtSettings, mark: dict[str, Any]):
        self.ctx = ctx
        self.s = settings
        self.mark = dict(mark)
        self.sender = DgtSender(settings)
        #: (sender, key, part, round) -> the blocks of that merge taken so far
        self._open: dict[tuple[str, int, int, int], _Assembly] = {}
        #: (sender, key, part) -> the last round of its merges assembled here
        self._assembled: dict[tuple[str, int, int], int] = {}
        #: (key, part) -> its number of values (known from its first assembled merge)
        self._size: dict[tuple[int, int], int] = {}
        #: (key, part) -> the late blocks taken, summed, for this node's next round
        self._late: dict[tuple[int, int], np.ndarray] = {}
        self._late_blocks: dict[tuple[int, int], int] = {}
        self.totals = [ReceiverTotals() for _ in range(settings.channels + 1)]
        self.missing = 0
        self.assemblies = 0

    # ------------------------------------------------------------------ sending
    async def send(self, dst: str, key: int, part: int, round_: int, value: np.ndarray,
                   meta: dict[str, Any]) -> tuple[Message, int]:
        """Send ``value`` (this node's whole merge buffer) to ``dst`` as DGT blocks, ``meta``
        on the end block; the end block's acknowledgement and the bytes sent."""
        node = _Marked(self.ctx, self.mark)
        ack = await self.sender.push(node, dst, key, part, round_, value, meta)  # type: ignore[arg-type]
        return ack, node.nbytes

    def note_loss(self, worker: str, loss: Any) -> None:
        """A worker's latest loss (DGT's adaptive K)."""
        self.sender.note_loss(worker, loss)

    def round_answered(self, key: int) -> None:
        """Drop the trailing band blocks of ``key``'s answered round."""
        self.sender.round_answered(key, checkpoint=False)

    # ------------------------------------------------------------------ receiving
    @staticmethod
    def is_block(msg: Message) -> bool:
        return DGT_META in msg.meta

    def take(self, msg: Message) -> np.ndarray | None:
        """Take one block of a merge: the merge's value (flat) when ``msg`` is its end
        block, else None (held until its end block, or late: kept for this node's next
        round, :meth:`late_into`). Raises ValueError on a malformed block."""
        seq, nb, be, band, round_ = block_header(msg, self.s.channels)
        is_end = seq == nb - 1
        if is_end and not msg.request_id:
            raise ValueError("a DGT end block must be a request (it is answered)")
        block = decode_block(self.ctx, msg, None if is_end else be)
        ident = (msg.src, msg.key, msg.part)
        late = round_ <= self._assembled.get(ident, -1)
        self.totals[band].count(msg.nbytes, late=late)
        if late:
            self._add_late(msg.key, msg.part, seq * be, block)
            return None
        at = self._open.setdefault((*ident, round_), _Assembly({}))
        at.on_time += 1
        at.blocks[seq] = block
        if not is_end:
            return None
        del self._open[(*ident, round_)]
        n = (nb - 1) * be + block.size
        known = self._size.setdefault((msg.key, msg.part), n)
        if known != n:
            raise ValueError(f"a DGT merge of key {msg.key} part {msg.part} has {n} values, "
                             f"not {known}")
        out = np.zeros(n, dtype=np.float32)
        for s, b in at.blocks.items():
            out[s * be:s * be + b.size] = b
        sent = msg.meta.get(SENT_META)
        sent_total = sum(v for v in sent if isinstance(v, int)) if isinstance(sent, list) else 0
        missing = max(0, sent_total - at.on_time)
        self.missing += missing
        self.assemblies += 1
        self._assembled[ident] = round_
        self.ctx.record("dgt_assemble", src=msg.src, key=msg.key, part=msg.part, round=round_,
                        sent=sent_total, on_time=at.on_time, missing=missing)
        return out

    def _add_late(self, key: int, part: int, lo: int, block: np.ndarray) -> None:
        n = self._size[(key, part)]  # its sender's merge of that round was assembled here
        if lo + block.size > n:
            raise ValueError(f"a late DGT block of key {key} part {part} ends at "
                             f"{lo + block.size}, past its {n} values")
        acc = self._late.get((key, part))
        if acc is None:
            acc = self._late[(key, part)] = np.zeros(n, dtype=np.float32)
        acc[lo:lo + block.size] += block
        self._late_blocks[(key, part)] = self._late_blocks.get((key, part), 0) + 1

    def late_into(self, key: int, part: int, value: Value) -> Value:
        """``value`` (a merge of this node's next round of (key, part)) plus the late
        blocks taken for it, which are then spent; ``value`` itself when there are none
        (a new array otherwise)."""
        acc = self._late.pop((key, part), None)
        if acc is None:
            return value
        self._late_blocks.pop((key, part), None)
        if isinstance(value, Payload):
            return value
        return (np.asarray(value, dtype=np.float32).reshape(-1) + acc).reshape(np.shape(value))

    def record_totals(self) -> None:
        """DGT's per-band receiver figures for this node's merges (``summary.json``'s
        ``extra["dgt"]`` sums them with the global servers'); late blocks still held at
        the end are ``unapplied``."""
        if not (self.assemblies or any(t.received for t in self.totals)):
            return
        self.ctx.record("dgt_receiver_totals", received=[t.received for t in self.totals],
                        on_time=[t.on_time for t in self.totals],
                        late=[t.late for t in self.totals],
                        bytes=[t.bytes for t in self.totals], missing=self.missing,
                        unapplied=sum(self._late_blocks.values()),
                        assemblies=self.assemblies)

    def record_sender_totals(self) -> None:
        if self.sender.whole or any(c.blocks for c in self.sender.sent):
            self.sender.record_totals(self.ctx)
