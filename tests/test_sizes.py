"""Sizes a reader can hold: no hand-written product file over 400 lines, no function over 60.

A function's size runs from its `def` line (decorators aside) to its last line. Generated
protobuf code is not counted. A failure lists every offender with its size, largest first.
"""

from __future__ import annotations

import ast

import pytest
from product_tree import product_files

MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60

SOURCES = list(product_files())


def file_lines(text: str) -> int:
    return len(text.splitlines())


def long_functions(shown: str, text: str) -> list[tuple[int, str]]:
    """(size, 'file:line name') for each function or method over the limit, nested ones too."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            size = node.end_lineno - node.lineno + 1  # type: ignore[operator]
            if size > MAX_FUNCTION_LINES:
                found.append((size, f"{shown}:{node.lineno} {node.name}"))
    return found


def report(offenders: list[tuple[int, str]], unit: str) -> str:
    return "\n".join(f"{size:5d} {unit}  {where}" for size, where in sorted(offenders, reverse=True))


def test_no_product_file_is_over_the_limit():
    assert SOURCES, "no product files found"
    offenders = [
        (size, s.shown)
        for s in SOURCES
        if (size := file_lines(s.path.read_text(encoding="utf-8"))) > MAX_FILE_LINES
    ]
    if offenders:
        pytest.fail(
            f"{len(offenders)} files over {MAX_FILE_LINES} lines:\n" + report(offenders, "lines"),
            pytrace=False,
        )


def test_no_product_function_is_over_the_limit():
    offenders = [
        found for s in SOURCES for found in long_functions(s.shown, s.path.read_text(encoding="utf-8"))
    ]
    if offenders:
        pytest.fail(
            f"{len(offenders)} functions over {MAX_FUNCTION_LINES} lines:\n" + report(offenders, "lines"),
            pytrace=False,
        )


def test_the_function_size_counts_from_def_to_last_line():
    text = "@decorator\ndef f():\n" + "    x = 1\n" * (MAX_FUNCTION_LINES - 1)
    assert long_functions("m.py", text) == []
    text += "    return x\n"
    assert long_functions("m.py", text) == [(MAX_FUNCTION_LINES + 1, "m.py:2 f")]
