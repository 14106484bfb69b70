"""A TSEngine merge under the job's codec: decode, add, encode again.

In TSEngine's aggregation (docs/papers.md §2 (b), docs/geomx-behaviour.md §4.5) a node
that is paired as a receiver adds the incoming merge into its own buffer and queues
again; the buffer it finally sends holds its own value and every merge it took. With a
codec on the overlay's hop (``wan`` between local servers, ``lan`` between a DC's
workers), that buffer is what gets encoded, once per round, by whichever node sends it:

* **dense codecs** (``fp16``, ``bf16``): the sum is rounded to half precision again at
  every hop; nothing is kept between rounds.
* **sparse and 1-bit codecs with error feedback** (``bsc``, ``onebit``, and ``mpq``'s
  Bi-Sparse for large tensors): a sum of top-k selections is no top-k selection and a
  sum of signs is no sign vector, so a relay cannot forward what it received as it is.
  It decodes each merge, adds it into its codec state's error-feedback memory, and
  encodes its own value with that state, a state of its own per (key, part): Bi-Sparse
  selects the top-k of the merged sum (its momentum correction acting on the relay's own
  gradient only: the senders applied theirs) and keeps the rest in the relay's
  accumulator, onebit sends the signs of sum + residual and keeps what they do not
  express. This is the hierarchical sparsification of gTop-k (Shi et al., ICDCS 2019:
  each merge step re-selects the top k of the summed sparse vectors) with DGC/EF-SGD
  error feedback at every step, so nothing a relay drops is lost: it travels in a later
  round, through whichever tree that round builds. ``mpq`` picks per tensor size as its rule says
  (``codec_for``), so small tensors travel fp16 and large ones Bi-Sparse on the WAN.

The state belongs to this object (one per overlay and node, held by the scheduler side,
saved with the local server's checkpoint), not to the node's own codec: a local server's
error feedback for its plain pushes and its residual as a relay are different streams.
Every member sends exactly one merge per (key, part) and round, so a state advances one
encode per round, in the same order on every run.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from geomx.policy.codec import Codec, CodecState
from geomx.policy.scheduling import SchedContext, Value
from geomx.wire import Message, Payload

#: meta key every encoded payload carries (geomx/policy/codec.py: the decoder's name)
CODEC_META = "codec"
_DENSE = "none"


class MergeCodec:
    """Encode a merge buffer for one overlay's hop and decode received merges."""

    def __init__(self, ctx: SchedContext, tier: str):
        self.ctx = ctx
        self.tier = tier
        #: (key, part) -> (the codec the state belongs to, its state)
        self._states: dict[tuple[int, int], tuple[Codec, CodecState]] = {}
        #: states of a checkpoint, taken when the codec of their (key, part) is known
        self._pending: dict[tuple[int, int], dict[str, Any]] = {}

    def encode(self, key: int, part: int, value: Value, *,
               received: Value = None) -> tuple[list[Payload], dict[str, Any]]:
        """This node's merge buffer as it leaves: its own ``value`` plus the decoded sum
        of the merges it took (``received``, None: none); the payloads and the codec's
        meta (empty when it travels dense, as without a codec).

        ``received`` joins the codec's error-feedback memory (Bi-Sparse's accumulator
        ``v``, onebit's residual) rather than its input: the senders corrected it for
        momentum already, and Bi-Sparse's momentum would otherwise apply again at every
        hop (a value relayed h times would be amplified by up to (1/(1-m))^h). The
        selection is the same, the top-k of everything this node holds; a codec whose
        state has no such memory (a stateless one) encodes the plain sum."""
        n = value.num_elements if isinstance(value, Payload) else int(value.size)
        codec = self.ctx.codec_for(n, tier=self.tier)
        if codec is None:
            if received is not None:
                _add_into(value, received)
            return [value if isinstance(value, Payload)
                    else Payload.of(np.ascontiguousarray(value))], {}
        if isinstance(value, Payload):  # a phantom: the encoded sizes, no kernel run
            return ([Payload.phantom(tuple(s.shape), s.dtype)
                     for s in codec.encoded_sizes(n, value.dtype)],
                    {CODEC_META: codec.name, "n": n, "dtype": value.dtype,
                     "shape": list(value.shape)})
        state = self._state(codec, key, part, n) if codec.stateful else None
        if received is not None:
            memory = _feedback_memory(state)
            if memory is None:
                _add_into(value, received)
            else:
                np.add(memory, received.reshape(memory.shape), out=memory, casting="unsafe")
        enc = codec.encode(key, value, state)
        meta = dict(enc.meta)
        if meta.get(CODEC_META) == _DENSE:
            meta = {}
        return [Payload.of(np.asarray(a)) for a in enc.arrays], meta

    def _state(self, codec: Codec, key: int, part: int, n: int) -> CodecState:
        kept = self._states.get((key, part))
        if kept is None or kept[0] is not codec or kept[1].num_elements != n:
            # first round of this (key, part), or a new codec (a command): a fresh state
            state = codec.new_state(n)
            saved = self._pending.pop((key, part), None)
            if saved is not None and saved.get("codec") == codec.name:
                state = _restored(state, saved)
            kept = self._states[(key, part)] = (codec, state)
        return kept[1]

    def add_decoded(self, msg: Message, like: Value, received: Value) -> Value:
        """``received`` (None: nothing yet) plus the value merge ``msg`` carries."""
        v = self.ctx.decode(msg, like=like)
        if isinstance(v, Payload) or isinstance(like, Payload):
            return None  # phantoms carry sizes only
        if received is None:
            return np.array(v, dtype=np.float32, copy=True).reshape(like.shape)
        _add_into(received, v)
        return received

    def decode(self, msg: Message, like: Value | None) -> Value | None:
        """The value an encoded merge carries (None: a dense merge, read as it is)."""
        if not msg.meta.get(CODEC_META):
            return None
        return self.ctx.decode(msg, like=like)

    def codec_name(self, msg: Message) -> str | None:
        """The codec a merge travelled with (None: dense)."""
        name = msg.meta.get(CODEC_META)
        return str(name) if name else None

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> list[dict[str, Any]] | None:
        """The residuals kept per (key, part), or None when there are none."""
        if not self._states and not self._pending:
            return None
        out = []
        for (key, part), (codec, st) in sorted(self._states.items()):
            arrays = {k: np.array(a, copy=True) for k, a in st.arrays().items()}
            out.append({"key": key, "part": part, "codec": codec.name, "round": st.round,
                        "arrays": arrays})
        for (key, part), saved in sorted(self._pending.items()):
            out.append(dict(saved, key=key, part=part))
        return out

    def load_state_dict(self, state: list[dict[str, Any]] | None) -> None:
        self._states.clear()
        self._pending = {(int(e["key"]), int(e["part"])): e for e in state or []}


def _feedback_memory(state: CodecState | None) -> np.ndarray | None:
    """The flat error-feedback memory of ``state`` (what a sender keeps of what it did
    not send), or None when the codec keeps none on the host."""
    if state is None:
        return None
    for a in (state.v, state.residual):
        if isinstance(a, np.ndarray) and a.dtype == np.float32:
            return a.reshape(-1)
    return None


def _add_into(acc: Value, v: Value) -> None:
    np.add(acc, np.asarray(v).reshape(acc.shape), out=acc, casting="unsafe")


def _restored(fresh: CodecState, saved: dict[str, Any]) -> CodecState:
    """A state shaped like ``fresh`` holding a checkpoint's arrays and round."""
    arrays = {}
    for name, mine in fresh.arrays().items():
        a = np.asarray(saved.get("arrays", {}).get(name))
        if a.size != np.asarray(mine).size:
            raise ValueError(f"a checkpointed TSEngine relay state of {saved.get('codec')!r} "
                             f"does not fit this job's codec (array {name!r})")
        arrays[name] = np.array(a, dtype=np.asarray(mine).dtype).reshape(np.shape(mine))
    return CodecState(fresh.num_elements, round=int(saved.get("round", 0)), **arrays)
