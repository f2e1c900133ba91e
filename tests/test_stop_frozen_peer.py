"""SIGTERM with an engine whose process is frozen (SIGSTOP): the daemon does not wait the
whole `drain_timeout_s` for a connection nobody will close, and loses nothing.

The engine holds an admitted request, its Events stream open, when it is frozen; the
daemon is stopped with a drain timeout far past what the test waits for. It exits 0 well
before it, the log has every decision the engine received, and says how the stop ended.
"""

from __future__ import annotations

import signal
import subprocess
import sys

from daemon_harness import DaemonProcess

DRAIN_TIMEOUT_S = 120  # reaching it is the failure: the test waits at most a quarter

ENGINE = """
import asyncio, sys
from kvbudget.client import EngineClient
from kvbudget.daemon.records import RequestSpec

async def main():
    async with EngineClient(sys.argv[1], "frozen", heartbeat=True) as engine:
        [admit] = await engine.step(submits=[RequestSpec("held", 16, 16)])
        print(admit.seq, flush=True)
        await asyncio.sleep(3600)

asyncio.run(main())
"""


def test_sigterm_does_not_wait_out_the_drain_for_a_frozen_engine(tmp_path) -> None:
    with DaemonProcess(tmp_path, "--drain-timeout-s", str(DRAIN_TIMEOUT_S)) as daemon:
        engine = subprocess.Popen([sys.executable, "-c", ENGINE, daemon.target], stdout=subprocess.PIPE, text=True)
        try:
            seq = int(engine.stdout.readline())
            engine.send_signal(signal.SIGSTOP)
            daemon.signal(signal.SIGTERM)
            assert daemon.wait(DRAIN_TIMEOUT_S / 4) == 0
        finally:
            engine.kill()
            engine.wait()
        assert [row["kind"] for row in daemon.decision_rows("seq = ?", (seq,))] == ["admit"]
        assert "no call in flight; closed the connections still open" in daemon.stderr()
