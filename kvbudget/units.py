"""Byte counts and durations as people read them, one way for every command (binary units,
as `free -h`; durations in the two largest units, as kubectl's AGE column), and sizes as
people write them (`8GiB`, `80GB`, `80e9`: `parse_size`)."""

from __future__ import annotations

import math
import re

_UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def format_bytes(num_bytes: int, spec: str = ".2f") -> str:
    """`1.95 GiB`: the largest binary unit the count reaches, the number in `spec`
    (`.1f`: `95.3 MiB`; `.3g`: `10 GiB`, `1.4 GiB`); under 1 KiB, whole bytes."""
    for unit, scale in _UNITS:
        if num_bytes >= scale:
            return f"{num_bytes / scale:{spec}} {unit}"
    return f"{num_bytes} B"


_MINUTE_S, _HOUR_S, _DAY_S = 60, 3600, 86400


def format_duration(seconds: float) -> str:
    """`45s`, `12m`, `2h13m`, `3d4h`: the largest unit and the next one, cut short (never
    rounded up: a daemon up 59.9 s is not "up 1m"); a next unit of 0 is left out (`2h`).
    Negative durations (a clock stepped back) read as `0s`."""
    whole = int(max(0.0, seconds))
    if whole < _MINUTE_S:
        return f"{whole}s"
    if whole < _HOUR_S:
        return f"{whole // _MINUTE_S}m"
    if whole < _DAY_S:
        hours, minutes = divmod(whole // _MINUTE_S, 60)
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    days, hours = divmod(whole // _HOUR_S, 24)
    return f"{days}d{hours}h" if hours else f"{days}d"


# The forms every SIZE setting takes (estimate's and replay's flags, the daemon's flags and
# config keys): a number, optionally with an exponent, then a unit. Single letters follow vLLM's
# human-readable sizes: lower case decimal, upper case binary.
_SIZE = re.compile(r"^\s*([+-]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")
_DECIMAL = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_BINARY = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_LETTER = {
    "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
    "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40,
}  # fmt: skip
SIZE_EXAMPLES = "80e9, 80GB (10^9) or 8GiB (2^30)"


class NegativeSize(ValueError):
    """A size below zero (the caller may say what its setting takes instead)."""


def parse_size(text: str) -> int:
    """Bytes from `80e9`, `80GB` (10^9), `8GiB` (2^30), `8G` (2^30), `8g` (10^9), `123`
    (whole bytes, a fraction cut: `1.5KiB` is 1536). Zero is a size; whether a setting
    takes it is the setting's to say. ValueError says what is wrong, without the text
    (the caller names the setting and quotes it)."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"expected a size like {SIZE_EXAMPLES}")
    number, unit = float(match.group(1)), match.group(2)
    if unit in _LETTER:
        scale = _LETTER[unit]
    elif unit.lower() in _DECIMAL:
        scale = _DECIMAL[unit.lower()]
    elif unit.lower() in _BINARY:
        scale = _BINARY[unit.lower()]
    else:
        raise ValueError(f"unknown unit {unit!r} (use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
    product = number * scale  # (1e400 reads as inf: checked before floor())
    if product >= 2**63:  # (inf too)
        raise ValueError("too large (at most 8 EiB)")
    if product < 0:
        raise NegativeSize("must not be negative")
    return math.floor(product)
