"""SIGHUP (`systemctl reload kvbudget`) on a real daemon: the config file read again."""

from __future__ import annotations

import signal
import urllib.request

import grpc
import pytest

from kvbudget.client import ObserverClient
from kvbudget.daemon.wire import convert
from kvbudget.v1 import observer_pb2, observer_pb2_grpc

from certificates import fingerprint, make_pair, new_connection, not_after_unix_s
from daemon_harness import DaemonProcess, await_until, free_port, wait_until

pytestmark = pytest.mark.slow

CONFIG = """
[admission]
policy = "{policy}"
max_queue_len = {max_queue_len}
enable_prefix_caching = {prefix_caching}

[tenants.team-a]
max_share = {share_a}
{team_b}
[log]
retention_max_bytes = {max_bytes}
"""


def write_config(path, *, policy="optimistic", share_a=0.25, team_b="", max_bytes=10 * 2**30, max_queue_len=0,
                 prefix_caching="true"):
    path.write_text(CONFIG.format(policy=policy, share_a=share_a, team_b=team_b, max_bytes=max_bytes,
                                  max_queue_len=max_queue_len, prefix_caching=prefix_caching))


async def test_sighup_applies_what_may_change_live_and_says_what_waits(tmp_path) -> None:
    config = tmp_path / "kvbudget.toml"
    write_config(config)
    with DaemonProcess(tmp_path, "--config", str(config)) as daemon:
        async with ObserverClient(daemon.target) as observer:
            before = await observer.snapshot()
            assert {t.tenant: t.quota_blocks for t in before.tenants} == {"team-a": 16}  # 0.25 x 64
            write_config(config, policy="guaranteed", share_a=0.5, max_bytes=2 * 2**20, max_queue_len=5,
                         prefix_caching="false", team_b="[tenants.team-b]\nmax_share = 0.125\nweight = 2\n")
            daemon.signal(signal.SIGHUP)

            async def reloaded():
                return "reloaded:" in daemon.stderr()

            await await_until(reloaded)
            after = await observer.snapshot()
            assert convert.policy_from_proto(after.policy) == "guaranteed"
            assert {t.tenant: (t.quota_blocks, t.weight) for t in after.tenants} == {
                "team-a": (32, 1.0), "team-b": (8, 2.0)}  # 0.5 x 64, 0.125 x 64
            assert after.decision_log.max_bytes == 2 * 2**20
            stderr = daemon.stderr()
            assert (
                "INFO: reloaded: policy optimistic -> guaranteed; max_queue_len 0 -> 5; tenant team-a max_share 0.25 weight 1 -> "
                "max_share 0.5 weight 1; tenant team-b (none) -> max_share 0.125 weight 2; "
                f"retention_max_bytes {10 * 2**30} -> {2 * 2**20}"
            ) in stderr
            assert "WARNING: reload: enable_prefix_caching changed; that takes a restart" in stderr
            # The switch is a decision like any other, in the log.
            policy_rows = daemon.decision_rows("kind = 'policy'")
            assert [r["detail"] for r in policy_rows] == ["by config reload: optimistic -> guaranteed"]
            # So is each quota it changed (issue 32): who, before -> after, per tenant.
            quota_rows = daemon.decision_rows("kind = 'admin' ORDER BY seq")
            assert [(r["reason"], r["tenant"], r["detail"]) for r in quota_rows] == [
                ("quota", "team-a", "by config reload: max_share 0.25 weight 1 -> max_share 0.5 weight 1"),
                ("quota", "team-b", "by config reload: no quota weight 1 -> max_share 0.125 weight 2"),
            ]
            assert policy_rows[0]["seq"] < quota_rows[0]["seq"]

            # A file that no longer loads changes nothing; the daemon goes on.
            config.write_text('[admission]\npolicy = "bogus"\n')
            daemon.signal(signal.SIGHUP)

            async def refused():
                return "reload failed, nothing changed" in daemon.stderr()

            await await_until(refused)
            assert "policy" in daemon.stderr().split("reload failed, nothing changed: ")[1].splitlines()[0]
            still = await observer.snapshot()
            assert still.policy == after.policy and len(still.tenants) == 2
    assert daemon.process.returncode == 0



def test_sighup_reads_the_tokens_file_again(tmp_path) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text('observer = ["observer-token-old"]\n')
    address = f"127.0.0.1:{free_port()}"
    with DaemonProcess(tmp_path, "--tokens-file", str(tokens),
                       listen=(f"unix://{tmp_path}/kvbudget.sock", address)) as daemon:
        with grpc.insecure_channel(address) as channel:
            stub = observer_pb2_grpc.ObserverServiceStub(channel)

            def snapshot_with(token: str):
                return stub.GetSnapshot(observer_pb2.GetSnapshotRequest(), timeout=10,
                                        metadata=(("authorization", f"Bearer {token}"),))

            snapshot_with("observer-token-old")
            tokens.write_text('observer = ["observer-token-new"]\n')  # rotated
            daemon.signal(signal.SIGHUP)
            wait_until(lambda: "reloaded:" in daemon.stderr())
            assert f"reloaded: tokens from {tokens}: 1" in daemon.stderr()
            snapshot_with("observer-token-new")
            with pytest.raises(grpc.RpcError) as old:
                snapshot_with("observer-token-old")
            assert old.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_sighup_changes_the_log_level(tmp_path) -> None:
    config = tmp_path / "kvbudget.toml"
    config.write_text('[server]\nlog_level = "warning"\n')
    with DaemonProcess(tmp_path, "--config", str(config)) as daemon:
        # Quiet: a reload's summary (info) is not said, its warning about a restart key is.
        config.write_text('[server]\nlog_level = "warning"\n[model]\nblock_size = 32\n')
        daemon.signal(signal.SIGHUP)
        wait_until(lambda: "block_size changed; that takes a restart" in daemon.stderr())
        assert "INFO:" not in daemon.stderr()
        # Back to info, live: this reload's summary already obeys it.
        config.write_text('[server]\nlog_level = "info"\n[admission]\npolicy = "guaranteed"\n')
        daemon.signal(signal.SIGHUP)
        wait_until(lambda: "reloaded:" in daemon.stderr())
        assert "INFO: reloaded: policy optimistic -> guaranteed; log_level warning -> info" in daemon.stderr()
    # The flag wins over the file, at start and at each reload.
    config.write_text('[server]\nlog_level = "info"\n')
    with DaemonProcess(tmp_path, "--config", str(config), "--log-level", "error") as daemon:
        async with ObserverClient(daemon.target) as observer:
            config.write_text('[server]\nlog_level = "info"\n[admission]\npolicy = "guaranteed"\n')
            daemon.signal(signal.SIGHUP)

            async def reloaded():
                return convert.policy_from_proto((await observer.snapshot()).policy) == "guaranteed"

            await await_until(reloaded)
        assert "INFO:" not in daemon.stderr()
    assert daemon.process.returncode == 0


async def test_sighup_serves_a_renewed_tls_certificate_to_new_connections(tmp_path) -> None:
    """A certificate renewed in place is served after `systemctl reload`, without a restart:
    new connections get it, the ones open keep going; a pair that cannot be served changes
    nothing and the journal names the file."""
    cert, key = make_pair(tmp_path, "served")
    first_fingerprint = fingerprint(cert)
    config = tmp_path / "kvbudget.toml"
    config.write_text(f"[server]\ntls_cert_file = '{cert}'\ntls_key_file = '{key}'\n")
    address = f"localhost:{free_port()}"
    metrics_port = free_port()

    def expiry_metric() -> float:
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
        line = next(line for line in text.splitlines()
                    if line.startswith("kvbudget_tls_certificate_expiry_timestamp_seconds "))
        return float(line.split()[1])

    with DaemonProcess(tmp_path, "--config", str(config), "--metrics-address", f"127.0.0.1:{metrics_port}",
                       listen=(f"unix://{tmp_path}/kvbudget.sock", address)) as daemon:
        assert f"tls certificate {cert}: sha256 {first_fingerprint}, valid until " in daemon.stderr()
        assert expiry_metric() == not_after_unix_s(cert)
        first = tmp_path / "first.pem"
        first.write_bytes(cert.read_bytes())
        assert await new_connection(address, first) == "ok"
        options = [("grpc.use_local_subchannel_pool", 1)]
        open_before = grpc.aio.secure_channel(address, grpc.ssl_channel_credentials(first.read_bytes()), options=options)
        observer = observer_pb2_grpc.ObserverServiceStub(open_before)
        await observer.GetSnapshot(observer_pb2.GetSnapshotRequest(), timeout=10)

        renewed_cert, renewed_key = make_pair(tmp_path, "renewed", days=90)
        cert.write_bytes(renewed_cert.read_bytes())
        key.write_bytes(renewed_key.read_bytes())
        daemon.signal(signal.SIGHUP)

        async def reloaded():
            return "reloaded:" in daemon.stderr()

        await await_until(reloaded)
        assert f"INFO: reloaded: tls certificate {cert}: sha256 {fingerprint(renewed_cert)}" in daemon.stderr()
        assert await new_connection(address, renewed_cert) == "ok"
        assert await new_connection(address, first) == "UNAVAILABLE"  # only the renewed one is presented
        assert expiry_metric() == not_after_unix_s(renewed_cert) > not_after_unix_s(first)
        reply = await observer.GetSnapshot(observer_pb2.GetSnapshotRequest(), timeout=10)
        assert reply.snapshot.num_blocks == 64  # the connection made before still works
        await open_before.close()

        _, stray_key = make_pair(tmp_path, "stray")
        key.write_bytes(stray_key.read_bytes())  # half a renewal: the key of another certificate
        daemon.signal(signal.SIGHUP)

        async def refused():
            return "reload failed, nothing changed" in daemon.stderr()

        await await_until(refused)
        why = daemon.stderr().split("reload failed, nothing changed: ")[1].splitlines()[0]
        assert f"server.tls_key_file: {key}: the key does not match the certificate in {cert}" in why
        assert await new_connection(address, renewed_cert) == "ok"  # still serving the renewed pair


async def test_a_quota_the_reload_cannot_apply_is_neither_claimed_nor_remembered(tmp_path) -> None:
    # 0.0001 of 64 blocks is less than one block: refused, team-a keeps 0.25 (16 blocks).
    # The summary claimed the change, and the daemon remembered 0.0001 as in force, so
    # putting 0.25 back "changed" it again.
    config = tmp_path / "kvbudget.toml"
    write_config(config)
    with DaemonProcess(tmp_path, "--config", str(config)) as daemon:
        async with ObserverClient(daemon.target) as observer:
            write_config(config, share_a=0.0001, policy="guaranteed")
            daemon.signal(signal.SIGHUP)
            await await_until(lambda_async(lambda: daemon.stderr().count("reloaded:") == 1))
            assert "reload: tenants.team-a.max_share: 0.0001 of the 64 blocks is less than one block; " \
                   "that tenant keeps its quota" in daemon.stderr()
            assert "INFO: reloaded: policy optimistic -> guaranteed\n" in daemon.stderr()  # not the quota
            assert {t.tenant: t.quota_blocks for t in (await observer.snapshot()).tenants} == {"team-a": 16}
            write_config(config, share_a=0.25, policy="guaranteed")  # what runs already
            daemon.signal(signal.SIGHUP)
            await await_until(lambda_async(lambda: daemon.stderr().count("reloaded:") == 2))
            assert daemon.stderr().rstrip().endswith("INFO: reloaded: nothing changed")


def lambda_async(predicate):
    async def check() -> bool:
        return predicate()
    return check


def test_a_reload_of_restart_keys_only_says_nothing_applied_live(tmp_path) -> None:
    # It said "reloaded: nothing changed", then that block_size changed.
    config = tmp_path / "kvbudget.toml"
    config.write_text('[server]\nlog_level = "info"\n')
    with DaemonProcess(tmp_path, "--config", str(config)) as daemon:
        # First the size the model already gave (16: no block_size at start) written down:
        # no change at all, and no restart asked for.
        config.write_text('[server]\nlog_level = "info"\n[model]\nblock_size = 16\n')
        daemon.signal(signal.SIGHUP)
        wait_until(lambda: "reloaded: nothing changed" in daemon.stderr())
        assert "takes a restart" not in daemon.stderr()
        config.write_text('[server]\nlog_level = "info"\n[model]\nblock_size = 32\n')
        daemon.signal(signal.SIGHUP)
        wait_until(lambda: "block_size changed; that takes a restart" in daemon.stderr())
        assert "INFO: reloaded: nothing applied live\n" in daemon.stderr()
        assert daemon.stderr().count("nothing changed") == 1  # (the first reload's)
