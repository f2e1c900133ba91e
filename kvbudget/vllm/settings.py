"""The adapter's settings, read once from the engine's environment (docs/vllm.md).

Environment variables, not vLLM flags: `--scheduler-cls` takes a class, not arguments, and
a systemd drop-in sets variables beside the unit that runs `vllm serve`.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

PREFIX = "KVBUDGET_"
FAIL_MODES = ("open", "closed")


class SettingError(ValueError):
    """A variable with a value the adapter cannot use; the message names the variable."""


@dataclass(frozen=True)
class AdapterSettings:
    target: str = "unix:///run/kvbudget/kvbudget.sock"
    token: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    engine_id: str = ""
    tenant: str = ""  # default tenant of requests that name none
    tenant_field: str = "tenant"  # the key of a request's extra args (the API's vllm_xargs) naming its tenant
    fail_mode: str = "open"  # daemon unreachable: vLLM's own admission (open) or none new (closed)
    step_timeout_s: float = 2.0  # one Step's wait before the daemon counts as unreachable
    connect_timeout_s: float = 10.0  # the first session's wait when vLLM starts (then: in the background)
    replace_existing: bool = True  # an engine restarted before its old lease lapsed takes its id back
    check_accounting: bool = True  # compare vLLM's blocks with the daemon's after each step


def _number(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(PREFIX + name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingError(f"{PREFIX}{name}={raw!r}: not a number of seconds") from None
    if not value > 0:
        raise SettingError(f"{PREFIX}{name}={raw!r}: must be above 0")
    return value


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = (env.get(PREFIX + name) or "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise SettingError(f"{PREFIX}{name}={raw!r}: use 1/0, true/false, yes/no or on/off")


def read_settings(env: Mapping[str, str] | None = None) -> AdapterSettings:
    """The settings from `env` (the process environment by default); a bad value raises
    SettingError naming the variable."""
    env = os.environ if env is None else env
    fail_mode = (env.get(PREFIX + "FAIL_MODE") or "open").strip().lower()
    if fail_mode not in FAIL_MODES:
        raise SettingError(f"{PREFIX}FAIL_MODE={fail_mode!r}: use open or closed")

    def text(name: str) -> str | None:
        return (env.get(PREFIX + name) or "").strip() or None

    return AdapterSettings(
        target=text("TARGET") or AdapterSettings.target,
        token=text("TOKEN"),
        tls_ca=text("TLS_CA"),
        tls_cert=text("TLS_CERT"),
        tls_key=text("TLS_KEY"),
        engine_id=text("ENGINE_ID") or f"vllm-{socket.gethostname()}-{os.getpid()}",
        tenant=text("TENANT") or "",
        tenant_field=text("TENANT_FIELD") or AdapterSettings.tenant_field,
        fail_mode=fail_mode,
        step_timeout_s=_number(env, "STEP_TIMEOUT_S", AdapterSettings.step_timeout_s),
        connect_timeout_s=_number(env, "CONNECT_TIMEOUT_S", AdapterSettings.connect_timeout_s),
        replace_existing=_flag(env, "REPLACE_EXISTING", True),
        check_accounting=_flag(env, "CHECK_ACCOUNTING", True),
    )
