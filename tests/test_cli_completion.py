"""`kvbudget completion bash|zsh` prints a completion script built from the parsers
themselves: commands, each command's flags, a flag's choices (policies, log levels), the
presets a --model takes, the shipped traces, and file names where a file goes. The bash
one is run here in bash with the words a user typed; the zsh one runs the same function
under zsh's bashcompinit (skipped without zsh).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from kvbudget.cli.main import main

TRY = """
source {script}
try() {{ COMP_WORDS=("$@"); COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 )); _kvbudget; echo "${{COMPREPLY[*]}}"; }}
"""
CASES = [  # (the words typed, the last one being completed; what is offered)
    (["kvbudget", ""], "demo daemon tui replay estimate log doctor admin completion ask"),
    (["kvbudget", "do"], "doctor"),
    (["kvbudget", "daemon", "--pol"], "--policy"),
    (["kvbudget", "daemon", "--policy", ""], "optimistic guaranteed predictive naive"),
    (["kvbudget", "daemon", "--model", "llama-3.1-8b", "--log-level", "w"], "warning"),
    (["kvbudget", "daemon", "--config", "kv"], "kvbudget.toml"),
    (["kvbudget", "estimate", "--model", "gemma"], "gemma-2-9b gemma-3-27b"),
    (["kvbudget", "demo", "--trace", "m"], "mooncake model.json"),
    (["kvbudget", "admin", "--token", "t", ""], "status set-policy set-quota drain"),
    (["kvbudget", "admin", "set-policy", "p"], "predictive"),
    (["kvbudget", "log", "--db-"], "--db-path"),  # (--db, its old name, still works: not offered)
    (["kvbudget", "completion", ""], "bash zsh"),
    (["kvbudget", "tui", "--target", ""], ""),  # an address: nothing to offer
]


def _offered(tmp_path: Path, shell: str, capsys: pytest.CaptureFixture) -> list[str]:
    assert main(["completion", shell]) == 0
    script = tmp_path / f"kvbudget.{shell}"
    script.write_text(capsys.readouterr().out)
    work = tmp_path / "work"  # the folder the user completes in: file names come from it
    work.mkdir()
    (work / "kvbudget.toml").write_text("")
    (work / "model.json").write_text("{}")
    lines = [TRY.format(script=script)] + ["try " + " ".join(f"'{w}'" for w in words) for words, _ in CASES]
    if shell == "zsh":
        lines.insert(0, "autoload -U compinit && compinit -u")
    result = subprocess.run([shell, "-c", "\n".join(lines)], cwd=work, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_bash_completes_commands_flags_and_values(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    offered = _offered(tmp_path, "bash", capsys)
    assert [sorted(line.split()) for line in offered] == [sorted(expected.split()) for _, expected in CASES]


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh not installed")
def test_zsh_runs_the_same_completion(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # zsh's bashcompinit hands what is offered to zsh, which keeps those matching the word
    # typed: here, before that, each case's answer is among what is offered.
    offered = _offered(tmp_path, "zsh", capsys)
    assert len(offered) == len(CASES)
    for line, (words, expected) in zip(offered, CASES):
        assert set(expected.split()) <= set(line.split()), words


def test_an_unknown_shell_is_one_line_and_exit_2(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        main(["completion", "fish"])
    assert info.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("kvbudget completion: error: argument shell: invalid choice: 'fish'")
