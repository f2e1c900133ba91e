"""Byte counts as people read them, one way for every command (binary units, as `free -h`)."""

from __future__ import annotations

_UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def format_bytes(num_bytes: int, spec: str = ".2f") -> str:
    """`1.95 GiB`: the largest binary unit the count reaches, the number in `spec`
    (`.1f`: `95.3 MiB`; `.3g`: `10 GiB`, `1.4 GiB`); under 1 KiB, whole bytes."""
    for unit, scale in _UNITS:
        if num_bytes >= scale:
            return f"{num_bytes / scale:{spec}} {unit}"
    return f"{num_bytes} B"
