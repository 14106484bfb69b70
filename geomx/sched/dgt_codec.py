"""DGT blocks encoded by a sparse or 1-bit codec, each block on its own.

DGT (geomx/sched/dgt.py, docs/geomx-behaviour.md §4.4) ranks and drops fixed-size blocks of
the dense values; a sparse (Bi-Sparse, MPQ's large tensors) or 1-bit codec
(docs/geomx-behaviour.md §4.1, §4.3) turns a whole tensor into one selection, which has no
such blocks. They compose in this order: DGT cuts the dense tensor into its blocks and
ranks them by the dense values' contribution; then each block is encoded apart, as a
tensor of its own, by the codec the *whole* tensor travels with (its size rule is the
tensor's: :meth:`geomx.policy.codec.Codec.block_codec`). Each block keeps its own
error-feedback state (Bi-Sparse's momentum and accumulator, onebit's residual), keyed by
(key, part, block): what a block's message could not carry is added to that block's next
message. The receiver decodes each block into its slice of the tensor
(:class:`geomx.sched.dgt.DgtReceiver`); a block lost on an unreliable channel is a block
of zeros there, as for dense blocks, and what it carried is lost with it (its sender's
state was already cleared of it).

Bi-Sparse keeps at most ``floor(n_block * r)`` values of a block of ``n_block``, so the
blocks of a tensor together keep at most ``floor(N * r)``: the global server's
re-sparsified pull reply (``floor(N * r * D)`` for D summed pushes) has room for all of
them, unless late blocks (``tcp`` bands that missed their round's end block, added into
the next round's) push a sum past it: the reply's ``meta["dropped"]`` counts what did
not fit, as for Bi-Sparse alone.

With such a codec ``quant``'s 4-bit bands do not apply (the blocks are already encoded;
the scenario refuses the pair, geomx/scenario/checks.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from geomx.policy.codec import Codec, CodecState
from geomx.wire import Payload

_MASK32 = (1 << 32) - 1


def block_key(key: int, part: int, seq: int) -> int:
    """The key a block is encoded under: Bi-Sparse seeds its sample from it, so every
    block of every key and part draws its own positions, the same in every run."""
    return ((int(key) & _MASK32) << 32) | ((int(part) & 0xFF) << 24) | (int(seq) & 0xFFFFFF)


class BlockCodecs:
    """A local server's per-block codec states for DGT (one per :class:`DgtSender`)."""

    def __init__(self) -> None:
        #: the whole-tensor codec's config the states belong to (a new codec starts afresh)
        self.config: dict[str, Any] | None = None
        self.block: Codec | None = None
        self.states: dict[tuple[int, int, int], CodecState] = {}

    def for_codec(self, codec: Codec | None) -> BlockCodecs | None:
        """Self, set up for blocks of a tensor that travels with ``codec``; None when the
        blocks need no encoding of their own (dense, or an elementwise codec such as fp16,
        which encodes a block as it encodes the tensor)."""
        if codec is None or codec.elementwise:
            return None
        config = codec.config()
        if config != self.config:
            self.config = config
            self.block = None
            self.states.clear()
        if self.block is None:
            self.block = codec.block_codec()
        return self

    @property
    def name(self) -> str:
        assert self.block is not None
        return self.block.name

    def encode(self, key: int, part: int, seq: int,
               block: np.ndarray) -> tuple[list[Payload], dict[str, Any]]:
        """Block ``seq`` of (``key``, ``part``) encoded with its own state: payloads, meta."""
        codec = self.block
        assert codec is not None
        state = None
        if codec.stateful:
            ident = (key, part, seq)
            state = self.states.get(ident)
            if state is None or state.num_elements != block.size:
                state = self.states[ident] = codec.new_state(block.size)
        enc = codec.encode(block_key(key, part, seq), block, state).to_host()
        return [Payload.of(a) for a in enc.arrays], dict(enc.meta)

    def state_dict(self) -> dict[str, Any] | None:
        """The codec config and each block's state (None: no block has one)."""
        if not self.states:
            return None
        return {"config": dict(self.config or {}),
                "blocks": [[list(i), {"n": st.num_elements, "round": st.round,
                                      **st.arrays()}]
                           for i, st in sorted(self.states.items())]}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        self.states.clear()
        self.block = None
        self.config = None
        if not state:
            return
        self.config = dict(state["config"])
        for ident, st in state["blocks"]:
            i = (int(ident[0]), int(ident[1]), int(ident[2]))
            arrays = {f: np.array(st[f], dtype=np.float32)  # a writeable copy: encode updates it
                      for f in ("u", "v", "residual") if st.get(f) is not None}
            self.states[i] = CodecState(int(st["n"]), round=int(st["round"]), **arrays)
