"""A daemon installed without the `gpu` extra (no torch) still runs, and says in one line
how to get an owned pool: `pip install 'kvbudget[gpu]'`.

The daemon runs in a real process where `import torch` fails as it does when torch is not
installed: a `torch` module first on its path raises ImportError.
"""

from __future__ import annotations

from pathlib import Path

from kvbudget.client import ObserverClient

from daemon_harness import DaemonProcess


async def test_owned_memory_without_torch_runs_accounting_and_names_the_extra(tmp_path: Path):
    shadow = tmp_path / "no-torch"
    shadow.mkdir()
    (shadow / "torch.py").write_text("raise ImportError(\"No module named 'torch'\")\n")
    with DaemonProcess(tmp_path, "--memory-mode", "owned", env={"PYTHONPATH": str(shadow)}) as daemon:
        async with ObserverClient(daemon.target) as observer:
            plan = (await observer.snapshot()).plan
        stderr = daemon.stderr()
    assert plan.num_blocks > 0 and not plan.HasField("memory")  # accounting only: no memory handle
    said = [line for line in stderr.splitlines() if "torch" in line]
    assert len(said) == 1, stderr
    assert said[0].startswith("kvbudget daemon: WARNING: torch is not installed: accounting-only pool")
    assert "pip install 'kvbudget[gpu]'" in said[0]
