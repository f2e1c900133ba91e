"""Under systemd, the daemon's log lines carry journald priorities, and the daemon reads
its default config file.

systemd points JOURNAL_STREAM at stderr's `device:inode` when stderr is the journal; the
daemon then leads every line with `<N>` (`<4>` a warning, `<6>` info), so `journalctl -p
warning` finds its warnings. Here stderr is a file and JOURNAL_STREAM names that file, as
systemd would name its stream; naming another file (stderr redirected) leaves lines bare.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvbudget.cli import cmd_daemon
from kvbudget.client.errors import CLIError

from daemon_harness import DaemonProcess

# An MLA model with a block size vLLM would not use: --check-config warns about it.
MLA_WARNING_ARGS = ("--model", "deepseek-v3", "--block-size", "32", "--num-gpu-blocks", "100",
                    "--memory-mode", "accounting", "--device", "cpu")


def journal_stream(path: Path) -> str:
    stat = os.stat(path)
    return f"{stat.st_dev}:{stat.st_ino}"


def check_config(tmp_path: Path, *args: str, stderr_env: str | None = None,
                 env: dict | None = None) -> tuple[subprocess.CompletedProcess, str]:
    """`kvbudget daemon --check-config ARGS`, stderr into a file (JOURNAL_STREAM: that
    file's, or `stderr_env`)."""
    err = tmp_path / "stderr.log"
    err.touch()
    full_env = {**os.environ, "JOURNAL_STREAM": stderr_env or journal_stream(err)}
    full_env.pop("KVBUDGET_CONFIG", None)  # (only what the test names)
    full_env.update(env or {})
    with open(err, "w") as stderr:
        done = subprocess.run(
            [sys.executable, "-m", "kvbudget", "daemon", "--check-config", *args,
             "--db-path", str(tmp_path / "decisions.db"), "--listen", f"unix://{tmp_path}/kvbudget.sock"],
            stdout=subprocess.PIPE, stderr=stderr, text=True, env=full_env, timeout=120, cwd=tmp_path,
        )
    return done, err.read_text()


def test_a_warning_is_filed_at_warning_priority_when_stderr_is_the_journal(tmp_path: Path):
    done, stderr = check_config(tmp_path, *MLA_WARNING_ARGS)
    assert done.returncode == 0, stderr
    assert stderr.startswith("<4>kvbudget daemon: WARNING: block size 32 tokens"), stderr
    assert all(line.startswith("<4>") for line in stderr.splitlines())


def test_lines_stay_bare_when_stderr_is_not_the_journal(tmp_path: Path):
    other = tmp_path / "journal-elsewhere"
    other.touch()
    done, stderr = check_config(tmp_path, *MLA_WARNING_ARGS, stderr_env=journal_stream(other))
    assert done.returncode == 0, stderr
    assert stderr.startswith("kvbudget daemon: WARNING: block size 32 tokens"), stderr


def test_a_running_daemon_files_info_lines_at_info_priority(tmp_path: Path):
    daemon = DaemonProcess(tmp_path, "--log-level", "debug")
    daemon.stderr_path.touch()  # (start() reopens it: same inode)
    daemon.env["JOURNAL_STREAM"] = journal_stream(daemon.stderr_path)
    with daemon:
        pass
    lines = daemon.stderr().splitlines()
    assert any(line.startswith("<6>kvbudget daemon: INFO: ") for line in lines), lines
    assert all(re.match(r"<[2-7]>", line) for line in lines), lines


def test_the_config_named_by_kvbudget_config_is_read_without_config(tmp_path: Path):
    config = tmp_path / "kvbudget.toml"
    config.write_text('[model]\nname = "qwen3-32b"\n[pool]\nnum_gpu_blocks = 77\n'
                      'memory_mode = "accounting"\ndevice = "cpu"\n')
    done, stderr = check_config(tmp_path, env={cmd_daemon.CONFIG_ENV: str(config)})
    assert done.returncode == 0, stderr
    assert done.stdout.startswith("config OK: qwen3-32b, 77 blocks"), done.stdout


def test_a_missing_kvbudget_config_is_one_line(tmp_path: Path):
    done, stderr = check_config(tmp_path, env={cmd_daemon.CONFIG_ENV: str(tmp_path / "none.toml")})
    assert done.returncode != 0
    assert stderr.strip().splitlines() == [
        f"kvbudget daemon: error: {cmd_daemon.CONFIG_ENV}={tmp_path / 'none.toml'}: no such file "
        "(unset it, or give --config)"
    ]


def test_the_default_path_is_read_when_it_exists_and_skipped_when_not(tmp_path: Path, monkeypatch):
    monkeypatch.delenv(cmd_daemon.CONFIG_ENV, raising=False)
    monkeypatch.setattr(cmd_daemon, "DEFAULT_CONFIG_PATH", str(tmp_path / "kvbudget.toml"))
    assert cmd_daemon.config_path(None) is None
    (tmp_path / "kvbudget.toml").write_text("")
    assert cmd_daemon.config_path(None) == str(tmp_path / "kvbudget.toml")
    assert cmd_daemon.config_path("given.toml") == "given.toml"
    monkeypatch.setenv(cmd_daemon.CONFIG_ENV, str(tmp_path / "none.toml"))
    with pytest.raises(CLIError):
        cmd_daemon.config_path(None)
