"""geomx.units: quantities as people write them, and text that reads back exactly."""

import math
import random

import pytest

from geomx.units import (
    format_bps,
    format_count,
    format_fraction,
    format_seconds,
    format_size,
    parse_bandwidth,
    parse_count,
    parse_fraction,
    parse_seconds,
    parse_size,
)


@pytest.mark.parametrize("text, bps", [
    ("100Mbps", 100e6),
    ("1Gbps", 1e9),
    ("10 Gbit/s", 10e9),
    ("155Mbit", 155e6),
    ("12.5MB/s", 100e6),          # bytes per second
    ("1MiB/s", 8 * 2**20),
    ("1KiBps", 8 * 1024),
    ("100mbps", 100e6),           # lower-case prefix still means mega
    ("64kbps", 64e3),
    ("64Kbps", 64e3),
    ("2.5 Gb/s", 2.5e9),
    ("1Tbps", 1e12),
    ("1e9", 1e9),
    ("1_000", 1000.0),
    (1e9, 1e9),
    (1000, 1000.0),
    (" 5 bps ", 5.0),
])
def test_parse_bandwidth_formats(text, bps):
    assert parse_bandwidth(text) == bps
    assert isinstance(parse_bandwidth(text), float)


@pytest.mark.parametrize("text, seconds", [
    ("30ms", 0.03),
    ("0.1 ms", 0.0001),
    ("2s", 2.0),
    ("5min", 300.0),
    ("250us", 0.00025),
    ("250µs", 0.00025),
    ("10ns", 1e-8),
    ("1h", 3600.0),
    ("1.5 seconds", 1.5),
    ("0s", 0.0),
    (3, 3.0),
    (0.5, 0.5),
    ("0.5", 0.5),
])
def test_parse_seconds_formats(text, seconds):
    assert parse_seconds(text) == seconds


def test_parsing_scales_exactly_like_the_decimal_written():
    # 0.1 * 1e-3 in binary floating point is 1.0000000000000002e-4; the text means 1e-4.
    assert parse_seconds("0.1ms") == 0.0001
    assert parse_bandwidth("0.3Gbps") == 300e6


@pytest.mark.parametrize("text, fraction", [
    ("1%", 0.01), (0.01, 0.01), ("0.5%", 0.005), ("0%", 0.0), ("100%", 1.0),
    (0, 0.0), (1, 1.0), ("0.25", 0.25), ("0.1 %", 0.001),
])
def test_parse_fraction_formats(text, fraction):
    assert parse_fraction(text) == fraction


@pytest.mark.parametrize("text, nbytes", [
    ("4MiB", 4 * 2**20), ("1MB", 10**6), ("64KiB", 65536), ("1460B", 1460), ("1.5KiB", 1536),
    ("2GiB", 2 * 2**30), ("10kB", 10_000), ("10 KB", 10_000), ("3 bytes", 3), (1460, 1460),
    ("1460", 1460), (2048.0, 2048),
])
def test_parse_size_formats(text, nbytes):
    assert parse_size(text) == nbytes
    assert isinstance(parse_size(text), int)


@pytest.mark.parametrize("text, count", [
    ("25.6M", 25_600_000), ("178k", 178_000), ("178K", 178_000), (25_600_000, 25_600_000),
    ("25_600_000", 25_600_000), ("1.2B", 1_200_000_000), ("2G", 2_000_000_000), ("7", 7),
    (1e6, 1_000_000),
])
def test_parse_count_formats(text, count):
    assert parse_count(text) == count


@pytest.mark.parametrize("parse, text, expected_words", [
    (parse_bandwidth, "10 Mbsp", ["'10 Mbsp'", "unknown unit 'Mbsp'", "did you mean 'Mbps'", "100Mbps"]),
    (parse_bandwidth, "-5Mbps", ["'-5Mbps'", "negative"]),
    (parse_bandwidth, "4MB", ["size, not a rate", "12.5MB/s"]),
    (parse_bandwidth, "fast", ["'fast'", "100Mbps"]),
    (parse_bandwidth, True, ["True", "bool"]),
    (parse_bandwidth, [1], ["list"]),
    (parse_bandwidth, float("nan"), ["finite"]),
    (parse_seconds, "30 mn", ["unknown unit 'mn'", "did you mean 'min'"]),
    (parse_seconds, "3 lightyears", ["unknown unit 'lightyears'", "30ms"]),
    (parse_seconds, "-1s", ["negative"]),
    (parse_fraction, 5, ["between 0 and 1", "'5%'"]),
    (parse_fraction, "150%", ["between 0 and 1"]),
    (parse_fraction, "1 permille", ["unknown unit"]),
    (parse_size, "4Mb", ["sizes are in bytes", "MiB"]),
    (parse_size, "4 MiBs", ["did you mean 'MiB'"]),
    (parse_size, 1.5, ["whole number of bytes"]),
    (parse_count, "25.6Q", ["unknown unit 'Q'", "25.6M"]),
    (parse_count, "1.5", ["whole number"]),
    (parse_count, "-3", ["negative"]),
])
def test_parse_errors_are_clear_value_errors(parse, text, expected_words):
    with pytest.raises(ValueError) as info:
        parse(text)
    for word in expected_words:
        assert word in str(info.value)


@pytest.mark.parametrize("bps, text", [
    (1e8, "100Mbps"), (1e9, "1Gbps"), (2.5e9, "2.5Gbps"), (155e6, "155Mbps"), (64e3, "64kbps"),
    (0.0, "0bps"), (12.0, "12bps"), (1e13, "10Tbps"),
])
def test_format_bps(bps, text):
    assert format_bps(bps) == text


@pytest.mark.parametrize("seconds, text", [
    (0.03, "30ms"), (2.0, "2s"), (180.0, "180s"), (0.00025, "250us"), (0.0, "0s"), (1e-8, "10ns"),
    (0.5, "500ms"), (1.5, "1.5s"),
])
def test_format_seconds(seconds, text):
    assert format_seconds(seconds) == text


def test_format_size_fraction_count():
    assert format_size(4 * 2**20) == "4MiB"
    assert format_size(10**6) == "1MB"
    assert format_size(65536) == "64KiB"
    assert format_size(1460) == "1460B"
    assert format_size(0) == "0B"
    assert format_fraction(0.01) == "1%"
    assert format_fraction(0.005) == "0.5%"
    assert format_fraction(0.0) == "0%"
    assert format_count(25_600_000) == "25.6M"
    assert format_count(178_000) == "178k"
    assert format_count(23_834_568) == "23834568"  # no unreadable "23.834568M"
    assert format_count(0) == "0"


def test_formatted_text_reads_back_to_the_same_number():
    rng = random.Random(7)
    samples = [0.1 + 0.2, 1 / 3, math.pi * 1e7, 123456789.123, 5e-324, 1.7976931348623157e308]
    samples += [rng.uniform(0, 1e10) for _ in range(200)] + [rng.uniform(0, 1e-3) for _ in range(200)]
    for value in samples:
        assert parse_bandwidth(format_bps(value)) == value
        assert parse_seconds(format_seconds(value)) == value
    for _ in range(200):
        fraction = rng.random()
        assert parse_fraction(format_fraction(fraction)) == fraction
        n = rng.randrange(0, 2**45)
        assert parse_size(format_size(n)) == n
        assert parse_count(format_count(n)) == n
