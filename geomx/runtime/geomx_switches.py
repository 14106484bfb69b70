"""GeoMX's feature switches in the environment, mapped onto scenario fields or refused.

GeoMX turns features on with environment variables read by each process
(docs/geomx-behaviour.md §5: ``MXNET_KVSTORE_USE_HFA``, ``MXNET_KVSTORE_HFA_K1``/``_K2``,
``MXNET_KVSTORE_BIGARRAY_BOUND``, ...); geomx keeps the job's set-up in the scenario.
Accepting such a variable silently is the worst outcome (a ``cnn_hfa.py`` job with
``MXNET_KVSTORE_USE_HFA=1`` would run FSA with a summing server, and its model would
double every sync), so every switch in :data:`SWITCHES` either becomes the ``--set`` override of the
field it means, or is refused with an error that names the field to use instead.

One row per variable; ``geomx node`` (``runtime/dmlc_env.py``) and ``geomx run``/``launch``
(``cli.py``, so the emulator runs what the processes would) apply the same table.
P3's and TSEngine's switches are rows here; DGT's are in ``runtime/config.py`` (``DGT_ENV``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping


class SwitchError(ValueError):
    """A GeoMX switch with a value geomx cannot honour; names the scenario field to use."""


@dataclass(frozen=True)
class Switch:
    """``var`` -> scenario override(s) from its value, or a refusal."""

    var: str
    field: str                                   # the scenario field it means
    to_overrides: Callable[[str], list[str]]     # raises SwitchError on a bad value
    doc: str


def _int(var: str, lo: int, hi: int) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            n = int(value.strip())
        except ValueError:
            raise SwitchError(f"{var}={value!r}: expected an integer in [{lo}, {hi}]") from None
        if not lo <= n <= hi:
            raise SwitchError(f"{var}={value!r}: allowed: an integer in [{lo}, {hi}]")
        return n
    return parse


def _flag(var: str, value: str) -> bool:
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("", "0", "false", "no", "off"):
        return False
    raise SwitchError(f"{var}={value!r}: allowed: 0 or 1")


def _use_hfa(value: str) -> list[str]:
    return ["sync.algorithm=hfa"] if _flag("MXNET_KVSTORE_USE_HFA", value) else []


def _to_field(var: str, field: str, lo: int, hi: int) -> Callable[[str], list[str]]:
    parse = _int(var, lo, hi)
    return lambda value: [f"{field}={parse(value)}"]


def _to_fields(var: str, fields: tuple[str, ...], lo: int, hi: int) -> Callable[[str], list[str]]:
    parse = _int(var, lo, hi)
    return lambda value: [f"{f}={parse(value)}" for f in fields]


def _enable_p3(value: str) -> list[str]:
    return ["sched.p3=" + ("true" if _flag("ENABLE_P3", value) else "false")]


def _to_flag(var: str, field: str) -> Callable[[str], list[str]]:
    return lambda value: [f"{field}=" + ("true" if _flag(var, value) else "false")]


def _greed_rate(value: str) -> list[str]:
    try:
        rate = float(value.strip())
    except ValueError:
        raise SwitchError(f"MAX_GREED_RATE_TS={value!r}: expected a number in [0, 1]") from None
    if not 0.0 <= rate <= 1.0:
        raise SwitchError(f"MAX_GREED_RATE_TS={value!r}: allowed: a number in [0, 1]")
    return [f"sched.tsengine_max_greed_rate={rate!r}"]


def _refuse_unless_off(var: str, field: str, why: str) -> Callable[[str], list[str]]:
    def check(value: str) -> list[str]:
        if value.strip() in ("", "0"):
            return []
        raise SwitchError(f"{var}={value!r}: {why}; set the scenario's {field} instead")
    return check


SWITCHES: tuple[Switch, ...] = (
    Switch("MXNET_KVSTORE_USE_HFA", "sync.algorithm", _use_hfa,
           "1: HFA (`sync.algorithm = \"hfa\"`); 0: as the scenario says"),
    Switch("MXNET_KVSTORE_HFA_K1", "sync.k1",
           _to_field("MXNET_KVSTORE_HFA_K1", "sync.k1", 1, 10**6), "HFA local steps per local sync"),
    Switch("MXNET_KVSTORE_HFA_K2", "sync.k2",
           _to_field("MXNET_KVSTORE_HFA_K2", "sync.k2", 1, 10**6), "HFA local syncs per global sync"),
    Switch("MXNET_KVSTORE_BIGARRAY_BOUND", "sched.bigarray_bound",
           _to_fields("MXNET_KVSTORE_BIGARRAY_BOUND",
                      ("sched.bigarray_bound", "sched.p3_slice_elements"), 1, 2**62),
           "elements above which a tensor is split across global servers; also P3's "
           "slice size (GeoMX uses the one bound for both)"),
    Switch("ENABLE_P3", "sched.p3", _enable_p3,
           "1: P3 priority propagation (`sched.p3 = true`); 0: off"),
    Switch("ENABLE_INTER_TS", "sched.tsengine_inter",
           _to_flag("ENABLE_INTER_TS", "sched.tsengine_inter"),
           "1: TSEngine overlay between local and global servers (`sched.tsengine_inter`)"),
    Switch("ENABLE_INTRA_TS", "sched.tsengine_intra",
           _to_flag("ENABLE_INTRA_TS", "sched.tsengine_intra"),
           "1: TSEngine overlay among a DC's workers and local server (`sched.tsengine_intra`)"),
    Switch("MAX_GREED_RATE_TS", "sched.tsengine_max_greed_rate", _greed_rate,
           "TSEngine's cap on the greedy (fastest known edge) probability"),
    Switch("MXNET_KVSTORE_SIZE_LOWER_BOUND", "codec.size_lower_bound",
           _to_field("MXNET_KVSTORE_SIZE_LOWER_BOUND", "codec.size_lower_bound", 0, 2**62),
           "smallest tensor Bi-Sparse / MPQ compress"),
    Switch("PS_RESEND", "membership.request_timeout",
           _refuse_unless_off("PS_RESEND", "membership.request_timeout",
                              "geomx sends over TCP, which does not lose messages; a request "
                              "whose reply never comes fails its node by name after"),
           "refused when on"),
    Switch("PS_RESEND_TIMEOUT", "membership.request_timeout",
           _refuse_unless_off("PS_RESEND_TIMEOUT", "membership.request_timeout",
                              "there is no resend timer (TCP is reliable); the bound on a "
                              "reply is"),
           "refused when set"),
    Switch("PS_DROP_MSG", "wan.N.loss",
           _refuse_unless_off("PS_DROP_MSG", "[[wan]] loss",
                              "dropping received messages on purpose is not supported; "
                              "packet loss is modelled per link by"),
           "refused when set"),
)


def switch_overrides(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """``(override, "env VAR")`` pairs for the switches set in ``env``; SwitchError on a
    value that cannot be honoured."""
    out: list[tuple[str, str]] = []
    for sw in SWITCHES:
        value = env.get(sw.var)
        if value is None:
            continue
        out += [(o, f"env {sw.var}") for o in sw.to_overrides(value)]
    return out
