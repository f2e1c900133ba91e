"""Filling a disk for real: the `small_disk` fixture (conftest.py) mounts one, 8 MiB."""

from __future__ import annotations

import errno
from pathlib import Path


def fill(disk: Path) -> int:
    """Writes a filler file (`disk/filler`) until the disk is full; its size."""
    written = 0
    with open(disk / "filler", "wb", buffering=0) as filler:
        chunk = b"\0" * 4096
        try:
            while True:
                written += filler.write(chunk)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return written
