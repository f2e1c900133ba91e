"""`kvbudget` command line: one module per subcommand, imported only when needed.

Each command module has `add_arguments(parser)` and `run(args) -> int`. Heavy imports
(grpc, textual, torch) happen inside `run`, so `kvbudget --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import NoReturn

from kvbudget import __version__
from kvbudget.client.errors import CLIError

COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("kvbudget.cli.cmd_demo", "daemon + real trace replay + dashboard, on embedded defaults"),
    "daemon": ("kvbudget.cli.cmd_daemon", "run the KV budget daemon"),
    "tui": ("kvbudget.cli.cmd_tui", "live dashboard of a running daemon"),
    "replay": ("kvbudget.cli.cmd_replay", "replay a request trace, live or offline"),
    "estimate": ("kvbudget.cli.cmd_estimate", "pool size and max concurrency for a model"),
    "log": ("kvbudget.cli.cmd_log", "query the decision log"),
    "doctor": ("kvbudget.cli.cmd_doctor", "diagnose a running daemon: pool full or budget full?"),
    "admin": ("kvbudget.cli.cmd_admin", "operator actions: policy, tenant quotas, drain"),
    "completion": ("kvbudget.cli.cmd_completion", "print the bash or zsh completion script"),
    "ask": ("kvbudget.cli.cmd_ask", "how soon a request of this shape would be admitted (for routers)"),
}
DESCRIPTION = ("KVBudget: per-request KV-cache budgeting and admission for LLM inference hosts. "
               "Run `kvbudget COMMAND --help` for a command's flags.")
# docs/cli-reference.md, "Exit status", says the same at length.
EXIT_STATUS = """\
exit status:
  0    done (doctor: healthy)
  1    what was asked found a problem: doctor's verdict is not healthy, admin drain --wait
       timed out, the daemon stopped on a failure, the dashboard crashed
  2    bad arguments or config (one line on stderr per mistake), or a daemon that could not
       be reached or refused the call
  130  interrupted (Ctrl-C); 143 / 129: the dashboard ended by SIGTERM / SIGHUP

shell completion: eval "$(kvbudget completion bash)" (or zsh) in your shell's rc file"""


class OneLineParser(argparse.ArgumentParser):
    """Usage mistakes come out as one line (`kvbudget CMD: error: ...`), exit 2, as other
    errors do; `--help` still prints the full usage."""

    chosen: str | None = None  # the command given, on the top parser

    def error(self, message: str) -> NoReturn:
        # argparse reports a subcommand's unknown flag from the top parser: name the command.
        prog = f"{self.prog} {self.chosen}" if self.chosen and message.startswith("unrecognized") else self.prog
        self.exit(2, f"{prog}: error: {message} (see {prog} --help)\n")


def _chosen_command(argv: list[str]) -> str | None:
    for arg in argv:
        if not arg.startswith("-"):
            return arg if arg in COMMANDS else None
    return None


def build_parser(argv: list[str], *, every_command: bool = False) -> argparse.ArgumentParser:
    """All commands are listed; only the chosen one's module is imported, so a broken or
    heavy command never affects the others (`every_command`: all of them, for completion)."""
    parser = OneLineParser(prog="kvbudget", description=DESCRIPTION, epilog=EXIT_STATUS,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"kvbudget {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = parser.chosen = _chosen_command(argv)
    for name, (module_name, help_text) in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen or every_command:
            module = importlib.import_module(module_name)
            module.add_arguments(command_parser)
            command_parser.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    if argv is None and _chosen_command(sys.argv[1:]) != "daemon":
        # gRPC's core writes its own lines to stderr (a failed TLS handshake: two
        # "Handshake failed" lines per try), past the one-line error a client command
        # prints, and over the dashboard's screen. Set before grpc loads, in a process
        # that is this command (not a caller's, a test's, that passes argv); the daemon
        # keeps them (who was refused, in the journal); a user's own setting wins.
        os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except CLIError as exc:
        print(f"kvbudget {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
