"""A reload that goes wrong while it is applied: systemd, told RELOADING=1, still hears
READY=1 (without it the unit stays "reloading" until systemd's timeout, and each
`systemctl reload` meanwhile waits on it)."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from pathlib import Path

import pytest

from kvbudget.daemon.config.loading import load_config
from kvbudget.daemon.server.lifecycle import Daemon

from daemon_harness import await_until

pytestmark = pytest.mark.slow


class NotifyListener:
    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.setblocking(False)
        self.messages: list[str] = []

    def received(self) -> list[str]:
        while True:
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except BlockingIOError:
                return self.messages


async def test_a_reload_that_fails_part_way_still_says_ready(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    notify = NotifyListener(tmp_path / "notify.sock")
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify.sock"))
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    config = load_config(None, {
        "model": "llama-3.1-8b", "num_gpu_blocks": 65, "memory_mode": "accounting", "device": "cpu",
        "db_path": str(tmp_path / "decisions.db"), "listen": f"unix://{tmp_path}/kvbudget.sock",
    })
    daemon = Daemon(config, reload_config=lambda: dataclasses.replace(config, watermark=0.5))
    serving = asyncio.create_task(daemon.serve())
    try:
        async def said(line: str) -> bool:
            return any(line in message.splitlines() for message in notify.received())

        await await_until(lambda: said("READY=1"), timeout=60)
        assert daemon.core is not None

        def broken_retune(**_: object) -> None:
            raise RuntimeError("retune broke")

        monkeypatch.setattr(daemon.core.controller, "retune", broken_retune)
        notify.messages.clear()
        daemon.request_reload()
        await await_until(lambda: said("STATUS=reload failed part-way, see the journal"), timeout=30)
        reload_messages = [m for m in notify.received() if not m.startswith(("STATUS=", "WATCHDOG="))]
        assert [m.splitlines()[0] for m in reload_messages] == ["RELOADING=1", "READY=1"]
        assert daemon.config.watermark == config.watermark  # not recorded as applied
    finally:
        daemon.request_stop()
        assert await asyncio.wait_for(serving, 60) == 0
        notify.sock.close()
