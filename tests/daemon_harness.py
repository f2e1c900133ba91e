"""A real `kvbudget daemon` process on a unix socket in a temp dir, for integration tests.

Waits for the standard health service to say SERVING (the daemon's promise that pool
and log are ready) and always stops the process when the test ends.
"""

from __future__ import annotations

import os
import socket
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from kvbudget.client.target import wait_until_serving

# Small and hand-checkable: llama-3.1-8b, 16-token blocks; 65 blocks = 64 usable + null.
DEFAULT_ARGS = (
    "--model", "llama-3.1-8b",
    "--num-gpu-blocks", "65",
    "--memory-mode", "accounting",
    "--device", "cpu",
    "--max-model-len", "2048",
)
START_TIMEOUT_S = 60.0


class DaemonProcess:
    def __init__(self, workdir: Path, *extra_args: str, lease_ttl_s: float = 5.0, env: dict | None = None,
                 listen: tuple[str, ...] | None = None) -> None:
        self.workdir = workdir
        self.socket_path = workdir / "kvbudget.sock"
        self.db_path = workdir / "decisions.db"
        self.target = f"unix://{self.socket_path}"
        self.listen = listen or (self.target,)
        self.args = [
            sys.executable, "-m", "kvbudget", "daemon", *DEFAULT_ARGS,
            "--db-path", str(self.db_path),
            "--lease-ttl-s", str(lease_ttl_s),
            *[item for address in self.listen for item in ("--listen", address)],
            *extra_args,
        ]
        self.env = dict(os.environ, **(env or {}))
        self.stderr_path = workdir / f"daemon-{time.monotonic_ns()}.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> DaemonProcess:
        self._stderr = open(self.stderr_path, "w")
        self.process = subprocess.Popen(
            self.args, stdout=subprocess.DEVNULL, stderr=self._stderr, env=self.env, cwd=self.workdir
        )
        self.wait_serving()
        return self

    def wait_serving(self) -> None:
        why = wait_until_serving(self.target, self.process, timeout_s=START_TIMEOUT_S)
        if why is not None:
            raise RuntimeError(f"daemon {why}: {self.stderr()}")

    def stderr(self) -> str:
        return self.stderr_path.read_text() if self.stderr_path.exists() else ""

    def signal(self, sig: int) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def wait(self, timeout: float = 30.0) -> int:
        assert self.process is not None
        return self.process.wait(timeout)

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL if it does not go; idempotent."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._stderr.close()
        return self.process.returncode

    def decision_rows(self, where: str = "1", params: tuple = ()) -> list[dict]:
        """Rows read with the plain sqlite3 module, as any operator tool would."""
        connection = sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True)
        connection.row_factory = sqlite3.Row
        try:
            return [dict(row) for row in connection.execute(f"SELECT * FROM decisions WHERE {where}", params)]
        finally:
            connection.close()

    def __enter__(self) -> DaemonProcess:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def free_port() -> int:
    """A TCP port on the loopback nobody listens on now (the daemon binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout: float = 20.0, interval: float = 0.05):
    """Polls until `predicate()` is truthy (returns it) or fails after `timeout` (not a timing
    assertion: the timeout only bounds a hang)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


async def await_until(predicate, timeout: float = 20.0, interval: float = 0.05):
    """`wait_until` for async tests: `predicate` is a coroutine function."""
    import asyncio

    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)
