"""Byte counts in every command's output: one formatter (kvbudget.units)."""

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
