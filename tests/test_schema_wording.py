"""One wording of a schema failure, wherever it is reported: the host's check
of an accept against its frozen form, its check of edited tool input against
the tool's input schema, and MCP elicitation asking again all say
``<field path> fails the schema's `<rule>` rule``, never the value."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from protocol.chat import ChatState, InputRequest, TextValue, ToolCallPendingConfirmation
from protocol.forms import answers_from_form_data, parse_form
from protocol.session import SessionState, ToolDefinition
from protocol.status import SessionStatus
from reducers import notes
from server.core.frozen_forms import Form, FormRegistry
from server.core.schemas import SchemaCheck
from server.mcp.elicitation import Question, form_content
from server.store.memory import MemoryStore
from tests.mcp_kit import submitted

SESSION = "ahp-session:/wording"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "title": "Name"},
        "code": {"type": "string", "title": "Code", "pattern": "^[A-Z]+$"},
        "count": {"type": "integer", "title": "Count", "maximum": 10},
    },
    "required": ["name", "code"],
}
WORDING = re.compile(r"^(the data|[\w/]+) fails the schema's `\w+` rule$")

CASES = [
    pytest.param(
        {"name": "SECRET", "code": "secret"},
        ["code fails the schema's `pattern` rule"],
        id="pattern",
    ),
    pytest.param(
        {"name": "SECRET", "code": "ABC", "count": 11},
        ["count fails the schema's `maximum` rule"],
        id="maximum",
    ),
    pytest.param(
        {"name": "SECRET", "code": "secret", "count": 99},
        ["code fails the schema's `pattern` rule", "count fails the schema's `maximum` rule"],
        id="several",
    ),
]
"""Failures of data that answers give (a missing answer to a required
question is the host's ``required-unanswered``, before any schema check)."""


def host_form_failure(data: dict[str, Any]) -> str | None:
    form = Form.of(SCHEMA)
    answers = answers_from_form_data(form.spec, data)
    return FormRegistry.form_check(form)(InputRequest(id="r1"), answers)


def host_tool_input_failure(data: dict[str, Any]) -> str | None:
    session = SessionState(
        provider="huddle",
        title="Wording",
        status=SessionStatus.IDLE,
        lifecycle="ready",
        active_clients=[],
        chats=[],
        server_tools=[ToolDefinition(name="fill", input_schema=SCHEMA)],
    )
    chat = ChatState(
        resource="ahp-chat:/wording",
        title="Wording",
        status=SessionStatus.IDLE,
        modified_at="t0",
        turns=[],
        meta={notes.HUDDLE: {"session": SESSION}},
    )
    registry = FormRegistry(MemoryStore(), lambda uri: session if uri == SESSION else None)
    call = ToolCallPendingConfirmation(
        tool_call_id="c1", tool_name="fill", display_name="Fill", invocation_message="Fill?"
    )
    return registry.tool_input_check(chat)(call, data)


def mcp_elicitation_failures(data: dict[str, Any]) -> list[str]:
    spec = parse_form(SCHEMA)
    question = Question(InputRequest(id="r1"), SCHEMA, spec)
    content = form_content(question, answers_from_form_data(spec, data))
    assert isinstance(content, list)
    return content


@pytest.mark.parametrize(("data", "texts"), CASES)
def test_every_path_words_a_schema_failure_the_same(data: dict[str, Any], texts: list[str]) -> None:
    assert SchemaCheck.of(SCHEMA).failure_texts(data) == texts
    assert host_form_failure(data) == "; ".join(texts)
    assert host_tool_input_failure(data) == "; ".join(texts)
    assert mcp_elicitation_failures(data) == texts


@pytest.mark.parametrize(("data", "texts"), CASES)
def test_a_schema_failure_names_field_and_rule_never_the_value(
    data: dict[str, Any], texts: list[str]
) -> None:
    for text in SchemaCheck.of(SCHEMA).failure_texts(data):
        assert WORDING.match(text), text
        assert "secret" not in text.lower()
        assert not any(str(value) in text for value in data.values())


def test_answers_that_make_no_data_for_the_form_are_worded_the_same_by_host_and_mcp() -> None:
    # Not a schema failure: the answers do not convert to the form's data
    # (protocol.forms.FormDataError words it, for both).
    form = Form.of(SCHEMA)
    answers = submitted(other=TextValue(value="secret"))
    host = FormRegistry.form_check(form)(InputRequest(id="r1"), answers)
    mcp = form_content(Question(InputRequest(id="r1"), SCHEMA, form.spec), answers)
    assert host == "property 'other': answers a question this form does not have"
    assert mcp == [host]


def test_a_missing_required_field_fails_at_its_own_path() -> None:
    data = {"code": "secret"}
    texts = ["name fails the schema's `required` rule", "code fails the schema's `pattern` rule"]
    assert SchemaCheck.of(SCHEMA).failure_texts(data) == texts
    assert host_tool_input_failure(data) == "; ".join(texts)


def test_data_that_fits_has_no_failure_anywhere() -> None:
    data = {"name": "Ada", "code": "ABC", "count": 3}
    assert SchemaCheck.of(SCHEMA).failure_texts(data) == []
    assert host_form_failure(data) is None
    assert host_tool_input_failure(data) is None
    spec = parse_form(SCHEMA)
    content = form_content(
        Question(InputRequest(id="r1"), SCHEMA, spec), answers_from_form_data(spec, data)
    )
    assert content == data


def test_a_failure_of_the_whole_is_the_datas() -> None:
    check = SchemaCheck.of({"type": "object", "additionalProperties": False})
    assert check.failure_texts({"x": 1}) == [
        "the data fails the schema's `additionalProperties` rule"
    ]


def test_a_tool_whose_input_schema_is_broken_refuses_no_input() -> None:
    # A broken schema says nothing of the input (jsonschema.validate's
    # SchemaError, as before the check was cached).
    assert not SchemaCheck.of({"type": "no-such-type"}).schema_is_valid
    assert SchemaCheck.of(SCHEMA).schema_is_valid


def test_a_schema_is_checked_as_it_is_now_even_after_its_dict_changed() -> None:
    # Checks are kept by the schema's content: one changed in place (an
    # agent editing its form's dict) is checked as it now reads.
    schema: dict[str, Any] = {"type": "object", "properties": {"n": {"type": "integer"}}}
    assert SchemaCheck.of(schema).failure_texts({"n": 1}) == []
    assert SchemaCheck.of(dict(schema)).failure_texts({"n": "one"}) == [
        "n fails the schema's `type` rule"
    ]
    before = json.loads(json.dumps(schema))
    schema["required"] = ["m"]
    assert SchemaCheck.of(schema).failure_texts({"n": 1}) == [
        "m fails the schema's `required` rule"
    ]
    assert SchemaCheck.of(before).failure_texts({"n": 1}) == []  # what it read before it changed
