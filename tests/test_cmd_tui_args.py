"""`kvbudget tui`'s file flags: what cannot be recorded to or played is one line and exit 2,
before the dashboard starts (a folder given to --record failed at the first write, as a
Textual traceback out of the running dashboard)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbudget.cli import main as cli


@pytest.mark.parametrize(
    ("where", "problem"),
    [("folder", "not a regular file"), ("proc", "cannot write: Invalid argument")],
)
def test_record_to_what_cannot_be_appended_is_one_line(tmp_path: Path, capsys, where: str, problem: str) -> None:
    target = tmp_path if where == "folder" else Path("/proc/version")
    if where == "proc" and not target.exists():
        pytest.skip("no /proc/version on this system (not Linux)")
    assert cli.main(["tui", "--target", f"unix://{tmp_path}/none.sock", "--record", str(target)]) == 2
    assert capsys.readouterr().err == f"kvbudget tui: error: --record {target}: {problem}\n"


def test_record_to_a_new_file_passes_the_check(tmp_path: Path, capsys) -> None:
    # It goes on to the terminal check (pytest's stdin is no TTY): the file was accepted.
    assert cli.main(["tui", "--target", f"unix://{tmp_path}/none.sock", "--record", str(tmp_path / "r.jsonl")]) == 2
    assert "needs a terminal" in capsys.readouterr().err


def test_playing_a_folder_says_it_is_not_a_file(tmp_path: Path, capsys) -> None:
    assert cli.main(["tui", "--recording", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"kvbudget tui: error: --recording {tmp_path}: not a regular file\n"


def test_a_recording_that_does_not_parse_is_one_line(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"snapshot": {"no_such_field": 1}}\n')  # (protobuf's message spans two lines)
    assert cli.main(["tui", "--recording", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvbudget tui: error: --recording {bad}: not a Watch recording (") and err.count("\n") == 1
