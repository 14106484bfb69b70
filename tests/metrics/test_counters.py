"""ByteCounters: LAN/WAN split, per-link and per-DC-pair totals, merge across processes."""

import pytest

from geomx.metrics.counters import ByteCounters, dc_from_node_name, event_dcs


def test_same_dc_is_lan_and_different_dc_is_wan():
    c = ByteCounters()
    c.add("a", "a", 100, ["h:a:0-up", "sw:a"])
    c.add("a", "b", 40, ["wan:a-b"])
    assert c.bytes_lan == 100
    assert c.bytes_wan == 40
    assert c.messages == 2 and c.messages_wan == 1
    assert c.bytes_per_link == {"h:a:0-up": 100, "sw:a": 100, "wan:a-b": 40}
    assert c.bytes_per_dc_pair == {"a->a": 100, "a->b": 40}
    assert c.bytes_total == 140


def test_dropped_bytes_count_as_sent_and_as_dropped():
    c = ByteCounters()
    c.add("a", "b", 10, None, dropped=True)
    assert c.bytes_wan == 10 and c.bytes_dropped == 10


def test_negative_bytes_are_rejected():
    with pytest.raises(ValueError, match="nbytes"):
        ByteCounters().add("a", "b", -1)


def test_merge_of_per_process_counters_equals_counting_in_one_place():
    whole, p1, p2 = ByteCounters(), ByteCounters(), ByteCounters()
    sends = [("a", "a", 5, ["l1"]), ("a", "b", 7, ["l2"]), ("b", "a", 11, ["l2", "l3"])]
    for i, s in enumerate(sends):
        whole.add(*s)
        (p1 if i % 2 else p2).add(*s)
    merged = ByteCounters().merge(p1).merge(p2)
    assert merged.to_dict() == whole.to_dict()


def test_to_dict_from_dict_round_trip_and_unknown_field_error():
    c = ByteCounters()
    c.add("x", "y", 3, ["b", "a"])
    d = c.to_dict()
    assert list(d["bytes_per_link"]) == ["a", "b"]  # sorted for stable serialisation
    assert ByteCounters.from_dict(d) == c
    with pytest.raises(ValueError, match="bogus"):
        ByteCounters.from_dict({"bogus": 1})


def test_dc_from_node_name_follows_naming_convention():
    assert dc_from_node_name("w:party-a:3") == "party-a"
    assert dc_from_node_name("ls:b") == "b"
    assert dc_from_node_name("lh:c") == "c"
    assert dc_from_node_name("gs:0") == "global"
    assert dc_from_node_name("gh") == "global"


def test_event_dcs_prefers_explicit_fields_then_dc_of():
    ev = {"src": "w:a:0", "dst": "gs:0", "bytes": 1}
    assert event_dcs(ev) == ("a", "global")
    assert event_dcs(ev, dc_of=lambda n: "a" if n == "gs:0" else "z") == ("z", "a")
    assert event_dcs({**ev, "src_dc": "s", "dst_dc": "d"}) == ("s", "d")


def test_from_events_counts_only_transfer_kinds_and_uses_path():
    events = [
        {"ev": "xfer", "src": "w:a:0", "dst": "ls:a", "bytes": 8, "link": "lan:a"},
        {"ev": "xfer", "src": "ls:a", "dst": "ls:b", "bytes": 4, "path": ["wan1", "wan2"]},
        {"ev": "send", "src": "ls:a", "dst": "ls:b", "bytes": 1000},
    ]
    c = ByteCounters.from_events(events)
    assert (c.bytes_lan, c.bytes_wan) == (8, 4)
    assert c.bytes_per_link == {"lan:a": 8, "wan1": 4, "wan2": 4}


def test_dc_of_may_be_a_topology_table_with_naming_fallback():
    ev = {"src": "gs:0", "dst": "w:b:1", "bytes": 1}
    assert event_dcs(ev, dc_of={"gs:0": "central"}) == ("central", "b")
