"""Byte counts and durations as people read them, one way for every command (binary units,
as `free -h`; durations in the two largest units, as kubectl's AGE column)."""

from __future__ import annotations

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
