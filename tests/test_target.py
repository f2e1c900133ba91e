"""kvbudget.client.target: one check of a daemon address for every client command.

A malformed target, or a unix socket path with nothing there, is one line before any call;
a failed call is one line naming the gRPC status.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys

import grpc
import pytest

from kvbudget.client.errors import CLIError
from kvbudget.client.target import (
    DEFAULT_TARGET,
    add_target_arguments,
    check_target,
    resolve_target,
    resolve_token,
    rpc_error_line,
)


@pytest.fixture
def listening_path(tmp_path):
    path = tmp_path / "d.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        yield path


def test_well_formed_targets_pass(listening_path):
    for target in (f"unix://{listening_path}", f"unix:{listening_path}", "unix-abstract:kvbudget",
                   "localhost:50051", "10.0.0.7:1", "[::1]:443", "[fe80::1]:65535", "dns:///gpu7:50051",
                   "ipv4:127.0.0.1:50051"):
        assert check_target(target) == target
    assert check_target("  localhost:50051 ") == "localhost:50051"


@pytest.mark.parametrize("target, message", [
    ("", "--target is empty"),
    ("bogus::addr", "expected unix:///path/to.sock or host:port"),
    ("localhost", "expected unix:///path/to.sock or host:port"),
    ("localhost:0", "(port 1-65535)"),
    ("localhost:65536", "(port 1-65535)"),
    ("[::1]", "expected unix:///path/to.sock or host:port"),
    ("unix://relative.sock", "unix:// needs an absolute path"),
    ("unix:", "no socket path after unix:"),
    ("unix-abstract:", "no name after unix-abstract:"),
])
def test_malformed_targets_are_one_line(target, message):
    with pytest.raises(CLIError) as refused:
        check_target(target)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_a_unix_path_must_be_a_socket_that_is_there(tmp_path):
    missing = tmp_path / "none.sock"
    for target in (f"unix://{missing}", f"unix:{missing}"):
        with pytest.raises(CLIError, match=f"^--target {target}: no daemon socket at {missing} "):
            check_target(target)
        assert check_target(target, require_socket=False) == target  # the dashboard waits for it
    (tmp_path / "file").write_text("")
    with pytest.raises(CLIError, match="is not a socket"):
        check_target(f"unix://{tmp_path}/file")
    with pytest.raises(CLIError, match="is a directory, not a socket"):
        check_target(f"unix://{tmp_path}", require_socket=False)


def test_flags_win_over_the_environment_which_wins_over_the_default(monkeypatch):
    monkeypatch.delenv("KVBUDGET_TARGET", raising=False)
    monkeypatch.delenv("KVBUDGET_TOKEN", raising=False)
    assert (resolve_target(None), resolve_token(None)) == (DEFAULT_TARGET, None)
    monkeypatch.setenv("KVBUDGET_TARGET", "gpu7:50051")
    monkeypatch.setenv("KVBUDGET_TOKEN", "env")
    assert (resolve_target(None), resolve_token(None)) == ("gpu7:50051", "env")
    assert (resolve_target("h:1"), resolve_token("flag")) == ("h:1", "flag")


def test_a_bad_environment_target_is_named_as_the_environment(monkeypatch):
    # It was called "--target 'garbage'" though no flag was given; an empty flag fell back
    # to the environment and the default without a word.
    monkeypatch.setenv("KVBUDGET_TARGET", "garbage")
    with pytest.raises(CLIError, match=r"^\$KVBUDGET_TARGET 'garbage': expected "):
        resolve_target(None)
    monkeypatch.setenv("KVBUDGET_TARGET", "")
    with pytest.raises(CLIError, match=r"^\$KVBUDGET_TARGET is empty"):
        resolve_target(None)
    assert resolve_target("") == ""  # the flag as given: check_target says it is empty
    with pytest.raises(CLIError, match="^--target is empty"):
        check_target(resolve_target(""))


def test_arguments_default_to_none_so_the_environment_is_read_at_run_time():
    parser = argparse.ArgumentParser()
    add_target_arguments(parser)
    args = parser.parse_args([])
    assert (args.target, args.token, args.tls_ca) == (None, None, None)
    args = parser.parse_args(["--target", "h:1", "--token", "t", "--tls-ca", "ca.pem"])
    assert (args.target, args.token, args.tls_ca) == ("h:1", "t", "ca.pem")
    no_tls = argparse.ArgumentParser()
    add_target_arguments(no_tls, tls=False, suppress=True)
    assert vars(no_tls.parse_args([])) == {}  # a subcommand's copy overwrites nothing


def test_a_failed_call_is_one_line_with_the_status_name(listening_path):
    target = f"unix://{listening_path}"  # bound, never listening: connecting is refused
    with grpc.insecure_channel(target) as channel:
        health = channel.unary_unary("/grpc.health.v1.Health/Check")
        with pytest.raises(grpc.RpcError) as failed:
            health(b"", timeout=10)
    line = rpc_error_line(target, failed.value)
    assert line.startswith(f"{target}: UNAVAILABLE: ") and "\n" not in line


def test_importing_the_module_imports_no_grpc():
    code = "import sys, kvbudget.client.target; print('grpc' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
