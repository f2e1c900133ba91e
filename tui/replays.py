"""Starting a replay from the dashboard: the shipped traces and the `kvbudget replay` process.

The dashboard does not replay anything itself. It runs `kvbudget replay --target ...` as a
child process against the daemon it is connected to; the replayer reports its progress to
the daemon (ObserverService.ReportReplay) and the Replays panel shows it from the snapshot
like any other replay. Children still running when the dashboard quits are stopped, so
closing the dashboard never leaves load running behind it.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from kvbudget.client.tls import NO_TLS, TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV, TlsFiles

TRACE_SUFFIXES = (".jsonl", ".csv")
POLICIES = ("optimistic", "guaranteed", "predictive", "naive")
SPEEDS = (1.0, 10.0, 100.0, 1000.0)


@dataclass(frozen=True)
class ReplayRequest:
    trace: Path
    speed: float = 10.0
    policy: str = ""  # "" keeps the daemon's policy
    limit: int = 0  # 0: the whole trace

    def __post_init__(self) -> None:
        if self.speed <= 0:
            raise ValueError(f"speed must be > 0, got {self.speed}")
        if self.policy and self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.limit < 0:
            raise ValueError(f"limit must be >= 0, got {self.limit}")


def shipped_traces() -> tuple[Path, ...]:
    """The traces packaged with `kvbudget.traces`, found without importing that package."""
    spec = importlib.util.find_spec("kvbudget.traces")
    if spec is None or not spec.submodule_search_locations:
        return ()
    found: list[Path] = []
    for location in spec.submodule_search_locations:
        folder = Path(location)
        if folder.is_dir():
            found += [p for p in folder.iterdir() if p.suffix in TRACE_SUFFIXES and p.is_file()]
    return tuple(sorted(found, key=lambda p: p.name))


def replay_argv(
    request: ReplayRequest, target: str, python: str = sys.executable, tls: TlsFiles = NO_TLS
) -> list[str]:
    """The command line of the replay child: `kvbudget replay TRACE --target ...`, and the
    dashboard's TLS files (--tls-ca ...) so that it reaches the daemon as the dashboard does.

    No token here: a command line is readable by every user (`ps`); see `replay_env`.
    File paths are no secret."""
    argv = [python, "-m", "kvbudget", "replay", str(request.trace), "--target", target, *tls.as_flags()]
    argv += ["--speed", f"{request.speed:g}"]
    if request.policy:
        argv += ["--policy", request.policy]
    if request.limit:
        argv += ["--limit", str(request.limit)]
    return argv


def replay_env(token: str | None, base: dict[str, str] | None = None) -> dict[str, str]:
    """The replay child's environment: ours, with the token in KVBUDGET_TOKEN (or none).

    Without the TLS variables: the child's TLS files are the dashboard's, on its command
    line; a variable the dashboard did not use (an embedder's) must not add any."""
    env = dict(os.environ if base is None else base)
    for name in ("KVBUDGET_TOKEN", TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV):
        env.pop(name, None)
    if token:
        env["KVBUDGET_TOKEN"] = token
    return env


@dataclass(frozen=True)
class Finished:
    """A replay child that ended: how, and the last line it wrote (its error, if it failed)."""

    trace: str
    returncode: int
    last_line: str


class ReplayLauncher:
    """Starts replay children, reports the ones that ended, stops the rest when asked.
    `tls`: the files the children talk TLS with (the dashboard's own)."""

    def __init__(
        self, target: str, token: str | None = None, log_path: Path | None = None, *, tls: TlsFiles = NO_TLS
    ) -> None:
        self.target = target
        self.token = token
        self.tls = tls
        self.log_path = log_path
        self.children: list[subprocess.Popen] = []
        self._outputs: dict[int, tuple[str, object]] = {}  # pid -> (trace name, output file)

    def start(self, request: ReplayRequest) -> subprocess.Popen:
        import tempfile

        # The child's output goes to a file (a pipe nobody reads would fill and block it);
        # an anonymous temporary one unless a log path was given.
        log = open(self.log_path, "a+b") if self.log_path else tempfile.TemporaryFile()
        try:
            child = subprocess.Popen(
                replay_argv(request, self.target, tls=self.tls),
                env=replay_env(self.token),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a ^C in the dashboard's terminal is not for it
            )
        except OSError:
            log.close()
            raise
        self.children.append(child)
        self._outputs[child.pid] = (request.trace.name, log)
        return child

    def running(self) -> list[subprocess.Popen]:
        return [c for c in self.children if c.poll() is None]

    def reap(self) -> list[Finished]:
        """The children that ended since the last call (the app polls this)."""
        ended: list[Finished] = []
        for child in [c for c in self.children if c.poll() is not None]:
            self.children.remove(child)
            trace, log = self._outputs.pop(child.pid)
            ended.append(Finished(trace, child.returncode, _last_line(log)))
        return ended

    def stop_all(self, timeout_s: float = 3.0) -> None:
        for child in self.running():
            child.terminate()
        for child in self.children:
            try:
                child.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        self.children.clear()
        for _, log in self._outputs.values():
            log.close()
        self._outputs.clear()


def _last_line(log) -> str:
    try:
        log.flush()
        log.seek(0)
        lines = [x for x in log.read()[-4096:].decode(errors="replace").splitlines() if x.strip()]
    except (OSError, ValueError):
        lines = []
    finally:
        log.close()
    return lines[-1].strip() if lines else ""
