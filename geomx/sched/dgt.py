"""DGT: differential gradient transmission of local -> global server pushes.

Follows the DGT paper (Zhou et al., FGCS 2021) as GeoMX wires it in (docs/papers.md §3,
docs/geomx-behaviour.md §4.4): a pushed tensor (one key, or this global server's part of a
split key) is cut into blocks of ``block_bytes`` of sent values; each block's
*contribution* is an EWMA of its mean absolute value across rounds; blocks that never
contributed are not sent; the rest are ranked, the top ``K`` fraction goes on channel 0
(reliable, highest priority), the remainder in ``C`` equal bands on low-priority
channels 1..C, and the last block (the *end block*) always on channel 0. The receiver
buffers blocks and assembles the tensor when the end block arrives: missing blocks are
zeros, a block that arrives after its round was assembled is added into the next
round's same block (applied once, one round late, never silently lost: counted).

Transports (``mode``): ``udp`` -- bands on unreliable datagram channels
``UNRELIABLE_BASE + band`` (UDP in the real runtime, dropped with the path's loss in the
emulator); ``tcp`` -- bands on reliable channels ``band`` (lower priority classes);
``quant`` -- like ``tcp`` with the band blocks 4-bit quantised with error feedback
(:mod:`geomx.sched.dgt_quant`).

Codecs: fp16 and bf16 encode each block as they encode a tensor (blocks are then
``block_bytes`` of half values). A sparse or 1-bit codec (Bi-Sparse, MPQ's large tensors,
onebit) has no blocks of its own: DGT cuts the dense float32 values into blocks of
``block_bytes``, ranks them as above, and the whole tensor's codec encodes each block
apart, with a state per block (:mod:`geomx.sched.dgt_codec`).

What we do that GeoMX does not (its bugs, docs/geomx-behaviour.md §4.4 and §4.7):
adaptive K ``K_t = max(k_min, k * loss_t / loss_0)`` from the loss the workers report
with their pushes (GeoMX parses the flag and ignores it); under MultiGPS each global
server gets only its part (GeoMX resends the whole key to every server); mode 3 packs
nibbles correctly; the send order is GeoMX's strict "important queue first": channel-0
blocks, then the end block, then the bands, so the end block never waits behind a band.

:class:`Dgt` is the transfer scheduler (geomx/policy/scheduling.py): its local-server
side sends through a :class:`DgtSender`, its global-server side reassembles with a
:class:`DgtReceiver`, both through their scheduler context; neither knows which runtime
it runs in.

Checkpoints (docs/reliability.md, "What is saved"): both keep their cross-round state
in the servers' checkpoint files (``state_dict``). The band blocks of the checkpoint
round trail its end block, so some are still on their way when the files are written:
the sender keeps that round's trailing blocks with its state and, resumed, sends them
again marked :data:`RESENT_META`; the receiver takes each (round, block) once.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

import numpy as np

from geomx.policy.options import PolicyOptions
from geomx.policy.scheduling import (HELD, GlobalSchedContext, LocalSchedContext,
                                     SchedContext, SchedGlobalSide, SchedLocalSide,
                                     SchedWorkerSide, TransferScheduler, WorkerSchedContext)
from geomx.sched.dgt_codec import BlockCodecs
from geomx.sched.dgt_quant import dequantise4, quantise4
from geomx.wire import UNRELIABLE_BASE, Kind, Message, Payload

#: Message meta key of a DGT block: ``[seq, n_blocks, block_elements]``.
DGT_META = "dgt"
#: Sender round of a block (late detection).
ROUND_META = "dgt_r"
#: End block only: blocks sent this round per band ``[band 0, band 1, ..., band C]``.
SENT_META = "dgt_sent"
#: A 4-bit quantised block (payloads: packed codes, [lo, hi]).
QUANT_META = "dgt_q4"
#: A block sent again by a resumed sender (it may have reached the receiver before the
#: checkpoint): the receiver takes it only if it has not seen its (round, seq) yet.
RESENT_META = "dgt_again"

MODES = ("off", "udp", "tcp", "quant")
HALF_CODECS = ("fp16", "bf16")


@dataclass(frozen=True)
class DgtSettings(PolicyOptions):
    """The job's DGT parameters (from the scenario's ``[sched] dgt*`` keys, built once
    by ``geomx/cluster.py``)."""

    mode: str = "off"
    block_bytes: int = 4096
    k: float = 0.5
    k_min: float = 0.2
    adaptive_k: bool = True
    channels: int = 3
    alpha: float = 0.3
    codec: str = "none"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"dgt mode {self.mode!r}; allowed: {', '.join(MODES)}")
        if not 1 <= self.channels <= 7:
            raise ValueError(f"dgt channels {self.channels}; allowed: 1..7")

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> DgtSettings:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (d or {}).items() if k in names})

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    @property
    def wire_itemsize(self) -> int:
        """Bytes per value on the wire (blocks are ``block_bytes`` of *sent* bytes)."""
        return 2 if self.codec in HALF_CODECS else 4

    @property
    def block_elements(self) -> int:
        return max(1, self.block_bytes // self.wire_itemsize)

    @property
    def dense_block_elements(self) -> int:
        """Block size in values when each block is encoded apart by a sparse or 1-bit
        codec (geomx/sched/dgt_codec.py): ``block_bytes`` of the dense float32 values
        the block is ranked and encoded from."""
        return max(1, self.block_bytes // 4)

    def channel_of_band(self, band: int) -> int:
        """Wire channel of band 0..C (0 = the reliable, highest-priority channel)."""
        if band == 0:
            return 0
        return UNRELIABLE_BASE + band if self.mode == "udp" else band


def band_of_channel(channel: int) -> int:
    return channel - UNRELIABLE_BASE if channel >= UNRELIABLE_BASE else channel


def is_phantom(v: Any) -> bool:
    return isinstance(v, Payload) and v.is_phantom


# ---------------------------------------------------------------- the pure parts

def block_means(flat: np.ndarray, block_elements: int) -> np.ndarray:
    """Mean absolute value of each block of ``flat`` (the last block may be shorter)."""
    n = flat.size
    nb = max(1, math.ceil(n / block_elements))
    starts = np.arange(nb) * block_elements
    sums = np.add.reduceat(np.abs(flat.astype(np.float32, copy=False)), starts) if n else \
        np.zeros(1, dtype=np.float32)
    lengths = np.minimum(starts + block_elements, n) - starts
    return (sums / np.maximum(lengths, 1)).astype(np.float32)


def assign_bands(contribution: np.ndarray, k: float, channels: int) -> np.ndarray:
    """Band per block: -1 = not sent (zero contribution), 0 = channel 0, 1..C = bands.

    Blocks but the last are ranked by contribution, descending (ties by position, so the
    result is deterministic); the top ``round(k * n)`` of the ``n`` non-zero ones get band 0,
    the rest ``C`` equal contiguous bands in rank order; the last (end) block is band 0.
    """
    nb = contribution.size
    bands = np.full(nb, -1, dtype=np.int64)
    bands[nb - 1] = 0
    if nb == 1:
        return bands
    c = contribution[:-1]
    candidates = np.flatnonzero(c != 0)
    order = candidates[np.argsort(-c[candidates], kind="stable")]
    n = order.size
    m = min(n, int(math.floor(k * n + 0.5)))
    bands[order[:m]] = 0
    rest = order[m:]
    if rest.size:
        bands[rest] = 1 + (np.arange(rest.size) * channels) // rest.size
    return bands


def adaptive_k(k0: float, k_min: float, loss_t: float, loss_0: float) -> float:
    """``K_t = max(k_min, k0 * loss_t / loss_0)`` (DGT paper), at most 1."""
    if not (loss_0 > 0 and math.isfinite(loss_t) and math.isfinite(loss_0)):
        return k0
    return min(1.0, max(k_min, k0 * loss_t / loss_0))


# ---------------------------------------------------------------- sender

@dataclass
class ChannelTotals:
    blocks: int = 0
    bytes: int = 0


class DgtSender:
    """A local server's DGT state: contributions, quantisation residuals, K, counters."""

    def __init__(self, settings: DgtSettings):
        self.s = settings
        self.contribution: dict[tuple[int, int], np.ndarray] = {}
        self.residual: dict[tuple[int, int], np.ndarray] = {}
        #: per-block codec states when a sparse or 1-bit codec encodes the blocks
        self.coder = BlockCodecs()
        self.losses: dict[str, float] = {}
        self.loss0: float | None = None
        self.k = settings.k
        self.sent = [ChannelTotals() for _ in range(settings.channels + 1)]
        self.skipped = 0
        self.whole = 0
        #: per (key, part): the blocks of its latest push sent after the end block, kept
        #: until its round is answered (longer when that round is a checkpoint's: they
        #: may still be on their way when the receiver's state is saved)
        self.tail: dict[tuple[int, int], list[Message]] = {}

    def note_loss(self, worker: str, loss: Any) -> None:
        """A worker's latest training loss (carried with its push)."""
        if isinstance(loss, (int, float)) and not isinstance(loss, bool) and math.isfinite(loss):
            self.losses[worker] = float(loss)

    def current_k(self) -> float:
        if not self.s.adaptive_k or not self.losses:
            return self.s.k
        loss_t = float(np.mean([self.losses[w] for w in sorted(self.losses)]))
        if self.loss0 is None:
            self.loss0 = loss_t
        self.k = adaptive_k(self.s.k, self.s.k_min, loss_t, self.loss0)
        return self.k

    async def push(self, node: SchedContext, dst: str, key: int, part: int, round_: int,
                   value: Any, extra_meta: dict[str, Any]) -> Message:
        """Send one push of ``value`` (this server's part) as DGT blocks; return the ack.

        ``node`` is the local server's scheduler context.
        """
        if is_phantom(value):
            raise ValueError("DGT ranks blocks by their values; a phantom tensor has none")
        flat = np.asarray(value, dtype=np.float32).reshape(-1)
        coder = self.coder.for_codec(node.codec_for(flat.size, tier="wan"))
        be = self.s.block_elements if coder is None else self.s.dense_block_elements
        means = block_means(flat, be)
        ident = (key, part)
        prev = self.contribution.get(ident)
        if prev is not None and prev.shape != means.shape:
            prev = None  # the blocks changed size with the codec (a command): start again
        a = self.s.alpha
        contribution = (1 - a) * means if prev is None else a * prev + (1 - a) * means
        self.contribution[ident] = contribution.astype(np.float32)
        if prev is None and coder is None:
            # the first push of a key goes whole on the reliable channel (initialisation)
            self.whole += 1
            payloads, meta = node.encode_push(key, value, tier="wan")
            meta.update(extra_meta)
            return await node.request(Message(Kind.PUSH, node.node_name, dst, key=key, part=part,
                                              version=round_, meta=meta, payloads=payloads))
        k = self.current_k()
        if prev is None:
            # encoded blocks: the first push goes as blocks too (each block's codec state
            # starts with it), every one on the reliable channel (initialisation)
            self.whole += 1
            bands = np.zeros(contribution.size, dtype=np.int64)
        else:
            bands = assign_bands(self.contribution[ident], k, self.s.channels)
        quant = self.s.mode == "quant" and coder is None
        residual = None
        if quant:
            residual = self.residual.get(ident)
            if residual is None:
                residual = self.residual[ident] = np.zeros(flat.size, dtype=np.float32)
        nb = bands.size
        end = nb - 1
        order = np.argsort(-self.contribution[ident][:-1], kind="stable") if nb > 1 else []
        counts = [0] * (self.s.channels + 1)
        nbytes = [0] * (self.s.channels + 1)
        dense_bytes = [0] * (self.s.channels + 1)
        first: list[Message] = []
        later: list[Message] = []
        for seq in list(order) + [end]:
            band = int(bands[seq])
            if band < 0:
                self.skipped += 1
                continue
            lo, hi = int(seq) * be, min(flat.size, (int(seq) + 1) * be)
            block = flat[lo:hi]
            if residual is not None:
                block = block + residual[lo:hi]
            if coder is not None:
                payloads, meta = coder.encode(key, part, int(seq), block)
                dense_bytes[band] += block.nbytes
            elif quant and band > 0:
                packed, bounds, decoded = quantise4(block)
                residual[lo:hi] = block - decoded
                payloads = [Payload.of(packed), Payload.of(bounds)]
                meta = {QUANT_META: 1}
            else:
                if residual is not None:
                    residual[lo:hi] = 0.0
                payloads, meta = node.encode_push(key, np.array(block, copy=True),
                                                  tier="wan")
            meta[DGT_META] = [int(seq), nb, be]
            meta[ROUND_META] = round_
            msg = Message(Kind.PUSH, node.node_name, dst, key=key, part=part, version=round_,
                          channel=self.s.channel_of_band(band), meta=meta, payloads=payloads)
            counts[band] += 1
            nbytes[band] += msg.nbytes
            if seq == end:
                end_msg = msg
            elif band == 0:
                first.append(msg)
            else:
                later.append(msg)
        end_msg.meta[SENT_META] = counts
        end_msg.meta.update(extra_meta)
        for i in range(len(counts)):
            self.sent[i].blocks += counts[i]
            self.sent[i].bytes += nbytes[i]
        if coder is None:
            node.record("dgt_push", key=key, part=part, round=round_, k=round(k, 6),
                        blocks=counts, bytes=nbytes, skipped=int(np.sum(bands < 0)))
        else:
            # per band: the bytes sent, and the dense bytes the codec encoded into them
            node.record("dgt_push", key=key, part=part, round=round_, k=round(k, 6),
                        blocks=counts, bytes=nbytes, skipped=int(np.sum(bands < 0)),
                        codec=coder.name, dense_bytes=dense_bytes)
        # GeoMX's strict order: the important queue (channel 0 and the end block) first
        for m in first:
            node.post(m)
        ack = asyncio.ensure_future(node.request(end_msg))
        await asyncio.sleep(0)  # the request is posted before the bands
        for m in later:
            node.post(m)
        self.tail[ident] = later
        return await ack

    def round_answered(self, key: int, checkpoint: bool) -> None:
        """Round of ``key`` answered: its tail blocks are needed no more, unless the round
        is a checkpoint's (they are saved with it, :meth:`state_dict`)."""
        if checkpoint:
            return
        for ident in [i for i in self.tail if i[0] == key]:
            del self.tail[ident]

    def resend_tail(self, node: SchedContext, key: int) -> None:
        """A resumed sender: post again the checkpoint round's tail blocks of ``key``
        (the receiver drops the ones it had before the checkpoint)."""
        for ident in sorted(i for i in self.tail if i[0] == key):
            msgs = self.tail.pop(ident)
            for m in msgs:
                node.post(replace(m, src=node.node_name, meta={**m.meta, RESENT_META: 1}))
            if msgs:
                node.record("dgt_resend", key=key, part=ident[1], round=msgs[0].version,
                            blocks=len(msgs))

    def state_dict(self) -> dict[str, Any]:
        """What outlives a round (a checkpoint): the contribution EWMAs and quantisation
        residuals per (key, part), the workers' latest losses, adaptive K's ``loss_0``
        and K, the checkpoint round's tail blocks (:meth:`resend_tail`) and, when a sparse
        or 1-bit codec encodes the blocks, each block's codec state. The byte and block
        counters are the run's, not the job's."""
        out = {"contribution": [[list(i), c] for i, c in sorted(self.contribution.items())],
                "residual": [[list(i), r] for i, r in sorted(self.residual.items())],
                "losses": dict(sorted(self.losses.items())), "loss0": self.loss0, "k": self.k,
                "tail": [[m.dst, m.key, m.part, m.version, m.channel, m.meta,
                          [p.data for p in m.payloads]]
                         for _, msgs in sorted(self.tail.items()) for m in msgs]}
        coded = self.coder.state_dict()
        if coded is not None:
            out["block_codec"] = coded
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.contribution = {(int(i[0]), int(i[1])): np.asarray(c, dtype=np.float32)
                             for i, c in state["contribution"]}
        self.residual = {(int(i[0]), int(i[1])): np.asarray(r, dtype=np.float32)
                         for i, r in state["residual"]}
        self.losses = {str(w): float(v) for w, v in state["losses"].items()}
        self.loss0 = None if state["loss0"] is None else float(state["loss0"])
        self.k = float(state["k"])
        self.tail = {}
        for dst, key, part, version, channel, meta, arrays in state["tail"]:
            msg = Message(Kind.PUSH, "", str(dst), key=int(key), part=int(part),
                          version=int(version), channel=int(channel), meta=dict(meta),
                          payloads=[Payload.of(a) for a in arrays])
            self.tail.setdefault((msg.key, msg.part), []).append(msg)
        self.coder.load_state_dict(state.get("block_codec"))

    def record_totals(self, node: SchedContext) -> None:
        node.record("dgt_sender_totals", blocks=[c.blocks for c in self.sent],
                    bytes=[c.bytes for c in self.sent], skipped=self.skipped, whole=self.whole,
                    k=round(self.k, 6))


# ---------------------------------------------------------------- receiver

@dataclass
class ReceiverTotals:
    """A receiver's count of one band's blocks (``dgt_receiver_totals``)."""

    received: int = 0
    on_time: int = 0
    late: int = 0
    bytes: int = 0

    def count(self, nbytes: int, *, late: bool) -> None:
        """One block of ``nbytes`` arrived, after its round was assembled if ``late``."""
        self.received += 1
        self.bytes += nbytes
        if late:
            self.late += 1
        else:
            self.on_time += 1


def block_header(msg: Message, channels: int) -> tuple[int, int, int, int, int]:
    """``(seq, blocks, values per block, band, round)`` of a DGT block, checked for what a
    block says of itself (the tensor it must fit is the receiver's to check).

    Raises ValueError on a malformed descriptor, a band past the job's ``channels`` or a
    round that is not an integer: what a stranger may send is refused before any use."""
    desc = msg.meta.get(DGT_META)
    if (not isinstance(desc, list) or len(desc) != 3
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in desc)):
        raise ValueError(f"bad DGT block descriptor {desc!r}")
    seq, nb, be = desc
    if be <= 0 or nb < 1 or not 0 <= seq < nb:
        raise ValueError(f"DGT block {seq}/{nb} of {be} values")
    band = band_of_channel(msg.channel)
    if band > channels:
        raise ValueError(f"DGT block on channel {msg.channel}; this job has "
                         f"{channels} low-priority channels")
    round_ = msg.meta.get(ROUND_META)
    if not isinstance(round_, int) or isinstance(round_, bool):
        raise ValueError(f"DGT block without an integer round ({ROUND_META})")
    return seq, nb, be, band, round_


def decode_block(ctx: SchedContext, msg: Message, count: int | None) -> np.ndarray:
    """The float32 values of one DGT block: 4-bit, a codec's (``ctx.decode`` is given the
    block without DGT's meta) or dense. ``count``: how many
    values the block must hold; None for a block whose size only its receiver's
    assembly knows (a merge's end block), which cannot be 4-bit."""
    if msg.meta.get(QUANT_META):
        if count is None or len(msg.payloads) != 2 or any(p.data is None for p in msg.payloads):
            raise ValueError("a 4-bit DGT block is a band block with two payloads "
                             "(codes, bounds)")
        return dequantise4(msg.payloads[0].data, msg.payloads[1].data, count)
    if msg.meta.get("codec"):
        meta = {k: v for k, v in msg.meta.items()
                if k not in (DGT_META, ROUND_META, SENT_META)}
        plain = Message(msg.kind, msg.src, msg.dst, key=msg.key, meta=meta,
                        payloads=msg.payloads)
        value = np.array(ctx.decode(plain), dtype=np.float32).reshape(-1)
    else:
        if len(msg.payloads) != 1 or msg.payloads[0].is_phantom:
            raise ValueError("a dense DGT block needs exactly one real payload")
        value = np.array(msg.payloads[0].data, dtype=np.float32).reshape(-1)
    if count is not None and value.size != count:
        raise ValueError(f"DGT block has {value.size} values, expected {count}")
    return value


class DgtReceiver:
    """A global server's DGT reassembly (GeoMX's "Diff-Reception", DGT_RECONSTRUCT=1).

    Memory is bounded by the keys' sizes: a sender's blocks for a (key, part) land in at
    most one buffer slot per block (a late block is added into its slot, never queued).
    """

    def __init__(self, settings: DgtSettings):
        self.s = settings
        self.buffers: dict[tuple[str, int, int], dict[int, np.ndarray]] = {}
        self.assembled: dict[tuple[str, int, int], int] = {}
        self.on_time_now: dict[tuple[str, int, int], int] = {}
        self.totals = [ReceiverTotals() for _ in range(settings.channels + 1)]
        self.missing = 0
        self.assemblies = 0
        #: per (sender, key, part): round -> the blocks of it received, for the rounds
        #: from the last assembled one on (a checkpoint saves the last assembled round's,
        #: so a resumed sender's resent blocks are taken once)
        self.seen: dict[tuple[str, int, int], dict[int, set[int]]] = {}

    def receive(self, node: SchedContext, msg: Message, like: Any) -> np.ndarray | None:
        """Take one block; return the assembled tensor when ``msg`` is the end block.

        Raises ValueError (the caller answers ERROR) on a block that does not fit ``like``.
        """
        seq, nb, be, band, round_ = block_header(msg, self.s.channels)
        if is_phantom(like):
            raise ValueError("DGT blocks for a phantom tensor")
        n = int(like.size)
        if nb != max(1, math.ceil(n / be)):
            raise ValueError(f"DGT block {seq}/{nb} of {be} values does not fit key "
                             f"{msg.key} part {msg.part} ({n} values)")
        lo, hi = seq * be, min(n, (seq + 1) * be)
        block = decode_block(node, msg, hi - lo)
        ident = (msg.src, msg.key, msg.part)
        is_end = seq == nb - 1
        if is_end and not msg.request_id:
            raise ValueError("a DGT end block must be a request (it is answered)")
        seen = self.seen.setdefault(ident, {}).setdefault(round_, set())
        if seq in seen and msg.meta.get(RESENT_META) and not is_end:
            return None  # it reached this receiver before the checkpoint
        seen.add(seq)
        buf = self.buffers.setdefault(ident, {})
        # a late block's round is done: it joins the next one
        late = round_ <= self.assembled.get(ident, -1)
        self.totals[band].count(msg.nbytes, late=late)
        if not late:
            self.on_time_now[ident] = self.on_time_now.get(ident, 0) + 1
        have = buf.get(seq)
        if have is None:
            buf[seq] = block
        else:
            have += block
        if not is_end:
            return None
        sent = msg.meta.get(SENT_META)
        sent_total = sum(v for v in sent if isinstance(v, int)) if isinstance(sent, list) else 0
        on_time = self.on_time_now.pop(ident, 0)
        missing = max(0, sent_total - on_time)
        self.missing += missing
        out = np.zeros(n, dtype=np.float32)
        for s, b in buf.items():
            out[s * be:s * be + b.size] = b
        buf.clear()
        self.assembled[ident] = round_
        rounds = self.seen[ident]
        for r in [r for r in rounds if r < round_]:
            del rounds[r]
        self.assemblies += 1
        node.record("dgt_assemble", src=msg.src, key=msg.key, part=msg.part, round=round_,
                    sent=sent_total, on_time=on_time, missing=missing)
        return out.reshape(like.shape).astype(like.dtype, copy=False)

    def state_dict(self) -> dict[str, Any]:
        """What outlives a round (a checkpoint), per (sender, key, part): the last round
        assembled and which of its blocks came, the blocks buffered for the next
        assembly (late ones of earlier rounds) and how many of the next round's blocks
        came on time."""
        idents = sorted(set(self.buffers) | set(self.assembled) | set(self.on_time_now))
        out = []
        for i in idents:
            last = self.assembled.get(i, -1)
            out.append([list(i), last, sorted(self.seen.get(i, {}).get(last, ())),
                        self.on_time_now.get(i, 0),
                        [[seq, b] for seq, b in sorted(self.buffers.get(i, {}).items())]])
        return {"senders": out}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffers, self.assembled, self.on_time_now, self.seen = {}, {}, {}, {}
        for ident, assembled, seen, on_time, blocks in state["senders"]:
            i = (str(ident[0]), int(ident[1]), int(ident[2]))
            if int(assembled) >= 0:
                self.assembled[i] = int(assembled)
                self.seen[i] = {int(assembled): {int(q) for q in seen}}
            if int(on_time):
                self.on_time_now[i] = int(on_time)
            self.buffers[i] = {int(seq): np.asarray(b, dtype=np.float32) for seq, b in blocks}

    def pending_late(self) -> int:
        """Blocks buffered for a round that will never be assembled (run over)."""
        return sum(len(b) for b in self.buffers.values())

    def record_totals(self, node: SchedContext) -> None:
        node.record("dgt_receiver_totals", received=[t.received for t in self.totals],
                    on_time=[t.on_time for t in self.totals], late=[t.late for t in self.totals],
                    bytes=[t.bytes for t in self.totals], missing=self.missing,
                    unapplied=self.pending_late(), assemblies=self.assemblies)


# ---------------------------------------------------------------- the scheduler

class Dgt(TransferScheduler):
    """DGT as a transfer scheduler: workers carry their loss (adaptive K), local servers
    push their DC sums as blocks on several channels, global servers reassemble them."""

    name: ClassVar[str] = "dgt"
    Options = DgtSettings
    options: DgtSettings

    def worker_side(self, ctx: WorkerSchedContext) -> SchedWorkerSide | None:
        # only a job whose local servers adapt K pays the bytes of carrying the loss
        return _DgtWorker() if self.options.adaptive_k else None

    def local_side(self, ctx: LocalSchedContext) -> SchedLocalSide:
        return _DgtLocal(ctx, DgtSender(self.options))

    def global_side(self, ctx: GlobalSchedContext) -> SchedGlobalSide:
        return _DgtGlobal(ctx, DgtReceiver(self.options))


class _DgtWorker(SchedWorkerSide):
    carries_loss = True


class _DgtLocal(SchedLocalSide):
    def __init__(self, ctx: LocalSchedContext, sender: DgtSender):
        self.ctx = ctx
        self.sender = sender

    def note_worker_push(self, msg: Message) -> None:
        self.sender.note_loss(msg.src, msg.meta.get("loss"))  # adaptive K

    def on_key_ready(self, key: int) -> None:
        self.sender.resend_tail(self.ctx, key)  # a resumed run: the checkpoint's tail

    async def push_part(self, dst: str, key: int, part: int, round_: int, value: Any,
                        meta: dict[str, Any]) -> Message:
        return await self.sender.push(self.ctx, dst, key, part, round_, value, meta)

    def on_round_answered(self, key: int, round_: int, value: Any,
                          reply_meta: dict[str, Any]) -> None:
        # "ckpt": the round is a checkpoint's (geomx/node/checkpoint.py)
        self.sender.round_answered(key, checkpoint=bool(reply_meta.get("ckpt")))

    def on_done(self) -> None:
        self.sender.record_totals(self.ctx)

    def state_dict(self) -> dict[str, Any]:
        return self.sender.state_dict()

    def load_state_dict(self, state: Any) -> None:
        self.sender.load_state_dict(state)


class _DgtGlobal(SchedGlobalSide):
    def __init__(self, ctx: GlobalSchedContext, receiver: DgtReceiver):
        self.ctx = ctx
        self.receiver = receiver

    def decode_push(self, msg: Message, like: Any) -> Any:
        if DGT_META not in msg.meta:
            return None
        value = self.receiver.receive(self.ctx, msg, like)
        return HELD if value is None else value  # a block: the end block completes it

    def on_done(self) -> None:
        self.receiver.record_totals(self.ctx)

    def state_dict(self) -> dict[str, Any]:
        return self.receiver.state_dict()

    def load_state_dict(self, state: Any) -> None:
        self.receiver.load_state_dict(state)
