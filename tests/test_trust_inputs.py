"""No traceback from any input (issue 30, point 6), as the user meets it on the command
line: a deeply nested config.json or trace line gave RecursionError (rc 1) in `estimate`,
`replay` and `daemon --check-config`; a 5,001-digit integer in a trace a ValueError
traceback; `replay --engines 2147483648` ran until memory ran out. Each is one line naming
the file and line (or the flag), and exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.daemon_harness import DEFAULT_ARGS

DEEP = "[" * 100_000
HUGE = "9" * 5_001  # past int()'s 4,300 digits
BIG = "9" * 4_000  # parses, but is no count


def _kvbudget(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvbudget", *args], capture_output=True, text=True, timeout=120)


def _one_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr[-2000:]
    assert len(lines[0]) < 300, lines[0]  # (the number is not echoed whole)
    return lines[0]


@pytest.mark.parametrize("content, why", [(DEEP, "nested too deeply"),
                                         ('{"num_hidden_layers": ' + HUGE + "}", "a number in it has too many digits")],
                         ids=["deep", "5001 digits"])
def test_a_config_json_that_cannot_be_read_is_one_line_in_estimate_and_the_check(
        tmp_path: Path, content: str, why: str) -> None:
    config = tmp_path / "config.json"
    config.write_text(content)
    line = _one_line(_kvbudget("estimate", "--model", str(config), "--gpu-memory-bytes", "80GiB"))
    assert line == f"kvbudget estimate: error: {config} is not a model config: {why}"
    args = [arg for arg in DEFAULT_ARGS]
    args[args.index("--model") + 1] = str(config)
    line = _one_line(_kvbudget("daemon", *args, "--check-config", "--listen", f"unix://{tmp_path}/k.sock",
                               "--db-path", str(tmp_path / "d.db")))
    assert line.startswith("kvbudget daemon: error: model: ") and line.endswith(f"is not a model config: {why}")


GOOD_ROW = json.dumps({"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 1})


@pytest.mark.parametrize("row, problem", [
    ('{"a": ' + DEEP, "not valid JSON (nested too deeply)"),
    ('{"arrival_s": 1, "prompt_tokens": ' + HUGE + ', "output_tokens": 1}',
     "not valid JSON (a number with too many digits)"),
    ('{"arrival_s": 1, "prompt_tokens": ' + BIG + ', "output_tokens": 1}', "prompt_tokens: must be at most "),
    ('{"arrival_s": ' + BIG + ', "prompt_tokens": 5, "output_tokens": 1}', "arrival_s: expected a number, got 999"),
], ids=["deep", "5001 digits", "4000 digits", "huge arrival"])
def test_a_trace_line_that_cannot_be_read_is_one_line_naming_it(tmp_path: Path, row: str, problem: str) -> None:
    trace = tmp_path / "t.jsonl"
    for lines, where in (([GOOD_ROW, row], 2), ([row], 1)):  # (the first line also picks the format)
        trace.write_text("\n".join(lines) + "\n")
        line = _one_line(_kvbudget("replay", str(trace), "--offline", "--model", "llama-3.1-8b",
                                   "--num-gpu-blocks", "100"))
        assert line.startswith(f"kvbudget replay: error: {trace}:{where}: "), line
        assert problem in line, line


@pytest.mark.parametrize("flag, value, problem", [
    ("--engines", "2147483648", "--engines must be at most 1,024, got '2147483648'"),
    ("--seed", HUGE, "--seed '999999999999999999999999999999'... (5,001 characters): expected an integer"),
    ("--max-num-seqs", "1" + "0" * 30, "--max-num-seqs must be at most 9,223,372,036,854,775,807"),
], ids=["engines", "seed", "max-num-seqs"])
def test_an_absurd_count_is_one_line_not_a_run_out_of_memory(tmp_path: Path, flag: str, value: str,
                                                             problem: str) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(GOOD_ROW + "\n")
    line = _one_line(_kvbudget("replay", str(trace), "--offline", "--model", "llama-3.1-8b", "--num-gpu-blocks", "100",
                               flag, value))
    assert line.startswith(f"kvbudget replay: error: {problem}"), line


@pytest.mark.parametrize("content, why", [("[model]\nname = " + DEEP + "\n", "nested too deeply"),
                                         ("[pool]\nnum_gpu_blocks = " + HUGE + "\n",
                                          "a number in it has too many digits")],
                         ids=["deep", "5001 digits"])
def test_a_config_or_tokens_file_that_cannot_be_read_is_one_line(tmp_path: Path, content: str, why: str) -> None:
    config = tmp_path / "kvbudget.toml"
    config.write_text(content)
    line = _one_line(_kvbudget("daemon", "--config", str(config), "--check-config"))
    assert line == f"kvbudget daemon: error: config file {config} is not valid TOML for kvbudget: {why}"
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(content.replace("[model]\nname", "engine").replace("[pool]\nnum_gpu_blocks", "engine"))
    line = _one_line(_kvbudget("daemon", *DEFAULT_ARGS, "--tokens-file", str(tokens), "--listen", "127.0.0.1:0",
                               "--db-path", str(tmp_path / "d.db"), "--check-config"))
    assert line == f"kvbudget daemon: error: tokens_file: tokens file {tokens} is not valid TOML for kvbudget: {why}"
