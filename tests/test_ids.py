"""Ids with structure: each builder's id parses back to its parts, and each
parser refuses ids its builder could not have made."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.uris import BadChannelUri
from server.runner.ids import (
    CallRef,
    InputRequestRef,
    MarkdownPartRef,
    child_turn_id,
    idempotency_key,
    input_request_id,
    markdown_part_id,
    mcp_request_id,
    parse_child_turn_id,
    parse_idempotency_key,
    parse_input_request_id,
    parse_markdown_part_id,
    parse_mcp_request_id,
    parse_plain_question_id,
    plain_question_id,
    runner_turn_id,
)

part = st.text(min_size=1, max_size=40)
"""Any non-empty part: AHP turn ids and model call ids are free text."""
ahp_turn = part.filter(lambda t: ":input:" not in t)
"""An AHP turn id that an input request id's parser can split off."""


# ─── The ids as chats and stores hold them ───────────────────────────────────


def test_the_ids_keep_their_format() -> None:
    assert input_request_id("turn-1", "call_9") == "turn-1:input:call_9"
    assert input_request_id("turn-1", None) == "turn-1:input:text"
    assert input_request_id("turn-1", "text:0123abcd") == "turn-1:input:text:0123abcd"
    assert plain_question_id("0123abcd") == "text:0123abcd"
    assert markdown_part_id("turn-1", 3, 2) == "turn-1:md:3.2"
    assert runner_turn_id("ahp-chat:/ticket-42", "turn-1") == "ticket-42.turn-1"
    assert child_turn_id("ticket-42.turn-1", "c1") == "ticket-42.turn-1.c1"
    assert idempotency_key("t1", "c1") == "t1:c1"
    assert markdown_part_id("turn-1", 3) == "turn-1:md:3"
    assert mcp_request_id("0123456789abcdef") == "mcp:0123456789abcdef"


# ─── Round trips ─────────────────────────────────────────────────────────────


@given(ahp_turn, part.filter(lambda c: c != "text" and not c.startswith("text:")))
def test_an_input_request_id_for_a_form_round_trips(chat_turn: str, call_id: str) -> None:
    parsed = parse_input_request_id(input_request_id(chat_turn, call_id))
    assert parsed == InputRequestRef(chat_turn, call_id)


@given(ahp_turn)
def test_an_input_request_id_for_a_plain_text_question_round_trips(chat_turn: str) -> None:
    parsed = parse_input_request_id(input_request_id(chat_turn, None))
    assert parsed == InputRequestRef(chat_turn, None)


@given(ahp_turn, st.from_regex(r"[0-9a-f]{8}", fullmatch=True))
def test_an_input_request_id_for_a_plain_text_question_with_an_id_round_trips(
    chat_turn: str, token: str
) -> None:
    question = plain_question_id(token)
    parsed = parse_input_request_id(input_request_id(chat_turn, question))
    assert parsed == InputRequestRef(chat_turn, None, question)


def test_a_new_plain_question_id_differs_from_the_last_and_parses() -> None:
    first, second = plain_question_id(), plain_question_id()
    assert first != second
    assert parse_plain_question_id(first) == first


def test_a_turn_id_used_again_makes_a_runner_turn_id_of_its_own() -> None:
    first = runner_turn_id("ahp-chat:/ticket-42", "turn-1")
    again = runner_turn_id("ahp-chat:/ticket-42", "turn-1", "0f3a9c1d")
    assert again == "ticket-42.turn-1~0f3a9c1d" != first


@given(part, part.filter(lambda c: "." not in c))
def test_a_child_turn_id_round_trips(parent: str, call_id: str) -> None:
    assert parse_child_turn_id(child_turn_id(parent, call_id)) == CallRef(parent, call_id)


@given(part, part.filter(lambda c: ":" not in c))
def test_an_idempotency_key_round_trips(turn_id: str, call_id: str) -> None:
    assert parse_idempotency_key(idempotency_key(turn_id, call_id)) == CallRef(turn_id, call_id)


@given(part, st.integers(min_value=0))
def test_a_markdown_part_id_round_trips_whatever_the_turn_id_holds(
    chat_turn: str, iteration: int
) -> None:
    parsed = parse_markdown_part_id(markdown_part_id(chat_turn, iteration))
    assert parsed == MarkdownPartRef(chat_turn, iteration)


@given(part, st.integers(min_value=0), st.integers(min_value=0))
def test_a_retried_attempts_markdown_part_id_round_trips(
    chat_turn: str, iteration: int, attempt: int
) -> None:
    parsed = parse_markdown_part_id(markdown_part_id(chat_turn, iteration, attempt))
    assert parsed == MarkdownPartRef(chat_turn, iteration, attempt)


def test_a_new_mcp_request_id_round_trips_and_differs_from_the_last() -> None:
    first, second = mcp_request_id(), mcp_request_id()
    assert first != second
    assert parse_mcp_request_id(first) == first.removeprefix("mcp:")


@given(st.from_regex(r"[0-9a-f]{16}", fullmatch=True))
def test_an_mcp_request_id_round_trips(token: str) -> None:
    assert parse_mcp_request_id(mcp_request_id(token)) == token


# ─── Foreign ids ─────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    "request_id",
    [
        "mcp:0123456789abcdef",
        "details",
        "turn-1:input:",
        ":input:c1",
        "turn-1:md:0",
        "turn-1:input:text:XYZ",
        "",
    ],
)
def test_an_input_request_id_the_runner_did_not_open_is_refused(request_id: str) -> None:
    assert parse_input_request_id(request_id) is None


@pytest.mark.parametrize("chat", ["ahp-session:/ticket-42", "ahp-root://", "ticket-42"])
def test_a_runner_turn_id_is_made_only_for_a_chat(chat: str) -> None:
    with pytest.raises(BadChannelUri):
        runner_turn_id(chat, "turn-1")


@pytest.mark.parametrize("turn_id", ["t1", "t1.", ".c1", ""])
def test_a_turn_id_without_a_parent_is_no_child_turn_id(turn_id: str) -> None:
    assert parse_child_turn_id(turn_id) is None


@pytest.mark.parametrize("key", ["t1", "t1:", ":c1", ""])
def test_a_key_without_a_call_is_no_idempotency_key(key: str) -> None:
    assert parse_idempotency_key(key) is None


@pytest.mark.parametrize(
    "part_id",
    [
        "turn-1:md:",
        "turn-1:md:x",
        "turn-1:md:-1",
        "turn-1:md:07",
        ":md:0",
        "turn-1:input:c1",
        "turn-1:md:3.0",
        "turn-1:md:3.x",
        "turn-1:md:3.01",
        "turn-1:md:3.",
        "",
    ],
)
def test_a_part_id_the_runner_did_not_write_is_no_markdown_part_id(part_id: str) -> None:
    assert parse_markdown_part_id(part_id) is None


@pytest.mark.parametrize(
    "request_id",
    ["mcp:", "mcp:0123456789ABCDEF", "mcp:0123456789abcde", "MCP:0123456789abcdef", "t:input:c"],
)
def test_an_id_the_mcp_bridge_did_not_make_is_no_mcp_request_id(request_id: str) -> None:
    assert parse_mcp_request_id(request_id) is None


@pytest.mark.parametrize("token", ["", "xyz", "0123ABCD", "0123abcd0"])
def test_a_plain_question_id_is_made_only_of_eight_hex_digits(token: str) -> None:
    with pytest.raises(ValueError, match="8 hex digits"):
        plain_question_id(token)


@pytest.mark.parametrize("token", ["", "xyz", "0123456789ABCDEF", "0123456789abcdef0"])
def test_an_mcp_request_id_is_made_only_of_sixteen_hex_digits(token: str) -> None:
    with pytest.raises(ValueError, match="16 hex digits"):
        mcp_request_id(token)
