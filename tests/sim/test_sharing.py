"""The max-min sharing solver on its own: constraints, variables, classes and bounds."""

from __future__ import annotations

import random

import pytest

from geomx.sim.sharing import SharingSystem


def test_textbook_max_min_two_links_three_flows():
    # Bertsekas & Gallager's example shape: a long flow over both links, one short flow
    # on each; link 1 has 10, link 2 has 4: the long flow and flow 2 get 2, flow 1 gets 8
    sys_ = SharingSystem()
    l1, l2 = sys_.new_constraint(10.0), sys_.new_constraint(4.0)
    long_ = sys_.new_variable("long", 0, float("inf"), (l1, l2))
    f1 = sys_.new_variable("f1", 0, float("inf"), (l1,))
    f2 = sys_.new_variable("f2", 0, float("inf"), (l2,))
    for v in (long_, f1, f2):
        sys_.enable(v, now=0.0)
    solved = sys_.solve()
    assert solved == [long_, f1, f2]  # in enable order
    assert (long_.value_bps, f1.value_bps, f2.value_bps) == (2.0, 8.0, 2.0)
    assert (l1.n_vars, l2.n_vars) == (2, 2)


def test_bounds_and_strict_priority_classes():
    sys_ = SharingSystem()
    link = sys_.new_constraint(100.0)
    capped = sys_.new_variable("capped", 0, 10.0, (link,))
    high = sys_.new_variable("high", 0, float("inf"), (link,))
    low = sys_.new_variable("low", 1, float("inf"), (link,))
    for v in (capped, high, low):
        sys_.enable(v, now=0.0)
    sys_.solve()
    # class 0 first: the capped flow takes its 10, the other 90 of class 0; class 1 gets 0
    assert (capped.value_bps, high.value_bps, low.value_bps) == (10.0, 90.0, 0.0)
    sys_.disable(high, now=1.0)
    sys_.solve()
    assert (capped.value_bps, low.value_bps) == (10.0, 90.0)


def test_only_the_changed_component_is_solved_and_busy_time_is_booked():
    sys_ = SharingSystem()
    a, b = sys_.new_constraint(8.0), sys_.new_constraint(6.0)
    va = sys_.new_variable("a", 0, float("inf"), (a,))
    vb = sys_.new_variable("b", 0, float("inf"), (b,))
    sys_.enable(va, now=0.0)
    sys_.enable(vb, now=0.0)
    assert sys_.solve() == [va, vb]
    vb2 = sys_.new_variable("b2", 0, float("inf"), (b,))
    sys_.enable(vb2, now=2.0)
    assert sys_.solve() == [vb, vb2]  # a's component is untouched
    assert (va.value_bps, vb.value_bps, vb2.value_bps) == (8.0, 3.0, 3.0)
    sys_.disable(va, now=5.0)
    assert a.n_vars == 0 and a.busy_s == 5.0
    sys_.set_capacity(b, 12.0)
    sys_.mark_changed(b)
    sys_.solve()
    assert (vb.value_bps, vb2.value_bps) == (6.0, 6.0)
    sys_.disable(vb, now=6.0)
    sys_.disable(vb2, now=6.0)
    assert sys_.solve() is None and sys_.n_enabled == 0


@pytest.mark.parametrize("seed", range(10))
def test_selective_solves_equal_a_full_solve(seed):
    """After random enables and disables, the values a selective solve leaves are the
    ones a solve over everything gives, bit for bit."""
    rng = random.Random(seed)
    sys_ = SharingSystem()
    cons = [sys_.new_constraint(rng.choice((10.0, 25.0, 100.0))) for _ in range(12)]
    live = []
    for step in range(200):
        if live and rng.random() < 0.4:
            sys_.disable(live.pop(rng.randrange(len(live))), now=float(step))
        else:
            path = tuple(rng.sample(cons, rng.randint(1, 4)))
            v = sys_.new_variable(step, rng.randint(0, 2), rng.choice((float("inf"), 7.0)), path)
            sys_.enable(v, now=float(step))
            live.append(v)
        sys_.solve()
        selective = [v.value_bps for v in live]
        sys_.mark_all_changed()
        sys_.solve()
        assert [v.value_bps for v in live] == selective
