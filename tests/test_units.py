"""Byte counts and durations in every command's output: one formatter each (kvbudget.units)."""

from __future__ import annotations

from kvbudget.units import format_bytes


def test_the_largest_binary_unit_reached() -> None:
    assert format_bytes(0) == "0 B"
    assert format_bytes(1023) == "1023 B"
    assert format_bytes(1024) == "1.00 KiB"
    assert format_bytes(2 * 2**20 - 1) == "2.00 MiB"  # rounds in the unit it reached
    assert format_bytes(int(1.95 * 2**30)) == "1.95 GiB"
    assert format_bytes(3 * 2**40) == "3.00 TiB"


def test_the_number_takes_the_callers_format() -> None:
    assert format_bytes(int(95.3 * 2**20), ".1f") == "95.3 MiB"  # kvbudget log --disk-usage
    assert format_bytes(10 * 2**30, ".3g") == "10 GiB"  # --check-config's retention
    assert format_bytes(1_500_000_000, ".3g") == "1.4 GiB"
    assert format_bytes(512 * 2**20, ".3g") == "512 MiB"


def test_durations_in_the_two_largest_units_cut_short() -> None:
    from kvbudget.units import format_duration

    assert format_duration(0) == "0s"
    assert format_duration(45.9) == "45s"  # cut, not rounded: not yet a minute
    assert format_duration(59.99) == "59s"
    assert format_duration(60) == "1m"
    assert format_duration(12 * 60 + 59) == "12m"  # under an hour: minutes alone
    assert format_duration(2 * 3600 + 13 * 60 + 59) == "2h13m"
    assert format_duration(2 * 3600 + 30) == "2h"  # a next unit of 0 is left out
    assert format_duration(86399) == "23h59m"
    assert format_duration(86400) == "1d"
    assert format_duration(3 * 86400 + 4 * 3600 + 59 * 60) == "3d4h"
    assert format_duration(400 * 86400) == "400d"  # days are the largest unit


def test_a_negative_duration_reads_as_none_elapsed() -> None:
    """A wall clock stepped back (NTP) can put "now" before the start."""
    from kvbudget.units import format_duration

    assert format_duration(-5.0) == "0s"
