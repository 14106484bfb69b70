"""Applies the job's gradient codec on the links GeoMX applies it to.

GeoMX (geomx-behaviour.md §4.1–4.3): Bi-Sparse only between local and global servers
(push: DC sum sparsified with error feedback; pull: the global sum re-sparsified), and
only for tensors of at least ``size_lower_bound`` elements; FP16 on both tiers; MPQ
mixes the two by tensor size. This module is the one place that decides, per link
tier and tensor, which codec runs, and wraps the codec's arrays as wire payloads.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from geomx.node.values import Value, from_payload, is_phantom
from geomx.wire import Message, Payload

DENSE = "none"


class LinkCodec:
    """Encode/decode values for one tier ("lan": worker<->local server, "wan": local<->global)."""

    def __init__(self, config: dict[str, Any], num_dcs: int = 1):
        self.config = dict(config or {"type": DENSE})
        self.type = str(self.config.get("type", DENSE))
        self.num_dcs = num_dcs
        self._impl = None
        if self.type != DENSE:
            from geomx.codec import link_policy_from_config

            self._impl = link_policy_from_config(self.config, num_dcs=num_dcs)
        self._states: dict[tuple[str, int], Any] = {}

    @property
    def enabled(self) -> bool:
        return self._impl is not None

    # -------------------------------------------------------------- encode
    def encode_push(self, key: int, value: Value, *, tier: str) -> tuple[list[Payload], dict[str, Any]]:
        if self._impl is None:
            return [_dense(value)], {}
        return self._impl.encode(key, value, tier=tier, direction="push", states=self._states)

    def encode_pull(self, key: int, value: Value, *, tier: str,
                    weights: bool = False) -> tuple[list[Payload], dict[str, Any]]:
        """Encode a pull reply. ``weights``: the value is a weight vector (GS optimizer
        installed), which must never be sparsified (GeoMX truncates it: a bug we fix)."""
        if self._impl is None:
            return [_dense(value)], {}
        return self._impl.encode(key, value, tier=tier, direction="pull", states=self._states,
                                 dense_only=weights)

    # -------------------------------------------------------------- decode
    def decode(self, msg: Message, *, like: Value | None = None) -> Value:
        """Decode a push/pull payload into a dense value shaped like ``like``."""
        if msg.meta.get("codec") and self._impl is not None:
            return self._impl.decode(msg.payloads, msg.meta, like=like)
        if msg.meta.get("codec"):
            # a codec we were not told about: build a decoder from the message itself
            from geomx.codec import link_policy_from_config

            impl = link_policy_from_config({"type": msg.meta["codec_type"]}, num_dcs=self.num_dcs)
            return impl.decode(msg.payloads, msg.meta, like=like)
        if len(msg.payloads) != 1:
            raise ValueError(f"dense message needs exactly one payload, got {len(msg.payloads)}")
        p = msg.payloads[0]
        if like is not None and not is_phantom(like) and p.num_elements != like.size:
            raise ValueError(f"payload has {p.num_elements} elements, key {msg.key} has {like.size}")
        if like is not None and is_phantom(like) != p.is_phantom:
            raise ValueError("phantom/real payload mismatch")
        v = from_payload(p)
        if like is not None and not is_phantom(like):
            v = v.reshape(like.shape)
            if v.dtype != like.dtype:
                v = v.astype(like.dtype)
        return v


def _dense(value: Value) -> Payload:
    """A dense payload holding a *copy*: the sender may update its array in place (an
    optimizer step) before the bytes leave, in either runtime."""
    if isinstance(value, Payload):
        return value
    return Payload.of(np.array(value, copy=True, order="C"))
