"""The systemd files in deploy/ are valid, hardened, and agree with each other.

`systemd-analyze verify` and `systemd-analyze security --offline=yes` judge the unit as
systemd itself would. They need systemd's tools (Debian: `apt-get install -y systemd`);
without them those tests are skipped with that reason, and the text checks still run.

verify refuses a unit whose ExecStart binary does not exist, so it runs on a copy with
ExecStart pointed at an executable that exists here; everything else is the shipped unit.
verify does not resolve `User=`, so the kvbudget user need not exist on the test machine;
the sysusers file is checked separately by creating that user in a scratch root.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
UNIT = DEPLOY / "kvbudget.service"
SYSUSERS = DEPLOY / "kvbudget.sysusers"
TMPFILES = DEPLOY / "kvbudget.tmpfiles"
EXAMPLE_CONFIG = DEPLOY / "kvbudget.toml"

MAX_EXPOSURE = 2.5

APT_HINT = "systemd tools not installed (Debian: apt-get install -y systemd)"


def unit_settings(text: str) -> dict[str, list[str]]:
    """Every `Key=value` of a unit file, by key, in order (keys may repeat)."""
    found: dict[str, list[str]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        found.setdefault(key.strip(), []).append(value.strip())
    return found


def seconds(value: str) -> float:
    """systemd time span ('90s', '2min', '1min 30s', '45') in seconds."""
    units = {"": 1, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600, "ms": 0.001}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value):
        total += float(number) * units[unit]
    return total


def runnable_copy(tmp_path: Path) -> Path:
    """The shipped unit with only the ExecStart binary swapped for one that exists here."""
    text = UNIT.read_text()
    stand_in = Path(sys.executable).resolve()
    swapped, count = re.subn(r"^ExecStart=\S+", f"ExecStart={stand_in}", text, flags=re.M)
    assert count == 1, "the unit must have exactly one ExecStart="
    if not Path("/bin/kill").exists():  # (procps is not on every image; systemd hosts have it)
        swapped = swapped.replace("ExecReload=/bin/kill", f"ExecReload={stand_in}")
    copy = tmp_path / UNIT.name
    copy.write_text(swapped)
    return copy


def require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.skip(APT_HINT)
    return path


# ------------------------------------------------------------------ systemd's own judgement


def test_reload_is_a_sighup_to_the_daemon() -> None:
    unit = unit_settings(UNIT.read_text())
    assert unit["ExecReload"] == ["/bin/kill -HUP $MAINPID"]  # the daemon reads its config again
    assert unit["NotifyAccess"] == ["main"]  # RELOADING=1 / READY=1 come from the daemon itself


def test_verify_prints_nothing(tmp_path: Path) -> None:
    analyze = require("systemd-analyze")
    copy = runnable_copy(tmp_path)
    result = subprocess.run(
        [analyze, "verify", str(copy)], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert result.stderr == ""
    assert result.returncode == 0


def test_verify_would_catch_a_broken_unit(tmp_path: Path) -> None:
    """The check above is not vacuous: verify does complain about a bad line."""
    analyze = require("systemd-analyze")
    copy = runnable_copy(tmp_path)
    copy.write_text(copy.read_text().replace("Type=notify", "Type=notifyy"))
    result = subprocess.run(
        [analyze, "verify", str(copy)], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert "notifyy" in result.stderr


def test_security_exposure_is_at_most_2_5(tmp_path: Path) -> None:
    analyze = require("systemd-analyze")
    copy = runnable_copy(tmp_path)
    result = subprocess.run(
        [analyze, "security", "--offline=yes", "--no-pager", str(copy)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    match = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", result.stdout)
    assert match, result.stdout[-2000:] + result.stderr
    assert float(match.group(1)) <= MAX_EXPOSURE


def test_sysusers_creates_the_static_user_and_group(tmp_path: Path) -> None:
    sysusers = require("systemd-sysusers")
    (tmp_path / "etc").mkdir()
    result = subprocess.run(
        [sysusers, f"--root={tmp_path}", str(SYSUSERS)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    passwd = {line.split(":")[0]: line.split(":") for line in (tmp_path / "etc/passwd").read_text().splitlines()}
    groups = {line.split(":")[0] for line in (tmp_path / "etc/group").read_text().splitlines()}
    unit = unit_settings(UNIT.read_text())
    user, group = unit["User"][0], unit["Group"][0]
    assert user in passwd and group in groups
    assert passwd[user][5] == "/var/lib/kvbudget"  # home = StateDirectory, writable under strict
    # every supplementary group the unit asks for exists after sysusers ran
    for wanted in unit.get("SupplementaryGroups", []):
        for name in wanted.split():
            assert name in groups


def test_tmpfiles_locks_down_the_tokens_file(tmp_path: Path) -> None:
    tmpfiles = require("systemd-tmpfiles")
    sysusers = require("systemd-sysusers")
    (tmp_path / "etc/kvbudget").mkdir(parents=True)
    subprocess.run([sysusers, f"--root={tmp_path}", str(SYSUSERS)], check=True, capture_output=True)
    tokens = tmp_path / "etc/kvbudget/tokens.toml"
    tokens.write_text('engine = ["t"]\n')
    tokens.chmod(0o644)
    result = subprocess.run(
        [tmpfiles, f"--root={tmp_path}", "--create", str(TMPFILES)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert tokens.stat().st_mode & 0o777 == 0o640


# ------------------------------------------------------------------ what the unit promises


def test_unit_is_a_notify_service_with_watchdog_and_restart() -> None:
    unit = unit_settings(UNIT.read_text())
    assert unit["Type"] == ["notify"]
    assert unit["NotifyAccess"] == ["main"]
    assert seconds(unit["WatchdogSec"][0]) > 0
    assert unit["Restart"] == ["on-failure"]
    assert unit["KillSignal"] == ["SIGTERM"]
    assert re.fullmatch(r"/usr/bin/kvbudget daemon --config \S+", unit["ExecStart"][0])


def test_stop_timeout_outlasts_the_graceful_drain() -> None:
    unit = unit_settings(UNIT.read_text())
    stop_s = seconds(unit["TimeoutStopSec"][0])
    from kvbudget.daemon.config import settings as config

    fields = config.DaemonConfig.__dataclass_fields__
    drain_fields = [name for name in fields if "drain" in name and name.endswith("_s")]
    assert drain_fields, "DaemonConfig names its graceful-drain deadline (drain_timeout_s)"
    defaults = {
        name: fields[name].default for name in drain_fields
    }
    for name, default in defaults.items():
        assert isinstance(default, int | float), name
        assert stop_s > default, f"TimeoutStopSec={stop_s}s must exceed {name}={default}s"


def test_directories_socket_and_state_match_the_example_config() -> None:
    unit = unit_settings(UNIT.read_text())
    assert unit["RuntimeDirectory"] == ["kvbudget"]
    assert unit["RuntimeDirectoryMode"] == ["0750"]
    assert unit["StateDirectory"] == ["kvbudget"]
    assert unit["ConfigurationDirectory"] == ["kvbudget"]
    # umask 0007: bind() makes the socket 0770 & ~umask -> group may connect, others not
    assert int(unit["UMask"][0], 8) & 0o070 == 0
    assert int(unit["UMask"][0], 8) & 0o007 == 0o007
    assert "/etc/kvbudget/kvbudget.toml" in " ".join(unit["Environment"])
    config = tomllib.loads(EXAMPLE_CONFIG.read_text())
    flat = _flatten(config)
    listen = [v for k, v in flat.items() if k.endswith("listen")]
    assert listen, "the example config names its listen addresses"
    unix = [a for a in _as_list(listen[0]) if a.startswith("unix:")]
    assert unix and all(a.startswith("unix:///run/kvbudget/") for a in unix)
    db = [v for k, v in flat.items() if k.endswith("db_path")]
    if db:
        assert str(db[0]).startswith("/var/lib/kvbudget/")


def test_cuda_breaking_options_stay_out() -> None:
    """Each of these hides the GPU or breaks CUDA; the unit says why it leaves them out."""
    text = UNIT.read_text()
    unit = unit_settings(text)
    assert unit.get("PrivateDevices", ["no"]) == ["no"]
    assert unit.get("MemoryDenyWriteExecute", ["no"]) == ["no"]
    assert unit.get("ProcSubset", ["all"]) == ["all"]
    assert unit["DevicePolicy"] == ["closed"]
    assert any(rule.startswith("char-nvidia") for rule in unit["DeviceAllow"])
    for omitted in ("PrivateDevices=yes", "MemoryDenyWriteExecute=yes", "ProcSubset=pid"):
        assert re.search(rf"^#\s+{re.escape(omitted)}\s+\S", text, flags=re.M), omitted


def test_hardening_that_cuda_tolerates_is_on() -> None:
    unit = unit_settings(UNIT.read_text())
    for key in (
        "NoNewPrivileges",
        "PrivateTmp",
        "ProtectKernelTunables",
        "ProtectKernelModules",
        "ProtectKernelLogs",
        "ProtectControlGroups",
        "ProtectClock",
        "ProtectHostname",
        "RestrictNamespaces",
        "RestrictRealtime",
        "RestrictSUIDSGID",
        "LockPersonality",
    ):
        assert unit[key] == ["yes"], key
    assert unit["ProtectSystem"] == ["strict"]
    assert unit["ProtectHome"] == ["yes"]
    assert unit["CapabilityBoundingSet"] == [""]
    assert set(unit["RestrictAddressFamilies"][0].split()) == {
        "AF_UNIX",
        "AF_INET",
        "AF_INET6",
        "AF_NETLINK",
    }
    assert "@system-service" in unit["SystemCallFilter"]


def _flatten(table: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def _as_list(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]
