"""A disk a test can really fill: an 8 MiB tmpfs of its own (needs root; skips without)."""

from __future__ import annotations

import errno
import subprocess
from pathlib import Path

import pytest


@pytest.fixture
def small_disk(tmp_path: Path):
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,mode=0755", "kvbudget-test", str(mount_point)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill ({mounted.stderr.strip() or 'not permitted'})")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "--lazy", str(mount_point)], check=False)


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
