"""Reading the docs' tables, for the tests that keep them in step with the code:
docs/cli-reference.md with what `kvbudget estimate --json` and `kvbudget doctor --json`
print, docs/engine-integration.md with the decisions an engine can get."""

from __future__ import annotations

import re
from pathlib import Path

CLI_REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "cli-reference.md"
ENGINE_INTEGRATION = CLI_REFERENCE.with_name("engine-integration.md")


def doc_section(title: str, doc: Path = CLI_REFERENCE) -> str:
    """The text under the `## title` heading of `doc`, up to the next `## ` heading."""
    text = doc.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def table_rows(section: str, first_headers: tuple[str, ...]) -> list[list[str]]:
    """The body rows, as cells, of every markdown table in `section` whose header starts
    with `first_headers`."""
    rows: list[list[str]] = []
    lines = section.splitlines()
    for i, line in enumerate(lines):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or tuple(cells[: len(first_headers)]) != first_headers:
            continue
        for body in lines[i + 2 :]:  # past the header and its --- line
            if not body.startswith("|"):
                break
            rows.append([c.strip() for c in body.strip().strip("|").split("|")])
    return rows


def names(cell: str) -> list[str]:
    """The `code` spans of a cell: the field names it lists."""
    return re.findall(r"`([^`]+)`", cell)
