"""`kvbudget replay`'s summary table keeps its title on one line (issue 32, point 4): over
a table narrower than it, "trace · model · N blocks" wrapped mid-phrase on an 80-column
terminal ("mooncake_fast25_conversation_trace.jsonl ·" then "gemma-3-27b · 4095 blocks")."""

from __future__ import annotations

import os
import subprocess
import sys


def test_the_summary_title_is_one_line_on_an_80_column_terminal():
    done = subprocess.run(
        [sys.executable, "-m", "kvbudget", "replay", "mooncake", "--offline", "--model", "gemma-3-27b",
         "--num-gpu-blocks", "4096", "--limit", "10"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "80"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    # 4,096 blocks less the null block; the title is 68 characters, the table as wide
    assert first.rstrip() == "mooncake_fast25_conversation_trace.jsonl · gemma-3-27b · 4095 blocks"
    assert all(len(line) <= 80 for line in done.stdout.splitlines())
