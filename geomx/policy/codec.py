"""The codec protocol: what a gradient codec is, what it produces, and its state.

A codec turns one tensor (one parameter key) into a few flat arrays that travel (their
``nbytes`` summed is what the network charges) plus a small JSON-able ``meta`` dict, and
turns them back into a dense tensor. Three rules shape the interface:

* **State is explicit.** Error-feedback memory (Bi-Sparse's momentum ``u`` and
  accumulator ``v``, onebit's residual) lives in a :class:`CodecState` the *caller* owns,
  one per key (``codec.new_state(n)``). Nothing is hidden inside a codec object, so a
  node can checkpoint, inspect or reset it, and a codec object can be shared.
* **Decoding is self-describing.** ``meta["codec"]`` names the decoder, so a server can
  decode any payload with :func:`decode` without knowing the sender's parameters.
  ``decode(..., out=buf, accumulate=True)`` adds into ``buf`` (scatter-add for sparse
  payloads), which is how servers aggregate pushes without densifying each one.
* **Phantoms are free.** ``encoded_sizes(n, dtype)`` gives the (dtype, shape) of every
  travelling array without touching data, so the emulator can charge the right bytes
  for a ResNet-50-sized model it never allocates.

Arrays may be numpy arrays (CPU kernels) or CUDA arrays (anything with
``__cuda_array_interface__``: numba device arrays, CuPy, PyTorch CUDA tensors), see
``device.py``; an :class:`Encoded` made from a CUDA tensor holds numba device arrays and
``Encoded.to_host()`` copies them out for the wire.
"""
from __future__ import annotations

import abc
import importlib
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, NamedTuple

import numpy as np

from geomx.policy import device

Tier = Literal["lan", "wan"]
#: "lan": worker <-> local server inside a DC; "wan": local server <-> global server.
TIERS: tuple[str, ...] = ("lan", "wan")

#: GeoMX's environment variable for the dense/sparse size boundary
#: (docs/geomx-behaviour.md §4.1, §4.3).
SIZE_BOUND_ENV = "MXNET_KVSTORE_SIZE_LOWER_BOUND"
#: GeoMX's server-side default for that boundary (the demo scripts set 1000).
DEFAULT_SIZE_LOWER_BOUND = 200_000


class CodecError(ValueError):
    """Bad codec input: malformed encoded data, wrong state, unsupported dtype."""


class ArraySpec(NamedTuple):
    """Shape and dtype of one travelling array (what a phantom payload carries)."""

    dtype: str  # numpy dtype string, e.g. "<f4", "<f2", "<i4", "|u1"
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(math.prod(self.shape)) * np.dtype(self.dtype).itemsize


@dataclass(eq=False)
class Encoded:
    """One encoded tensor: ``arrays`` travel, ``meta`` (small, JSON-able) describes them.

    ``meta`` always has ``codec`` (decoder name), ``n`` (number of elements), ``dtype``
    (numpy dtype string of the original tensor) and ``shape`` (list of ints).
    """

    arrays: list[Any]
    meta: dict[str, Any]

    @property
    def nbytes(self) -> int:
        """Bytes that travel: the sum of the arrays' ``nbytes``."""
        return int(sum(int(a.nbytes) for a in self.arrays))

    @property
    def codec(self) -> str:
        return str(self.meta["codec"])

    @property
    def num_elements(self) -> int:
        return int(self.meta["n"])

    @property
    def on_device(self) -> bool:
        return any(device.is_cuda_array(a) for a in self.arrays)

    def specs(self) -> list[ArraySpec]:
        return [ArraySpec(np.dtype(a.dtype).str, tuple(int(s) for s in a.shape)) for a in self.arrays]

    def to_host(self) -> "Encoded":
        """A copy whose arrays are numpy arrays (device arrays are copied to the host)."""
        return Encoded([device.to_host(a) for a in self.arrays], dict(self.meta))


@dataclass(eq=False)
class CodecState:
    """Per-key codec memory, owned by the caller (one per key and direction).

    ``u``/``v``: Bi-Sparse momentum and accumulator (``v`` is the error-feedback residual:
    whatever was not sent keeps accumulating there). ``residual``: onebit's error
    feedback. ``round``: number of encodes done with this state; Bi-Sparse derives its
    sample seed from (seed, key, round). ``extra``: scratch buffers a codec reuses
    between rounds; they never influence a result.
    """

    num_elements: int
    u: Any = None
    v: Any = None
    residual: Any = None
    round: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def arrays(self) -> dict[str, Any]:
        return {k: a for k, a in (("u", self.u), ("v", self.v), ("residual", self.residual)) if a is not None}

    @property
    def nbytes(self) -> int:
        return int(sum(int(a.nbytes) for a in self.arrays().values()))

    def reset(self) -> None:
        """Zero the memory (for example after a model reload)."""
        for a in self.arrays().values():
            if isinstance(a, np.ndarray):
                a[...] = 0
            else:
                device.cuda_kernels().fill_zero(a)
        self.round = 0


# --------------------------------------------------------------------------- decoders

_DECODERS: dict[str, type["Codec"]] = {}

#: Decoder names the installed loader can register, and the loader
#: (:func:`set_decoder_loader`).
_LOADABLE: frozenset[str] = frozenset()
_LOADER: Callable[[str], object] | None = None
#: The package that installs the built-in codecs' loader when it is imported. This layer
#: may not import it (pyproject.toml's layers), so it names it, as
#: ``geomx.policy.registry.BUILTIN`` names every built-in codec's class.
_BUILTIN_PACKAGE = "geomx.codec"


def set_decoder_loader(names: Iterable[str], load: Callable[[str], object]) -> None:
    """Let :func:`decode` find decoders whose modules are not imported yet.

    A decoder is registered when its codec's class is created, that is when its module
    is imported; the built-in compressing codecs import Numba, so their modules are
    imported only when needed (geomx/codec/__init__.py). A node can receive a payload of
    a codec it has never built: a global server installs the master's
    ``set_gradient_compression`` and answers in fp16 before the command it forwards has
    reached the local server that pulled. Commands and payloads travel on different
    paths, so decoding must not depend on which arrives first.

    ``names``: the decoder names (``meta["codec"]``) ``load`` registers; ``load(name)``
    imports the module that defines that decoder. geomx.codec installs its loader when
    it is imported; :func:`decode` imports geomx.codec itself when no loader is installed.
    """
    global _LOADABLE, _LOADER
    _LOADABLE = frozenset(names)
    _LOADER = load


def _loadable() -> frozenset[str]:
    """The decoder names the loader can register (importing geomx.codec, which installs
    the loader, on first need)."""
    if _LOADER is None:
        importlib.import_module(_BUILTIN_PACKAGE)
    return _LOADABLE


def _decoder(name: Any) -> type["Codec"] | None:
    """The decoder registered as ``name``, loading a built-in one not imported yet."""
    if not isinstance(name, str):
        return None
    cls = _DECODERS.get(name)
    if cls is None and name in _loadable() and _LOADER is not None:
        _LOADER(name)
        cls = _DECODERS.get(name)
    return cls


def known_decoders() -> list[str]:
    """Every decoder name :func:`decode` accepts: those registered and the built-in ones
    the loader registers on first use."""
    return sorted(set(_DECODERS) | _loadable())


def decode(encoded: "Encoded | tuple[list[Any], dict[str, Any]]", out: Any = None,
           accumulate: bool = False) -> Any:
    """Decode any codec's payload (picked by ``meta["codec"]``).

    ``out``: optional destination with ``meta["n"]`` elements (numpy array, or a CUDA
    array for device payloads); it is overwritten, or added to when ``accumulate`` is
    true. Without ``out`` a new array of the original shape and dtype is returned.
    A built-in codec's decoder is loaded on first use (:func:`set_decoder_loader`), so
    any node decodes any built-in payload whatever it has imported or been told.
    Raises :class:`CodecError` on malformed input (wrong array count/dtypes/sizes,
    indices out of range, unknown codec).
    """
    if isinstance(encoded, Encoded):
        arrays, meta = encoded.arrays, encoded.meta
    else:
        try:
            arrays, meta = encoded
        except (TypeError, ValueError):
            raise CodecError("decode expects an Encoded or an (arrays, meta) pair") from None
    if not isinstance(meta, dict):
        raise CodecError(f"meta must be a dict, got {type(meta).__name__}")
    name = meta.get("codec")
    cls = _decoder(name)
    if cls is None:
        raise CodecError(f"unknown codec {name!r} in meta; known: {known_decoders()}")
    arrays = list(arrays)
    n, dtype, shape = parse_meta(meta)
    on_dev = any(device.is_cuda_array(a) for a in arrays)
    if accumulate and out is None:
        raise CodecError("accumulate=True needs an out array")
    if out is not None:
        out_dev = device.is_cuda_array(out)
        if out_dev != on_dev and arrays:
            raise CodecError("out and the encoded arrays must be on the same device")
        on_dev = out_dev
        size = int(np.prod(out.shape)) if out_dev else int(np.asarray(out).size)
        if size != n:
            raise CodecError(f"out has {size} elements, the payload {n}")
        if not out_dev:
            if not isinstance(out, np.ndarray):
                raise CodecError("out must be a numpy array")
            if not out.flags.c_contiguous or not out.flags.writeable:
                raise CodecError("out must be C-contiguous and writeable")
            if out.dtype.kind != "f":
                raise CodecError(f"out must be a float array, got {out.dtype}")
    if on_dev:
        arrays = [device.as_device(a) for a in arrays]
        dout = device.as_device(out).reshape(n) if out is not None else None
        res = cls._decode_cuda(arrays, meta, n, dtype, dout, accumulate)
        if out is not None:
            return out
        return res.reshape(shape) if tuple(res.shape) != tuple(shape) else res
    arrays = [np.asarray(a) for a in arrays]
    flat = out.reshape(-1) if out is not None else None
    res = cls._decode_cpu(arrays, meta, n, dtype, flat, accumulate)
    if out is not None:
        return out
    return res.reshape(shape)


def parse_meta(meta: dict[str, Any]) -> tuple[int, np.dtype, tuple[int, ...]]:
    """Validate the common meta fields; returns (n, dtype, shape)."""
    try:
        n = meta["n"]
        dtype = np.dtype(meta["dtype"])
        shape = tuple(meta.get("shape", (n,)))
    except (KeyError, TypeError) as e:
        raise CodecError(f"meta lacks or mangles a required field: {e}") from None
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise CodecError(f"meta n must be a non-negative int, got {n!r}")
    if not all(isinstance(s, int) and s >= 0 for s in shape) or math.prod(shape) != n:
        raise CodecError(f"meta shape {list(shape)} does not hold n={n} elements")
    if dtype.kind != "f":
        raise CodecError(f"meta dtype must be a float dtype, got {dtype}")
    return n, dtype, shape


def make_meta(codec: str, n: int, dtype: np.dtype, shape: tuple[int, ...], **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"codec": codec, "n": int(n), "dtype": np.dtype(dtype).str,
                            "shape": [int(s) for s in shape]}
    meta.update(extra)
    return meta


def expect_arrays(arrays: list[Any], codec: str, specs: list[tuple[str, int | None]]) -> None:
    """Check the number, dtype and (optionally) size of received arrays."""
    if len(arrays) != len(specs):
        raise CodecError(f"{codec}: expected {len(specs)} arrays, got {len(arrays)}")
    for i, (a, (dt, size)) in enumerate(zip(arrays, specs)):
        if np.dtype(a.dtype) != np.dtype(dt):
            raise CodecError(f"{codec}: array {i} has dtype {np.dtype(a.dtype).str}, expected {np.dtype(dt).str}")
        if len(a.shape) != 1:
            raise CodecError(f"{codec}: array {i} must be 1-D, got shape {tuple(a.shape)}")
        if size is not None and int(a.shape[0]) != size:
            raise CodecError(f"{codec}: array {i} has {int(a.shape[0])} elements, expected {size}")


def finish_cpu(result_f32: np.ndarray, out: np.ndarray | None, accumulate: bool,
               dtype: np.dtype) -> np.ndarray:
    """Deliver a decoded float32 vector into ``out`` (any float dtype) or as ``dtype``."""
    if out is None:
        return result_f32 if result_f32.dtype == dtype else result_f32.astype(dtype)
    if accumulate:
        out += result_f32
    else:
        out[...] = result_f32
    return out


# --------------------------------------------------------------------------- the codec


class CodecPolicy(abc.ABC):
    """What a job's ``[codec] type`` names: per tensor size and hop, which :class:`Codec`
    encodes it. A plain codec is its own policy (:class:`Codec`); MPQ picks one of two
    by size (docs/geomx-behaviour.md §4.3). ``params`` are the constructor's keyword
    arguments a scenario's ``[codec]`` table or ``[codec.options]`` may set; ``config()``
    is the dict that rebuilds an equal policy on every node (and travels in GeoMX's
    ``set_gradient_compression`` command)."""

    name: ClassVar[str]
    #: Constructor parameters accepted from a config dict (``codec_from_config``).
    params: ClassVar[tuple[str, ...]] = ()
    #: Whether every element is encoded on its own, in place (a precision change such as
    #: fp16): then a value may be cut into parts that travel encoded apart, and a weight
    #: vector may travel encoded. False (the safe default) for sparse and 1-bit codecs:
    #: their payload is the whole tensor's selection, so the servers keep it whole and
    #: send weights dense (GeoMX truncates weights with Bi-Sparse: a bug we do not copy,
    #: docs/geomx-behaviour.md §4).
    elementwise: ClassVar[bool] = False

    @abc.abstractmethod
    def applies_to(self, num_elements: int) -> bool:
        """Whether tensors of this size are compressed (else they travel dense)."""

    @abc.abstractmethod
    def codec_for(self, num_elements: int, tier: Tier) -> "Codec":
        """The codec for a tensor of ``num_elements`` on hop ``tier`` (``"lan"``/``"wan"``)."""

    def config(self) -> dict[str, Any]:
        """The dict that ``codec_from_config`` turns back into an equal policy. A user
        codec's ``type`` is the spec the scenario found it by (``"/abs/lab/topk.py:TopK"``,
        which :func:`geomx.policy.registry.policy_class` sets as the class's
        ``registry_spec``), so every node that reads the dict loads the same class."""
        type_ = type(self).__dict__.get("registry_spec") or self.name
        return {"type": type_, **{p: getattr(self, p) for p in self.params}}


class Codec(CodecPolicy):
    """A gradient codec. Subclasses register their ``name`` for :func:`decode`.

    A codec of your own subclasses this and implements ``encode``, ``encoded_sizes`` and
    ``_decode_cpu`` (``_decode_cuda`` for CUDA arrays); name it in a scenario as
    ``[codec] type = "file.py:Class"`` (docs/extending.md). Its ``name`` must be unique:
    receivers pick the decoder by ``meta["codec"]``.
    """

    #: Whether ``encode`` needs a :class:`CodecState` (error feedback).
    stateful: ClassVar[bool] = False

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        name = cls.__dict__.get("name")
        if not isinstance(name, str):
            return
        if not cls.__module__.startswith("geomx."):
            taken = _DECODERS.get(name)
            if (taken is not None and taken.__module__.startswith("geomx.")) or name in _loadable():
                # a built-in's decoder, imported yet or not, is never replaced (the
                # registry refuses the name)
                return
        _DECODERS[name] = cls

    # -- policy -----------------------------------------------------------------
    def applies_to(self, num_elements: int) -> bool:
        """Whether tensors of this size are compressed (else they travel dense)."""
        return True

    def codec_for(self, num_elements: int, tier: Tier) -> "Codec":
        """The codec to use for a tensor of this size on this hop (GeoMX's table).

        Default: this codec on every hop. Bi-Sparse and onebit override it: GeoMX only
        compresses the LS <-> GS (WAN) link and sends tensors below the size bound dense.
        """
        check_tier(tier)
        return self

    def block_codec(self) -> "Codec":
        """The codec that encodes each block of a tensor this codec was picked for, when a
        transfer scheduler cuts the tensor into blocks encoded apart (DGT,
        geomx/sched/dgt.py): the size rule belongs to the whole tensor, so a block must be
        encoded even when it alone is below a size bound. Default: this codec (it has no
        size rule, or encodes any size)."""
        return self

    # -- state ------------------------------------------------------------------
    def new_state(self, num_elements: int, *, like: Any = None) -> CodecState:
        """Fresh (zero) per-key state; on the GPU when ``like`` is a CUDA array."""
        return CodecState(int(num_elements))

    # -- encode -----------------------------------------------------------------
    @abc.abstractmethod
    def encode(self, key: int, x: Any, state: CodecState | None = None) -> Encoded:
        """Encode tensor ``x`` of parameter ``key`` (push direction)."""

    def encode_pull(self, key: int, x: Any, *, sources: int = 1) -> Encoded:
        """Encode a server's aggregated tensor for the pull reply (no state).

        ``sources``: how many sparse pushes were summed (D, the number of DCs), which
        sets Bi-Sparse's pull capacity. Default: dense (GeoMX compresses pulls only for
        Bi-Sparse; its inherited 2bit codec pulls uncompressed too).
        """
        return encode_dense(x)

    @abc.abstractmethod
    def encoded_sizes(self, num_elements: int, dtype: Any = "<f4") -> list[ArraySpec]:
        """(dtype, shape) of the arrays ``encode`` sends for such a tensor, no data.

        For data-dependent sizes (Bi-Sparse) this is the capacity, the most that can
        be sent."""

    def pull_encoded_sizes(self, num_elements: int, dtype: Any = "<f4", *, sources: int = 1) -> list[ArraySpec]:
        """(dtype, shape) of the arrays ``encode_pull`` sends (capacity), no data."""
        return [ArraySpec(np.dtype(dtype).str, (int(num_elements),))]

    def encoded_nbytes(self, num_elements: int, dtype: Any = "<f4") -> int:
        return sum(s.nbytes for s in self.encoded_sizes(num_elements, dtype))

    # -- decode -----------------------------------------------------------------
    def decode(self, encoded: "Encoded | tuple[list[Any], dict[str, Any]]", out: Any = None,
               accumulate: bool = False) -> Any:
        """Same as the module-level :func:`decode` (dispatches on ``meta["codec"]``)."""
        return decode(encoded, out, accumulate)

    @classmethod
    @abc.abstractmethod
    def _decode_cpu(cls, arrays: list[np.ndarray], meta: dict[str, Any], n: int, dtype: np.dtype,
                    out: np.ndarray | None, accumulate: bool) -> np.ndarray: ...

    @classmethod
    def _decode_cuda(cls, arrays: list[Any], meta: dict[str, Any], n: int, dtype: np.dtype,
                     out: Any, accumulate: bool) -> Any:
        raise CodecError(f"codec {cls.name!r} has no CUDA decoder")

    # -- description ------------------------------------------------------------
    def __repr__(self) -> str:
        args = ", ".join(f"{p}={getattr(self, p)!r}" for p in self.params)
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.config() == self.config()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, tuple(sorted(self.config().items()))))


# --------------------------------------------------------------------------- helpers


def check_tier(tier: str) -> str:
    if tier not in TIERS:
        raise ValueError(f"tier must be one of {list(TIERS)}, got {tier!r}")
    return tier


def flat_input(x: Any) -> tuple[Any, bool, np.dtype, tuple[int, ...]]:
    """(flat contiguous view of x, on_device, dtype, shape) for an input tensor."""
    if device.is_cuda_array(x):
        d = device.as_device(x)
        shape = tuple(int(s) for s in d.shape)
        n = int(math.prod(shape))
        if not d.is_c_contiguous():
            raise CodecError("CUDA input must be C-contiguous")
        return d.reshape(n), True, np.dtype(d.dtype), shape
    a = np.asarray(x)
    if a.dtype.kind != "f":
        raise CodecError(f"codecs encode float tensors, got dtype {a.dtype}")
    return np.ascontiguousarray(a).reshape(-1), False, a.dtype, a.shape


def as_f32_cpu(flat: np.ndarray) -> np.ndarray:
    return flat if flat.dtype == np.float32 else flat.astype(np.float32)


def check_fraction(codec: str, name: str, value: Any, *, lo_open: bool = True, hi_open: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ValueError(f"codec {codec!r}: {name} must be a number, got {value!r}")
    v = float(value)
    lo_ok = v > 0 if lo_open else v >= 0
    hi_ok = v < 1 if hi_open else v <= 1
    if not (lo_ok and hi_ok):
        lb = "(" if lo_open else "["
        rb = ")" if hi_open else "]"
        raise ValueError(f"codec {codec!r}: {name} must be in {lb}0, 1{rb}, got {value!r}")
    return v


def check_count(codec: str, name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"codec {codec!r}: {name} must be a non-negative integer, got {value!r}")
    if isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer():
        value = int(value)
    if not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"codec {codec!r}: {name} must be a non-negative integer, got {value!r}")
    return int(value)


def default_size_lower_bound() -> int:
    """GeoMX's bound: ``MXNET_KVSTORE_SIZE_LOWER_BOUND`` if set, else 200000."""
    raw = os.environ.get(SIZE_BOUND_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_SIZE_LOWER_BOUND
    try:
        v = int(raw.strip())
    except ValueError:
        raise ValueError(f"{SIZE_BOUND_ENV} must be a non-negative integer, got {raw!r}") from None
    if v < 0:
        raise ValueError(f"{SIZE_BOUND_ENV} must be a non-negative integer, got {raw!r}")
    return v


def resolve_size_lower_bound(codec: str, value: Any) -> int:
    return default_size_lower_bound() if value is None else check_count(codec, "size_lower_bound", value)


def check_state(codec: str, state: CodecState | None, n: int, fields: tuple[str, ...], on_device: bool) -> CodecState:
    if state is None:
        raise CodecError(f"{codec}: encode needs its per-key state (codec.new_state({n})); "
                         "error-feedback memory is owned by the caller")
    if not isinstance(state, CodecState):
        raise CodecError(f"{codec}: state must be a CodecState, got {type(state).__name__}")
    if state.num_elements != n:
        raise CodecError(f"{codec}: state is for {state.num_elements} elements, tensor has {n}")
    for f in fields:
        a = getattr(state, f)
        if a is None:
            raise CodecError(f"{codec}: state has no {f!r} array (made by another codec?)")
        if device.is_cuda_array(a) != on_device:
            raise CodecError(f"{codec}: state {f!r} and the tensor must be on the same device")
        size = int(math.prod(a.shape))
        if size != n or np.dtype(a.dtype) != np.float32:
            raise CodecError(f"{codec}: state {f!r} must be float32 with {n} elements")
        if not on_device and not (a.flags.c_contiguous and a.flags.writeable):
            raise CodecError(f"{codec}: state {f!r} must be C-contiguous and writeable")
    return state


def zeros_like_device(n: int, like: Any) -> Any:
    """float32 zeros of length n, on the GPU when ``like`` is a CUDA array."""
    if like is not None and device.is_cuda_array(like):
        return device.cuda_kernels().zeros(n)
    return np.zeros(n, dtype=np.float32)


#: Codec name of dense, uncompressed payloads (the identity codec, ``codec/identity.py``).
DENSE = "none"


def encode_dense(x: Any) -> Encoded:
    """``x`` dense in its own dtype, as a copy (the caller may reuse its buffer while the
    message is in flight). The identity codec's encoding, and every codec's default pull
    reply; it lives here so the base needs no implementation module."""
    flat, on_dev, dtype, shape = flat_input(x)
    data = device.cuda_kernels().copy(flat) if on_dev else flat.copy()
    return Encoded([data], make_meta(DENSE, int(flat.shape[0]), dtype, shape))
