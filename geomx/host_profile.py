"""A host profile: what this machine's CPU pays per message, per codec byte, per kvstore
call and per server push, measured by ``geomx calibrate`` (geomx/calibrate.py) and charged
by the emulator (geomx/sim/cpu.py) when a scenario names it (``[host] profile``).

The emulator moves bytes through a network model and charges compute from the scenario,
but the real runtime also spends its processes' CPU on every message: framing, the event
loop, the kvstore's bookkeeping, decoding, the server's sum. On a job of many small
messages that is the difference between the runtimes (docs/calibration.md). A profile
holds those costs as plain numbers, so the emulated run that charges them stays
deterministic: the same profile gives the same event log on any machine.

The file is TOML (schema in docs/calibration.md)::

    format = 1
    [message]                      # per message, by wire size (Message.nbytes)
    size_bytes = [100, 1124, ...]  # increasing; costs interpolate linearly between them
    send_s = [...]                 # CPU seconds the sender pays
    recv_s = [...]                 # CPU seconds the receiver pays
    wakeup_s = 3e-05               # an idle receiver's wake-up (not CPU: a delay)
    shaped_send_s = 2e-05          # a message to another DC: the shaper's CPU ...
    shaped_late_s = 1e-03          # ... and how much later than its link's delay it is
                                   # handled (the shaper's timers, the receiver waking up)
    [codec.fp16]                   # per byte of the dense float tensor (4 bytes a value)
    encode_s_per_byte = 1.2e-10
    decode_s_per_byte = 0.9e-10
    [cpu]
    stretch = 1.0                  # wall seconds a burst of one CPU second takes here
                                   # (> 1: other processes shared the cores when measured)
    [kvstore]                      # a worker's push or pull call, beyond its messages
    call_s = 2.1e-05
    call_s_per_byte = 1e-10        # per byte pushed or pulled (snapshot, copy into out)
    [server]                       # a server's handling, beyond the messages
    push_s = 1.5e-05               # of one push ...
    push_s_per_byte = 1.1e-10      # ... and per byte it takes in (sum, optimizer)
    pull_s = 8e-06                 # of one pull ...
    pull_s_per_byte = 1e-11        # ... and per byte it answers
    [provenance]                   # where and when it was measured (free-form)

Errors name the file and the field: ``host.toml: message.send_s[2]: ...``.
"""

from __future__ import annotations

import bisect
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

__all__ = ["PROFILE_FORMAT", "CodecCost", "HostProfile", "ProfileError", "load_profile",
           "parse_profile", "profile_to_toml"]

#: The profile format this geomx writes and reads.
PROFILE_FORMAT = 1

#: The largest per-event cost a profile may state (seconds): anything above is a unit
#: mistake, not a measurement.
MAX_COST_S = 1.0
#: The largest CPU stretch: a node given a hundredth of a core.
MAX_STRETCH = 100.0
#: The largest per-byte cost (seconds per byte: 1 us a byte is 1 MB/s, far below any CPU).
MAX_COST_S_PER_BYTE = 1e-6


class ProfileError(ValueError):
    """A profile file that cannot be used; the message is one line naming the field."""


@dataclass(frozen=True)
class CodecCost:
    """One codec's CPU cost per byte of the dense float tensor it encodes or decodes."""

    encode_s_per_byte: float = 0.0
    decode_s_per_byte: float = 0.0


@dataclass(frozen=True)
class HostProfile:
    """The measured costs (seconds of one core's CPU time); see the module docstring."""

    size_bytes: tuple[int, ...] = (0,)
    send_s: tuple[float, ...] = (0.0,)
    recv_s: tuple[float, ...] = (0.0,)
    wakeup_s: float = 0.0
    shaped_send_s: float = 0.0
    shaped_late_s: float = 0.0
    codecs: Mapping[str, CodecCost] = field(default_factory=dict)
    cpu_stretch: float = 1.0
    kvstore_call_s: float = 0.0
    kvstore_call_s_per_byte: float = 0.0
    server_push_s: float = 0.0
    server_push_s_per_byte: float = 0.0
    server_pull_s: float = 0.0
    server_pull_s_per_byte: float = 0.0
    provenance: Mapping[str, Any] = field(default_factory=dict)

    def send_cost_s(self, nbytes: int) -> float:
        """CPU seconds a node pays to send one message of ``nbytes`` on the wire."""
        return _interpolate(self.size_bytes, self.send_s, nbytes)

    def recv_cost_s(self, nbytes: int) -> float:
        """CPU seconds a node pays to receive one message of ``nbytes`` on the wire."""
        return _interpolate(self.size_bytes, self.recv_s, nbytes)

    def encode_cost_s(self, codec: str, dense_bytes: int) -> float:
        """CPU seconds to encode a tensor of ``dense_bytes`` with ``codec`` (0 for a codec
        the profile has not measured)."""
        c = self.codecs.get(codec)
        return 0.0 if c is None else c.encode_s_per_byte * dense_bytes

    def decode_cost_s(self, codec: str, dense_bytes: int) -> float:
        c = self.codecs.get(codec)
        return 0.0 if c is None else c.decode_s_per_byte * dense_bytes

    def push_cost_s(self, nbytes: int) -> float:
        """CPU seconds a server pays to take in one push of ``nbytes`` of values."""
        return self.server_push_s + self.server_push_s_per_byte * nbytes

    def pull_cost_s(self, nbytes: int) -> float:
        """CPU seconds a server pays to answer one pull with ``nbytes`` of values
        (``nbytes`` = 0: the part paid when the pull arrives)."""
        return self.server_pull_s if nbytes == 0 else self.server_pull_s_per_byte * nbytes


def _interpolate(xs: tuple[int, ...], ys: tuple[float, ...], x: float) -> float:
    """Piecewise-linear through the size classes; the first class's cost below it, the
    last segment's slope (the per-byte cost of large messages) above the last class."""
    if len(xs) == 1 or x <= xs[0]:
        return ys[0]
    i = bisect.bisect_right(xs, x)
    if i >= len(xs):
        i = len(xs) - 1
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


# ------------------------------------------------------------------------- reading
def load_profile(path: str | Path) -> HostProfile:
    """Read and check a profile file; :class:`ProfileError` (one line) when it cannot."""
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ProfileError(f"{path}: no such file (write one with `geomx calibrate --out "
                           f"{p.name}`)") from None
    except OSError as e:
        raise ProfileError(f"{path}: cannot read ({e.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ProfileError(f"{path}: not a TOML file ({e})") from None
    try:
        return parse_profile(raw)
    except ProfileError as e:
        raise ProfileError(f"{path}: {e}") from None


def _number(raw: Mapping[str, Any], key: str, where: str, hi: float) -> float:
    v = raw.get(key, 0.0)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or not 0 <= v <= hi:
        raise ProfileError(f"{where}{key}: expected a number of seconds in [0, {hi:g}], "
                           f"got {v!r}")
    return float(v)


def _table(raw: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    v = raw.get(key, {})
    if not isinstance(v, Mapping):
        raise ProfileError(f"{key}: expected a table ([{key}]), got {type(v).__name__}")
    return v


#: The one-number keys of ``[message]`` (``HostProfile`` fields of the same names).
MESSAGE_SCALARS = ("wakeup_s", "shaped_send_s", "shaped_late_s")
#: The keys of ``[kvstore]`` and ``[server]`` (``HostProfile`` fields ``kvstore_*``,
#: ``server_*``).
KVSTORE_KEYS = ("call_s", "call_s_per_byte")
SERVER_KEYS = ("push_s", "push_s_per_byte", "pull_s", "pull_s_per_byte")


def _bound(key: str) -> float:
    return MAX_COST_S_PER_BYTE if key.endswith("_per_byte") else MAX_COST_S


def parse_profile(raw: Mapping[str, Any]) -> HostProfile:
    """Check a profile given as the dict ``tomllib`` returns."""
    known = {"format", "message", "cpu", "codec", "kvstore", "server", "provenance"}
    for k in raw:
        if k not in known:
            raise ProfileError(f"{k}: unknown key; allowed: {', '.join(sorted(known))}")
    fmt = raw.get("format", PROFILE_FORMAT)
    if fmt != PROFILE_FORMAT or isinstance(fmt, bool):
        raise ProfileError(f"format: expected {PROFILE_FORMAT}, got {fmt!r} (recalibrate with "
                           "this geomx: `geomx calibrate`)")
    msg = _table(raw, "message")
    sizes = msg.get("size_bytes", [0])
    if not isinstance(sizes, list) or not sizes or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in sizes) \
            or any(b <= a for a, b in zip(sizes, sizes[1:])):
        raise ProfileError(f"message.size_bytes: expected a non-empty list of increasing "
                           f"integers >= 0, got {sizes!r}")
    costs = {}
    for key in ("send_s", "recv_s"):
        v = msg.get(key, [0.0] * len(sizes))
        if not isinstance(v, list) or len(v) != len(sizes):
            raise ProfileError(f"message.{key}: expected a list of {len(sizes)} numbers (one "
                               f"per size class), got {v!r}")
        costs[key] = tuple(_number({f"{key}[{i}]": x}, f"{key}[{i}]", "message.", MAX_COST_S)
                           for i, x in enumerate(v))
    allowed = ("size_bytes", "send_s", "recv_s", *MESSAGE_SCALARS)
    for k in msg:
        if k not in allowed:
            raise ProfileError(f"message.{k}: unknown key; allowed: {', '.join(allowed)}")
    codecs = {}
    for name, c in _table(raw, "codec").items():
        if not isinstance(c, Mapping):
            raise ProfileError(f"codec.{name}: expected a table ([codec.{name}])")
        for k in c:
            if k not in ("encode_s_per_byte", "decode_s_per_byte"):
                raise ProfileError(f"codec.{name}.{k}: unknown key; allowed: "
                                   "encode_s_per_byte, decode_s_per_byte")
        codecs[str(name)] = CodecCost(
            _number(c, "encode_s_per_byte", f"codec.{name}.", MAX_COST_S_PER_BYTE),
            _number(c, "decode_s_per_byte", f"codec.{name}.", MAX_COST_S_PER_BYTE))
    cpu = _table(raw, "cpu")
    for k in cpu:
        if k != "stretch":
            raise ProfileError(f"cpu.{k}: unknown key; allowed: stretch")
    stretch = cpu.get("stretch", 1.0)
    if isinstance(stretch, bool) or not isinstance(stretch, (int, float)) \
            or not 1.0 <= stretch <= MAX_STRETCH:
        raise ProfileError(f"cpu.stretch: expected a number in [1, {MAX_STRETCH:g}], got "
                           f"{stretch!r}")
    kv = _table(raw, "kvstore")
    srv = _table(raw, "server")
    for table, name, keys in ((kv, "kvstore", KVSTORE_KEYS), (srv, "server", SERVER_KEYS)):
        for k in table:
            if k not in keys:
                raise ProfileError(f"{name}.{k}: unknown key; allowed: {', '.join(keys)}")
    prov = _table(raw, "provenance")
    return HostProfile(size_bytes=tuple(sizes), send_s=costs["send_s"],
                       recv_s=costs["recv_s"], codecs=codecs, cpu_stretch=float(stretch),
                       **{k: _number(msg, k, "message.", MAX_COST_S) for k in MESSAGE_SCALARS},
                       **{f"kvstore_{k}": _number(kv, k, "kvstore.", _bound(k))
                          for k in KVSTORE_KEYS},
                       **{f"server_{k}": _number(srv, k, "server.", _bound(k))
                          for k in SERVER_KEYS},
                       provenance=dict(prov))


# ------------------------------------------------------------------------- writing
def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else "nan"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if v is None:
        return '""'
    raise TypeError(f"cannot write {type(v).__name__} into a profile")


def profile_to_toml(p: HostProfile) -> str:
    """The profile as the TOML text :func:`load_profile` reads back to an equal profile."""
    out = ["# geomx host profile: CPU seconds this host pays (geomx calibrate; "
           "docs/calibration.md)", f"format = {PROFILE_FORMAT}", "", "[message]",
           f"size_bytes = {_toml_value(list(p.size_bytes))}",
           f"send_s = {_toml_value(list(p.send_s))}",
           f"recv_s = {_toml_value(list(p.recv_s))}",
           *(f"{k} = {_toml_value(getattr(p, k))}" for k in MESSAGE_SCALARS), ""]
    for name in sorted(p.codecs):
        c = p.codecs[name]
        out += [f"[codec.{name}]", f"encode_s_per_byte = {_toml_value(c.encode_s_per_byte)}",
                f"decode_s_per_byte = {_toml_value(c.decode_s_per_byte)}", ""]
    out += ["[cpu]", f"stretch = {_toml_value(p.cpu_stretch)}", "", "[kvstore]"]
    out += [f"{k} = {_toml_value(getattr(p, f'kvstore_{k}'))}" for k in KVSTORE_KEYS]
    out += ["", "[server]"]
    out += [f"{k} = {_toml_value(getattr(p, f'server_{k}'))}" for k in SERVER_KEYS]
    out.append("")
    if p.provenance:
        out.append("[provenance]")
        nested = []
        for k, v in p.provenance.items():
            if isinstance(v, Mapping):
                nested.append((k, v))
            else:
                out.append(f"{k} = {_toml_value(v)}")
        for k, table in nested:
            out += ["", f"[provenance.{k}]"]
            out += [f"{kk} = {_toml_value(vv)}" for kk, vv in table.items()
                    if not isinstance(vv, Mapping)]
        out.append("")
    return "\n".join(out)
