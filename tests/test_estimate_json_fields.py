"""`kvbudget estimate --json` against its field list in docs/cli-reference.md, and the one
line it prints for a pool that has no usable block.

The doc's tables under "`kvbudget estimate --json`" whose first column is `field` list every
path the report can hold (`groups[].index`: the `index` of each entry of `groups`;
`trace.<point>.tokens`: `trace.p50.tokens`, `trace.mean.tokens`, `trace.p99.tokens`). The
real command, run on inputs that between them print every kind of field, must print no
path the doc does not list, and all of them together exactly the paths it lists.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from doc_tables import doc_section, names, table_rows

KVBUDGET = [sys.executable, "-m", "kvbudget"]
POINTS = ("p50", "mean", "p99")  # what `<point>` stands for in the doc


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KVBUDGET, "estimate", *args], capture_output=True, text=True, timeout=60, check=False)


def run_json(*args: str) -> dict[str, Any]:
    result = run(*args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


# ------------------------------------------------------------------ the doc


def documented_fields() -> dict[str, str]:
    """Every documented path, with its "null or absent" cell."""
    fields: dict[str, str] = {}
    for row in table_rows(doc_section("`kvbudget estimate --json`"), ("field",)):
        for name in names(row[0]):
            expanded = [name.replace("<point>", p) for p in POINTS] if "<point>" in name else [name]
            for path in expanded:
                assert path not in fields, f"{path} is listed twice"
                fields[path] = row[-1]
    return fields


def test_the_doc_lists_fields() -> None:
    fields = documented_fields()
    # (a broken table would list nothing, and every output key would then fail below)
    assert {"model", "groups[].index", "sizing.source", "trace.p99.tokens", "daemon_max_concurrency"} <= set(fields)


# ------------------------------------------------------------------ the output


def values_by_path(node: Any, prefix: str = "") -> dict[str, list[Any]]:
    """Every key path in a JSON value, with the values found there (lists: `[]`)."""
    found: dict[str, list[Any]] = {}

    def walk(value: Any, path: str) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                child = f"{path}.{key}" if path else key
                found.setdefault(child, []).append(item)
                walk(item, child)
        elif isinstance(value, list):
            for item in value:
                walk(item, path + "[]")

    walk(node, prefix)
    return found


def ancestors(path: str) -> list[str]:
    parts = path.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


# Representative inputs that between them print every kind of field: sliding-window groups
# sized from GPU memory (the README's example), a trace and a token cap, chunked local
# attention, and estimated weights (weights_note set).
CASES = {
    "gemma-3-27b, GPU memory": ("--model", "gemma-3-27b", "--gpu-memory-bytes", "80e9", "--weights-bytes", "54e9"),
    "llama-3.1-8b, blocks, trace, token cap": (
        "--model", "llama-3.1-8b", "--num-gpu-blocks", "4096", "--trace", "mooncake", "--token-cap", "2048",
    ),
    "llama-4-scout, KV bytes": ("--model", "llama-4-scout", "--kv-cache-memory-bytes", "8GiB"),
    "deepseek-v3, estimated weights": ("--model", "deepseek-v3", "--gpu-memory-bytes", "1000GB"),
}  # fmt: skip


@pytest.fixture(scope="module")
def reports() -> dict[str, dict[str, Any]]:
    return {name: run_json(*args) for name, args in CASES.items()}


@pytest.mark.parametrize("case", list(CASES))
def test_every_printed_field_is_documented(case: str, reports: dict[str, dict[str, Any]]) -> None:
    printed = values_by_path(reports[case])
    undocumented = set(printed) - set(documented_fields())
    assert not undocumented, f"printed but not in docs/cli-reference.md: {sorted(undocumented)}"


@pytest.mark.parametrize("case", list(CASES))
def test_fields_the_doc_says_are_always_there_are_there_and_not_null(
    case: str, reports: dict[str, dict[str, Any]]
) -> None:
    printed = values_by_path(reports[case])
    nulls = {path for path, values in printed.items() if None in values}
    for path, when in documented_fields().items():
        if "absent" in when or any(parent in nulls for parent in ancestors(path)):
            continue  # (trace.* under a null trace)
        assert path in printed, f"{path}: documented as always there, not printed"
        if when.startswith("never"):
            assert None not in printed[path], f"{path}: documented as never null, printed null"


def test_the_inputs_print_exactly_the_documented_fields(reports: dict[str, dict[str, Any]]) -> None:
    printed: set[str] = set()
    for report in reports.values():
        printed |= set(values_by_path(report))
    documented = set(documented_fields())
    assert printed == documented, (
        f"printed, not documented: {sorted(printed - documented)}; "
        f"documented, never printed: {sorted(documented - printed)}"
    )


# ------------------------------------------------------------------ a pool with no usable block


def test_one_block_is_a_one_line_error_naming_the_null_block() -> None:
    # One block is the null block alone: 0 usable. It printed a report of zeros, exit 0, with
    # "the longest that does is 0"; the daemon refuses the pool ("must be at least 2").
    for extra in ((), ("--json",)):
        result = run("--model", "llama-3.1-8b", "--num-gpu-blocks", "1", *extra)
        assert result.returncode == 2, result.stdout
        assert result.stdout == ""
        assert result.stderr == (
            "kvbudget estimate: error: --num-gpu-blocks 1 leaves no usable block (block 0 is the null block, "
            "which no request gets): give at least 2 (a one-token request needs 1 block, plus the null block)\n"
        )


def test_one_block_of_a_many_group_model_names_the_blocks_one_request_needs() -> None:
    # gemma-3-27b: 7 KV-cache groups, a one-token request takes a block in each: 7 + the null block.
    result = run("--model", "gemma-3-27b", "--num-gpu-blocks", "1")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "kvbudget estimate: error: --num-gpu-blocks 1 leaves no usable block (block 0 is the null block, "
        "which no request gets): give at least 8 (a one-token request needs 7 blocks, plus the null block)"
    ]


def test_one_block_from_memory_names_the_memory_to_give() -> None:
    # llama-3.1-8b: a block is 64 KiB x 32 layers = 2 MiB; 2 MiB makes one block.
    result = run("--model", "llama-3.1-8b", "--kv-cache-memory-bytes", "2MiB")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "kvbudget estimate: error: 2.00 MiB for the KV cache makes 1 block of 2.00 MiB, which leaves no usable "
        "block (block 0 is the null block, which no request gets): give --kv-cache-memory-bytes at least "
        "4.00 MiB, 2 blocks (a one-token request needs 1 block, plus the null block)"
    ]


def test_two_blocks_is_one_usable_block_and_an_answer() -> None:
    out = run_json("--model", "llama-3.1-8b", "--num-gpu-blocks", "2")
    assert out["num_blocks"] == 2 and out["daemon_usable_blocks"] == 1
    assert out["max_model_len_that_fits"] == 16  # one 16-token block
    result = run("--model", "llama-3.1-8b", "--num-gpu-blocks", "2")
    assert result.returncode == 0, result.stderr
    assert "the longest that does is 16" in " ".join(result.stdout.split())


def test_a_pool_no_request_fits_says_so_not_longest_0() -> None:
    # gemma-3-27b on 7 blocks: 6 usable, a one-token request needs 7 (one per group). The daemon
    # starts on it (and rejects every request as never_fits), so it is an answer, said plainly.
    result = run("--model", "gemma-3-27b", "--num-gpu-blocks", "7")
    assert result.returncode == 0, result.stderr
    assert (
        "\nno request fits the pool: it has 7 blocks, and a one-token request needs 7 plus the null block; "
        "give it at least 8\n"
    ) in result.stdout
    assert "longest that does is 0" not in " ".join(result.stdout.split())
    assert run_json("--model", "gemma-3-27b", "--num-gpu-blocks", "7")["max_model_len_that_fits"] == 0
    auto = run("--model", "gemma-3-27b", "--num-gpu-blocks", "7", "--max-model-len", "auto")
    assert auto.returncode == 2 and auto.stdout == ""
    assert auto.stderr.splitlines() == [
        "kvbudget estimate: error: --max-model-len auto: not even a one-token request fits the pool: it has "
        "7 blocks, and one needs 7 plus the null block; give it at least 8"
    ]
