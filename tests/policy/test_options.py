"""A policy's options are checked once, against its dataclass (or, for a codec, its
constructor's annotations), each failure one line naming the policy and the field
(geomx/policy/options.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pytest

from geomx.policy.options import (OptionsError, PolicyOptions, options_from_table,
                                  options_to_table, params_from_table)


@dataclass(frozen=True)
class Opts(PolicyOptions):
    staleness: int = 2
    rate: float = 0.5
    mode: Literal["a", "b"] = "a"
    sizes: tuple[int, ...] = ()
    cap: int | None = None

    def __post_init__(self) -> None:
        if self.staleness < 0:
            raise ValueError("staleness must be >= 0")


P = "sync policy 'lab/ssp.py:Ssp'"


def test_values_are_converted_and_round_trip():
    o = options_from_table(Opts, {"staleness": 3, "rate": 1, "sizes": [1, 2], "cap": 7},
                           policy=P, where="sync.options")
    assert o == Opts(staleness=3, rate=1.0, sizes=(1, 2), cap=7)
    assert options_from_table(Opts, options_to_table(o), policy=P) == o


@pytest.mark.parametrize("table, message", [
    ({"stalenes": 1}, r"^sync policy 'lab/ssp.py:Ssp': unknown option sync.options.stalenes; "
                      r"allowed: staleness, rate, mode, sizes, cap$"),
    ({"staleness": "2"}, r"^sync policy .*: sync.options.staleness = '2'; allowed: an integer$"),
    ({"staleness": True}, r"sync.options.staleness = True; allowed: an integer$"),
    ({"mode": "c"}, r"sync.options.mode = 'c'; allowed: one of 'a', 'b'$"),
    ({"sizes": [1, "x"]}, r"sync.options.sizes\[1\] = 'x'; allowed: an integer$"),
    ({"cap": "x"}, r"sync.options.cap = 'x'; allowed: an integer$"),
    ({"staleness": -1}, r"^sync policy .*: sync.options: staleness must be >= 0$"),
])
def test_each_bad_option_is_one_line_naming_the_policy_and_the_field(table, message):
    with pytest.raises(OptionsError, match=message):
        options_from_table(Opts, table, policy=P, where="sync.options")


class TopK:
    params = ("ratio", "seed", "exact")

    def __init__(self, ratio: float = 0.01, seed: int = 0, exact=True):
        self.ratio, self.seed, self.exact = ratio, seed, exact


def test_codec_params_follow_the_constructor_annotations_or_defaults():
    assert params_from_table(TopK, {"ratio": 1, "exact": False}, policy="codec policy 'x'",
                             where="codec.options") == {"ratio": 1.0, "exact": False}
    with pytest.raises(OptionsError, match=r"^codec policy 'x': unknown option "
                                           r"codec.options.rate; allowed: ratio, seed, exact$"):
        params_from_table(TopK, {"rate": 1}, policy="codec policy 'x'", where="codec.options")
    with pytest.raises(OptionsError, match=r"codec.options.seed = 0.5; allowed: an integer$"):
        params_from_table(TopK, {"seed": 0.5}, policy="codec policy 'x'", where="codec.options")
    with pytest.raises(OptionsError, match=r"codec.options.exact = 'yes'; allowed: a boolean$"):
        params_from_table(TopK, {"exact": "yes"}, policy="codec policy 'x'", where="codec.options")
