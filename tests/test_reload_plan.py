"""What a reload changes live and what waits for a restart (daemon/server/reload.py), in process."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kvbudget.daemon.config.settings import ConfigError, DaemonConfig, TenantQuota
from kvbudget.daemon.server.reload import model_resolved, plan_reload, tenant_updates
from kvbudget.daemon.config.tls_files import read_client_ca, read_pair

from certificates import fingerprint, make_ca, make_pair

BASE = DaemonConfig(model="llama-3.1-8b", num_gpu_blocks=65, device="cpu", memory_mode="accounting",
                    tenants={"team-a": TenantQuota(0.25, 1.0), "team-c": TenantQuota(None, 3.0)})


def test_nothing_changed() -> None:
    plan = plan_reload(BASE, BASE)
    assert (plan.changes, plan.at_restart, plan.roles) == ((), (), None)
    assert plan.config == BASE


def test_writing_down_what_the_model_gave_is_no_change() -> None:
    """llama-3.1-8b left to itself serves 16-token blocks and 131,072 tokens: a config that
    now spells those out changes nothing; another size, or another model, waits for a restart."""
    served = model_resolved(16, 131072)
    spelled_out = dataclasses.replace(BASE, block_size=16, max_model_len=131072)
    plan = plan_reload(BASE, spelled_out, resolved=served)
    assert (plan.changes, plan.at_restart) == ((), ())
    assert plan_reload(spelled_out, BASE, resolved=served).at_restart == ()  # and back to unset
    assert plan_reload(BASE, dataclasses.replace(BASE, block_size=32), resolved=served).at_restart == ("block_size",)
    assert plan_reload(BASE, dataclasses.replace(BASE, max_model_len=4096), resolved=served).at_restart == (
        "max_model_len",)
    other_model = dataclasses.replace(spelled_out, model="deepseek-v3")  # (its own default is 64)
    assert plan_reload(BASE, other_model, resolved=served).at_restart == ("model", "block_size", "max_model_len")
    assert plan_reload(BASE, spelled_out).at_restart == ("block_size", "max_model_len")  # nothing resolved: as given


def test_live_keys_are_applied_and_said_the_rest_waits_for_a_restart() -> None:
    loaded = dataclasses.replace(
        BASE, policy="guaranteed", retention_days=7.0, retention_max_bytes=2**30, lease_ttl_s=20.0,
        tenants={"team-a": TenantQuota(0.5, 1.0), "team-b": TenantQuota(0.125, 2.0)},
        num_gpu_blocks=129, max_queue_len=10, watermark=0.05, enable_prefix_caching=False,
        listen=("unix:///elsewhere.sock",), log_level="warning",
    )
    plan = plan_reload(BASE, loaded)
    assert plan.changes == (
        "policy optimistic -> guaranteed",
        "watermark 0.015 -> 0.05",
        "max_queue_len 0 -> 10",
        "tenant team-a max_share 0.25 weight 1 -> max_share 0.5 weight 1",
        "tenant team-b (none) -> max_share 0.125 weight 2",
        "tenant team-c max_share none weight 3 -> (none)",
        "lease_ttl_s 10 -> 20",
        "log_level info -> warning",
        "retention_days 30 -> 7",
        f"retention_max_bytes {10 * 2**30} -> {2**30}",
    )
    assert plan.at_restart == ("num_gpu_blocks", "enable_prefix_caching", "listen")
    # The running config after it: the live keys new, the others as they run now.
    assert (plan.config.policy, plan.config.retention_days, plan.config.lease_ttl_s) == ("guaranteed", 7.0, 20.0)
    assert (plan.config.num_gpu_blocks, plan.config.enable_prefix_caching, plan.config.listen) == (
        65, True, BASE.listen)
    assert (plan.config.max_queue_len, plan.config.watermark) == (10, 0.05)
    assert tenant_updates(BASE, plan.config) == [("team-a", 0.5, 1.0), ("team-b", 0.125, 2.0), ("team-c", None, 1.0)]
    # Reloading the same file again reports the restart keys again, and nothing else.
    again = plan_reload(plan.config, loaded)
    assert (again.changes, again.at_restart) == ((), ("num_gpu_blocks", "enable_prefix_caching", "listen"))


def test_the_tokens_file_is_read_again_each_reload(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text('engine = ["engine-token-123"]\n')
    running = dataclasses.replace(BASE, tokens_file=str(tokens))
    tokens.write_text('engine = ["engine-token-456"]\nadmin = ["admin-token-789"]\n')
    plan = plan_reload(running, running)  # the same name, new contents
    assert plan.roles is not None
    assert plan.roles.tokens == {"engine-token-456": "engine", "admin-token-789": "admin"}
    assert plan.changes == (f"tokens from {tokens}: 2",)
    # A file that no longer reads fails the whole reload (the caller changes nothing).
    tokens.write_text('engine = ["short"]\n')
    with pytest.raises(ConfigError, match=r"engine\[0\]: a token must be at least"):
        plan_reload(running, running)


def test_tokens_on_or_off_is_a_restart() -> None:
    # Without a tokens file TCP callers are trusted (TLS-only setups): that mode is set at start.
    plan = plan_reload(BASE, dataclasses.replace(BASE, tokens_file="/etc/kvbudget/tokens.toml"))
    assert (plan.changes, plan.at_restart, plan.roles) == ((), ("tokens_file",), None)


def test_the_tls_pair_is_read_again_and_served_only_when_it_changed(tmp_path: Path) -> None:
    cert, key = make_pair(tmp_path, "a")
    served = read_pair(str(cert), str(key))
    running = dataclasses.replace(BASE, tls_cert_file=str(cert), tls_key_file=str(key))
    plan = plan_reload(running, running, served)  # nothing new in the files
    assert (plan.changes, plan.at_restart, plan.certificate) == ((), (), None)

    renewed_cert, renewed_key = make_pair(tmp_path, "renewed")
    cert.write_bytes(renewed_cert.read_bytes())  # a renewal in place: the same names
    key.write_bytes(renewed_key.read_bytes())
    plan = plan_reload(running, running, served)
    assert plan.certificate is not None and plan.certificate.fingerprint == fingerprint(renewed_cert)
    assert plan.changes == (f"tls certificate {plan.certificate.describe()}",)
    assert plan.changes[0].startswith(f"tls certificate {cert}: sha256 {fingerprint(renewed_cert)}, valid until ")
    assert plan.at_restart == ()

    # Other files named: served as well, and the running config names them from now on.
    other_cert, other_key = make_pair(tmp_path, "other")
    loaded = dataclasses.replace(running, tls_cert_file=str(other_cert), tls_key_file=str(other_key))
    plan = plan_reload(running, loaded, plan.certificate)
    assert plan.changes[0].startswith(f"tls certificate {other_cert}: sha256 {fingerprint(other_cert)}, valid until ")
    assert (plan.config.tls_cert_file, plan.config.tls_key_file) == (str(other_cert), str(other_key))

    # A pair that cannot be served fails the whole reload, naming the file (nothing changes).
    key.write_bytes(other_key.read_bytes())
    with pytest.raises(ConfigError) as caught:
        plan_reload(running, running, served)
    assert caught.value.key == "server.tls_key_file" and "does not match the certificate" in str(caught.value)


def test_tls_on_or_off_is_a_restart(tmp_path: Path) -> None:
    cert, key = make_pair(tmp_path, "a")
    with_tls = dataclasses.replace(BASE, tls_cert_file=str(cert), tls_key_file=str(key))
    plan = plan_reload(BASE, with_tls)
    assert (plan.changes, plan.at_restart, plan.certificate) == ((), ("tls_cert_file", "tls_key_file"), None)
    plan = plan_reload(with_tls, BASE, read_pair(str(cert), str(key)))
    assert (plan.changes, plan.at_restart, plan.certificate) == ((), ("tls_cert_file", "tls_key_file"), None)
    assert plan.config.tls_cert_file == str(cert)  # (still serving it until the restart)


def test_the_client_ca_file_is_read_again_and_served_only_when_it_changed(tmp_path: Path) -> None:
    cert, key = make_pair(tmp_path, "a")
    ca, _ = make_ca(tmp_path, "ca")
    served_pair, served_ca = read_pair(str(cert), str(key)), read_client_ca(str(ca))
    running = dataclasses.replace(BASE, tls_cert_file=str(cert), tls_key_file=str(key), tls_client_ca_file=str(ca))
    plan = plan_reload(running, running, served_pair, served_ca)
    assert (plan.changes, plan.at_restart, plan.certificate, plan.client_ca) == ((), (), None, None)

    second, _ = make_ca(tmp_path, "second-ca")  # a CA added to the bundle in place
    ca.write_bytes(ca.read_bytes() + second.read_bytes())
    plan = plan_reload(running, running, served_pair, served_ca)
    assert plan.client_ca is not None and plan.client_ca.num_certificates == 2
    assert (plan.changes, plan.at_restart, plan.certificate) == ((f"tls client CA {plan.client_ca.describe()}",), (), None)
    assert plan.changes[0].startswith(f"tls client CA {ca}: 2 CA certificates, the first expires ")

    loaded = dataclasses.replace(running, tls_client_ca_file=str(second))  # another file named
    plan = plan_reload(running, loaded, served_pair, served_ca)
    assert plan.changes[0].startswith(f"tls client CA {second}: 1 CA certificate, valid until ")
    assert plan.config.tls_client_ca_file == str(second)

    ca.write_text("not a certificate any more\n")  # refused whole, naming the key and file
    with pytest.raises(ConfigError) as caught:
        plan_reload(running, running, served_pair, served_ca)
    assert caught.value.key == "server.tls_client_ca_file" and f"{ca}: no PEM certificate in it" in str(caught.value)


def test_client_certificates_on_or_off_is_a_restart(tmp_path: Path) -> None:
    cert, key = make_pair(tmp_path, "a")
    ca, _ = make_ca(tmp_path, "ca")
    with_tls = dataclasses.replace(BASE, tls_cert_file=str(cert), tls_key_file=str(key))
    with_mtls = dataclasses.replace(with_tls, tls_client_ca_file=str(ca))
    served_pair = read_pair(str(cert), str(key))
    plan = plan_reload(with_tls, with_mtls, served_pair)
    assert (plan.changes, plan.at_restart, plan.client_ca) == ((), ("tls_client_ca_file",), None)
    assert plan.config.tls_client_ca_file == ""  # (clients present none until the restart)
    plan = plan_reload(with_mtls, with_tls, served_pair, read_client_ca(str(ca)))
    assert (plan.changes, plan.at_restart, plan.client_ca) == ((), ("tls_client_ca_file",), None)
    plan = plan_reload(BASE, with_mtls)  # TLS and client certificates at once
    assert plan.at_restart == ("tls_cert_file", "tls_key_file", "tls_client_ca_file")
