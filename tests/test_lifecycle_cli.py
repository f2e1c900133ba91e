"""`kvbudget daemon` flags beside a config file, as an operator combines them (a drop-in
adds a flag to the shipped unit's `--config`)."""

from __future__ import annotations

import argparse
import re
import signal

import pytest

from kvbudget.cli.main import build_parser
from kvbudget.client import ObserverClient
from kvbudget.daemon.config.settings import KEYS

from daemon_harness import DaemonProcess, await_until


def daemon_parser() -> argparse.ArgumentParser:
    parser = build_parser(["daemon"])
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return subparsers.choices["daemon"]


def test_every_flag_names_its_key_in_the_file() -> None:
    """Most flags are the key's name; --model is model.name and --metrics-address is
    metrics.address, and --help said neither (most flags had no help at all). Each help
    says what the flag is for, then (its key, its default)."""
    helps = {action.dest: action.help or "" for action in daemon_parser()._actions}
    assert "(model.name)" in helps["model"]
    assert helps["metrics_address"] == 'where /metrics is served; "": off (metrics.address)'
    assert helps["block_size"] == "tokens per block (model.block_size, default 16; 64 for MLA models)"
    assert "(server.listen; " in helps["listen"]
    assert helps["tenant"].endswith("(tenants.NAME)")
    keys_in_help = {key for help_text in helps.values() for key in re.findall(r"\(([a-z_]+\.[a-z_]+)", help_text)}
    assert {f"{key.section}.{key.name}" for key in KEYS} <= keys_in_help


@pytest.mark.slow
async def test_a_tenant_flag_keeps_the_files_other_tenants_also_after_a_reload(tmp_path) -> None:
    config = tmp_path / "kvbudget.toml"
    config.write_text("[tenants.team-a]\nmax_share = 0.25\n")
    with DaemonProcess(tmp_path, "--config", str(config), "--tenant", "team-c=0.5:2") as daemon:
        async with ObserverClient(daemon.target) as observer:
            async def quotas() -> dict[str, tuple[int, float]]:
                return {t.tenant: (t.quota_blocks, t.weight) for t in (await observer.snapshot()).tenants}

            # 64 usable blocks: 0.25 -> 16, 0.5 -> 32
            assert await quotas() == {"team-a": (16, 1.0), "team-c": (32, 2.0)}
            config.write_text("[tenants.team-a]\nmax_share = 0.125\n[tenants.team-c]\nmax_share = 0.25\n")
            daemon.signal(signal.SIGHUP)

            async def reloaded() -> bool:
                return "reloaded:" in daemon.stderr()

            await await_until(reloaded)
            # team-a follows the file; team-c's share is the flag's still, whatever the file says
            assert await quotas() == {"team-a": (8, 1.0), "team-c": (32, 2.0)}
