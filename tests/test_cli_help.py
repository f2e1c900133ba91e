"""The command line's help is written for its users: what KVBudget is and the exit
statuses (not how the CLI is built), the daemon's flags grouped as the config file's
sections with their keys, choices shown, and the presets listed where a model is asked."""

from __future__ import annotations

import re

import pytest

from kvbudget.cli.main import main
from kvbudget.daemon.config.hf_config import preset_names
from kvbudget.daemon.config.settings import KEYS, flag_name


@pytest.fixture(autouse=True)
def _wide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps to the terminal: no wrapping here


def _help(capsys: pytest.CaptureFixture, *argv: str) -> str:
    with pytest.raises(SystemExit) as info:
        main([*argv, "--help"])
    assert info.value.code == 0
    return capsys.readouterr().out


def _sections(text: str) -> dict[str, str]:
    """Each "[section] ...:" group of the help, by section, with its lines."""
    blocks = re.split(r"\n(?=\[[a-z.A-Z]+\] )", text)
    return {re.match(r"\[([a-z]+)", block).group(1): block for block in blocks[1:]}


def test_the_top_help_says_what_kvbudget_is_and_its_exit_statuses(capsys: pytest.CaptureFixture) -> None:
    text = _help(capsys)
    assert "KV-cache budgeting and admission for LLM inference hosts" in text
    assert "imported only when needed" not in text  # (an implementation note, once)
    exit_lines = text[text.index("exit status:"):].splitlines()
    assert [line.split()[0] for line in exit_lines[1:] if re.match(r"  \d", line)] == ["0", "1", "2", "130"]
    assert 'eval "$(kvbudget completion bash)"' in text


def test_daemon_flags_are_grouped_by_config_section_with_their_keys(capsys: pytest.CaptureFixture) -> None:
    sections = _sections(_help(capsys, "daemon"))
    assert list(sections) == ["model", "pool", "parallel", "admission", "tenants", "server", "log", "metrics"]
    for spec in KEYS:  # every key's flag in its section's group, naming the key
        flag = flag_name(spec.field)
        block = sections[spec.section]
        assert re.search(rf"^  {flag}\b", block, re.M), (flag, spec.section)
        assert f"{spec.section}.{spec.name}" in " ".join(block.split()), (flag, spec.section)
    assert "--policy {optimistic,guaranteed,predictive,naive}" in sections["admission"]
    assert "--log-level {debug,info,warning,error}" in sections["server"]


@pytest.mark.parametrize("command", ["daemon", "estimate", "demo"])
def test_a_model_flag_lists_the_presets(capsys: pytest.CaptureFixture, command: str) -> None:
    text = " ".join(_help(capsys, command).split())
    assert f"presets: {', '.join(preset_names())}" in text
