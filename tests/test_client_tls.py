"""Client commands over TLS and mutual TLS (kvbudget.client.target: --tls-ca, --tls-cert, --tls-key).

Every mistake in the TLS files is one line naming the flag (or variable) and the file,
before any call. Against real gRPC servers on localhost, with a CA and certificates made
by `openssl` (tests/certificates.py): a client certificate gets through a server that
requires one and nothing else does; `kvbudget admin`, `doctor`, `replay` (live), the
dashboard's Watch source and the replays it launches all present it. A real daemon with a
TLS listener serves `admin` and a live `replay` given only --tls-ca.

The mutual-TLS servers are this file's own (a fake ObserverService / EngineService that
records which client certificate each call came with); they are blocking `grpc.server`s on
threads, since the commands under test make blocking calls from the test's own thread.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kvbudget.cli import main as cli
from kvbudget.client.tls import NO_TLS, TlsFile, TlsFiles, channel_credentials, resolve_tls
from kvbudget.client.errors import CLIError
from kvbudget.client.target import channel
from kvbudget.tui.source import Connected, Disconnected, Update, WatchSource
from kvbudget.v1 import common_pb2, engine_pb2_grpc, observer_pb2, observer_pb2_grpc

from certificates import make_ca, make_signed
from daemon_harness import DaemonProcess, free_port

CLIENT_NAME = "kvbudget-client"  # the common name of the client certificate the CA signs
TLS_VARIABLES = ("KVBUDGET_TLS_CA", "KVBUDGET_TLS_CERT", "KVBUDGET_TLS_KEY")
MODEL = "tls-test-model"


@pytest.fixture(autouse=True)
def _no_ambient_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    # Defaults come from these; each test names what it uses.
    for name in ("KVBUDGET_TARGET", "KVBUDGET_TOKEN", *TLS_VARIABLES):
        monkeypatch.delenv(name, raising=False)


# ------------------------------------------------------------------ certificates


@dataclass(frozen=True)
class Certificates:
    ca: Path  # signed the server's and the client's certificates
    server: tuple[Path, Path]
    client: tuple[Path, Path]
    stranger: tuple[Path, Path]  # a client certificate from another CA
    folder: Path


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    folder = tmp_path_factory.mktemp("certificates")
    ca = make_ca(folder, "kvbudget-ca")
    other_ca = make_ca(folder, "other-ca")
    return Certificates(
        ca=ca[0],
        server=make_signed(folder, "server", ca),
        client=make_signed(folder, "client", ca, common_name=CLIENT_NAME),
        stranger=make_signed(folder, "stranger", other_ca, common_name="stranger"),
        folder=folder,
    )


def client_flags(certs: Certificates) -> list[str]:
    return ["--tls-ca", str(certs.ca), "--tls-cert", str(certs.client[0]), "--tls-key", str(certs.client[1])]


def client_tls(certs: Certificates) -> TlsFiles:
    return TlsFiles(TlsFile(str(certs.ca), "--tls-ca"), TlsFile(str(certs.client[0]), "--tls-cert"),
                    TlsFile(str(certs.client[1]), "--tls-key"))  # fmt: skip


# ------------------------------------------------------------------ servers


def _plan() -> common_pb2.PoolPlan:
    return common_pb2.PoolPlan(model=MODEL, block_size_tokens=16, num_blocks=64, max_model_len_tokens=2048,
                               max_num_batched_tokens=2048)  # fmt: skip


def _snapshot() -> common_pb2.Snapshot:
    return common_pb2.Snapshot(num_blocks=64, num_free_blocks=64, policy=common_pb2.POLICY_OPTIMISTIC, plan=_plan())


def _peer_name(context: grpc.ServicerContext) -> str:
    """The common name of the certificate the caller presented ("" if none)."""
    names = context.auth_context().get("x509_common_name") or [b""]
    return names[0].decode()


@dataclass
class Calls:
    """(method, client certificate's common name) of every call that reached the server."""

    seen: list[tuple[str, str]] = field(default_factory=list)

    def add(self, method: str, context: grpc.ServicerContext) -> None:
        self.seen.append((method, _peer_name(context)))


class FakeObserver(observer_pb2_grpc.ObserverServiceServicer):
    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    def GetSnapshot(self, request, context):
        self.calls.add("GetSnapshot", context)
        return observer_pb2.GetSnapshotResponse(snapshot=_snapshot())

    def Watch(self, request, context):
        self.calls.add("Watch", context)
        yield observer_pb2.WatchResponse(snapshot=_snapshot())  # then the stream ends


class FakeEngine(engine_pb2_grpc.EngineServiceServicer):
    """Records the session a replay asks for, then refuses it: reaching it is the point."""

    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    def OpenSession(self, request, context):
        self.calls.add("OpenSession", context)
        context.abort(grpc.StatusCode.PERMISSION_DENIED, "test server: no engine sessions here")


@dataclass
class TlsServer:
    address: str  # "localhost:PORT": the name the server certificate is for
    calls: Calls


def _serve(certs: Certificates, *, require_client_auth: bool) -> Iterator[TlsServer]:
    calls = Calls()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    observer_pb2_grpc.add_ObserverServiceServicer_to_server(FakeObserver(calls), server)
    engine_pb2_grpc.add_EngineServiceServicer_to_server(FakeEngine(calls), server)
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    cert, key = certs.server
    credentials = grpc.ssl_server_credentials(
        [(key.read_bytes(), cert.read_bytes())],
        root_certificates=certs.ca.read_bytes() if require_client_auth else None,
        require_client_auth=require_client_auth,
    )
    port = server.add_secure_port("localhost:0", credentials)
    server.start()
    try:
        yield TlsServer(f"localhost:{port}", calls)
    finally:
        server.stop(grace=None)


@pytest.fixture(scope="module")
def mtls_server(certs: Certificates) -> Iterator[TlsServer]:
    """Mutual TLS: a client certificate signed by the CA, or no connection."""
    yield from _serve(certs, require_client_auth=True)


@pytest.fixture
def mtls(mtls_server: TlsServer) -> TlsServer:
    mtls_server.calls.seen.clear()  # each test sees its own calls
    return mtls_server


def health_check(address: str, credentials: grpc.ChannelCredentials | None) -> str:
    """"SERVING" over `kvbudget.client.target.channel`, or the status the call failed with."""
    with channel(address, credentials) as to_server:
        try:
            reply = health_pb2_grpc.HealthStub(to_server).Check(health_pb2.HealthCheckRequest(), timeout=10)
        except grpc.RpcError as error:
            return error.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """`kvbudget ARGV` in this process: (exit status, stdout, stderr)."""
    capsys.readouterr()
    try:
        code = cli.main(list(argv))
    except SystemExit as exc:  # argparse's own exits
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(err: str, command: str, message: str) -> None:
    assert err == f"kvbudget {command}: error: {message}\n"
    assert "Traceback" not in err


# ------------------------------------------------------------ the credential builder


def _bad_files(certs: Certificates) -> dict[str, Path]:
    folder = certs.folder
    garbage = folder / "garbage.pem"
    garbage.write_text("not a certificate\n")
    broken = folder / "broken.pem"  # the markers, but no certificate inside
    broken.write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    encrypted = folder / "encrypted.key"
    subprocess.run(["openssl", "pkey", "-in", str(certs.client[1]), "-aes256", "-passout", "pass:secret",
                    "-out", str(encrypted)], check=True, capture_output=True, timeout=60)  # fmt: skip
    return {"garbage": garbage, "broken": broken, "encrypted": encrypted, "missing": folder / "missing.pem"}


def test_every_mistake_in_the_files_is_one_line_naming_the_flag_and_the_file(certs: Certificates) -> None:
    bad = _bad_files(certs)
    ca, (cert, key), stranger_key = str(certs.ca), map(str, certs.client), str(certs.stranger[1])
    cases = [  # (--tls-ca, --tls-cert, --tls-key), the message
        ((str(bad["missing"]), None, None), f"--tls-ca: cannot read {bad['missing']}: No such file or directory"),
        ((str(certs.folder), None, None), f"--tls-ca: cannot read {certs.folder}: Is a directory"),
        ((str(bad["garbage"]), None, None), f"--tls-ca {bad['garbage']}: no PEM certificate in it"),
        ((str(bad["broken"]), None, None), f"--tls-ca {bad['broken']}: a certificate in it does not parse"),
        ((ca, str(bad["missing"]), key), f"--tls-cert: cannot read {bad['missing']}: No such file or directory"),
        ((ca, str(bad["garbage"]), key), f"--tls-cert {bad['garbage']}: no PEM certificate in it"),
        ((ca, str(bad["broken"]), key), f"--tls-cert {bad['broken']}: a certificate in it does not parse"),
        ((ca, cert, str(bad["missing"])), f"--tls-key: cannot read {bad['missing']}: No such file or directory"),
        ((ca, cert, cert), f"--tls-key {cert}: not an unencrypted PEM private key"),
        ((ca, cert, str(bad["encrypted"])), f"--tls-key {bad['encrypted']}: not an unencrypted PEM private key"),
        ((ca, cert, stranger_key), f"--tls-key {stranger_key}: the key does not match the certificate in {cert}"),
        ((ca, cert, None), f"--tls-cert {cert} needs --tls-key (or $KVBUDGET_TLS_KEY) too: "
                           "the client certificate's private key"),
        ((ca, None, key), f"--tls-key {key} needs --tls-cert (or $KVBUDGET_TLS_CERT) too: "
                          "the client certificate it is the key of"),
        ((None, cert, key), "--tls-cert and --tls-key need --tls-ca (or $KVBUDGET_TLS_CA) too: the CA that "
                            "signed the daemon's certificate (for a public CA: the system bundle)"),
    ]  # fmt: skip
    for flags, message in cases:
        with pytest.raises(CLIError) as refused:
            channel_credentials(resolve_tls("localhost:50051", *flags))
        assert str(refused.value) == message, flags


def test_good_files_make_credentials_and_none_make_plaintext(certs: Certificates) -> None:
    assert channel_credentials(NO_TLS) is None
    assert channel_credentials(resolve_tls("localhost:50051", None, None, None)) is None
    assert isinstance(channel_credentials(resolve_tls("localhost:50051", str(certs.ca), None, None)),
                      grpc.ChannelCredentials)  # fmt: skip
    assert isinstance(channel_credentials(client_tls(certs)), grpc.ChannelCredentials)


def test_the_environment_stands_in_for_each_flag_and_its_errors_name_the_variable(
    certs: Certificates, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVBUDGET_TLS_CA", str(certs.ca))
    monkeypatch.setenv("KVBUDGET_TLS_CERT", str(certs.client[0]))
    tls = resolve_tls("gpu7:50051", None, None, None)
    assert tls == TlsFiles(TlsFile(str(certs.ca), "$KVBUDGET_TLS_CA"),
                           TlsFile(str(certs.client[0]), "$KVBUDGET_TLS_CERT"))  # fmt: skip
    with pytest.raises(CLIError) as refused:
        channel_credentials(tls)
    assert str(refused.value) == (f"$KVBUDGET_TLS_CERT {certs.client[0]} needs --tls-key (or $KVBUDGET_TLS_KEY) "
                                  "too: the client certificate's private key")  # fmt: skip
    # A flag wins over its variable.
    flag_key = resolve_tls("gpu7:50051", None, None, str(certs.client[1])).key
    assert flag_key == TlsFile(str(certs.client[1]), "--tls-key")
    assert resolve_tls("gpu7:50051", "flag-ca.pem", None, None).ca == TlsFile("flag-ca.pem", "--tls-ca")


def test_tls_flags_with_a_unix_socket_are_refused_and_the_variables_ignored(
    certs: Certificates, monkeypatch: pytest.MonkeyPatch
) -> None:
    for target in ("unix:///run/kvbudget/kvbudget.sock", "unix-abstract:kvbudget"):
        with pytest.raises(CLIError) as refused:
            resolve_tls(target, None, str(certs.client[0]), str(certs.client[1]))
        assert str(refused.value) == (f"--tls-cert {certs.client[0]}: TLS is for TCP targets, and {target} "
                                      "is a unix socket (plaintext: its file mode is the guard)")  # fmt: skip
    for name, path in zip(TLS_VARIABLES, (certs.ca, *certs.client)):
        monkeypatch.setenv(name, str(path))
    # For the remote daemon the environment points at, not for a local socket.
    assert resolve_tls("unix:///run/kvbudget/kvbudget.sock", None, None, None) == NO_TLS
    from_environment = resolve_tls("localhost:50051", None, None, None)
    assert [f.source for f in (from_environment.ca, from_environment.cert, from_environment.key)] == [
        "$KVBUDGET_TLS_CA", "$KVBUDGET_TLS_CERT", "$KVBUDGET_TLS_KEY"]  # fmt: skip


@pytest.mark.parametrize("command", ["admin", "doctor", "tui", "replay"])
def test_every_client_command_takes_the_three_flags(command: str) -> None:
    argv = [command, *(["azure"] if command == "replay" else []), "--tls-ca", "ca.pem", "--tls-cert", "me.pem",
            "--tls-key", "me.key", *(["status"] if command == "admin" else [])]  # fmt: skip
    args = cli.build_parser(argv).parse_args(argv)
    assert (args.tls_ca, args.tls_cert, args.tls_key) == ("ca.pem", "me.pem", "me.key")


# ------------------------------------------------------------ mutual TLS, on the wire


def test_a_client_certificate_gets_through_mutual_tls_and_nothing_else_does(
    certs: Certificates, mtls: TlsServer
) -> None:
    ca_only = resolve_tls(mtls.address, str(certs.ca), None, None)
    stranger = resolve_tls(mtls.address, str(certs.ca), *map(str, certs.stranger))
    assert health_check(mtls.address, channel_credentials(ca_only)) == "UNAVAILABLE"
    assert health_check(mtls.address, channel_credentials(stranger)) == "UNAVAILABLE"
    assert health_check(mtls.address, None) == "UNAVAILABLE"  # plaintext to a TLS port
    assert health_check(mtls.address, channel_credentials(client_tls(certs))) == "SERVING"

    with channel(mtls.address, channel_credentials(client_tls(certs))) as to_server:
        observer_pb2_grpc.ObserverServiceStub(to_server).GetSnapshot(observer_pb2.GetSnapshotRequest(), timeout=10)
    assert mtls.calls.seen == [("GetSnapshot", CLIENT_NAME)]  # the server saw our certificate


def test_admin_presents_its_client_certificate(certs: Certificates, mtls: TlsServer, capsys) -> None:
    code, out, err = run_cli(capsys, "admin", "--target", mtls.address, *client_flags(certs), "--json", "status")
    assert (code, err) == (0, "")
    status = json.loads(out)
    assert (status["model"], status["blocks"]["total"]) == (MODEL, 64)
    assert mtls.calls.seen == [("GetSnapshot", CLIENT_NAME)]

    # Without the certificate the server refuses the connection: one line, exit 2.
    code, out, err = run_cli(capsys, "admin", "--target", mtls.address, "--tls-ca", str(certs.ca), "status")
    assert code == 2 and out == ""
    assert err.startswith(f"kvbudget admin: error: {mtls.address}: UNAVAILABLE: ") and err.count("\n") == 1
    assert "Traceback" not in err


def test_a_refused_handshake_is_one_line_that_says_what_to_check(certs: Certificates, mtls: TlsServer) -> None:
    """In a process of its own: gRPC's core writes to the stderr file itself, unseen by capsys."""
    wrong_ca = certs.folder / "other-ca.pem"  # not the CA of the server's certificate
    result = subprocess.run([sys.executable, "-m", "kvbudget", "admin", "status", "--target", mtls.address,
                             "--tls-ca", str(wrong_ca), *client_flags(certs)[2:]],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(f"kvbudget admin: error: {mtls.address}: UNAVAILABLE: ")
    assert result.stderr.count("\n") == 1, result.stderr  # not gRPC's "Handshake failed" lines too
    assert "wants --tls-cert/--tls-key signed by that CA" in result.stderr


def test_doctor_presents_its_client_certificate(certs: Certificates, mtls: TlsServer, capsys) -> None:
    code, out, err = run_cli(capsys, "doctor", "--target", mtls.address, *client_flags(certs),
                             "--samples", "1", "--json")  # fmt: skip
    assert code in (0, 1), err  # a diagnosis, healthy or not: the daemon was asked
    assert json.loads(out)["target"] == mtls.address
    assert mtls.calls.seen == [("GetSnapshot", CLIENT_NAME)]


def test_a_live_replay_presents_its_client_certificate_on_every_channel(
    certs: Certificates, mtls: TlsServer, capsys
) -> None:
    code, out, err = run_cli(capsys, "replay", "azure", "--target", mtls.address, *client_flags(certs),
                             "--limit", "3", "--as-fast-as-possible")  # fmt: skip
    # The observer's snapshot, then an engine session, which this server refuses.
    assert_one_line_error(err, "replay", f"{mtls.address}: PERMISSION_DENIED: test server: no engine sessions here")
    assert code == 2
    assert mtls.calls.seen[:2] == [("GetSnapshot", CLIENT_NAME), ("OpenSession", CLIENT_NAME)]


def test_client_commands_say_what_is_wrong_with_a_file_in_one_line(certs: Certificates, capsys) -> None:
    cert = str(certs.client[0])
    # A TCP target nobody listens on: the files are checked before any connection is tried.
    for command, extra in (("admin", ["status"]), ("doctor", []), ("replay", []), ("tui", [])):
        argv = [command, *(["azure"] if command == "replay" else []), "--target", "localhost:1",
                "--tls-ca", str(certs.ca), "--tls-cert", cert, *extra]  # fmt: skip
        code, out, err = run_cli(capsys, *argv)
        assert code == 2 and out == ""
        assert_one_line_error(err, command, f"--tls-cert {cert} needs --tls-key (or $KVBUDGET_TLS_KEY) too: "
                                            "the client certificate's private key")  # fmt: skip


def test_an_offline_replay_refuses_tls_flags(certs: Certificates, capsys) -> None:
    code, _, err = run_cli(capsys, "replay", "azure", "--offline", "--tls-ca", str(certs.ca))
    assert code == 2
    assert_one_line_error(err, "replay", "--offline runs in-process, with no daemon to talk TLS to; "
                                         "drop --tls-ca / --tls-cert / --tls-key")  # fmt: skip


# ------------------------------------------------------------ the dashboard


async def _first_events(source: WatchSource, count: int) -> list:
    events = source.events()
    try:
        return [await asyncio.wait_for(events.__anext__(), 20) for _ in range(count)]
    finally:
        await events.aclose()


async def test_the_dashboards_watch_source_connects_over_mutual_tls(certs: Certificates, mtls: TlsServer) -> None:
    source = WatchSource(mtls.address, credentials=channel_credentials(client_tls(certs)))
    connected, update = await _first_events(source, 2)
    assert isinstance(connected, Connected) and isinstance(update, Update)
    assert update.response.snapshot.plan.model == MODEL
    assert mtls.calls.seen == [("Watch", CLIENT_NAME)]

    no_certificate = channel_credentials(resolve_tls(mtls.address, str(certs.ca), None, None))
    [refused] = await _first_events(WatchSource(mtls.address, credentials=no_certificate), 1)
    assert isinstance(refused, Disconnected) and refused.detail.startswith("UNAVAILABLE")


def test_kvbudget_tui_gives_its_tls_files_to_the_source_and_the_replay_launcher(
    certs: Certificates, mtls: TlsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvbudget.tui import app as app_module

    given: dict = {}

    class FakeApp:  # the real one needs a terminal; what it is handed is the point here
        def __init__(self, target, token, **kwargs) -> None:
            given.update(kwargs, target=target)

        def run(self) -> int:
            return 0

    monkeypatch.setattr(app_module, "KVBudgetApp", FakeApp)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert cli.main(["tui", "--target", mtls.address, *client_flags(certs)]) == 0

    assert given["tls"] == client_tls(certs)  # for the replays it launches
    connected, _ = asyncio.run(_first_events(given["source"], 2))  # the live source: mutual TLS
    assert isinstance(connected, Connected)
    assert mtls.calls.seen == [("Watch", CLIENT_NAME)]


async def test_the_app_built_with_tls_watches_over_it_and_launches_replays_with_it(
    certs: Certificates, mtls: TlsServer
) -> None:
    from kvbudget.tui.app import KVBudgetApp

    app = KVBudgetApp(mtls.address, tls=client_tls(certs))
    assert app.launcher.tls == client_tls(certs)
    connected, _ = await _first_events(app.source, 2)
    assert isinstance(connected, Connected)
    assert mtls.calls.seen == [("Watch", CLIENT_NAME)]


def test_the_replay_launcher_hands_its_tls_files_to_the_child(
    certs: Certificates, mtls: TlsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvbudget.tui.replays import ReplayLauncher, ReplayRequest, replay_argv, replay_env, shipped_traces

    azure = next(p for p in shipped_traces() if p.name.startswith("azure"))
    request = ReplayRequest(azure, speed=1000.0, limit=3)
    argv = replay_argv(request, mtls.address, tls=client_tls(certs))
    assert argv[argv.index("--tls-ca") + 1] == str(certs.ca)
    assert argv[argv.index("--tls-cert") + 1] == str(certs.client[0])
    assert argv[argv.index("--tls-key") + 1] == str(certs.client[1])
    # The child's TLS is the dashboard's, on its command line: none from the environment.
    monkeypatch.setenv("KVBUDGET_TLS_CA", "elsewhere.pem")
    assert not set(TLS_VARIABLES) & set(replay_env("token"))

    # The real child, against the mutual-TLS server: it gets as far as an engine session.
    launcher = ReplayLauncher(mtls.address, log_path=tmp_path / "replay.log", tls=client_tls(certs))
    child = launcher.start(request)
    try:
        child.wait(120)
    finally:
        launcher.stop_all()
    assert ("OpenSession", CLIENT_NAME) in mtls.calls.seen, (tmp_path / "replay.log").read_text()
    assert ("GetSnapshot", CLIENT_NAME) in mtls.calls.seen


# ------------------------------------------------------------ a real daemon, TLS on TCP



@pytest.mark.slow
def test_admin_and_a_live_replay_reach_a_real_daemon_over_tls(certs: Certificates, tmp_path: Path, capsys) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text('admin = ["admin-token-123"]\n')
    address = f"localhost:{free_port()}"
    cert, key = certs.server
    listen = (f"unix://{tmp_path}/kvbudget.sock", address)
    daemon = DaemonProcess(tmp_path, "--tls-cert-file", str(cert), "--tls-key-file", str(key),
                           "--tokens-file", str(tokens), listen=listen)  # fmt: skip
    with daemon:
        over_tls = ["--target", address, "--token", "admin-token-123", "--tls-ca", str(certs.ca)]
        code, out, err = run_cli(capsys, "admin", *over_tls, "--json", "status")
        assert (code, err) == (0, "")
        assert json.loads(out)["blocks"]["total"] == 64

        code, out, err = run_cli(capsys, "replay", "azure", *over_tls, "--limit", "5", "--as-fast-as-possible",
                                 "--json")  # fmt: skip
        # (the test daemon's 64 blocks fit none of these requests: the replay reports each
        # rejection as it happens, and nothing else)
        assert code == 0
        assert all(line.startswith("kvbudget replay: rejected ") for line in err.splitlines()), err
        summary = json.loads(out)
        assert (summary["mode"], summary["requests"], summary["unfinished"]) == ("live", 5, 0)
