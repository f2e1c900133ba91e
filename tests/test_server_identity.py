"""Issue 30, point 1: an engine's identity is the credential that opened its session.

Through a real daemon over TCP, as an attacker holding another engine's token meets it: a
token may open only the engine ids the tokens file lists for it, may not replace a live
session another credential opened, and may not use one (Step, Events, Heartbeat,
CloseSession) even knowing its session id. A token listed without `engines` keeps its old
meaning (any engine id).
"""

from __future__ import annotations

import subprocess
import sys

import grpc
import pytest

from kvbudget.daemon.config.settings import ConfigError
from kvbudget.daemon.config.tokens_file import load_roles
from kvbudget.v1 import engine_pb2, engine_pb2_grpc

from daemon_harness import DEFAULT_ARGS, DaemonProcess, free_port

pytestmark = pytest.mark.slow
Code = grpc.StatusCode
TOKENS_FILE = """engine = [
  { token = "engine-A-token-1", engines = ["engine-A", "pfx-*"] },
  { token = "engine-B-token-1", engines = ["engine-B"] },
  "any-engine-token-1",
]
"""



@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("identity")
    tokens = workdir / "tokens.toml"
    tokens.write_text(TOKENS_FILE)
    address = f"127.0.0.1:{free_port()}"
    with DaemonProcess(workdir, "--tokens-file", str(tokens), listen=(f"unix://{workdir}/kvbudget.sock", address)):
        channel = grpc.insecure_channel(address)
        yield engine_pb2_grpc.EngineServiceStub(channel)
        channel.close()


def _md(token: str):
    return (("authorization", f"Bearer {token}"),)


def _refused(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def _open(stub, token: str, engine_id: str, replace: bool = False) -> str:
    request = engine_pb2.OpenSessionRequest(engine_id=engine_id, replace_existing=replace)
    return stub.OpenSession(request, metadata=_md(token)).session_id


def test_a_token_opens_only_the_engine_ids_listed_for_it(daemon) -> None:
    error = _refused(lambda: _open(daemon, "engine-B-token-1", "engine-A"))
    assert error.code() == Code.PERMISSION_DENIED
    assert error.details().startswith("engine_id: 'engine-A' is not among")
    assert _open(daemon, "engine-A-token-1", "pfx-7")  # a pattern
    assert _open(daemon, "any-engine-token-1", "free-1")  # no engines list: any id, as before


def test_another_credential_cannot_replace_or_use_a_live_session(daemon) -> None:
    session_id = _open(daemon, "engine-A-token-1", "engine-A")
    submit = engine_pb2.StepRequest(session_id=session_id)
    submit.submits.add(request_id="a-1", prompt_tokens=32, max_new_tokens=16)
    assert daemon.Step(submit, metadata=_md("engine-A-token-1")).decisions

    error = _refused(lambda: _open(daemon, "any-engine-token-1", "engine-A", replace=True))
    assert (error.code(), error.details().split(":")[0]) == (Code.PERMISSION_DENIED, "replace_existing")
    thief = _md("any-engine-token-1")
    finish = engine_pb2.StepRequest(session_id=session_id)
    finish.finishes.add(request_id="a-1")
    calls = {
        "Step": lambda: daemon.Step(finish, metadata=thief),
        "Heartbeat": lambda: daemon.Heartbeat(engine_pb2.HeartbeatRequest(session_id=session_id), metadata=thief),
        "Events": lambda: next(daemon.Events(engine_pb2.EventsRequest(session_id=session_id), metadata=thief)),
        "CloseSession": lambda: daemon.CloseSession(
            engine_pb2.CloseSessionRequest(session_id=session_id), metadata=thief),
    }
    for name, call in calls.items():
        error = _refused(call)
        assert (name, error.code()) == (name, Code.PERMISSION_DENIED)
        assert error.details().startswith("session_id: this session was opened with another credential")

    # A's session and request are untouched, and A itself may still use and replace it.
    heartbeat = engine_pb2.HeartbeatRequest(session_id=session_id)
    assert daemon.Heartbeat(heartbeat, metadata=_md("engine-A-token-1")).lease_ttl_s > 0
    step = daemon.Step(finish, metadata=_md("engine-A-token-1"))
    assert [d.request_id for d in step.decisions] == ["a-1"]
    assert _open(daemon, "engine-A-token-1", "engine-A", replace=True) != session_id


@pytest.mark.parametrize("entry, key", [
    ('{ token = "engine-A-token-1", engines = "engine-A" }', "engine[0].engines"),
    ('{ token = "engine-A-token-1", engine = ["x"] }', "engine[0].engine"),
    ('{ engines = ["x"] }', "engine[0].token"),
])
def test_a_malformed_engines_entry_names_its_key(tmp_path, entry, key) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text(f"engine = [{entry}]\n")
    with pytest.raises(ConfigError) as info:
        load_roles(path)
    assert key in str(info.value)


def test_a_certificate_name_carries_its_engine_ids(tmp_path) -> None:
    from kvbudget.daemon.server.auth import Authorizer, Role

    path = tmp_path / "tokens.toml"
    path.write_text('[certificates]\nengine = [{ name = "vllm-0.gpu-3", engines = ["vllm-0"] }, "any-host"]\n')
    roles = load_roles(path)
    auth = Authorizer(roles.tokens, certificate_names=roles.certificate_names, engines=roles.engines)
    caller = auth.check_caller("ipv4:127.0.0.1:5000", [], Role.ENGINE, [b"vllm-0.gpu-3"])
    assert (caller.credential, caller.engines) == ("certificate:vllm-0.gpu-3", ("vllm-0",))
    assert auth.check_caller("ipv4:127.0.0.1:5000", [], Role.ENGINE, [b"any-host"]).engines is None


def test_check_config_says_a_bad_engines_list_in_one_line(tmp_path) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text('engine = [{ token = "engine-A-token-1", engines = "engine-A" }]\n')
    done = subprocess.run(
        [sys.executable, "-m", "kvbudget", "daemon", *DEFAULT_ARGS, "--db-path", str(tmp_path / "d.db"),
         "--listen", f"unix://{tmp_path}/s.sock", "--tokens-file", str(tokens), "--check-config"],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert "engine[0].engines: must be a list of engine ids" in line
