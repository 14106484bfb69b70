"""Applies the job's gradient codec on the links GeoMX applies it to.

GeoMX (docs/geomx-behaviour.md §4.1–4.3): Bi-Sparse only between local and global servers
(push: the DC sum sparsified with momentum correction and error feedback; pull: the
global sum re-sparsified), and only for tensors of at least ``size_lower_bound``
elements; FP16 on both tiers; MPQ mixes the two by tensor size. The codec package
(``geomx.codec``) holds that table (``policy.codec_for(num_elements, tier)``); this module
is the one place that asks it, owns the per-key error-feedback state of this node, and
turns encoded arrays into wire payloads (phantom payloads for phantom tensors, sized
without running a kernel).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from geomx.node.values import Value, from_payload, is_phantom
from geomx.wire import Message, Payload

DENSE = "none"


def codec_config_check(config: dict[str, Any]) -> dict[str, Any]:
    """Validate a ``set_gradient_compression`` dict; return it normalised (raises ValueError)."""
    from geomx.codec import codec_from_config

    return dict(codec_from_config(config).config())


def _policy(config: dict[str, Any]):
    from geomx.codec import codec_from_config

    return codec_from_config(config)


class CodecNotice:
    """The codec the master worker set (``set_gradient_compression``), told once to each
    worker of a server: GeoMX's workers learn it from their server's next reply (the
    ``codec_config`` of its meta), not from a message of their own."""

    def __init__(self) -> None:
        self.config: dict[str, Any] | None = None
        self._told: set[str] = set()

    def command(self, config: dict[str, Any]) -> None:
        """A new codec: every worker is to be told again."""
        self.config = dict(config)
        self._told.clear()

    def tell(self, worker: str, meta: dict[str, Any]) -> dict[str, Any]:
        """``meta``, with the codec when ``worker`` has not been told it yet."""
        if self.config is not None and worker not in self._told:
            self._told.add(worker)
            meta["codec_config"] = self.config
        return meta


class SavedCodecMemory:
    """A resumed node's error-feedback memory from its checkpoint, and the codec config
    (:attr:`LinkCodec.identity`) it belongs to.

    Why it waits: a training program sets its codec at run time
    (``kv.set_gradient_compression``), so a resumed node starts with the scenario's
    ``[codec]`` and installs the program's when the master's command (or, on a worker, a
    reply) arrives -- after the checkpoint was loaded. The memory fills every codec this
    node installs whose config equals the saved one (each gets its own copy) until the
    node's first encoded push: from then on the round after the checkpoint is under way,
    and a codec installed later starts fresh, as it would in an uninterrupted run.
    At that first push the node records which it resumed with: ``codec_restore`` when
    the codec encoding it is the one the memory belongs to, else a ``warning`` naming
    both configs (its memory starts from zero: the job's codec differs from the
    checkpoint's).
    """

    def __init__(self, config: dict[str, Any], states: dict[tuple[str, int, int], Any],
                 record: Callable[..., None]):
        self.config = dict(config)
        self._states = states
        self._record = record

    def offer(self, codec: LinkCodec) -> None:
        """Fill ``codec``'s states with copies of the saved ones when they belong to it."""
        if codec.identity == self.config:
            codec.states = {k: _copy_state(st) for k, st in self._states.items()}

    def close(self, codec: LinkCodec) -> None:
        """``codec`` encodes this node's first push since the resume: record whether it
        carries on from the checkpoint's memory."""
        if codec.identity == self.config:
            self._record("codec_restore", codec=codec.type, keys=len(self._states))
            return
        self._record("warning", text=(
            f"the checkpoint's codec memory ({len(self._states)} keys) belongs to codec "
            f"{self.config}, and this node encodes with {codec.identity}: its error "
            "feedback starts from zero (the job's codec differs from the checkpoint's)"))


def _copy_state(st: Any) -> Any:
    return dataclasses.replace(st, **{f: np.array(a, copy=True) for f, a in st.arrays().items()},
                               extra={})


class LinkCodec:
    """Encode/decode values on one node for a tier ("lan": worker<->local server, "wan":
    local<->global server, or worker<->global server in the flat-PS baseline)."""

    def __init__(self, config: dict[str, Any] | None, num_dcs: int = 1):
        self.config = dict(config or {"type": DENSE})
        self.type = str(self.config.get("type", DENSE))
        self.num_dcs = num_dcs
        self._policy = None if self.type == DENSE else _policy(self.config)
        #: per (tier, key, part) error-feedback memory of this node (explicit, never hidden)
        self.states: dict[tuple[str, int, int], Any] = {}
        #: a resumed node's checkpointed memory, until this node's first encoded push
        self._saved: SavedCodecMemory | None = None

    @property
    def identity(self) -> dict[str, Any]:
        """The normalised config (every parameter, defaults included) that rebuilds this
        codec: what a checkpoint records its memory as belonging to, and compares."""
        return {"type": DENSE} if self._policy is None else dict(self._policy.config())

    def hold(self, saved: SavedCodecMemory) -> None:
        """Keep a checkpoint's memory until this node's first encoded push, filling this
        codec's states now when they belong to it (:class:`SavedCodecMemory`)."""
        self._saved = saved
        saved.offer(self)

    def replaced(self, config: dict[str, Any]) -> LinkCodec:
        """The codec a ``set_gradient_compression`` installs in place of this one: fresh
        memory, except a resumed node's checkpointed memory, which is handed on and fills
        the new codec when it belongs to it."""
        new = LinkCodec(config, num_dcs=self.num_dcs)
        if self._saved is not None:
            new.hold(self._saved)
        return new

    @property
    def enabled(self) -> bool:
        """True when some tensor may be sent as a whole-tensor selection (a codec that is
        not ``elementwise``: sparse, 1-bit), so placement must not split it."""
        return self._policy is not None and not self._policy.elementwise

    def codec_for(self, num_elements: int, tier: str) -> Any:
        """The codec a tensor of ``num_elements`` travels with on ``tier`` (None: dense)."""
        return self._codec(num_elements, tier)

    def _codec(self, n: int, tier: str):
        if self._policy is None:
            return None
        c = self._policy.codec_for(n, tier)
        return None if c.name == DENSE else c

    # -------------------------------------------------------------- encode
    def encode_push(self, key: int, value: Value, *, tier: str,
                    part: int = 0) -> tuple[list[Payload], dict[str, Any]]:
        if self._saved is not None:  # the first round after the checkpoint has begun
            self._saved.close(self)
            self._saved = None
        if self._policy is None:  # no codec configured: dense, without sizing the value
            return [_dense(value)], {}
        n = _num_elements(value)
        codec = self._codec(n, tier)
        if codec is None:
            return [_dense(value)], {}
        if is_phantom(value):
            return _phantom(codec.encoded_sizes(n, value.dtype), codec.name, value)
        state = None
        if codec.stateful:
            state = self.states.get((tier, key, part))
            if state is None:
                state = self.states[(tier, key, part)] = codec.new_state(n)
        enc = codec.encode(key, value, state)
        return [Payload.of(a) for a in enc.arrays], dict(enc.meta)

    def encode_pull(self, key: int, value: Value, *, tier: str,
                    weights: bool = False) -> tuple[list[Payload], dict[str, Any]]:
        """Encode a pull reply. ``weights``: the value is a weight vector (a global
        optimizer is installed); it is never sparsified (GeoMX truncates it: a bug we fix),
        though a precision codec (fp16/bf16) still applies."""
        if self._policy is None:
            return [_dense(value)], {}
        n = _num_elements(value)
        codec = self._codec(n, tier)
        if codec is None or (weights and not codec.elementwise):
            return [_dense(value)], {}
        if is_phantom(value):
            return _phantom(codec.pull_encoded_sizes(n, value.dtype, sources=self.num_dcs),
                            codec.name, value)
        enc = codec.encode_pull(key, value, sources=self.num_dcs)
        if enc.meta.get("codec") == DENSE:
            return [Payload.of(a) for a in enc.arrays], {}
        return [Payload.of(a) for a in enc.arrays], dict(enc.meta)

    # -------------------------------------------------------------- decode
    def decode(self, msg: Message, *, like: Value | None = None) -> Value:
        """Decode a push/pull payload into a dense value shaped like ``like``.

        Raises ValueError (the caller answers ERROR and keeps serving) on anything that
        does not fit: wrong element count, unknown codec, malformed sparse data.
        """
        name = msg.meta.get("codec")
        if name:
            return self._decode_coded(msg, str(name), like)
        if len(msg.payloads) != 1:
            raise ValueError(f"dense message needs exactly one payload, got {len(msg.payloads)}")
        p = msg.payloads[0]
        if p.data is None and (like is None or is_phantom(like)):
            # a phantom is a size and nothing else, never written: the receiver may hold
            # the one it got (what from_payload would build is an equal new one)
            return p
        if like is not None and not is_phantom(like) and p.num_elements != like.size:
            raise ValueError(f"payload has {p.num_elements} elements, key {msg.key} has {like.size}")
        if like is not None and is_phantom(like) != p.is_phantom:
            raise ValueError("phantom/real payload mismatch")
        v = from_payload(p, take=True)
        if like is not None and not is_phantom(like):
            v = v.reshape(like.shape)
            if v.dtype != like.dtype:
                v = v.astype(like.dtype)
        return v

    def _decode_coded(self, msg: Message, name: str, like: Value | None) -> Value:
        from geomx.codec import CodecError, decode

        meta = dict(msg.meta)
        meta.pop("stop", None)
        meta.pop("ckpt", None)
        n = meta.get("n")
        if like is not None and n != _num_elements(like):
            raise ValueError(f"encoded tensor has {n} elements, key {msg.key} has "
                             f"{_num_elements(like)}")
        if any(p.is_phantom for p in msg.payloads):
            shape = tuple(meta.get("shape", (n,)))
            return Payload.phantom(shape, meta.get("dtype", "<f4"))
        try:
            out = decode(([p.data for p in msg.payloads], meta))
        except (CodecError, KeyError, TypeError) as e:
            raise ValueError(f"cannot decode {name!r} payload: {e}") from None
        out = np.asarray(out)
        if like is not None and not is_phantom(like):
            out = out.reshape(like.shape)
            if out.dtype != like.dtype:
                out = out.astype(like.dtype)
        return out


def _num_elements(v: Value) -> int:
    if isinstance(v, Payload):
        return v.num_elements
    return int(v.size)


def _phantom(specs: list[Any], name: str, like: Payload) -> tuple[list[Payload], dict[str, Any]]:
    meta = {"codec": name, "n": like.num_elements, "dtype": like.dtype,
            "shape": list(like.shape)}
    return [Payload.phantom(tuple(s.shape), s.dtype) for s in specs], meta


def _dense(value: Value) -> Payload:
    """A dense payload holding a *copy*: the sender may update its array in place (an
    optimizer step) before the bytes leave, in either runtime -- unless the array is
    read-only (:func:`geomx.node.values.freeze`: a snapshot its owner no longer writes,
    or copies before writing), which is sent as it is."""
    if isinstance(value, Payload):
        return value
    flags = value.flags
    if not flags.writeable and flags.c_contiguous:
        return Payload.of(value)
    return Payload.of(np.array(value, copy=True, order="C"))
