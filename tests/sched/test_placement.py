"""Key -> server placement follows GeoMX (docs/geomx-behaviour.md §1.2)."""

import pytest

from geomx.sched.placement import place


def test_small_tensors_go_whole_to_key_times_9973_mod_s():
    for key in range(10):
        parts = place(key, 1000, 3, 1_000_000)
        assert len(parts) == 1
        assert parts[0].server == (key * 9973) % 3
        assert (parts[0].lo, parts[0].hi) == (0, 1000)


def test_large_tensors_are_split_evenly_and_cover_everything():
    parts = place(4, 2_500_001, 3, 1_000_000)
    assert [p.server for p in parts] == [0, 1, 2]
    assert parts[0].lo == 0 and parts[-1].hi == 2_500_001
    assert all(a.hi == b.lo for a, b in zip(parts, parts[1:]))
    assert max(p.size for p in parts) - min(p.size for p in parts) <= 1


def test_split_can_be_disabled_and_single_server_never_splits():
    assert len(place(1, 5_000_000, 4, 1_000_000, split=False)) == 1
    assert len(place(1, 5_000_000, 1, 1_000_000)) == 1


def test_bad_arguments():
    with pytest.raises(ValueError):
        place(0, 10, 0, 100)
    with pytest.raises(ValueError):
        place(-1, 10, 2, 100)
