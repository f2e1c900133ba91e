"""`kvbudget admin status`: where the daemon's live settings differ from its config file.

`admin set-policy` and `admin set-quota` change the daemon live, until it restarts or
reloads: then the file is the truth again, silently. The status says which live settings
the file would undo: the policy, and each tenant's quota and weight (a quota as the blocks
it comes to on this pool, int(max_share x usable blocks), as the daemon counts it).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from kvbudget.client.errors import CLIError
from kvbudget.client.tenants import tenants_folded


class Difference(NamedTuple):
    setting: str  # "policy", "tenants.NAME.max_share", "tenants.NAME.weight"
    live: str
    file: str


class FileSettings(NamedTuple):
    """What the file says of the settings admin changes live (the rest of it is not read:
    a file that leaves the model to the daemon's flags is still a fine one to compare)."""

    policy: str
    tenants: dict[str, Any]  # name -> TenantQuota


def file_settings(path: str) -> FileSettings:
    """The file's [admission] policy (the daemon's default where it says none) and its
    [tenants] quotas, read as the daemon reads them."""
    from pathlib import Path

    from kvbudget.daemon.config.loading import _parse_tenants, read_toml_file
    from kvbudget.daemon.config.settings import ConfigError, DaemonConfig

    try:
        raw = read_toml_file(Path(path))
        admission = raw.get("admission", {})
        policy = admission.get("policy", DaemonConfig.policy) if isinstance(admission, dict) else DaemonConfig.policy
        return FileSettings(str(policy), _parse_tenants(raw.get("tenants", {}), path, "tenants"))
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


def compared(snapshot: Any, path: str | None, given: bool) -> tuple[dict[str, Any], list[str]]:
    """The JSON fields and the status's lines comparing `snapshot` with the file at `path`
    (None: no file, nothing said). A file that cannot be read is an error when it was
    `given` (--config); the daemon's default one is said to be unreadable instead (it may
    be the daemon's user's alone), and the status goes on."""
    if path is None:
        return {"config_file": None, "differs_from_file": None, "config_error": ""}, []
    try:
        settings = file_settings(path)
    except ValueError as exc:
        if given:
            raise CLIError(f"--config: {exc}") from None
        return ({"config_file": path, "differs_from_file": None, "config_error": str(exc)},
                [f"  settings   not compared with the config file: {exc}"])
    found = differences(snapshot, settings)
    return ({"config_file": path, "differs_from_file": [d._asdict() for d in found], "config_error": ""},
            render_differences(path, found))


def differences(snapshot: Any, config: FileSettings) -> list[Difference]:
    """The live settings `snapshot` shows that `config` (the file's) does not say."""
    from kvbudget.daemon.wire import convert

    found = []
    live_policy = convert.policy_from_proto(snapshot.policy) or "unknown"
    if live_policy != config.policy:
        found.append(Difference("policy", live_policy, config.policy))
    capacity = snapshot.num_blocks
    listed = snapshot.tenants[:-1] if tenants_folded(snapshot) else snapshot.tenants
    live = {t.tenant: t for t in listed}
    for name in sorted(set(live) | set(config.tenants)):
        planned = config.tenants.get(name)
        share = planned.max_share if planned is not None else None
        weight = planned.weight if planned is not None else 1.0
        t = live.get(name)
        if t is None:
            continue  # (a configured tenant the daemon does not list: an older daemon)
        quota = int(share * capacity) if share else 0
        if t.quota_blocks != quota:
            found.append(Difference(
                f"tenants.{name}.max_share", _quota(t.quota_blocks, None),
                _quota(quota, share) if share else "no quota",
            ))  # fmt: skip
        if abs(t.weight - weight) > 1e-9:
            found.append(Difference(f"tenants.{name}.weight", f"{t.weight:g}", f"{weight:g}"))
    return found


def _quota(blocks: int, share: float | None) -> str:
    if not blocks and share is None:
        return "no quota"
    return f"{blocks} blocks" + (f" (max_share {share:g})" if share is not None else "")


def render_differences(path: str, found: list[Difference]) -> list[str]:
    """The status's lines for them: one saying the file, one a setting."""
    if not found:
        return [f"  settings   as in {path}"]
    lines = [f"  settings   {len(found)} live setting{'s' if len(found) > 1 else ''} differ from {path} "
             "(set live: the file's value comes back at restart or reload)"]
    width = max(len(d.setting) for d in found)
    lines += [f"             {d.setting:<{width}}  live {d.live}, file {d.file}" for d in found]
    return lines
