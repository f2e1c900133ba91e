"""docs/routing.md's tables list exactly AskAdmission's fields, and `kvbudget ask --json`
prints exactly the answer's (plus the target)."""

from __future__ import annotations

from doc_tables import CLI_REFERENCE, doc_section, names, table_rows

from kvbudget.cli.cmd_ask import answer_fields
from kvbudget.v1 import observer_pb2

ROUTING = CLI_REFERENCE.with_name("routing.md")


def documented(first_header: str) -> list[str]:
    rows = table_rows(doc_section("The question and the answer", ROUTING), (first_header, "meaning"))
    return [name for row in rows for name in names(row[0])]


def test_the_request_table_is_the_message() -> None:
    fields = [f.name for f in observer_pb2.AskAdmissionRequest.DESCRIPTOR.fields]
    assert sorted(documented("request field")) == sorted(fields)


def test_the_answer_table_is_the_message_and_the_cli_prints_it_all() -> None:
    fields = [f.name for f in observer_pb2.AskAdmissionResponse.DESCRIPTOR.fields]
    assert sorted(documented("answer field")) == sorted(fields)
    assert sorted(answer_fields(observer_pb2.AskAdmissionResponse())) == sorted(fields)
